//! Chat Completions bodies passed through byte for byte but for the `model` value: the
//! client's request on its way up, and the upstream's answers (whole bodies and stream chunks)
//! that carry no tool calls on their way down. A borrowing parse reads only what the gateway
//! interprets (every other field is skipped, not built) and finds the `model` value's span,
//! and the new name is spliced in its place.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::turn::Usage;

#[derive(Deserialize)]
struct ModelField<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
}

/// `raw` with its top-level `model` value replaced by `model` (as a JSON string). A body
/// without `model` gets none added.
pub fn with_model(raw: &Bytes, model: &str) -> Result<Bytes, serde_json::Error> {
    object(raw)?;
    let field: ModelField<'_> = serde_json::from_slice(raw)?;
    splice(raw, field.model, model)
}

/// A struct also deserializes from an array; only an object is a body.
fn object(raw: &[u8]) -> Result<(), serde_json::Error> {
    if raw.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(serde::de::Error::custom("the body must be a JSON object"));
    }
    Ok(())
}

/// `raw` with `value` (a span borrowed from it) replaced by `model` as a JSON string.
fn splice(raw: &Bytes, value: Option<&RawValue>, model: &str) -> Result<Bytes, serde_json::Error> {
    let Some(value) = value else {
        return Ok(raw.clone());
    };
    // The raw value borrows from `raw`: its offset is the distance between the two.
    let start = value.get().as_ptr() as usize - raw.as_ptr() as usize;
    let end = start + value.get().len();
    let mut out = Vec::with_capacity(raw.len() + model.len() + 2);
    out.extend_from_slice(&raw[..start]);
    serde_json::to_writer(&mut out, model)?;
    out.extend_from_slice(&raw[end..]);
    Ok(out.into())
}

/// What the gateway reads of an upstream answer (a whole body or one stream chunk).
#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(default, borrow)]
    choices: Option<Vec<Choice<'a>>>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow)]
    message: Option<Said<'a>>,
    #[serde(default, borrow)]
    delta: Option<Said<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

/// A message or a delta: its text, and whether it carries tool calls (matched by name after
/// unescaping, so an escaped key is seen too).
#[derive(Deserialize)]
struct Said<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    /// Reasoning as DeepSeek and others send it (`reasoning_content`) or vLLM and OpenRouter
    /// (`reasoning`).
    #[serde(default, borrow, alias = "reasoning")]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    total_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
    #[serde(default)]
    completion_tokens_details: Option<Details>,
    /// Cache writes as gateways that front Claude models report them.
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    cache_write_tokens: Option<u64>,
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

/// The upstream's own Chat Completions body or stream chunk, `model` renamed, for a surface
/// that relays that wire.
#[derive(Debug)]
pub enum Native {
    /// No tool calls in it: relayed byte for byte. `finish`: it has a `finish_reason`.
    Raw { json: Bytes, finish: bool },
    /// Read as a tree, its tool calls taken out.
    Tree(serde_json::Value),
}

impl Native {
    /// Whether the first choice has a `finish_reason`.
    pub fn finishes(&self) -> bool {
        match self {
            Native::Raw { finish, .. } => *finish,
            Native::Tree(v) => v["choices"][0]["finish_reason"].as_str().is_some(),
        }
    }

    /// As a tree (parsed only on the tool-call paths, which rewrite it).
    pub fn into_value(self) -> serde_json::Value {
        match self {
            Native::Tree(v) => v,
            raw => raw.to_value(),
        }
    }

    /// A copy as a tree.
    pub fn to_value(&self) -> serde_json::Value {
        match self {
            Native::Raw { json, .. } => serde_json::from_slice(json).unwrap_or_default(),
            Native::Tree(v) => v.clone(),
        }
    }

    /// One SSE `data:` event of it.
    pub fn event(&self) -> String {
        match self {
            Native::Raw { json, .. } => {
                let mut out = String::with_capacity(json.len() + 8);
                out.push_str("data: ");
                out.push_str(std::str::from_utf8(json).unwrap_or_default());
                out.push_str("\n\n");
                out
            }
            Native::Tree(v) => format!("data: {v}\n\n"),
        }
    }
}

/// An upstream answer with no tool calls, read without building a tree.
#[derive(Debug)]
pub struct Plain {
    /// The body (or chunk) with `model` renamed, to relay as it is.
    pub json: Bytes,
    pub text: String,
    pub reasoning: String,
    pub usage: Option<Usage>,
    /// The first choice's `finish_reason`, when it has one.
    pub finish: Option<String>,
}

