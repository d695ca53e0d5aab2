//! Input items as neutral messages, and continuation detection.
//!
//! `message` items map to messages of their role (text parts joined, image URLs kept). A run of
//! consecutive assistant `message`, `function_call` and `custom_tool_call` items is one
//! assistant message with its calls, the shape of one response's output; `reasoning` items
//! inside a run do not break it. Each `function_call_output` / `custom_tool_call_output` is one
//! tool message. A custom call's `input` is carried as the arguments `{"input": …}` of its
//! function form (`tools.rs`). `reasoning`, `item_reference` and unknown item types carry no
//! history a backend could use: they are skipped.

use serde_json::{json, Value};

use super::tools::ToolMap;
use crate::continuation::token::token_digest;
use crate::error::{ApiError, Param};
use crate::surface::turn::{detect_run, Detected};
use crate::turn::{Call, Message, Role};

/// The text and image URLs of a `content` (a string or an array of parts).
fn content(v: &Value) -> (String, Vec<String>) {
    match v {
        Value::String(s) => (s.clone(), Vec::new()),
        Value::Array(parts) => {
            let mut text = String::new();
            let mut images = Vec::new();
            for p in parts {
                match p["type"].as_str() {
                    Some("input_image") => {
                        if let Some(url) = p["image_url"].as_str().or(p["file_id"].as_str()) {
                            images.push(url.to_string());
                        }
                    }
                    _ => {
                        if let Some(t) = p["text"].as_str().or(p["refusal"].as_str()) {
                            text.push_str(t);
                        } else if let Some(s) = p.as_str() {
                            text.push_str(s);
                        }
                    }
                }
            }
            (text, images)
        }
        _ => (String::new(), Vec::new()),
    }
}

fn call_id(item: &Value) -> String {
    item["call_id"].as_str().unwrap_or_default().to_string()
}

/// The neutral messages of `input`, after the instructions (a leading system message).
pub fn messages(input: &Value, instructions: Option<&str>, map: &ToolMap) -> Vec<Message> {
    let mut out = Vec::new();
    if let Some(i) = instructions.filter(|i| !i.is_empty()) {
        out.push(Message::new(Role::System, i.to_string(), Vec::new()));
    }
    let items = match input {
        Value::String(s) => {
            out.push(Message::new(Role::User, s.clone(), Vec::new()));
            return out;
        }
        Value::Array(items) => items,
        _ => return out,
    };
    // The assistant message being assembled from a run of output items.
    let mut run: Option<Message> = None;
    for item in items {
        let kind = item["type"].as_str().unwrap_or("message");
        match kind {
            "message" => {
                let role = Role::parse(item["role"].as_str().unwrap_or("user"));
                let (text, images) = content(&item["content"]);
                if role == Role::Assistant {
                    let m = run.get_or_insert_with(|| {
                        Message::new(Role::Assistant, String::new(), vec![])
                    });
                    m.text.push_str(&text);
                    m.images.extend(images);
                } else {
                    out.extend(run.take());
                    out.push(Message::new(role, text, images));
                }
            }
            "function_call" | "custom_tool_call" => {
                let name = map.neutral(
                    item["namespace"].as_str(),
                    item["name"].as_str().unwrap_or_default(),
                );
                let arguments = if kind == "custom_tool_call" {
                    json!({"input": item["input"].as_str().unwrap_or_default()}).to_string()
                } else {
                    match &item["arguments"] {
                        Value::String(s) => s.clone(),
                        Value::Null => String::new(),
                        other => other.to_string(),
                    }
                };
                let m =
                    run.get_or_insert_with(|| Message::new(Role::Assistant, String::new(), vec![]));
                m.tool_calls.push(Call {
                    id: call_id(item),
                    name,
                    arguments,
                });
            }
            "function_call_output" | "custom_tool_call_output" => {
                out.extend(run.take());
                let (text, images) = content(&item["output"]);
                let mut m = Message::new(Role::Tool, text, images);
                m.tool_call_id = Some(call_id(item));
                out.push(m);
            }
            _ => {}
        }
    }
    out.extend(run);
    out
}

fn malformed() -> ApiError {
    ApiError::invalid(
        "call_id values must be Turnstile continuation ids (`srct-` followed by 32 lowercase hex digits)",
    )
    .with_param(Param::Conversation)
}

