//! A scripted Gemini API for Gemini CLI (`gemini --acp`) as a backend
//! (`GOOGLE_GEMINI_BASE_URL`), on 127.0.0.1:0 in the test process. Gemini CLI calls
//! `POST /v1beta/models/{model}:streamGenerateContent?alt=sse` for every model turn (SSE
//! `data: <GenerateContentResponse>` frames); the scenario is that `{model}` (the gateway's
//! `backend_model`, passed as `--model` or set with `session/set_model`). The client's tools are
//! the function declarations named `mcp_<server>_<tool>`; the one called is the one whose name
//! ends with `read_file` (Gemini CLI's own `read_file` has no `mcp_` prefix and is never
//! picked), else the first whose name has `read` in it, else the first. Every scenario request
//! body is recorded; `hold_next` keeps the next scenario answer back until the test calls
//! `release`.
//!
//! Scenarios (a "round" is a model message that calls tools; the answer after the rounds is
//! text that quotes every tool result it was sent, in order, joined by ` | `, with `!` before an
//! error; Gemini CLI's `<untrusted_context>` wrapper around a result is taken off, and an MCP
//! error result is quoted by its text content):
//! - `one`: one call of the client tool, `{"path": "a.txt"}`.
//! - `parallel`: two calls of the client tool in one message (`a.txt`, `b.txt`).
//! - `rounds3`: three rounds of one call each (`r0.txt`, `r1.txt`, `r2.txt`).
//! - `bash`: one call of Gemini CLI's own `run_shell_command` (`echo gateway > bash-ran.txt`),
//!   which makes the agent ask `session/request_permission` (kind `execute`).
//! - `masquerade`: one call of Gemini CLI's own `enter_plan_mode` whose `reason` (the
//!   permission request's title) reads like the client tool's title, `read_file (t MCP Server)`.
//! - `text`: no tools; the answer says `You said: <the last user text>`.
//! - `think`: a thought part (`**Pondering**` / `pondering the question`, which Gemini CLI
//!   sends as an `agent_thought_chunk` `**Pondering**\npondering the question`), then the
//!   `text` answer.
//!
//! Every model call reports `promptTokenCount` 100 (of which `cachedContentTokenCount` 50) and
//! `candidatesTokenCount` 20, on its last frame.
//!
//! Auxiliary calls are answered without touching the scenario (not recorded in `bodies`, never
//! held; see `aux`): a request asking for JSON output (`generationConfig.responseMimeType`
//! `application/json` / `responseJsonSchema`; with model `auto`, Gemini CLI first asks a
//! `gemini-*-flash-lite:generateContent` classifier for `{complexity_reasoning,
//! complexity_score}`; the loop-detection and next-speaker checks have schemas too) gets a JSON
//! object filled from the schema; a non-streamed `generateContent` for a model that is not a
//! scenario (e.g. a session summary) gets a short text; `:countTokens` gets `{"totalTokens":
//! 10}`. Any other method or path is recorded in `strays` and answered 404.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Map, Value};

/// The scenario names (any other model streamed to is answered like `one` without a call).
const SCENARIOS: &[&str] = &[
    "one",
    "parallel",
    "rounds3",
    "bash",
    "text",
    "think",
    "masquerade",
];

#[derive(Default)]
pub struct Seen {
    /// Scenario requests, in order: `(model, body)`.
    pub bodies: Mutex<Vec<(String, Value)>>,
    /// Auxiliary requests (JSON output, summaries, `countTokens`), in order: `(path, body)`.
    pub aux: Mutex<Vec<(String, Value)>>,
    /// Requests to anything else: `"METHOD /path?query"`.
    pub strays: Mutex<Vec<String>>,
    pub hold_next: AtomicUsize,
    pub release: tokio::sync::Notify,
    /// Requests that arrived and are held.
    pub held: AtomicUsize,
}

