//! Chat Completions bodies passed through byte for byte but for a few spliced values: the
//! client's request on its way up (`model` renamed; a streamed request always asks for the
//! usage chunk, so every stream is metered), and the upstream's answers (whole bodies and
//! stream chunks) that carry no tool calls on their way down (`model` renamed; the usage the
//! gateway asked for and the client did not is cut out). A borrowing parse reads only what the
//! gateway interprets (every other field is skipped, not built) and finds the spans to
//! replace, and the new bytes are spliced in their place.

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::turn::Usage;

#[derive(Deserialize)]
struct Fields<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    stream: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_cache_key: Option<&'a RawValue>,
    #[serde(borrow)]
    user: Option<&'a RawValue>,
}

/// The members of a Chat Completions request that providers bucket their prompt caches by.
pub const CACHE_HINTS: [&str; 2] = ["prompt_cache_key", "user"];

/// A client's cache hint as it reaches the shared upstream: a digest bound to the principal,
/// so two principals never share a provider cache entry through the gateway (each keeps its
/// own stable key).
pub fn scoped_cache_key(principal: &str, hint: &serde_json::Value) -> serde_json::Value {
    let text = match hint {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut material = b"turnstile cache key\0".to_vec();
    material.extend_from_slice(principal.as_bytes());
    material.push(0);
    material.extend_from_slice(text.as_bytes());
    hex::encode(crate::digest::sha256(&material)).into()
}

/// A member's value whatever it is, `null` included (a plain `Option` reads `null` as
/// absent, and a `null` member still has a span to replace or cut).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// A passthrough body on its way up.
#[derive(Debug)]
pub struct Up {
    pub body: Bytes,
    /// The gateway asked for the streamed usage chunk the client did not ask for: it is
    /// metered, then cut from what the client receives.
    pub strip_usage: bool,
}

/// `raw` with its top-level `model` value replaced by `model` (as a JSON string; a body
/// without `model` gets none added), its cache hints scoped to `principal`
/// ([`scoped_cache_key`]) and, when it streams without asking for usage,
/// `stream_options.include_usage` set to true.
pub fn upstream_body(
    raw: &Bytes,
    model: Option<&str>,
    principal: &str,
) -> Result<Up, serde_json::Error> {
    let text = object(raw)?;
    let f: Fields<'_> = serde_json::from_str(text)?;
    let mut edits: Vec<(Range<usize>, Put<'_>)> = Vec::new();
    if let (Some(v), Some(m)) = (f.model, model) {
        edits.push((span(text, v), Put::Str(m)));
    }
    for hint in [f.prompt_cache_key, f.user].into_iter().flatten() {
        let value: serde_json::Value = serde_json::from_str(hint.get())?;
        let scoped = serde_json::to_string(&scoped_cache_key(principal, &value))?;
        edits.push((span(text, hint), Put::Text(scoped)));
    }
    let streamed = f.stream.is_some_and(|s| s.get() == "true");
    let mut strip_usage = false;
    if streamed {
        match f.stream_options {
            None => {
                // After the opening brace: a streamed body has at least its `stream` member.
                let at = raw.iter().position(|b| *b == b'{').unwrap_or(0) + 1;
                let ask = r#""stream_options":{"include_usage":true},"#.to_string();
                edits.push((at..at, Put::Text(ask)));
                strip_usage = true;
            }
            Some(o) => {
                let mut options: serde_json::Value = serde_json::from_str(o.get())?;
                if options["include_usage"] != true {
                    if !options.is_object() {
                        options = serde_json::json!({});
                    }
                    options["include_usage"] = true.into();
                    let options = serde_json::to_string(&options)?;
                    edits.push((span(text, o), Put::Text(options)));
                    strip_usage = true;
                }
            }
        }
    }
    let body = match edits.is_empty() {
        true => raw.clone(),
        false => rewrite(text, &mut edits).into(),
    };
    Ok(Up { body, strip_usage })
}

/// `raw` as text, when it is a JSON object (a struct also deserializes from an array). Read
/// as a `str`, its UTF-8 is checked once, not again for each string in it.
fn object(raw: &[u8]) -> Result<&str, serde_json::Error> {
    if !opens_object(raw) {
        return Err(serde::de::Error::custom("the body must be a JSON object"));
    }
    std::str::from_utf8(raw).map_err(serde::de::Error::custom)
}

/// Whether JSON text `raw` opens an object (its first byte past whitespace is `{`).
fn opens_object(raw: &[u8]) -> bool {
    raw.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// Where `value` (a span borrowed from `raw`) lies in `raw`.
fn span(raw: &str, value: &RawValue) -> Range<usize> {
    // The raw value borrows from `raw`: its offset is the distance between the two.
    let start = value.get().as_ptr() as usize - raw.as_ptr() as usize;
    start..start + value.get().len()
}

/// What replaces a span.
enum Put<'b> {
    /// A string, written as JSON.
    Str(&'b str),
    /// JSON text.
    Text(String),
}

/// `raw` with each range (disjoint, on JSON token boundaries) replaced.
fn rewrite(raw: &str, edits: &mut [(Range<usize>, Put<'_>)]) -> String {
    edits.sort_unstable_by_key(|(r, _)| r.start);
    let mut out = String::with_capacity(raw.len() + 64);
    let mut at = 0;
    for (r, put) in edits.iter() {
        out.push_str(&raw[at..r.start]);
        match put {
            Put::Str(s) => quoted(&mut out, s),
            Put::Text(t) => out.push_str(t),
        }
        at = r.end;
    }
    out.push_str(&raw[at..]);
    out
}

/// `s` as a JSON string (as serde_json writes it: only `"`, `\\` and control characters
/// escaped).
fn quoted(out: &mut String, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::Value::from(s).to_string());
    }
}

/// The whole member (`"key": value` and one separating comma) around the value at `value`,
/// in an object `raw` that a JSON parser accepted.
fn member(raw: &str, value: Range<usize>) -> Range<usize> {
    let raw = raw.as_bytes();
    let back = |mut i: usize| {
        while i > 0 && raw[i - 1].is_ascii_whitespace() {
            i -= 1;
        }
        i
    };
    // `value` <- ws <- ':' <- ws <- '"' key '"' (a key has no unescaped quote inside).
    let colon = back(value.start) - 1;
    let mut key = back(colon) - 1;
    loop {
        key -= 1;
        if raw[key] == b'"' && raw[key - 1] != b'\\' {
            break;
        }
    }
    let before = back(key);
    if raw[before - 1] == b',' {
        return before - 1..value.end;
    }
    // The first member: take the comma after it, if any.
    let mut after = value.end;
    while after < raw.len() && raw[after].is_ascii_whitespace() {
        after += 1;
    }
    match raw.get(after) {
        Some(b',') => {
            after += 1;
            while after < raw.len() && raw[after].is_ascii_whitespace() {
                after += 1;
            }
            key..after
        }
        _ => key..value.end,
    }
}

/// What the gateway reads of an upstream answer (a whole body or one stream chunk). Its
/// `usage` is read as a [`WireUsage`], or as a [`Member`] when it is to be cut out.
#[derive(Deserialize)]
struct Answer<'a, U> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(default, borrow)]
    choices: Option<Vec<Choice<'a>>>,
    #[serde(default)]
    usage: U,
    /// Cut when null (the published schema allows a string or nothing).
    #[serde(default, borrow)]
    system_fingerprint: Member<'a>,
}

/// A member's value whatever it is, `null` included, found in the same read (only the one
/// usage chunk of a stream is then read again, as a [`WireUsage`]).
#[derive(Default)]
struct Member<'a>(Option<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Member<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        present(d).map(Member)
    }
}

