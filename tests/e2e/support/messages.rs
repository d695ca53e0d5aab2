//! Helpers for the Anthropic Messages tests: requests authenticated like Claude Code
//! (`x-api-key`, `anthropic-version`, `anthropic-beta`, `?beta=true`), a strict stream reader
//! that rebuilds the message, and the continuation (the conversation again plus the results).

use serde_json::{json, Value};

use super::schema::{self, Wire};
use super::Gateway;

pub async fn post(gw: &Gateway, key: &str, body: &Value) -> reqwest::Response {
    gw.http
        .post(format!("{}/v1/messages?beta=true", gw.url))
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .header(
            "anthropic-beta",
            "claude-code-20250219,interleaved-thinking-2025-05-14",
        )
        .json(body)
        .send()
        .await
        .expect("send")
}

/// Non-streaming: status and body.
pub async fn create(gw: &Gateway, key: &str, body: &Value) -> (u16, Value) {
    let (status, text) = create_text(gw, key, body).await;
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON {text}"));
    match status {
        200 => schema::check(Wire::Message, &v),
        _ => schema::check(Wire::MessageError, &v),
    }
    (status, v)
}

pub async fn create_text(gw: &Gateway, key: &str, body: &Value) -> (u16, String) {
    let r = post(gw, key, body).await;
    (r.status().as_u16(), r.text().await.expect("body"))
}

/// Streaming: the status, the events (pings left out) and the message they build. The
/// grammar is checked strictly: an `event:` line naming each `type`; `message_start` first;
/// blocks with consecutive indices, each started, given deltas of its own kind and stopped
/// before the next; `message_delta` then `message_stop` last, or an `error` event last.
pub async fn stream(gw: &Gateway, key: &str, body: &Value) -> (u16, Vec<Value>, Value) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = post(gw, key, &body).await;
    let status = r.status().as_u16();
    if status != 200 {
        let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        schema::check(Wire::MessageError, &v);
        return (status, vec![v.clone()], v);
    }
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        if block.lines().all(|l| l.starts_with(':')) {
            continue;
        }
        let name = block.lines().find_map(|l| l.strip_prefix("event: "));
        let data = block
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap();
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(name, v["type"].as_str(), "{block}");
        match v["type"].as_str() {
            Some("ping") => continue,
            Some("error") => schema::check(Wire::MessageError, &v),
            _ => schema::check(Wire::MessageEvent, &v),
        }
        events.push(v);
    }
    let message = rebuild(&events, &text);
    (status, events, message)
}

/// Checks the event grammar and rebuilds the message (for an `error` ending, the error).
fn rebuild(events: &[Value], text: &str) -> Value {
    assert_eq!(events[0]["type"], "message_start", "{text}");
    let mut message = events[0]["message"].clone();
    assert_eq!(message["content"], json!([]), "{text}");
    assert!(message["stop_reason"].is_null(), "{text}");
    let mut content: Vec<Value> = Vec::new();
    let mut open: Option<usize> = None;
    let mut partial = String::new();
    for (i, e) in events.iter().enumerate().skip(1) {
        let last = i == events.len() - 1;
        match e["type"].as_str().unwrap() {
            "content_block_start" => {
                assert!(open.is_none(), "a block is still open: {text}");
                let index = e["index"].as_u64().unwrap() as usize;
                assert_eq!(index, content.len(), "{text}");
                let block = e["content_block"].clone();
                assert!(
                    block["type"] == "text" && block["text"] == ""
                        || block["type"] == "tool_use" && block["input"] == json!({})
                        || block["type"] == "thinking"
                            && block["thinking"] == ""
                            && block["signature"] == "",
                    "{block}"
                );
                content.push(block);
                open = Some(index);
                partial.clear();
            }
            "content_block_delta" => {
                let index = open.expect("a delta outside a block");
                assert_eq!(e["index"], index as u64, "{text}");
                let b = &mut content[index];
                match (b["type"].as_str().unwrap(), e["delta"]["type"].as_str()) {
                    ("text", Some("text_delta")) => {
                        let t = format!(
                            "{}{}",
                            b["text"].as_str().unwrap(),
                            e["delta"]["text"].as_str().unwrap()
                        );
                        b["text"] = json!(t);
                    }
                    ("tool_use", Some("input_json_delta")) => {
                        partial.push_str(e["delta"]["partial_json"].as_str().unwrap())
                    }
                    ("thinking", Some("thinking_delta")) => {
                        assert_eq!(b["signature"], "", "a thinking delta after its signature");
                        let t = format!(
                            "{}{}",
                            b["thinking"].as_str().unwrap(),
                            e["delta"]["thinking"].as_str().unwrap()
                        );
                        b["thinking"] = json!(t);
                    }
                    ("thinking", Some("signature_delta")) => {
                        b["signature"] = e["delta"]["signature"].clone();
                    }
                    other => panic!("delta {other:?} in the wrong block: {text}"),
                }
            }
            "content_block_stop" => {
                let index = open.take().expect("a stop outside a block");
                assert_eq!(e["index"], index as u64, "{text}");
                if content[index]["type"] == "tool_use" {
                    content[index]["input"] = serde_json::from_str(&partial).unwrap();
                }
                if content[index]["type"] == "thinking" {
                    assert_ne!(content[index]["signature"], "", "a thinking block unsigned");
                }
            }
            "message_delta" => {
                assert!(open.is_none(), "{text}");
                assert_eq!(events[i + 1]["type"], "message_stop", "{text}");
                assert_eq!(i + 2, events.len(), "{text}");
                message["stop_reason"] = e["delta"]["stop_reason"].clone();
                message["usage"] = e["usage"].clone();
            }
            "message_stop" => assert!(last, "{text}"),
            "error" => {
                assert!(last, "{text}");
                return e.clone();
            }
            other => panic!("unexpected event {other}: {text}"),
        }
    }
    message["content"] = Value::Array(content);
    message
}

