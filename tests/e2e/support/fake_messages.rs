//! A scripted Anthropic Messages API for Claude Code as a backend (`ANTHROPIC_BASE_URL`), on
//! 127.0.0.1:0 in the test process. The scenario is the request's `model` (the gateway's
//! `backend_model`, passed as `--model`); the client's tools are the request's tools named
//! `mcp__t__…` (the one called is `Read` or `read_file`, else the first whose name has
//! `read` in it, else the first). Every request body is recorded; `hold_next` keeps the next answer back until
//! the test calls `release`.
//!
//! Scenarios (a "round" is a model message that calls tools; the answer after the rounds is
//! text that quotes every tool result it was sent, in order, with `!` before an error):
//! - `one`: one call of the first client tool, `{"path": "a.txt"}`.
//! - `parallel`: two calls of the first client tool in one message (`a.txt`, `b.txt`).
//! - `rounds3`: three rounds of one call each.
//! - `readfile`: one call with `{"file_path": <the last path to a `.txt` file the user
//!   named>}` (Claude Code's own `Read`, or Gemini CLI's `read_file`, as a client tool); the
//!   answer starts `Tool result:`.
//! - `shell`: `cat` of that path through Codex CLI's own `exec_command`, as a client tool;
//!   the answer starts `Tool result:`.
//! - `bash`: one `Bash` call (`echo gateway > bash-ran.txt`).
//! - `masquerade`: one `Bash` call whose command (the permission request's title) is
//!   `mcp__t__read_file`, the client tool's name.
//! - `text`: no tools; the answer says `You said: <the last user text>`.
//! - `think`: a thinking block, then the `text` answer.
//!
//! Every model call reports input 100, cache writes 7, cache reads 50 and output 20 tokens.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

#[derive(Default)]
pub struct Seen {
    pub bodies: Mutex<Vec<Value>>,
    pub hold_next: AtomicUsize,
    pub release: tokio::sync::Notify,
    /// Requests that arrived and are held.
    pub held: AtomicUsize,
}

pub struct FakeMessages {
    pub url: String,
    pub seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeMessages {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeMessages {
    pub async fn start() -> FakeMessages {
        let seen = Arc::new(Seen::default());
        let app = Router::new()
            .route("/v1/messages", post(messages))
            .route("/v1/messages/count_tokens", post(count))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeMessages { url, seen, task }
    }

    /// The model requests of one scenario, in order.
    pub fn bodies(&self, model: &str) -> Vec<Value> {
        let bodies = self.seen.bodies.lock().unwrap();
        bodies
            .iter()
            .filter(|b| b["model"] == model)
            .cloned()
            .collect()
    }
}

async fn count() -> Json<Value> {
    Json(json!({"input_tokens": 10}))
}

/// Every tool result of the request, in order, as `text` (`!text` for an error).
fn results(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        for block in m["content"].as_array().into_iter().flatten() {
            if block["type"] != "tool_result" {
                continue;
            }
            let text = match &block["content"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
                _ => String::new(),
            };
            // Claude Code appends its own reminders after the result.
            let text = text.split("<system-reminder>").next().unwrap_or("").trim();
            let bang = if block["is_error"] == true { "!" } else { "" };
            out.push(format!("{bang}{text}"));
        }
    }
    out
}

/// The last user message.
fn last_message(body: &Value) -> Value {
    let messages = body["messages"].as_array();
    let last = messages.and_then(|m| m.iter().rev().find(|m| m["role"] == "user"));
    last.cloned().unwrap_or(Value::Null)
}

/// The text of the last user message (its text blocks without Claude Code's reminders).
fn last_user_text(body: &Value) -> String {
    let last = last_message(body);
    let text = match &last["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|p| p["type"] == "text")
            .filter_map(|p| p["text"].as_str())
            .filter(|t| !t.starts_with("<system-reminder>"))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    // Claude Code's transcript of a model change (`/model`) comes before the user's text.
    let text: Vec<&str> = text
        .split("\n\n")
        .filter(|p| {
            !p.starts_with("<local-command-") && !p.trim_start().starts_with("<command-name>")
        })
        .collect();
    text.join("\n\n").trim().to_string()
}

/// Tool rounds already answered: assistant messages that called tools.
fn rounds(body: &Value) -> usize {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["role"] == "assistant"
                && m["content"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|b| b["type"] == "tool_use"))
        })
        .count()
}