#[derive(Deserialize)]
struct Choice<'a> {
    /// Kept whole: members the published schema requires are added to it when missing.
    #[serde(default, borrow)]
    message: Option<&'a RawValue>,
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
    #[serde(default, borrow)]
    refusal: Member<'a>,
    #[serde(default, borrow)]
    annotations: Member<'a>,
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

/// An upstream answer with no tool calls, read without building a tree.
#[derive(Debug)]
pub struct Plain {
    /// The body (or chunk) with `model` renamed, to relay as it is.
    pub json: String,
    /// False for a usage chunk the client did not ask for: metered, not relayed.
    pub relay: bool,
    pub text: String,
    pub reasoning: String,
    pub usage: Option<Usage>,
    /// The first choice's `finish_reason`, when it has one.
    pub finish: Option<String>,
}

/// Reads an answer that carries no tool calls, `model` renamed to `model` and, with
/// `strip_usage`, its `usage` member cut out; None when it has tool calls, or no `model`, or
/// is not an object of this shape: the caller reads it as a tree. Without `model` it is read
/// for the gateway alone (not relayed: `json` is left empty).
pub fn plain(raw: &str, model: Option<&str>, strip_usage: bool) -> Option<Plain> {
    if !opens_object(raw.as_bytes()) {
        return None;
    }
    if !strip_usage {
        let a: Answer<'_, Option<WireUsage>> = serde_json::from_str(raw).ok()?;
        let usage = a.usage.map(wire_usage);
        let parts = (a.model, a.choices, a.system_fingerprint);
        return read(raw, model, parts, usage, None);
    }
    let a: Answer<'_, Member<'_>> = serde_json::from_str(raw).ok()?;
    let usage = match a.usage.0.filter(|u| u.get() != "null") {
        Some(u) => Some(wire_usage(serde_json::from_str(u.get()).ok()?)),
        None => None,
    };
    let cut = a.usage.0.map(|u| member(raw, span(raw, u)));
    let parts = (a.model, a.choices, a.system_fingerprint);
    read(raw, model, parts, usage, cut)
}

