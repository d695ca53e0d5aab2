//! `systemInstruction` and `contents` as neutral messages, and continuation detection.
//!
//! `systemInstruction` is a leading system message (its text parts joined with a blank
//! line). A `model` turn is an assistant message: its text parts (not `thought` ones) joined
//! as sent, its `functionCall` parts its calls (`args` as JSON text). A `user` turn (or a
//! legacy `function` one) gives one tool message per `functionResponse` part, then a user
//! message with its other parts (text joined with a blank line, `inlineData` as `data:` URLs,
//! `fileData` by URI). A response's text is its `output`, `result` or `content` when that is
//! its only member and a string, an `error` member's text (a failed call), else the whole
//! `response` as JSON. A response without an `id` answers the next unanswered call of its
//! name in the model turn before it. `thoughtSignature`, `thought`, `videoMetadata`,
//! `executableCode` and `codeExecutionResult` parts carry nothing for a backend.

use serde_json::Value;

use crate::error::{ApiError, Param};
use crate::surface::turn::{detect_last_turn, Detected};
use crate::turn::{Call, Message, Role};

/// How the text parts of a user turn or the system instruction are joined.
const JOIN: &str = "\n\n";

/// A member of a part in either JSON spelling (`functionCall` / `function_call`).
pub(super) fn member<'a>(v: &'a Value, camel: &str, snake: &str) -> Option<&'a Value> {
    v.get(camel)
        .or_else(|| v.get(snake))
        .filter(|m| !m.is_null())
}

fn push_text(text: &mut String, t: &str, join: &str) {
    if !text.is_empty() {
        text.push_str(join);
    }
    text.push_str(t);
}

/// The URL of an `inlineData` or `fileData` part.
fn image_url(part: &Value) -> Option<String> {
    if let Some(d) = member(part, "inlineData", "inline_data") {
        let mime = member(d, "mimeType", "mime_type").and_then(Value::as_str);
        let data = d["data"].as_str()?;
        return Some(format!(
            "data:{};base64,{data}",
            mime.unwrap_or("application/octet-stream")
        ));
    }
    let f = member(part, "fileData", "file_data")?;
    member(f, "fileUri", "file_uri")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The text and media URLs of a turn's parts that are neither calls nor responses.
fn content(parts: &[Value], join: &str) -> (String, Vec<String>) {
    let mut text = String::new();
    let mut images = Vec::new();
    for p in parts {
        if p["thought"] == true {
            continue;
        }
        if let Some(t) = p["text"].as_str() {
            push_text(&mut text, t, join);
        } else if let Some(url) = image_url(p) {
            images.push(url);
        }
    }
    (text, images)
}

/// The text a `functionResponse.response` stands for, and whether it reports a failure.
fn response_text(response: &Value) -> (String, bool) {
    if let Some(o) = response.as_object() {
        if let Some(e) = o.get("error").filter(|e| !e.is_null()) {
            let text = e.as_str().map_or_else(|| e.to_string(), str::to_string);
            return (text, true);
        }
        if o.len() == 1 {
            for key in ["output", "result", "content"] {
                if let Some(s) = o.get(key).and_then(Value::as_str) {
                    return (s.to_string(), false);
                }
            }
        }
    }
    match response {
        Value::Null => (String::new(), false),
        Value::String(s) => (s.clone(), false),
        other => (other.to_string(), false),
    }
}

/// The model turn's calls not yet answered in this user turn, by position.
struct Open<'a> {
    calls: &'a [Call],
    answered: Vec<bool>,
}

impl Open<'_> {
    /// The id of the call a response answers: its own `id`, else the next unanswered call of
    /// its name.
    fn answer(&mut self, id: Option<&str>, name: &str) -> String {
        if let Some(id) = id.filter(|i| !i.is_empty()) {
            if let Some(i) = self.calls.iter().position(|c| c.id == id) {
                self.answered[i] = true;
            }
            return id.to_string();
        }
        let next = (0..self.calls.len()).find(|&i| !self.answered[i] && self.calls[i].name == name);
        match next {
            Some(i) => {
                self.answered[i] = true;
                self.calls[i].id.clone()
            }
            None => String::new(),
        }
    }
}