/// Reads an answer that carries no tool calls, `model` renamed to `model`; None when it has
/// tool calls, or no `model`, or is not an object of this shape: the caller reads it as a
/// tree.
pub fn plain(raw: &Bytes, model: &str) -> Option<Plain> {
    object(raw).ok()?;
    let a: Answer<'_> = serde_json::from_slice(raw).ok()?;
    a.model?;
    let first = a.choices.as_ref().and_then(|c| c.first());
    let said = first.and_then(|c| c.message.as_ref().or(c.delta.as_ref()));
    let calls = a.choices.iter().flatten().any(|c| {
        [&c.message, &c.delta]
            .into_iter()
            .flatten()
            .any(|s| s.tool_calls.is_some_and(|t| t.get() != "null"))
    });
    if calls {
        return None;
    }
    let usage = a.usage.map(|u| Usage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        total_tokens: u.total_tokens,
        cached_tokens: u
            .prompt_tokens_details
            .as_ref()
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0),
        cache_write_tokens: u
            .prompt_tokens_details
            .as_ref()
            .and_then(|d| d.cache_write_tokens)
            .or(u.cache_creation_input_tokens)
            .unwrap_or(0),
        reasoning_tokens: u
            .completion_tokens_details
            .and_then(|d| d.reasoning_tokens)
            .unwrap_or(0),
    });
    Some(Plain {
        text: said
            .and_then(|s| s.content.as_deref())
            .unwrap_or_default()
            .to_string(),
        reasoning: said
            .and_then(|s| s.reasoning_content.as_deref())
            .unwrap_or_default()
            .to_string(),
        usage,
        finish: first.and_then(|c| c.finish_reason.as_deref().map(str::to_owned)),
        json: splice(raw, a.model, model).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_model_value_changes() {
        let raw = Bytes::from_static(
            b"{ \"messages\" : [{\"role\":\"user\",\"content\":\"model\"}],\n  \"model\":\"pub\" , \"temperature\": 1.0e0, \"x\": {\"model\": 1} }",
        );
        let out = with_model(&raw, "real \"m\"").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "{ \"messages\" : [{\"role\":\"user\",\"content\":\"model\"}],\n  \"model\":\"real \\\"m\\\"\" , \"temperature\": 1.0e0, \"x\": {\"model\": 1} }"
        );
    }

    #[test]
    fn a_plain_answer_is_read_without_a_tree_and_relayed_as_sent() {
        let raw = Bytes::from_static(
            b"{\"id\":\"c\",\"model\":\"up\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"hi \\u00e9\"},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6,\"total_tokens\":11,\"prompt_tokens_details\":{\"cached_tokens\":2},\"x\":null}}",
        );
        let p = plain(&raw, "pub").unwrap();
        assert_eq!(p.text, "hi \u{e9}");
        assert_eq!(p.finish.as_deref(), Some("length"));
        let u = p.usage.unwrap();
        assert_eq!(
            (u.prompt_tokens, u.cached_tokens, u.total_tokens),
            (5, 2, 11)
        );
        let back: serde_json::Value = serde_json::from_slice(&p.json).unwrap();
        let mut want: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        want["model"] = "pub".into();
        assert_eq!(back, want);
        // A chunk: the delta's text, no usage, no finish.
        let chunk = Bytes::from_static(
            b"{\"model\":\"up\",\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}],\"usage\":null}",
        );
        let p = plain(&chunk, "pub").unwrap();
        assert_eq!(
            (p.text.as_str(), p.finish, p.usage.is_none()),
            ("a", None, true)
        );
    }

    #[test]
    fn an_answer_with_tool_calls_is_not_plain() {
        for body in [
            &b"{\"model\":\"u\",\"choices\":[{\"message\":{\"content\":null,\"tool_calls\":[{\"id\":\"x\"}]}}]}"[..],
            b"{\"model\":\"u\",\"choices\":[{\"delta\":{\"tool\\u005fcalls\":[{\"index\":0}]}}]}",
            b"[1]",
            b"{\"model\":\"u\",\"choices\":7}",
            b"{\"choices\":[]}",
        ] {
            assert!(plain(&Bytes::copy_from_slice(body), "m").is_none());
        }
        let nulled = Bytes::from_static(b"{\"model\":\"u\",\"choices\":[{\"message\":{\"content\":\"x\",\"tool_calls\":null}}]}");
        assert!(plain(&nulled, "m").is_some());
    }

    #[test]
    fn escaped_and_missing_and_invalid() {
        let raw = Bytes::from_static(b"{\"mod\\u0065l\":\"a\",\"n\":1}");
        assert_eq!(
            &with_model(&raw, "b").unwrap()[..],
            b"{\"mod\\u0065l\":\"b\",\"n\":1}"
        );
        let raw = Bytes::from_static(b"{\"n\":1}");
        assert_eq!(&with_model(&raw, "b").unwrap()[..], b"{\"n\":1}");
        assert!(with_model(&Bytes::from_static(b"{\"model\":\"a\""), "b").is_err());
        assert!(with_model(&Bytes::from_static(b"[1]"), "b").is_err());
    }
}