pub struct FakeGemini {
    /// The base URL, for `GOOGLE_GEMINI_BASE_URL` (no trailing slash, no `/v1beta`).
    pub url: String,
    pub seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeGemini {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeGemini {
    pub async fn start() -> FakeGemini {
        let seen = Arc::new(Seen::default());
        let app = Router::new()
            .route("/v1beta/models/{call}", post(models))
            .route("/v1/models/{call}", post(models))
            .fallback(stray)
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeGemini { url, seen, task }
    }

    /// The model requests of one scenario, in order.
    pub fn bodies(&self, model: &str) -> Vec<Value> {
        let bodies = self.seen.bodies.lock().unwrap();
        bodies
            .iter()
            .filter(|(m, _)| m == model)
            .map(|(_, b)| b.clone())
            .collect()
    }

    /// The paths of the auxiliary requests, in order.
    #[allow(dead_code)]
    pub fn aux_paths(&self) -> Vec<String> {
        let aux = self.seen.aux.lock().unwrap();
        aux.iter().map(|(p, _)| p.clone()).collect()
    }

    /// Requests to unknown paths, in order.
    #[allow(dead_code)]
    pub fn strays(&self) -> Vec<String> {
        self.seen.strays.lock().unwrap().clone()
    }
}

fn google_error(status: StatusCode, message: &str) -> Response {
    let body = json!({"error": {"code": status.as_u16(), "message": message,
                                "status": status.canonical_reason().unwrap_or("ERROR")}});
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("response")
}

fn json_response(body: &Value) -> Response {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("response")
}

async fn stray(State(seen): State<Arc<Seen>>, method: Method, uri: Uri) -> Response {
    seen.strays.lock().unwrap().push(format!("{method} {uri}"));
    google_error(StatusCode::NOT_FOUND, "fake gemini: unknown path")
}

/// The usage every model call reports.
fn usage() -> Value {
    json!({"promptTokenCount": 100, "cachedContentTokenCount": 50,
           "candidatesTokenCount": 20, "totalTokenCount": 120})
}

/// The names of the request's function declarations, in order.
fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["functionDeclarations"].as_array().into_iter().flatten())
        .filter_map(|f| f["name"].as_str())
        .map(str::to_string)
        .collect()
}

/// Every `text` of a `{"type": "text", "text": …}` object inside `v`, in order.
fn texts_in(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            if o.get("type").and_then(Value::as_str) == Some("text") {
                if let Some(t) = o.get("text").and_then(Value::as_str) {
                    out.push(t.to_string());
                    return;
                }
            }
            for x in o.values() {
                texts_in(x, out);
            }
        }
        Value::Array(a) => {
            for x in a {
                texts_in(x, out);
            }
        }
        _ => {}
    }
}

/// A tool result's text without Gemini CLI's `<untrusted_context>` wrapper.
fn unwrap_result(text: &str) -> String {
    let t = text.trim();
    let t = t.strip_prefix("<untrusted_context>").unwrap_or(t);
    let t = t.strip_suffix("</untrusted_context>").unwrap_or(t);
    t.trim().to_string()
}

/// An error result's text: for an MCP tool error (`MCP tool '…' reported tool error for
/// function call: … with response: <json>`) the text content of that response, else the
/// message itself.
fn error_text(message: &str) -> String {
    const MARK: &str = " with response: ";
    if message.contains("reported tool error") {
        if let Some(i) = message.rfind(MARK) {
            if let Ok(v) = serde_json::from_str::<Value>(&message[i + MARK.len()..]) {
                let mut texts = Vec::new();
                texts_in(&v, &mut texts);
                if !texts.is_empty() {
                    return texts.join(" ");
                }
            }
        }
    }
    message.trim().to_string()
}

