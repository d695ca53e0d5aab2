//! A scripted fake of the OpenAI **Responses API** on `127.0.0.1:0`, standing in for the model
//! behind a real `codex app-server` so a whole turn runs offline (reference §13).
//!
//! It serves only `POST /v1/responses`, answering with `text/event-stream` frames written as
//! `event: <type>\ndata: <json>\n\n`. Each test scripts the model with a routing function over
//! the request body (`FakeResponses::start`) or a queue of replies (`FakeResponses::queue`).
//! Codex sends the **full** history on every request, so routing on "is there a
//! `function_call_output` for this `call_id` yet" (`output_for`) is how a script knows which
//! step of the turn it is in, as upstream's own tests do.
//!
//! Every request body is recorded (parsed JSON) so tests can assert what the model saw; any
//! other method or path is recorded as a stray and answered 404. Stalled streams end when the
//! client goes away (counted, see `dropped_streams`), when the fake is dropped, or after
//! `STALL_MAX`, so no test can hang on one.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::wait_for_within;

/// The longest a stalled stream stays open.
pub const STALL_MAX: Duration = Duration::from_secs(30);
/// How often a stalled stream writes an SSE comment, so a peer that left is noticed.
const STALL_PING: Duration = Duration::from_millis(200);
/// The usage every completed response reports.
pub const INPUT_TOKENS: u64 = 11;
pub const CACHED_TOKENS: u64 = 3;
pub const OUTPUT_TOKENS: u64 = 7;

/// One scripted answer to one `POST /v1/responses`.
#[derive(Debug, Clone)]
pub enum Reply {
    /// `200 text/event-stream`: these events, then the connection closes. Leaving out
    /// `response.completed` gives a stream cut short.
    Sse(Vec<Value>),
    /// `200 text/event-stream`: these events, then the stream stays open (SSE comments only)
    /// until the client goes away.
    Stall(Vec<Value>),
    /// An HTTP error status with a JSON body.
    Status(u16, Value),
}

impl Reply {
    /// A streamed assistant message: `response.created`, `response.output_item.added`,
    /// `response.output_text.delta` x `chunks`, `response.output_item.done`, then
    /// `response.completed` with usage.
    pub fn text(text: &str, chunks: usize) -> Reply {
        let mut events = vec![created(), message_added("msg_1")];
        events.extend(split(text, chunks).iter().map(|d| text_delta("msg_1", d)));
        events.push(message_done("msg_1", text));
        events.push(completed());
        Reply::Sse(events)
    }

    /// One response holding these function calls, `(call_id, name, arguments)`, in order.
    pub fn calls(calls: &[(&str, &str, Value)]) -> Reply {
        let mut events = vec![created()];
        events.extend(
            calls
                .iter()
                .map(|(id, name, args)| function_call(id, name, args)),
        );
        events.push(completed());
        Reply::Sse(events)
    }

    /// One call to a (dynamic) tool.
    pub fn call(call_id: &str, name: &str, args: Value) -> Reply {
        Reply::calls(&[(call_id, name, args)])
    }

    /// A built-in `exec_command` call asking to run outside the sandbox, which makes Codex
    /// request a command approval under `approval_policy = "on-request"`.
    pub fn exec_command(call_id: &str, cmd: &str, justification: &str) -> Reply {
        Reply::call(
            call_id,
            "exec_command",
            json!({"cmd": cmd, "sandbox_permissions": "require_escalated",
                   "justification": justification}),
        )
    }

    /// An HTTP error with an OpenAI-shaped body.
    pub fn http_error(status: u16) -> Reply {
        Reply::Status(
            status,
            json!({"error": {"message": "fake: scripted failure", "type": "server_error",
                             "param": null, "code": null}}),
        )
    }

    /// Streams `text` as one delta, then closes without `response.completed`.
    pub fn cut_after(text: &str) -> Reply {
        Reply::Sse(vec![
            created(),
            message_added("msg_1"),
            text_delta("msg_1", text),
        ])
    }

    /// Streams `text` as one delta, then holds the stream open.
    pub fn stall_after(text: &str) -> Reply {
        Reply::Stall(vec![
            created(),
            message_added("msg_1"),
            text_delta("msg_1", text),
        ])
    }
}