/// A `functionResponse` part as a tool message.
fn tool_result(fr: &Value, open: &mut Open<'_>) -> Message {
    let name = fr["name"].as_str().unwrap_or_default();
    let id = open.answer(fr["id"].as_str(), name);
    let (text, is_error) = response_text(&fr["response"]);
    let images = (fr["parts"].as_array())
        .map(|p| content(p, JOIN).1)
        .unwrap_or_default();
    let mut m = Message::new(Role::Tool, text, images);
    m.tool_call_id = Some(id);
    m.name = Some(name.to_string());
    m.is_error = is_error;
    m
}

/// A `functionCall` part as a call.
fn call(fc: &Value) -> Call {
    let arguments = match &fc["args"] {
        Value::Null => "{}".to_string(),
        args => args.to_string(),
    };
    Call {
        id: fc["id"].as_str().unwrap_or_default().to_string(),
        name: fc["name"].as_str().unwrap_or_default().to_string(),
        arguments,
    }
}

/// The neutral messages of `systemInstruction` and `contents` (400 on a turn that is not a
/// `Content` with a known role).
pub fn messages(system: Option<&Value>, wire: &[Value]) -> Result<Vec<Message>, ApiError> {
    let mut out = Vec::with_capacity(wire.len() + 1);
    let system_text = match system {
        Some(Value::String(s)) => s.clone(),
        Some(s) => match s["parts"].as_array() {
            Some(parts) => content(parts, JOIN).0,
            None => String::new(),
        },
        None => String::new(),
    };
    if !system_text.is_empty() {
        out.push(Message::new(Role::System, system_text, Vec::new()));
    }
    let mut last_calls: Option<usize> = None;
    for c in wire {
        let parts = match &c["parts"] {
            Value::Array(p) => p.as_slice(),
            Value::Null => &[],
            _ => {
                return Err(ApiError::invalid("each content's `parts` must be an array")
                    .with_param(Param::Conversation))
            }
        };
        match c["role"].as_str() {
            Some("model") => {
                let (text, images) = content(parts, "");
                let mut a = Message::new(Role::Assistant, text, images);
                a.tool_calls = (parts.iter())
                    .filter_map(|p| member(p, "functionCall", "function_call"))
                    .map(call)
                    .collect();
                last_calls = (!a.tool_calls.is_empty()).then_some(out.len());
                out.push(a);
            }
            None | Some("user" | "function") => {
                let responses: Vec<&Value> = (parts.iter())
                    .filter_map(|p| member(p, "functionResponse", "function_response"))
                    .collect();
                let calls = last_calls.map_or(&[][..], |i| &out[i].tool_calls[..]);
                let mut open = Open {
                    calls,
                    answered: vec![false; calls.len()],
                };
                let results: Vec<Message> = (responses.iter())
                    .map(|fr| tool_result(fr, &mut open))
                    .collect();
                let (text, images) = content(parts, JOIN);
                let answered = !results.is_empty();
                out.extend(results);
                if !answered || !text.is_empty() || !images.is_empty() {
                    out.push(Message::new(Role::User, text, images));
                }
            }
            Some(_) => {
                return Err(ApiError::invalid("Please use a valid role: user, model.")
                    .with_param(Param::Conversation))
            }
        }
    }
    Ok(out)
}

/// Finds the function responses of the last user turn (text beside them allowed) and the
/// calls they answer.
pub fn detect(messages: &[Message]) -> Result<Detected, ApiError> {
    let beside = (messages.iter().rev())
        .take_while(|m| m.role == Role::User)
        .count();
    detect_last_turn(
        messages,
        beside,
        "every functionCall of the last model turn must be answered by a functionResponse in the next user turn",
        "functionResponse.id",
        "functionResponse parts must be in the user turn right after the model turn with the functionCall parts they answer",
    )
}
