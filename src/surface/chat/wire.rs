//! Chat Completions wire types: tolerant request structs and response/chunk builders.
//! No gateway logic lives here. Requests accept what real harnesses send (array `content`,
//! `role:"developer"`, extra keys); unknown request fields are ignored.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::turn::{ExposedCall, Usage};

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(default, deserialize_with = "null_as_false")]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Kept raw: their canonical form is digested for continuations.
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub reasoning_effort: Option<Value>,
    #[serde(default)]
    pub response_format: Option<Value>,
    /// Cache hints, only noticed (a shared upstream receives them scoped to the principal).
    #[serde(default)]
    pub prompt_cache_key: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    pub user: Option<serde::de::IgnoredAny>,
}

fn null_as_false<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(false))
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// `content` as a string or as an array of parts (`{"type":"text","text":…}`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Value>),
}

impl Content {
    /// The text of the content: a string verbatim, or the text parts joined with no separator.
    /// Non-text parts (images) are skipped.
    pub fn text(&self) -> String {
        match self {
            Content::Text(s) => s.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|p| match p {
                    Value::String(s) => Some(s.as_str()),
                    Value::Object(o) => o.get("text").and_then(Value::as_str),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join(""),
        }
    }
}

impl Message {
    pub fn text(&self) -> String {
        self.content.as_ref().map(Content::text).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// A JSON string per the API; some clients send an object, which is accepted.
    #[serde(default)]
    pub arguments: Value,
}

impl FunctionCall {
    pub fn arguments_text(&self) -> String {
        match &self.arguments {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }
    }
}

/// Usage in the Chat Completions shape.
pub fn usage_json(u: Usage) -> Value {
    // Cannot fail: a struct of numbers.
    serde_json::to_value(UsageOut::of(u)).unwrap_or_default()
}

/// Identity fields shared by every response of one leg.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: std::sync::Arc<str>,
}

/// A whole `chat.completion` answer, written straight from typed parts (no tree).
pub fn completion(
    meta: &ResponseMeta,
    content: Option<&str>,
    reasoning: Option<&str>,
    calls: &[ExposedCall],
    finish_reason: &str,
    usage: Usage,
) -> Vec<u8> {
    let body = Completion {
        id: &meta.id,
        object: "chat.completion",
        created: meta.created,
        model: &meta.model,
        choices: [Choice {
            index: 0,
            message: Said {
                role: "assistant",
                content,
                tool_calls: calls.iter().map(CallOut::of).collect(),
                refusal: (),
                annotations: [],
                reasoning_content: reasoning,
            },
            logprobs: (),
            finish_reason,
        }],
        usage: UsageOut::of(usage),
    };
    // Cannot fail: every part is a string, a number or null.
    serde_json::to_vec(&body).unwrap_or_default()
}

#[derive(Serialize)]
struct Completion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a>; 1],
    usage: UsageOut,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    message: Said<'a>,
    /// Always null.
    logprobs: (),
    finish_reason: &'a str,
}

#[derive(Serialize)]
struct Said<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<CallOut<'a>>,
    /// Always null.
    refusal: (),
    /// Always empty.
    annotations: [(); 0],
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
}

#[derive(Serialize)]
struct CallOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionOut<'a>,
}

