//! Chat Completions request bodies for an upstream: the translation of a neutral turn (for
//! surfaces other than Chat Completions), and the restoring of the upstream's own call ids in
//! a continuation. Both keep one body message per input message, so input indices address
//! the body's `messages` whether it is the client's own body or a translation.

use serde_json::{json, Map, Value};

use crate::backend::Resume;
use crate::turn::{Role, ToolChoice, TurnInput};

/// A Chat Completions body for a neutral turn.
pub fn chat_body(input: &TurnInput) -> Value {
    let messages: Vec<Value> = input
        .messages
        .iter()
        .map(|m| {
            let mut o = Map::new();
            o.insert("role".into(), json!(m.role.as_str()));
            let empty_assistant = m.role == Role::Assistant && m.text.is_empty();
            let content = if empty_assistant && !m.tool_calls.is_empty() {
                Value::Null
            } else if m.images.is_empty() || m.role == Role::Tool {
                // Chat tool messages take text only.
                json!(m.text)
            } else {
                let mut parts = vec![json!({"type": "text", "text": m.text})];
                parts.extend(
                    m.images
                        .iter()
                        .map(|url| json!({"type": "image_url", "image_url": {"url": url}})),
                );
                Value::Array(parts)
            };
            o.insert("content".into(), content);
            if let Some(n) = &m.name {
                o.insert("name".into(), json!(n));
            }
            if !m.tool_calls.is_empty() {
                let calls: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        json!({"id": c.id, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}})
                    })
                    .collect();
                o.insert("tool_calls".into(), Value::Array(calls));
            }
            if let Some(id) = &m.tool_call_id {
                o.insert("tool_call_id".into(), json!(id));
            }
            Value::Object(o)
        })
        .collect();
    let mut body = json!({"model": input.model, "messages": messages, "stream": input.stream});
    let tools = input.tools.as_deref().unwrap_or_default();
    if !tools.is_empty() {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {"name": t.name,
                       "description": t.description, "parameters": t.parameters}})
            })
            .collect();
        body["tools"] = Value::Array(tools);
        body["parallel_tool_calls"] = json!(input.parallel_tool_calls);
    }
    let choice = match &input.tool_choice {
        ToolChoice::Auto | ToolChoice::Invalid => None,
        ToolChoice::None => Some(json!("none")),
        ToolChoice::Required => Some(json!("required")),
        ToolChoice::Named(n) => Some(json!({"type": "function", "function": {"name": n}})),
    };
    if let Some(c) = choice {
        body["tool_choice"] = c;
    }
    if input.stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    if let Some(o) = body.as_object_mut() {
        o.extend(options(input));
    }
    body
}

/// The Chat Completions options of a neutral turn: its sampling options and its effort.
pub fn options(input: &TurnInput) -> Map<String, Value> {
    let s = &input.sampling;
    let mut o = Map::new();
    let effort = input.effort.map(|e| json!(e.as_str()));
    for (key, v) in [
        ("max_tokens", &s.max_tokens),
        ("temperature", &s.temperature),
        ("top_p", &s.top_p),
        ("stop", &s.stop),
        ("reasoning_effort", &effort),
        ("prompt_cache_key", &s.cache_key),
        ("response_format", &s.response_format),
    ] {
        if let Some(v) = v {
            o.insert(key.into(), v.clone());
        }
    }
    o
}

/// Puts the upstream's ids back where the answered batch's tokens are: the assistant
/// message's `tool_calls[].id` and each result's `tool_call_id`.
pub fn restore_ids(body: &mut Value, r: &Resume<'_>, ids: &[String]) {
    let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else {
        return;
    };
    let assistant = r.continuation.assistant;
    if let Some(calls) = messages
        .get_mut(assistant)
        .and_then(|m| m.get_mut("tool_calls"))
        .and_then(Value::as_array_mut)
    {
        for (call, pos) in calls.iter_mut().zip(&r.echo_calls) {
            if let (Some(id), Some(original)) = (call.get_mut("id"), ids.get(*pos)) {
                *id = json!(original);
            }
        }
    }
    for a in &r.answers {
        let slot = messages
            .get_mut(a.message)
            .and_then(|m| m.get_mut("tool_call_id"));
        if let (Some(id), Some(original)) = (slot, ids.get(a.call)) {
            *id = json!(original);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(v: Value) -> TurnInput {
        let t = tokio::time::Instant::now();
        crate::surface::responses::parse(v.to_string().as_bytes(), t)
            .unwrap()
            .0
    }

    #[test]
    fn a_responses_turn_in_chat_form() {
        const T: &str = "srct-0123456789abcdef0123456789abcdef";
        let body = chat_body(&input(json!({"model": "m", "instructions": "sys",
            "max_output_tokens": 9, "reasoning": {"effort": "high"},
            "tools": [{"type": "custom", "name": "apply_patch"}],
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "see"},
                                             {"type": "input_image", "image_url": "data:i"}]},
                {"type": "custom_tool_call", "call_id": T, "name": "apply_patch", "input": "P"},
                {"type": "custom_tool_call_output", "call_id": T, "output": [
                    {"type": "input_text", "text": "ok"}, {"type": "input_image", "image_url": "data:j"}]}]})));
        let m = body["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "sys"}));
        assert_eq!(m[1]["content"][1]["image_url"]["url"], "data:i");
        assert_eq!(
            m[2]["tool_calls"][0]["function"],
            json!({"name": "apply_patch", "arguments": "{\"input\":\"P\"}"})
        );
        assert_eq!(m[2]["content"], Value::Null);
        assert_eq!(
            m[3],
            json!({"role": "tool", "content": "ok", "tool_call_id": T})
        );
        assert_eq!(body["tools"][0]["function"]["name"], "apply_patch");
        assert_eq!(
            (
                body["max_tokens"].as_u64(),
                body["reasoning_effort"].as_str()
            ),
            (Some(9), Some("high"))
        );
    }
}