/// Every function response of the request, in order, as `text` (`!text` for an error).
fn results(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for c in body["contents"].as_array().into_iter().flatten() {
        for p in c["parts"].as_array().into_iter().flatten() {
            let Some(fr) = p.get("functionResponse") else {
                continue;
            };
            let response = &fr["response"];
            if let Some(e) = response.get("error") {
                let msg = match e {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                out.push(format!("!{}", error_text(&msg)));
                continue;
            }
            let text = match response.get("output").or_else(|| response.get("content")) {
                Some(Value::String(s)) => s.clone(),
                Some(other) => {
                    let mut texts = Vec::new();
                    texts_in(other, &mut texts);
                    if texts.is_empty() {
                        other.to_string()
                    } else {
                        texts.join(" ")
                    }
                }
                None => response.to_string(),
            };
            out.push(unwrap_result(&text));
        }
    }
    out
}

/// The text of the last user message that has text (without Gemini CLI's
/// `<session_context>` part, which shares the first user message with the prompt).
fn last_user_text(body: &Value) -> String {
    let contents = body["contents"].as_array();
    for c in contents.into_iter().flatten().rev() {
        if c["role"] != "user" {
            continue;
        }
        let texts: Vec<&str> = c["parts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["thought"] != true)
            .filter_map(|p| p["text"].as_str())
            .filter(|t| !t.trim_start().starts_with("<session_context>"))
            .collect();
        if !texts.is_empty() {
            return texts.join("\n").trim().to_string();
        }
    }
    String::new()
}

/// Tool rounds already answered: model messages that called functions.
fn rounds(body: &Value) -> usize {
    body["contents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c["role"] == "model"
                && c["parts"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p.get("functionCall").is_some()))
        })
        .count()
}

/// Whether the request asks for JSON output (Gemini CLI's auxiliary `generateJson` calls).
fn wants_json(body: &Value) -> bool {
    let gc = &body["generationConfig"];
    gc["responseMimeType"] == "application/json"
        || gc.get("responseJsonSchema").is_some_and(|s| !s.is_null())
        || gc.get("responseSchema").is_some_and(|s| !s.is_null())
}

/// A value for a JSON schema (`type` in either case), with sensible answers for the
/// fields of Gemini CLI's router, next-speaker and loop-detection checks.
fn fill(schema: &Value, name: &str) -> Value {
    if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
        return match name {
            "model_choice" => json!("flash"),
            "next_speaker" => json!("user"),
            _ => first.clone(),
        };
    }
    let ty = match &schema["type"] {
        Value::String(s) => s.to_lowercase(),
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .find(|t| !t.eq_ignore_ascii_case("null"))
            .unwrap_or("string")
            .to_lowercase(),
        _ if schema.get("properties").is_some() => "object".to_string(),
        _ => "string".to_string(),
    };
    match ty.as_str() {
        "object" => {
            let mut o = Map::new();
            if let Some(props) = schema["properties"].as_object() {
                for (k, v) in props {
                    o.insert(k.clone(), fill(v, k));
                }
            }
            Value::Object(o)
        }
        "array" => json!([]),
        "integer" => match name {
            "complexity_score" => json!(10),
            _ => json!(0),
        },
        "number" => json!(0.0),
        "boolean" => json!(false),
        _ => match name {
            "model_choice" => json!("flash"),
            "next_speaker" => json!("user"),
            _ => json!("fake"),
        },
    }
}

/// One `GenerateContentResponse` frame with these parts; the last frame carries the finish
/// reason and usage.
fn frame(model: &str, n: usize, parts: Vec<Value>, last: bool) -> Value {
    let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    let mut out = json!({"modelVersion": model, "responseId": format!("resp_{model}_{n}")});
    if last {
        candidate["finishReason"] = json!("STOP");
        out["usageMetadata"] = usage();
    }
    out["candidates"] = json!([candidate]);
    out
}

