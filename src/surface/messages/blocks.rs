//! Messages and content blocks as neutral messages, and continuation detection.
//!
//! The top-level `system` is a leading system message; a `role:"system"` message inside
//! `messages` stays a system message where it is. Text blocks of one message are joined with
//! a blank line; `image` blocks become image URLs (`data:` URLs for base64 sources); a
//! `document` block contributes its text (plain-text and content sources) or a one-line note
//! that it was not forwarded (PDF and URL sources). An assistant message's `tool_use` blocks
//! are its calls (`input` as JSON text); `thinking`, `redacted_thinking` and server-tool blocks
//! are dropped. A user message's `tool_result` blocks come first, one tool message each (text
//! of their content, images, `is_error`), then one user message with the rest of its blocks.
//! `cache_control` and every other block key are ignored.

use serde_json::Value;

use crate::error::ApiError;
use crate::surface::turn::{detect_last_turn, Detected};
use crate::turn::{Call, Message, Role};

/// How the text blocks of one message are joined.
const JOIN: &str = "\n\n";

fn push_text(text: &mut String, t: &str) {
    if !text.is_empty() {
        text.push_str(JOIN);
    }
    text.push_str(t);
}

/// The URL of an image block's source.
fn image_url(source: &Value) -> Option<String> {
    match source["type"].as_str()? {
        "base64" => Some(format!(
            "data:{};base64,{}",
            source["media_type"].as_str().unwrap_or("image/png"),
            source["data"].as_str()?
        )),
        "url" => source["url"].as_str().map(str::to_string),
        "file" => source["file_id"].as_str().map(str::to_string),
        _ => None,
    }
}

/// The text a `document` block contributes.
fn document_text(block: &Value) -> String {
    let source = &block["source"];
    let title = block["title"].as_str().filter(|t| !t.is_empty());
    let body = match source["type"].as_str() {
        Some("text") => source["data"].as_str().map(str::to_string),
        Some("content") => match &source["content"] {
            Value::String(s) => Some(s.clone()),
            Value::Array(parts) => Some(content(parts).0),
            _ => None,
        },
        _ => None,
    };
    match (body, title) {
        (Some(b), Some(t)) => format!("{t}\n{b}"),
        (Some(b), None) => b,
        (None, _) => format!(
            "[document not forwarded: {} ({})]",
            title.unwrap_or("untitled"),
            source["media_type"]
                .as_str()
                .or(source["type"].as_str())
                .unwrap_or("unknown")
        ),
    }
}

/// The text and image URLs of non-tool blocks.
fn content(blocks: &[Value]) -> (String, Vec<String>) {
    let mut text = String::new();
    let mut images = Vec::new();
    for b in blocks {
        match b["type"].as_str() {
            Some("text") => push_text(&mut text, b["text"].as_str().unwrap_or_default()),
            Some("image") => images.extend(image_url(&b["source"])),
            Some("document") => push_text(&mut text, &document_text(b)),
            Some("search_result") => {
                let inner = b["content"].as_array().map(|c| content(c).0);
                push_text(&mut text, &inner.unwrap_or_default());
            }
            None => {
                if let Some(s) = b.as_str() {
                    push_text(&mut text, s);
                }
            }
            // Thinking, tool and server-tool blocks carry no text for a backend.
            Some(_) => {}
        }
    }
    (text, images)
}