// --- event builders (each carries its own `type`, as the real API does) ----------------------

pub fn created() -> Value {
    json!({"type": "response.created", "response": {"id": "resp_fake"}})
}

pub fn message_added(item_id: &str) -> Value {
    json!({"type": "response.output_item.added", "output_index": 0,
           "item": {"type": "message", "role": "assistant", "id": item_id, "content": []}})
}

pub fn text_delta(item_id: &str, delta: &str) -> Value {
    json!({"type": "response.output_text.delta", "item_id": item_id, "output_index": 0,
           "content_index": 0, "delta": delta})
}

pub fn message_done(item_id: &str, text: &str) -> Value {
    json!({"type": "response.output_item.done", "output_index": 0,
           "item": {"type": "message", "role": "assistant", "id": item_id,
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}})
}

pub fn function_call(call_id: &str, name: &str, args: &Value) -> Value {
    json!({"type": "response.output_item.done",
           "item": {"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
                    "name": name, "arguments": args.to_string()}})
}

pub fn completed() -> Value {
    json!({"type": "response.completed", "response": {"id": "resp_fake", "usage": {
        "input_tokens": INPUT_TOKENS,
        "input_tokens_details": {"cached_tokens": CACHED_TOKENS},
        "output_tokens": OUTPUT_TOKENS,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
    }}})
}

/// `text` in `n` pieces split on char boundaries (fewer if the text is shorter).
fn split(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(n.max(1)).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

// --- reading a request body -------------------------------------------------------------------

/// Every `function_call_output` in the request's `input`: `(call_id, output)`.
pub fn outputs(body: &Value) -> Vec<(String, Value)> {
    items(body)
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| {
            (
                i["call_id"].as_str().unwrap_or_default().to_string(),
                i["output"].clone(),
            )
        })
        .collect()
}

/// The output the model is given for `call_id`, if it has one yet.
pub fn output_for(body: &Value, call_id: &str) -> Option<Value> {
    outputs(body)
        .into_iter()
        .find(|(id, _)| id == call_id)
        .map(|(_, o)| o)
}

/// The `function_call` items of the history, `(call_id, name)`.
pub fn function_calls(body: &Value) -> Vec<(String, String)> {
    items(body)
        .filter(|i| i["type"] == "function_call")
        .map(|i| {
            let s = |k: &str| i[k].as_str().unwrap_or_default().to_string();
            (s("call_id"), s("name"))
        })
        .collect()
}

/// The texts of the user messages, in order (Codex's own `<environment_context>` included).
pub fn user_texts(body: &Value) -> Vec<String> {
    items(body)
        .filter(|i| i["type"] == "message" && i["role"] == "user")
        .map(|i| match &i["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join(""),
            _ => String::new(),
        })
        .collect()
}

/// True when any user message of the request contains `needle`.
pub fn user_says(body: &Value, needle: &str) -> bool {
    user_texts(body).iter().any(|t| t.contains(needle))
}

/// The names of the tools the model is offered (namespaces by their own name).
pub fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect()
}

/// The tool definition the model is offered under `name`.
pub fn tool(body: &Value, name: &str) -> Option<Value> {
    body["tools"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == name)
        .cloned()
}

fn items(body: &Value) -> impl Iterator<Item = &Value> {
    body["input"].as_array().into_iter().flatten()
}

// --- the server -------------------------------------------------------------------------------

type Route = Box<dyn Fn(usize, &Value) -> Reply + Send + Sync>;

struct Shared {
    route: Route,
    requests: Mutex<Vec<Value>>,
    stray: Mutex<Vec<String>>,
    dropped: AtomicUsize,
    stop: CancellationToken,
}

/// A running fake. Dropping it stops the server and ends its stalled streams.
pub struct FakeResponses {
    /// The provider `base_url`: `http://127.0.0.1:PORT/v1`.
    pub base_url: String,
    shared: Arc<Shared>,
}