fn results(messages: &[Message], from: usize) -> Result<Vec<([u8; 32], usize)>, ApiError> {
    messages
        .iter()
        .enumerate()
        .skip(from)
        .map(|(i, m)| {
            token_digest(m.tool_call_id.as_deref().unwrap_or_default())
                .map(|d| (d, i))
                .ok_or_else(malformed)
        })
        .collect()
}

/// Finds the trailing outputs and the calls they answer; every id involved must have the
/// `srct-` shape.
pub fn detect(messages: &[Message], stateful: bool) -> Result<Detected, ApiError> {
    let trailing = messages
        .iter()
        .rev()
        .take_while(|m| m.role == Role::Tool)
        .count();
    if stateful {
        if trailing == 0 {
            return Ok(Detected::Follows);
        }
        if trailing != messages.len() {
            return Err(ApiError::invalid(
                "with `previous_response_id`, `input` must hold either only the `function_call_output` / `custom_tool_call_output` items answering that response's calls, or only new input",
            )
            .with_param(Param::Conversation));
        }
        let results = results(messages, 0)?;
        let tokens = results.iter().map(|r| r.0).collect();
        return Ok(Detected::Bound { tokens, results });
    }
    detect_run(
        messages,
        messages.len(),
        "call_id",
        "trailing tool outputs must follow the function_call / custom_tool_call items they answer",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: &str = "srct-0123456789abcdef0123456789abcdef";
    const T2: &str = "srct-ffffffffffffffffffffffffffffffff";

    #[test]
    fn output_items_group_into_one_assistant_message() {
        let input = json!([
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "data:x"}]},
            {"type": "reasoning", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hm"}]},
            {"type": "reasoning", "summary": []},
            {"type": "function_call", "call_id": T1, "name": "f", "arguments": "{}"},
            {"type": "custom_tool_call", "call_id": T2, "name": "apply_patch", "input": "*** Begin"},
            {"type": "function_call_output", "call_id": T1, "output": "r1"},
            {"type": "custom_tool_call_output", "call_id": T2, "output": [{"type": "input_text", "text": "r2"}]},
            {"type": "unknown_future_item"}
        ]);
        let m = messages(&input, Some("sys"), &ToolMap::default());
        let roles: Vec<_> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(
            roles,
            ["system", "developer", "user", "assistant", "tool", "tool"]
        );
        assert_eq!(m[2].images, ["data:x"]);
        assert_eq!(m[3].text, "hm");
        assert_eq!(m[3].tool_calls[1].arguments, r#"{"input":"*** Begin"}"#);
        assert_eq!(m[5].text, "r2");
        let Detected::Answers {
            assistant,
            tokens,
            results,
        } = detect(&m, false).unwrap()
        else {
            panic!()
        };
        assert_eq!((assistant, tokens.len()), (3, 2));
        assert_eq!(results.iter().map(|r| r.1).collect::<Vec<_>>(), [4, 5]);
    }

    #[test]
    fn a_string_input_is_one_user_message() {
        let m = messages(&json!("hi"), None, &ToolMap::default());
        assert_eq!((m.len(), m[0].text.as_str()), (1, "hi"));
        assert_eq!(detect(&m, false).unwrap(), Detected::Fresh);
    }

    #[test]
    fn foreign_ids_orphans_and_stateful_shapes() {
        let map = ToolMap::default();
        let foreign = messages(
            &json!([{"role": "user", "content": "a"},
                {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "r"}]),
            None,
            &map,
        );
        assert_eq!(detect(&foreign, false).unwrap(), Detected::ClientOwned);
        let orphan = messages(
            &json!([{"role": "user", "content": "a"},
                {"type": "function_call_output", "call_id": T1, "output": "r"}]),
            None,
            &map,
        );
        assert!(detect(&orphan, false).is_err());
        let outputs = messages(
            &json!([{"type": "function_call_output", "call_id": T1, "output": "r"}]),
            None,
            &map,
        );
        assert!(matches!(
            detect(&outputs, true).unwrap(),
            Detected::Bound { .. }
        ));
        let fresh = messages(&json!("more"), None, &map);
        assert_eq!(detect(&fresh, true).unwrap(), Detected::Follows);
        let mixed = messages(
            &json!([{"role": "user", "content": "a"},
                {"type": "function_call_output", "call_id": T1, "output": "r"}]),
            None,
            &map,
        );
        assert!(detect(&mixed, true).is_err());
    }
}