async fn messages(State(seen): State<Arc<Seen>>, Json(body): Json<Value>) -> Response {
    seen.bodies.lock().unwrap().push(body.clone());
    if seen
        .hold_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        seen.held.fetch_add(1, Ordering::SeqCst);
        seen.release.notified().await;
    }
    let model = body["model"].as_str().unwrap_or_default().to_string();
    let client: Vec<&str> = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .filter(|n| n.starts_with("mcp__t__"))
        .collect();
    let tool = client
        .iter()
        .find(|n| n.ends_with("__Read") || n.ends_with("__read_file"))
        .or(client.iter().find(|n| n.to_lowercase().contains("read")))
        .or(client.first())
        .unwrap_or(&"mcp__t__missing")
        .to_string();
    // A path the user named (`/…`), for `readfile`.
    let named = last_message(&body)
        .to_string()
        .replace("\\n", " ")
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| c == '"' || c == '\\'))
        .map(|w| w.trim_end_matches(['.', ',']))
        .rfind(|w| w.starts_with('/') && w.ends_with(".txt"))
        .unwrap_or_default()
        .to_string();
    let done = rounds(&body);
    let calls: Vec<(String, Value)> = match (model.as_str(), done) {
        ("one", 0) => vec![(tool, json!({"path": "a.txt"}))],
        ("parallel", 0) => vec![
            (tool.clone(), json!({"path": "a.txt"})),
            (tool, json!({"path": "b.txt"})),
        ],
        ("rounds3", n) if n < 3 => vec![(tool, json!({"path": format!("r{n}.txt")}))],
        ("readfile", 0) => vec![(tool, json!({"file_path": named}))],
        ("shell", 0) => {
            let shell = client
                .iter()
                .find(|n| n.ends_with("__exec_command") || n.ends_with("__shell"))
                .unwrap_or(&"mcp__t__exec_command");
            vec![(shell.to_string(), json!({"cmd": format!("cat {named}")}))]
        }
        ("bash", 0) => vec![(
            "Bash".to_string(),
            json!({"command": "echo gateway > bash-ran.txt", "description": "write a marker"}),
        )],
        // Claude Code's own tool whose title (its command) reads like the client tool's name.
        ("masquerade", 0) => vec![(
            "Bash".to_string(),
            json!({"command": "mcp__t__read_file", "description": "mcp__t__read_file"}),
        )],
        _ => Vec::new(),
    };
    let text = match model.as_str() {
        "text" | "think" => format!("You said: {}", last_user_text(&body)),
        "shell" | "readfile" => format!("Tool result: {}", results(&body).join(" | ")),
        _ => format!("results: {}", results(&body).join(" | ")),
    };
    let n = body["messages"].as_array().map_or(0, Vec::len);
    let mut events = vec![json!({"type": "message_start", "message": {
        "id": format!("msg_{model}_{n}"), "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 100, "cache_creation_input_tokens": 7,
                  "cache_read_input_tokens": 50, "output_tokens": 1}}})];
    let mut index = 0;
    let mut block = |events: &mut Vec<Value>, start: Value, deltas: Vec<Value>| {
        events.push(json!({"type": "content_block_start", "index": index, "content_block": start}));
        for d in deltas {
            events.push(json!({"type": "content_block_delta", "index": index, "delta": d}));
        }
        events.push(json!({"type": "content_block_stop", "index": index}));
        index += 1;
    };
    if model == "think" {
        block(
            &mut events,
            json!({"type": "thinking", "thinking": "", "signature": ""}),
            vec![
                json!({"type": "thinking_delta", "thinking": "pondering the question"}),
                json!({"type": "signature_delta", "signature": "c2ln"}),
            ],
        );
    }
    let stop = if calls.is_empty() {
        let (a, b) = text.split_at(text.len() / 2);
        block(
            &mut events,
            json!({"type": "text", "text": ""}),
            vec![
                json!({"type": "text_delta", "text": a}),
                json!({"type": "text_delta", "text": b}),
            ],
        );
        "end_turn"
    } else {
        for (i, (name, input)) in calls.iter().enumerate() {
            block(
                &mut events,
                json!({"type": "tool_use", "id": format!("toolu_{n}_{i}"), "name": name, "input": {}}),
                vec![json!({"type": "input_json_delta", "partial_json": input.to_string()})],
            );
        }
        "tool_use"
    };
    events.push(
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                       "usage": {"output_tokens": 20}}),
    );
    events.push(json!({"type": "message_stop"}));
    let sse: String = events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
        .collect();
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from(sse))
        .expect("response")
}