impl FakeResponses {
    /// Serves replies chosen by `route(n, body)`, where `n` counts requests from 0.
    pub async fn start(route: impl Fn(usize, &Value) -> Reply + Send + Sync + 'static) -> Self {
        let shared = Arc::new(Shared {
            route: Box::new(route),
            requests: Mutex::new(Vec::new()),
            stray: Mutex::new(Vec::new()),
            dropped: AtomicUsize::new(0),
            stop: CancellationToken::new(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake Responses API");
        let addr = listener.local_addr().expect("local addr");
        let app = Router::new()
            .route("/v1/responses", post(responses).fallback(stray))
            .fallback(stray)
            .with_state(shared.clone());
        let stop = shared.stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
        });
        FakeResponses {
            base_url: format!("http://{addr}/v1"),
            shared,
        }
    }

    /// Serves `replies` in order; once they run out every request gets a 500 (and the
    /// surplus shows in `requests()`).
    pub async fn queue(replies: Vec<Reply>) -> Self {
        let replies = Mutex::new(VecDeque::from(replies));
        Self::start(move |_, _| {
            lock(&replies)
                .pop_front()
                .unwrap_or_else(|| Reply::http_error(500))
        })
        .await
    }

    /// Every request body received so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        lock(&self.shared.requests).clone()
    }

    /// Methods and paths requested other than `POST /v1/responses`.
    pub fn stray(&self) -> Vec<String> {
        lock(&self.shared.stray).clone()
    }

    /// Stalled streams whose client went away before the stall ended.
    pub fn dropped_streams(&self) -> usize {
        self.shared.dropped.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until `n` stalled streams were dropped by their client.
    pub async fn wait_dropped(&self, n: usize) {
        wait_for_within(
            &format!("the client to drop {n} stalled streams"),
            Duration::from_secs(20),
            String::new,
            async || (self.dropped_streams() >= n).then_some(()),
        )
        .await
    }
}

impl Drop for FakeResponses {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn stray(State(shared): State<Arc<Shared>>, method: Method, uri: Uri) -> StatusCode {
    lock(&shared.stray).push(format!("{method} {uri}"));
    StatusCode::NOT_FOUND
}

async fn responses(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let parsed: Value =
        serde_json::from_slice(&body).unwrap_or_else(|_| json!({"unparsed_bytes": body.len()}));
    let n = {
        let mut requests = lock(&shared.requests);
        requests.push(parsed.clone());
        requests.len() - 1
    };
    match (shared.route)(n, &parsed) {
        Reply::Status(status, body) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            axum::Json(body),
        )
            .into_response(),
        Reply::Sse(events) => sse(futures::stream::iter(frames(&events)).boxed()),
        Reply::Stall(events) => {
            let guard = DropCounter {
                shared: shared.clone(),
                armed: true,
            };
            let stop = shared.stop.clone();
            // Comments every STALL_PING until the stall ends; a failed write (the peer left)
            // drops the stream, and with it the armed guard.
            let pings = futures::stream::unfold(
                (guard, Instant::now() + STALL_MAX),
                move |(mut guard, until)| {
                    let stop = stop.clone();
                    async move {
                        tokio::select! {
                            _ = stop.cancelled() => {}
                            _ = tokio::time::sleep(STALL_PING) => {
                                if Instant::now() < until {
                                    return Some((Bytes::from_static(b": ping\n\n"), (guard, until)));
                                }
                            }
                        }
                        guard.disarm();
                        None
                    }
                },
            );
            sse(futures::stream::iter(frames(&events)).chain(pings).boxed())
        }
    }
}

fn frames(events: &[Value]) -> Vec<Bytes> {
    events
        .iter()
        .map(|e| {
            let kind = e["type"].as_str().unwrap_or("message");
            Bytes::from(format!("event: {kind}\ndata: {e}\n\n"))
        })
        .collect()
}

fn sse(stream: futures::stream::BoxStream<'static, Bytes>) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream.map(Ok::<_, Infallible>)))
        .expect("valid SSE response")
}

/// Counts a stalled stream that was dropped while still armed (its client went away).
struct DropCounter {
    shared: Arc<Shared>,
    armed: bool,
}

impl DropCounter {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for DropCounter {
    fn drop(&mut self) {
        if self.armed {
            self.shared.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}