pub fn claude_read_tool() -> Value {
    json!({"name": "Read", "description": "Reads a file from the local filesystem.",
           "input_schema": {"$schema": "https://json-schema.org/draft/2020-12/schema",
             "type": "object", "properties": {"file_path": {"type": "string"}},
             "required": ["file_path"], "additionalProperties": false}})
}

pub fn tools() -> Value {
    json!([claude_read_tool(),
           {"name": "Bash", "description": "Runs a command",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
            "cache_control": {"type": "ephemeral"}},
           {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}])
}

/// A request shaped like Claude Code's: system blocks with `cache_control`, a reminder and the
/// prompt as two text blocks, a mid-conversation system message, thinking, effort, metadata.
pub fn request(model: &str, prompt: &str) -> Value {
    json!({"model": model, "max_tokens": 32000,
           "system": [{"type": "text", "text": "x-billing: 1"},
                      {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
           "messages": [
               {"role": "user", "content": [{"type": "text", "text": "<system-reminder>be careful</system-reminder>"},
                                            {"type": "text", "text": prompt}]},
               {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /tmp", "cache_control": {"type": "ephemeral"}}]}],
           "tools": tools(),
           "thinking": {"type": "adaptive", "display": "omitted"},
           "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
           "output_config": {"effort": "high"},
           "metadata": {"user_id": "{\"device_id\":\"d\"}"}})
}

pub fn tool_uses(message: &Value) -> Vec<Value> {
    message["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .cloned()
        .collect()
}

pub fn text(message: &Value) -> String {
    message["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect()
}

/// The continuation: the request's messages, the assistant message as received, and one user
/// message with a `tool_result` per `tool_use` (plus `beside` text blocks).
pub fn answer(
    req: &Value,
    resp: &Value,
    result: impl Fn(usize, &Value) -> Value,
    beside: &[&str],
) -> Value {
    let mut next = req.clone();
    let messages = next["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": resp["content"]}));
    let mut blocks: Vec<Value> = tool_uses(resp)
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut b = json!({"type": "tool_result", "tool_use_id": t["id"]});
            let r = result(i, t);
            if r.is_object() {
                b.as_object_mut()
                    .unwrap()
                    .extend(r.as_object().unwrap().clone());
            } else {
                b["content"] = r;
            }
            b
        })
        .collect();
    blocks.extend(beside.iter().map(|t| json!({"type": "text", "text": t})));
    messages.push(json!({"role": "user", "content": blocks}));
    next
}

/// The Turnstile code of an Anthropic error body (the message's prefix).
pub fn code(v: &Value) -> String {
    assert_eq!(v["type"], "error", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    message.split(':').next().unwrap_or_default().to_string()
}

pub fn is_token(id: &Value) -> bool {
    let id = id.as_str().unwrap_or_default();
    id.len() == 37 && id.starts_with("srct-")
}