/// A `tool_result` block as a tool message.
fn tool_result(block: &Value) -> Message {
    let (text, images) = match &block["content"] {
        Value::String(s) => (s.clone(), Vec::new()),
        Value::Array(parts) => content(parts),
        _ => (String::new(), Vec::new()),
    };
    let mut m = Message::new(Role::Tool, text, images);
    m.tool_call_id = Some(
        block["tool_use_id"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    );
    m.is_error = block["is_error"].as_bool().unwrap_or(false);
    m
}

/// The JSON text of a `tool_use` block's input (the neutral call's arguments).
fn arguments(input: &Value) -> String {
    match input {
        Value::Null => "{}".to_string(),
        other => other.to_string(),
    }
}

/// The neutral messages of `system` and `messages`.
pub fn messages(system: Option<&Value>, wire: &[Value]) -> Vec<Message> {
    let mut out = Vec::new();
    let system_text = match system {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => content(blocks).0,
        _ => String::new(),
    };
    if !system_text.is_empty() {
        out.push(Message::new(Role::System, system_text, Vec::new()));
    }
    for m in wire {
        let role = Role::parse(m["role"].as_str().unwrap_or("user"));
        let blocks: &[Value] = match &m["content"] {
            Value::String(s) => {
                out.push(Message::new(role, s.clone(), Vec::new()));
                continue;
            }
            Value::Array(blocks) => blocks,
            _ => &[],
        };
        let (text, images) = content(blocks);
        match role {
            Role::Assistant => {
                let mut a = Message::new(Role::Assistant, text, images);
                a.tool_calls = blocks
                    .iter()
                    .filter(|b| b["type"] == "tool_use")
                    .map(|b| Call {
                        id: b["id"].as_str().unwrap_or_default().to_string(),
                        name: b["name"].as_str().unwrap_or_default().to_string(),
                        arguments: arguments(&b["input"]),
                    })
                    .collect();
                out.push(a);
            }
            role => {
                let results: Vec<&Value> = blocks
                    .iter()
                    .filter(|b| b["type"] == "tool_result")
                    .collect();
                out.extend(results.iter().map(|b| tool_result(b)));
                if results.is_empty() || !text.is_empty() || !images.is_empty() {
                    out.push(Message::new(role, text, images));
                }
            }
        }
    }
    out
}

/// Finds the tool results of the last user message (text beside them, and system messages
/// after them, allowed) and the `tool_use` blocks they answer.
pub fn detect(messages: &[Message]) -> Result<Detected, ApiError> {
    let beside = messages
        .iter()
        .rev()
        .take_while(|m| matches!(m.role, Role::User | Role::System))
        .count();
    detect_last_turn(
        messages,
        beside,
        "every `tool_use` block of the last assistant message must be answered by a `tool_result` block in the next user message",
        "tool_use_id",
        "`tool_result` blocks must be in the user message right after the assistant message with the `tool_use` blocks they answer",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Param;
    use serde_json::json;

    const T1: &str = "srct-0123456789abcdef0123456789abcdef";
    const T2: &str = "srct-ffffffffffffffffffffffffffffffff";

    fn wire(v: Value) -> Vec<Value> {
        v.as_array().unwrap().clone()
    }

    #[test]
    fn blocks_map_to_neutral_messages() {
        let system = json!([{"type": "text", "text": "a"},
                            {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}]);
        let m = messages(
            Some(&system),
            &wire(json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "<reminder>"}, {"type": "text", "text": "hi"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "R0"}},
                    {"type": "document", "title": "T", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}},
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "x"}}]},
                {"role": "system", "content": [{"type": "text", "text": "env"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "let me"},
                    {"type": "tool_use", "id": T1, "name": "Read", "input": {"file_path": "/x"}},
                    {"type": "tool_use", "id": T2, "name": "Bash", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": T1, "content": "one"},
                    {"type": "tool_result", "tool_use_id": T2, "is_error": true,
                     "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "!"}]},
                    {"type": "text", "text": "beside"}]}
            ])),
        );
        let roles: Vec<_> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(
            roles,
            [
                "system",
                "user",
                "system",
                "assistant",
                "tool",
                "tool",
                "user"
            ]
        );
        assert_eq!(m[0].text, "a\n\nb");
        assert_eq!(m[1].images, ["data:image/gif;base64,R0"]);
        assert!(m[1]
            .text
            .starts_with("<reminder>\n\nhi\n\nT\ndoc\n\n[document not forwarded"));
        assert_eq!(m[3].text, "let me");
        assert_eq!(m[3].tool_calls[0].arguments, r#"{"file_path":"/x"}"#);
        assert_eq!((m[4].text.as_str(), m[4].is_error), ("one", false));
        assert_eq!((m[5].text.as_str(), m[5].is_error), ("two\n\n!", true));
        assert_eq!(m[6].text, "beside");
        let Detected::Answers {
            assistant,
            tokens,
            results,
        } = detect(&m).unwrap()
        else {
            panic!()
        };
        assert_eq!((assistant, tokens.len()), (3, 2));
        assert_eq!(results.iter().map(|r| r.1).collect::<Vec<_>>(), [4, 5]);
    }

    #[test]
    fn fresh_client_owned_and_orphans() {
        let fresh = messages(None, &wire(json!([{"role": "user", "content": "hi"}])));
        assert_eq!(detect(&fresh).unwrap(), Detected::Fresh);
        let done = messages(
            None,
            &wire(json!([
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": T1, "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": T1, "content": "r"}]},
                {"role": "assistant", "content": "answer"},
                {"role": "user", "content": "more"}])),
        );
        assert_eq!(detect(&done).unwrap(), Detected::Fresh);
        let own = messages(
            None,
            &wire(json!([
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]}])),
        );
        assert_eq!(detect(&own).unwrap(), Detected::ClientOwned);
        let orphan = messages(
            None,
            &wire(json!([{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": T1, "content": "r"}]}])),
        );
        assert_eq!(
            detect(&orphan).unwrap_err().param,
            Some(Param::Conversation)
        );
    }
}