impl<'a> CallOut<'a> {
    fn of(c: &'a ExposedCall) -> CallOut<'a> {
        CallOut {
            id: &c.id,
            kind: "function",
            function: FunctionOut {
                name: &c.name,
                arguments: &c.arguments,
            },
        }
    }
}

#[derive(Serialize)]
struct FunctionOut<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// A Chat Completions `usage` (with its details), typed.
#[derive(Serialize)]
struct UsageOut {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: CachedOut,
    completion_tokens_details: ReasoningOut,
}

#[derive(Serialize)]
struct CachedOut {
    cached_tokens: u64,
    cache_write_tokens: u64,
}

#[derive(Serialize)]
struct ReasoningOut {
    reasoning_tokens: u64,
}

impl UsageOut {
    fn of(u: Usage) -> UsageOut {
        UsageOut {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.total_tokens,
            prompt_tokens_details: CachedOut {
                cached_tokens: u.cached_tokens,
                cache_write_tokens: u.cache_write_tokens,
            },
            completion_tokens_details: ReasoningOut {
                reasoning_tokens: u.reasoning_tokens,
            },
        }
    }
}

/// An upstream's whole answer made to say what the published schema requires, as OpenAI
/// itself answers (the relay does the same in bytes: `backend::upstream::native::plain`): no
/// null `system_fingerprint`, and every message with `refusal` and `annotations`.
pub fn conform(body: &mut Value) {
    let Some(o) = body.as_object_mut() else {
        return;
    };
    if o.get("system_fingerprint").is_some_and(Value::is_null) {
        o.remove("system_fingerprint");
    }
    let choices = o.get_mut("choices").and_then(Value::as_array_mut);
    for c in choices.into_iter().flatten() {
        if let Some(m) = c.get_mut("message").and_then(Value::as_object_mut) {
            m.entry("refusal").or_insert(Value::Null);
            m.entry("annotations").or_insert_with(|| json!([]));
        }
    }
}

/// One `chat.completion.chunk` with a single choice. `with_usage_null` adds `"usage":null`, as
/// OpenAI does on every chunk when `stream_options.include_usage` is set.
pub fn chunk(
    meta: &ResponseMeta,
    delta: Value,
    finish: Option<&str>,
    with_usage_null: bool,
) -> Value {
    let mut v = json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
    });
    if with_usage_null {
        v["usage"] = Value::Null;
    }
    v
}

/// The closing usage chunk (`choices: []`).
pub fn usage_chunk(meta: &ResponseMeta, usage: Usage) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": usage_json(usage),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_completion_has_the_published_shape_in_order() {
        let meta = ResponseMeta {
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
        };
        let calls = [ExposedCall {
            id: "srct-1".into(),
            name: "read".into(),
            arguments: "{\"p\":1}".into(),
        }];
        let usage = Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            total_tokens: 5,
            cached_tokens: 1,
            ..Usage::default()
        };
        let body = completion(&meta, None, Some("r"), &calls, "tool_calls", usage);
        let text = String::from_utf8(body).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v,
            json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "m",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": null,
                       "tool_calls": [{"id": "srct-1", "type": "function",
                                       "function": {"name": "read", "arguments": "{\"p\":1}"}}],
                       "refusal": null, "annotations": [], "reasoning_content": "r"},
                       "logprobs": null, "finish_reason": "tool_calls"}],
                   "usage": usage_json(usage)})
        );
        assert!(text.starts_with(r#"{"id":"chatcmpl-1","object":"chat.completion","created":7,"#));
        let plain = completion(&meta, Some("hi"), None, &[], "stop", usage);
        let v: Value = serde_json::from_slice(&plain).unwrap();
        assert_eq!(
            v["choices"][0]["message"],
            json!({"role": "assistant", "content": "hi", "refusal": null, "annotations": []})
        );
    }

    #[test]
    fn tolerant_request_parsing() {
        let req: ChatRequest = serde_json::from_value(json!({
            "model": "m", "stream": null, "store": false, "max_completion_tokens": 5,
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"type": "function", "id": "x", "function": {"name": "f", "arguments": {"k": 1}}}]},
                {"role": "tool", "tool_call_id": "x", "content": [{"type": "text", "text": "r"}]}
            ],
            "tools": [{"type": "function", "name": "f", "function": {"name": "f", "parameters": {}}}]
        }))
        .unwrap();
        assert!(!req.stream);
        assert_eq!(req.messages[1].text(), "ab");
        assert_eq!(req.messages[3].text(), "r");
        let call = &req.messages[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.function.arguments_text(), "{\"k\":1}");
    }
}