/// The frames as one `text/event-stream` body, or (not streamed) as one response with every
/// part.
fn answer(frames: Vec<Value>, stream: bool) -> Response {
    if stream {
        let sse: String = frames
            .iter()
            .map(|f| format!("data: {f}\r\n\r\n"))
            .collect();
        return Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from(sse))
            .expect("response");
    }
    let parts: Vec<Value> = frames
        .iter()
        .flat_map(|f| {
            f["candidates"][0]["content"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let mut merged = frames.last().cloned().unwrap_or_else(|| json!({}));
    merged["candidates"][0]["content"]["parts"] = Value::Array(parts);
    json_response(&merged)
}

/// Splits `text` near its middle, on a character boundary.
fn halves(text: &str) -> (&str, &str) {
    let mut i = text.len() / 2;
    while !text.is_char_boundary(i) {
        i += 1;
    }
    text.split_at(i)
}

async fn models(State(seen): State<Arc<Seen>>, Path(call): Path<String>, raw: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let Some((model, method)) = call.rsplit_once(':') else {
        seen.strays.lock().unwrap().push(format!("POST {call}"));
        return google_error(StatusCode::NOT_FOUND, "fake gemini: no method");
    };
    let model = model.to_string();
    let stream = match method {
        "streamGenerateContent" => true,
        "generateContent" => false,
        "countTokens" => {
            seen.aux.lock().unwrap().push((call.clone(), body));
            return json_response(&json!({"totalTokens": 10}));
        }
        _ => {
            seen.strays.lock().unwrap().push(format!("POST {call}"));
            return google_error(StatusCode::NOT_FOUND, "fake gemini: unknown method");
        }
    };

    // Auxiliary calls: JSON output, or a non-streamed call for a model that is no scenario.
    if wants_json(&body) || (!stream && !SCENARIOS.contains(&model.as_str())) {
        seen.aux.lock().unwrap().push((call.clone(), body.clone()));
        let gc = &body["generationConfig"];
        let text = if wants_json(&body) {
            let schema = if gc["responseJsonSchema"].is_null() {
                &gc["responseSchema"]
            } else {
                &gc["responseJsonSchema"]
            };
            fill(schema, "").to_string()
        } else {
            "A fake summary.".to_string()
        };
        return answer(
            vec![frame(&model, 0, vec![json!({"text": text})], true)],
            stream,
        );
    }

    seen.bodies
        .lock()
        .unwrap()
        .push((model.clone(), body.clone()));
    if seen
        .hold_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        seen.held.fetch_add(1, Ordering::SeqCst);
        seen.release.notified().await;
    }

    let names = tool_names(&body);
    let client: Vec<&String> = names.iter().filter(|n| n.starts_with("mcp_")).collect();
    let tool = client
        .iter()
        .find(|n| n.ends_with("read_file"))
        .or(client.iter().find(|n| n.to_lowercase().contains("read")))
        .or(client.first())
        .map(|n| n.to_string())
        // None declared: a name no agent has, so that the test fails loudly.
        .unwrap_or_else(|| "no_client_tool_was_declared".to_string());
    let done = rounds(&body);
    let calls: Vec<(String, Value)> = match (model.as_str(), done) {
        ("one", 0) => vec![(tool, json!({"path": "a.txt"}))],
        ("parallel", 0) => vec![
            (tool.clone(), json!({"path": "a.txt"})),
            (tool, json!({"path": "b.txt"})),
        ],
        ("rounds3", n) if n < 3 => vec![(tool, json!({"path": format!("r{n}.txt")}))],
        ("bash", 0) => vec![(
            "run_shell_command".to_string(),
            json!({"command": "echo gateway > bash-ran.txt", "description": "write a marker"}),
        )],
        // Gemini CLI's own tool of kind `other`, titled with the model's `reason`.
        ("masquerade", 0) => vec![(
            "enter_plan_mode".to_string(),
            json!({"reason": "read_file (t MCP Server)"}),
        )],
        _ => Vec::new(),
    };
    let text = match model.as_str() {
        "text" | "think" => format!("You said: {}", last_user_text(&body)),
        _ => format!("results: {}", results(&body).join(" | ")),
    };

    let n = body["contents"].as_array().map_or(0, Vec::len);
    let mut parts: Vec<Vec<Value>> = Vec::new();
    if model == "think" {
        parts.push(vec![
            json!({"text": "**Pondering**\n\npondering the question", "thought": true}),
        ]);
    }
    if calls.is_empty() {
        let (a, b) = halves(&text);
        parts.push(vec![json!({"text": a})]);
        parts.push(vec![json!({"text": b})]);
    } else {
        parts.push(
            calls
                .into_iter()
                .map(|(name, args)| json!({"functionCall": {"name": name, "args": args}}))
                .collect(),
        );
    }
    let count = parts.len();
    let frames: Vec<Value> = parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| frame(&model, n, p, i + 1 == count))
        .collect();
    answer(frames, stream)
}
