//! One Claude Code session: its `claude` process (`agent::child`) and what its stdout lines
//! mean. The CLI streams each model call as Messages API events (text and thinking go to the
//! turn as they arrive; the call's usage is metered when its `message_delta` reports it),
//! asks the host for the session's MCP server (`mcp_message`: the client's tools, held on
//! `tools/call`), and asks before a built-in runs (`hook_callback` PreToolUse, or
//! `can_use_tool`): the approval policy answers. A `result` ends the turn.
//!
//! The calls of one model message are one batch: Claude Code starts a call as soon as its
//! block is complete, so the calls are kept back until the message has ended, then handed on
//! together, and `Yield` follows once every client call the message made has arrived (a call
//! that waits behind a built-in arrives later, and the engine's debounce sends what came).

use parking_lot::Mutex;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use serde_json::{json, Value};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::approval::Answer;
use super::control::{self, Frame};
use super::names::Names;
use crate::backend::agent::child::{Child, Output};
use crate::backend::agent::sessions::AgentSession;
use crate::backend::{BackendError, HeldCall, Meter, TurnEvent};
use crate::turn::{Effort, Usage};

/// How long a request to the CLI (its `initialize`) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the answer to one of the host's control requests goes.
type Answered = oneshot::Sender<Result<Value, String>>;

/// What a session was started with; a kept session continues only a turn that asks the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Settings {
    pub model: Option<String>,
    pub effort: Option<Effort>,
    /// The client's tools as declared (`tools/list`).
    pub names: Names,
    pub tools: Vec<Value>,
}

/// A client call the CLI is waiting on.
struct Held {
    invocation: u64,
    /// The `mcp_message` control request to answer.
    request: String,
    rpc_id: Value,
}

/// The turn running on the session now: where its events go.
struct Route {
    events: UnboundedSender<TurnEvent>,
    meter: Meter,
    finished: bool,
    interrupted: bool,
}

#[derive(Default)]
struct State {
    route: Option<Route>,
    held: Vec<Held>,
    /// Calls of the model message being streamed, kept back until it ends.
    kept_back: Vec<HeldCall>,
    /// The client calls (`tool_use` ids) of the current model message, and those arrived.
    batch: Vec<String>,
    arrived: Vec<String>,
    /// The current model message is still streaming.
    streaming: bool,
    /// The usage `message_start` reported for each model call under way: the session's own
    /// (None) and its subagents' (by the call that started them), which may interleave.
    calls: Vec<(Option<String>, Usage)>,
    /// Built-in uses the policy allowed (a `can_use_tool` after the hook is answered at once).
    allowed: HashSet<String>,
    /// Text the client sent beside its results, for the next answer.
    beside: Vec<String>,
}

pub(super) struct Session {
    pub id: u64,
    pub child: Arc<Child>,
    pub settings: Settings,
    /// The working folder of the agent, shown to approvers.
    pub cwd: String,
    /// Removed once the process is gone: nothing a session wrote there outlives it.
    scratch: Option<PathBuf>,
    /// The session's place in `max_sessions`, held while the process lives.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    state: Mutex<State>,
    /// Our own control requests waiting for their answer.
    pending: Mutex<Vec<(String, Answered)>>,
    next_request: AtomicU64,
    next_invocation: Arc<AtomicU64>,
    /// Counted out of the backend's live processes once.
    gone: AtomicBool,
    released: AtomicBool,
    alive: Weak<AtomicU64>,
    me: Weak<Session>,
}