/// A read answer's `model`, `choices` and `system_fingerprint`.
type Parts<'a> = (Option<&'a RawValue>, Option<Vec<Choice<'a>>>, Member<'a>);

/// [`plain`] once the answer is read: `cut` is the usage member to take out. What the
/// published schema requires of a whole answer is made true on the way: a null
/// `system_fingerprint` is cut, and a message without `refusal` or `annotations` gets them
/// (null and empty), as OpenAI itself answers.
fn read(
    raw: &str,
    model: Option<&str>,
    (model_value, choices, fingerprint): Parts<'_>,
    usage: Option<Usage>,
    cut: Option<Range<usize>>,
) -> Option<Plain> {
    let model_value = model_value?;
    let choices = choices.unwrap_or_default();
    let finish = choices.first().and_then(|c| c.finish_reason.clone());
    let relay = cut.is_none() || !choices.is_empty();
    // `model`, and at most a message's members, a fingerprint and the usage.
    let mut edits = Vec::with_capacity(4);
    let mut said = None;
    for (i, c) in choices.into_iter().enumerate() {
        let s = match (c.message, c.delta) {
            (Some(m), _) => {
                let s: Said<'_> = serde_json::from_str(m.get()).ok()?;
                if model.is_some() {
                    complete(raw, m, &s, &mut edits);
                }
                Some(s)
            }
            (None, delta) => delta,
        };
        if s.as_ref()
            .is_some_and(|s| s.tool_calls.is_some_and(|t| t.get() != "null"))
        {
            return None;
        }
        if i == 0 {
            said = s;
        }
    }
    let json = match model {
        Some(model) => {
            edits.push((span(raw, model_value), Put::Str(model)));
            if let Some(f) = fingerprint.0.filter(|f| f.get() == "null") {
                edits.push((member(raw, span(raw, f)), Put::Text(String::new())));
            }
            if let Some(member) = cut {
                edits.push((member, Put::Text(String::new())));
            }
            rewrite(raw, &mut edits)
        }
        None => String::new(),
    };
    Some(Plain {
        text: said
            .as_ref()
            .and_then(|s| s.content.as_deref())
            .unwrap_or_default()
            .to_string(),
        reasoning: said
            .as_ref()
            .and_then(|s| s.reasoning_content.as_deref())
            .unwrap_or_default()
            .to_string(),
        usage,
        finish: finish.map(Cow::into_owned),
        json,
        // The usage-only chunk goes whole; elsewhere only the member.
        relay,
    })
}

/// The members a whole answer's `message` (at `m` in `raw`) lacks of those the published
/// schema requires, added before its closing brace.
fn complete<'r>(raw: &str, m: &RawValue, s: &Said<'_>, edits: &mut Vec<(Range<usize>, Put<'r>)>) {
    let missing = match (s.refusal.0.is_some(), s.annotations.0.is_some()) {
        (true, true) => return,
        (false, true) => r#""refusal":null"#,
        (true, false) => r#""annotations":[]"#,
        (false, false) => r#""refusal":null,"annotations":[]"#,
    };
    // Only an object takes members (serde reads a struct from an array too).
    if !m.get().starts_with('{') {
        return;
    }
    let at = span(raw, m).end - 1;
    let empty = m.get()[1..m.get().len() - 1].trim().is_empty();
    let mut put = String::with_capacity(missing.len() + 1);
    if !empty {
        put.push(',');
    }
    put.push_str(missing);
    edits.push((at..at, Put::Text(put)));
}

fn wire_usage(u: WireUsage) -> Usage {
    Usage {
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
    }
}

#[cfg(test)]
mod tests;
