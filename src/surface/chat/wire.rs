//! Chat Completions wire types: tolerant request structs and response/chunk builders.
//! No gateway logic lives here. Requests accept what real harnesses send (array `content`,
//! `role:"developer"`, extra keys); unknown request fields are ignored.

use serde::Deserialize;
use serde_json::{json, Map, Value};

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
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens,
                                  "cache_write_tokens": u.cache_write_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    })
}

/// Identity fields shared by every response of one leg.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

pub fn completion(
    meta: &ResponseMeta,
    content: Option<String>,
    calls: &[ExposedCall],
    finish_reason: &str,
    usage: Usage,
) -> Value {
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    message.insert("content".into(), json!(content));
    if !calls.is_empty() {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    message.insert("refusal".into(), Value::Null);
    message.insert("annotations".into(), json!([]));
    json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{"index": 0, "message": message, "logprobs": null,
                     "finish_reason": finish_reason}],
        "usage": usage_json(usage),
    })
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