impl Session {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        child: Arc<Child>,
        settings: Settings,
        cwd: String,
        scratch: Option<PathBuf>,
        permit: OwnedSemaphorePermit,
        next_invocation: Arc<AtomicU64>,
        alive: &Arc<AtomicU64>,
    ) -> Arc<Session> {
        alive.fetch_add(1, Ordering::SeqCst);
        Arc::new_cyclic(|me| Session {
            id,
            child,
            settings,
            cwd,
            scratch,
            permit: Mutex::new(Some(permit)),
            state: Mutex::new(State::default()),
            pending: Mutex::new(Vec::new()),
            next_request: AtomicU64::new(1),
            next_invocation,
            gone: AtomicBool::new(false),
            released: AtomicBool::new(false),
            alive: Arc::downgrade(alive),
            me: me.clone(),
        })
    }

    /// Sends a control request and waits for its answer.
    pub async fn call(&self, request: Value) -> Result<Value, BackendError> {
        if !self.child.is_alive() {
            return Err(BackendError::Lost);
        }
        let id = format!("req_{}", self.next_request.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        self.pending.lock().push((id.clone(), tx));
        self.child.send(control::request(&id, request));
        tokio::select! {
            answer = tokio::time::timeout(REQUEST_TIMEOUT, rx) => match answer {
                Ok(Ok(Ok(v))) => Ok(v),
                Ok(Ok(Err(e))) => Err(BackendError::Rejected(format!("claude refused the request: {e}"))),
                Ok(Err(_)) => Err(BackendError::Lost),
                Err(_) => Err(BackendError::Unavailable("claude did not answer in time".into())),
            },
            _ = self.child.dead().cancelled() => Err(BackendError::Lost),
        }
    }

    /// Starts a turn with `text` as the user's message; its events go to `events`.
    pub fn open(&self, text: &str, events: UnboundedSender<TurnEvent>, meter: Meter) {
        *self.state.lock() = State {
            route: Some(Route {
                events,
                meter,
                finished: false,
                interrupted: false,
            }),
            ..State::default()
        };
        self.child.send(control::user(text));
    }

    fn emit(&self, state: &mut State, ev: TurnEvent) {
        if let Some(r) = state.route.as_ref() {
            // A closed receiver means the execution is gone; the event has no one to reach.
            let _ = r.events.unbounded_send(ev);
        }
    }

    /// Ends the turn once with `ev`.
    fn end(&self, state: &mut State, ev: TurnEvent) {
        let Some(r) = state.route.as_mut().filter(|r| !r.finished) else {
            return;
        };
        r.finished = true;
        let _ = r.events.unbounded_send(ev);
    }

    fn on_stream(&self, event: &Value, parent: Option<String>) {
        let mut state = self.state.lock();
        match event["type"].as_str().unwrap_or_default() {
            "message_start" => {
                let started = usage_started(&event["message"]["usage"]);
                state.calls.retain(|(p, _)| *p != parent);
                if parent.is_none() {
                    state.streaming = true;
                    state.batch.clear();
                    state.arrived.clear();
                }
                state.calls.push((parent, started));
            }
            // The call's final usage: metered now, whatever the turn does next.
            "message_delta" => {
                let pos = state.calls.iter().position(|(p, _)| *p == parent);
                let started = pos.map(|i| state.calls.swap_remove(i).1);
                let usage = usage_ended(started.unwrap_or_default(), &event["usage"]);
                if let Some(r) = state.route.as_ref() {
                    (r.meter)(usage);
                }
                self.emit(&mut state, TurnEvent::Usage(usage));
            }
            "message_stop" if parent.is_none() => {
                state.streaming = false;
                self.flush(&mut state);
            }
            _ if parent.is_some() => {}
            "content_block_start" => {
                let block = &event["content_block"];
                if block["type"] == "tool_use" {
                    let name = block["name"].as_str().unwrap_or_default();
                    if self.settings.names.is_client_tool(name) {
                        if let Some(id) = block["id"].as_str() {
                            state.batch.push(id.to_string());
                        }
                    }
                }
            }
            "content_block_delta" => {
                let delta = &event["delta"];
                let text = |k: &str| delta[k].as_str().filter(|t| !t.is_empty());
                match delta["type"].as_str() {
                    Some("text_delta") => {
                        if let Some(t) = text("text") {
                            self.emit(&mut state, TurnEvent::Delta(t.to_string()));
                        }
                    }
                    Some("thinking_delta") => {
                        if let Some(t) = text("thinking") {
                            self.emit(&mut state, TurnEvent::Reasoning(t.to_string()));
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    /// Hands on the calls kept back, and `Yield` once the message's batch is complete.
    fn flush(&self, state: &mut State) {
        if state.streaming {
            return;
        }
        let calls = std::mem::take(&mut state.kept_back);
        let handed = !calls.is_empty();
        for call in calls {
            self.emit(state, TurnEvent::ToolCall(call));
        }
        let complete = state.batch.iter().all(|id| state.arrived.contains(id));
        if handed && complete {
            self.emit(state, TurnEvent::Yield);
        }
    }

    fn on_request(&self, id: &str, request: &Value) {
        match request["subtype"].as_str().unwrap_or_default() {
            "mcp_message" => self.on_mcp(id, &request["message"]),
            "hook_callback" => {
                let input = &request["input"];
                let tool = input["tool_name"].as_str().unwrap_or_default();
                let use_id = input["tool_use_id"].as_str().unwrap_or_default();
                self.decide(id, tool, &input["tool_input"], use_id, Answer::Hook);
            }
            "can_use_tool" => {
                let tool = request["tool_name"].as_str().unwrap_or_default();
                let use_id = request["tool_use_id"].as_str().unwrap_or_default();
                self.decide(id, tool, &request["input"], use_id, Answer::CanUse);
            }
            other => {
                tracing::debug!(
                    backend_process = self.child.id,
                    subtype = other,
                    "unknown claude request refused"
                );
                self.child
                    .send(control::error(id, &format!("unsupported request: {other}")));
            }
        }
    }

    fn on_mcp(&self, id: &str, message: &Value) {
        let rpc_id = message.get("id").cloned().unwrap_or(Value::Null);
        let method = message["method"].as_str().unwrap_or_default();
        let reply = |result: Result<Value, (i64, &str)>| {
            self.child.send(control::mcp(id, &rpc_id, result));
        };
        match method {
            "initialize" => reply(Ok(json!({
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "turnstile", "version": env!("CARGO_PKG_VERSION")},
            }))),
            "tools/list" => reply(Ok(json!({"tools": self.settings.tools}))),
            "tools/call" => self.on_call(id, rpc_id, &message["params"]),
            m if m.starts_with("notifications/") => reply(Ok(json!({}))),
            "ping" => reply(Ok(json!({}))),
            _ => reply(Err((-32601, "method not found"))),
        }
    }

    /// A client call: held, never answered by the gateway itself.
    fn on_call(&self, id: &str, rpc_id: Value, params: &Value) {
        let declared = params["name"].as_str().unwrap_or_default();
        let mut state = self.state.lock();
        let running = state.route.as_ref().is_some_and(|r| !r.finished);
        let Some(name) = self.settings.names.client(declared).filter(|_| running) else {
            drop(state);
            let result = json!({"content": [{"type": "text", "text": "no live execution for this call"}], "isError": true});
            self.child.send(control::mcp(id, &rpc_id, Ok(result)));
            return;
        };
        let invocation = self.next_invocation.fetch_add(1, Ordering::Relaxed);
        let arguments = match &params["arguments"] {
            Value::Null => "{}".to_string(),
            v => v.to_string(),
        };
        let use_id = params["_meta"]["claudecode/toolUseId"].as_str();
        let call = HeldCall {
            invocation,
            name: name.to_string(),
            arguments,
        };
        state.held.push(Held {
            invocation,
            request: id.to_string(),
            rpc_id,
        });
        match use_id.filter(|u| state.batch.iter().any(|b| b == u)) {
            // A call of the session's own model message: part of its batch.
            Some(use_id) => {
                state.arrived.push(use_id.to_string());
                state.kept_back.push(call);
            }
            // A subagent's: handed on at once, and the engine's debounce batches it.
            None => self.emit(&mut state, TurnEvent::ToolCall(call)),
        }
        self.flush(&mut state);
    }

    /// A tool about to run: a client tool is the client's to allow; a built-in goes to the
    /// approval policy, whose answer is written in the shape the request expects.
    fn decide(&self, id: &str, tool: &str, input: &Value, use_id: &str, answer: Answer) {
        if self.settings.names.is_client_tool(tool)
            || (answer == Answer::CanUse
                && !use_id.is_empty()
                && self.state.lock().allowed.contains(use_id))
        {
            return self.child.send(answer.write(id, true, input));
        }
        let ask = super::approval::ask(self.me.clone(), &self.cwd, id, tool, input, use_id, answer);
        let mut state = self.state.lock();
        match state.route.as_ref().filter(|r| !r.finished) {
            Some(_) => self.emit(&mut state, TurnEvent::Approval(Box::new(ask))),
            // No turn owns the session: the responder's drop declines.
            None => drop(ask),
        }
    }

    /// The policy allowed a built-in's use (a `can_use_tool` for it is then answered at once).
    pub fn allowed(&self, use_id: String) {
        if !use_id.is_empty() {
            self.state.lock().allowed.insert(use_id);
        }
    }

    fn on_result(&self, subtype: &str, is_error: bool) {
        let mut state = self.state.lock();
        let interrupted = state.route.as_ref().is_some_and(|r| r.interrupted);
        // Calls the turn never got to are answered by nobody now.
        state.held.clear();
        state.kept_back.clear();
        let ev = match (subtype, is_error) {
            ("success", false) => TurnEvent::Completed,
            _ if interrupted => TurnEvent::Interrupted,
            _ => TurnEvent::Failed(format!("claude turn ended: {subtype}")),
        };
        self.end(&mut state, ev);
    }
}

impl AgentSession for Session {
    fn id(&self) -> u64 {
        self.id
    }

    /// Answers a held client call with the client's result (and any text sent beside it).
    fn answer(&self, invocation: u64, text: &str, failed: bool) -> bool {
        let mut state = self.state.lock();
        let running = state.route.as_ref().is_some_and(|r| !r.finished);
        let Some(pos) = state.held.iter().position(|h| h.invocation == invocation) else {
            return false;
        };
        if !running || !self.child.is_alive() {
            return false;
        }
        let held = state.held.swap_remove(pos);
        let beside = std::mem::take(&mut state.beside);
        drop(state);
        let mut content = vec![json!({"type": "text", "text": text})];
        content.extend(beside.iter().map(|t| json!({"type": "text", "text": t})));
        let result = json!({"content": content, "isError": failed});
        self.child
            .send(control::mcp(&held.request, &held.rpc_id, Ok(result)));
        true
    }

    /// Text the client sent beside its results: it goes with the next answer.
    fn steer(&self, input: Vec<String>) -> bool {
        let mut state = self.state.lock();
        let running = state.route.as_ref().is_some_and(|r| !r.finished);
        if running {
            state.beside.extend(input);
        }
        running
    }

    /// Asks the CLI to stop the running turn; its `result` follows.
    fn interrupt(&self) {
        let mut state = self.state.lock();
        let Some(route) = state.route.as_mut().filter(|r| !r.finished) else {
            return;
        };
        if std::mem::replace(&mut route.interrupted, true) || !self.child.is_alive() {
            return;
        }
        drop(state);
        let id = format!("req_{}", self.next_request.fetch_add(1, Ordering::Relaxed));
        self.child
            .send(control::request(&id, json!({"subtype": "interrupt"})));
    }

    fn is_alive(&self) -> bool {
        self.child.is_alive()
    }

    /// The running turn has ended (or none runs).
    fn finished(&self) -> bool {
        self.state.lock().route.as_ref().is_none_or(|r| r.finished)
    }

    /// Alive and still holding its place (not evicted).
    fn usable(&self) -> bool {
        self.child.is_alive()
            && !self.released.load(Ordering::SeqCst)
            && self.permit.lock().is_some()
    }

    /// The turn completed: nothing listens until the next one.
    fn close_route(&self) {
        self.state.lock().route = None;
    }

    /// Ends the session: the process and its group are killed, its place is given back, and
    /// its scratch folder is removed once the process is gone.
    fn release(&self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        self.child.close();
        let me = self.me.clone();
        crate::backend::agent::sessions::when_reaped(
            &self.child,
            self.scratch.clone(),
            move || {
                if let Some(s) = me.upgrade() {
                    s.permit.lock().take();
                }
            },
        );
    }
}

fn count(u: &Value, k: &str) -> Option<u64> {
    u.get(k).and_then(Value::as_u64)
}

/// A model call's usage as `message_start` reports it (prompt tokens are the uncached input
/// plus the cache reads and writes, as everywhere in the gateway).
fn usage_started(u: &Value) -> Usage {
    let read = count(u, "cache_read_input_tokens").unwrap_or(0);
    let write = count(u, "cache_creation_input_tokens").unwrap_or(0);
    Usage {
        prompt_tokens: count(u, "input_tokens").unwrap_or(0) + read + write,
        completion_tokens: count(u, "output_tokens").unwrap_or(0),
        cached_tokens: read,
        cache_write_tokens: write,
        ..Usage::default()
    }
}

/// The call's final usage: `message_delta` gives the output count and may restate the input.
fn usage_ended(started: Usage, u: &Value) -> Usage {
    let mut usage = started;
    if let Some(out) = count(u, "output_tokens") {
        usage.completion_tokens = out;
    }
    let uncached = started
        .prompt_tokens
        .saturating_sub(started.cached_tokens + started.cache_write_tokens);
    let input = count(u, "input_tokens").unwrap_or(uncached);
    usage.cached_tokens = count(u, "cache_read_input_tokens").unwrap_or(started.cached_tokens);
    usage.cache_write_tokens =
        count(u, "cache_creation_input_tokens").unwrap_or(started.cache_write_tokens);
    usage.prompt_tokens = input + usage.cached_tokens + usage.cache_write_tokens;
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    usage
}

impl Output for Session {
    fn line(self: &Arc<Self>, line: &[u8]) {
        match control::parse(line) {
            Frame::Stream { event, parent } => self.on_stream(&event, parent),
            Frame::Request { id, request } => self.on_request(&id, &request),
            Frame::Response { id, result } => {
                let mut pending = self.pending.lock();
                if let Some(pos) = pending.iter().position(|(p, _)| *p == id) {
                    let (_, tx) = pending.swap_remove(pos);
                    let _ = tx.send(result);
                }
            }
            Frame::Cancel { id } => {
                // The CLI gave up on a call (its turn is being interrupted): nothing to answer.
                self.state.lock().held.retain(|h| h.request != id);
            }
            Frame::Result { subtype, is_error } => self.on_result(&subtype, is_error),
            Frame::Other => {}
        }
    }

    fn ended(&self, why: &str) {
        self.child.mark_dead();
        self.pending.lock().clear();
        if self.child.reaped().is_cancelled() {
            self.permit.lock().take();
        }
        let mut state = self.state.lock();
        state.held.clear();
        self.end(&mut state, TurnEvent::Lost(why.to_string()));
        drop(state);
        if !self.gone.swap(true, Ordering::SeqCst) {
            if let Some(alive) = self.alive.upgrade() {
                alive.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calls_usage_is_its_start_with_the_final_counts() {
        let start = usage_started(
            &json!({"input_tokens": 100, "cache_creation_input_tokens": 7,
                                          "cache_read_input_tokens": 50, "output_tokens": 1}),
        );
        assert_eq!(
            (
                start.prompt_tokens,
                start.cached_tokens,
                start.cache_write_tokens
            ),
            (157, 50, 7)
        );
        let end = usage_ended(start, &json!({"output_tokens": 20}));
        assert_eq!(
            (end.prompt_tokens, end.completion_tokens, end.total_tokens),
            (157, 20, 177)
        );
        assert_eq!((end.cached_tokens, end.cache_write_tokens), (50, 7));
        // A delta that restates the input wins.
        let end = usage_ended(
            start,
            &json!({"output_tokens": 5, "input_tokens": 3,
                                             "cache_read_input_tokens": 0}),
        );
        assert_eq!(
            (end.prompt_tokens, end.cached_tokens, end.completion_tokens),
            (10, 0, 5)
        );
    }
}
