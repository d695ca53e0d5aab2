//! One ACP session: its agent process (`agent::child`) speaking JSON-RPC 2.0 over stdio, and
//! what its lines mean. A turn is a `session/prompt` whose response (with its `stopReason`
//! and usage) ends it; `session/update` notifications stream its text and thoughts; the
//! agent asks `session/request_permission` before acting on its own (the approval policy
//! answers) and calls the client's tools through the session's MCP bridge endpoint
//! ([`Host`]: each call is held until the client's result arrives).

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use serde_json::{json, Value};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::metering::Metering;
use super::permission;
use crate::backend::agent::bridge::{Answered, Endpoint, Host};
use crate::backend::agent::child::{Child, Output};
use crate::backend::agent::sessions::AgentSession;
use crate::backend::{BackendError, HeldCall, Meter, TurnEvent};
use crate::turn::{Effort, Usage};

/// How long a released agent gets to exit before its group is killed.
const RELEASE_GRACE: Duration = Duration::from_secs(2);

/// How long a request to the agent (`initialize`, `session/new`, model choice) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What a session was started with; a kept session continues only a turn that asks the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Settings {
    pub model: Option<String>,
    pub effort: Option<Effort>,
    /// The client's tool names, and the tools as MCP `tools/list` declares them.
    pub names: Vec<String>,
    pub tools: Vec<Value>,
}

/// A client call the agent is waiting on (through the bridge).
struct Held {
    invocation: u64,
    answer: oneshot::Sender<Answered>,
}

/// The turn running on the session now.
struct Route {
    /// The gateway-local number of this turn (a bridge call names the turn it belongs to).
    turn: u64,
    /// The JSON-RPC id of its `session/prompt`.
    prompt: u64,
    events: UnboundedSender<TurnEvent>,
    meter: Meter,
    /// What the turn cost so far, metered as its rounds end.
    metering: Metering,
    finished: bool,
    interrupted: bool,
}

#[derive(Default)]
struct State {
    route: Option<Route>,
    held: Vec<Held>,
    /// Text the client sent beside its results, for the next answer.
    beside: Vec<String>,
    /// The tools the turn's latest `tool_call` updates named (`toolCallId`,
    /// `_meta.claudeCode.toolName`), for the permission requests that follow them.
    announced: VecDeque<(String, String)>,
}

/// How many announced tool calls a turn remembers (a model answer's calls are asked about
/// right after they are announced).
const ANNOUNCED: usize = 32;

impl State {
    /// Notes on the running turn's metering.
    fn metering(&mut self, f: impl FnOnce(&mut Metering)) {
        if let Some(r) = self.route.as_mut() {
            f(&mut r.metering);
        }
    }
}

type Answer = oneshot::Sender<Result<Value, String>>;

pub(super) struct Session {
    pub id: u64,
    pub child: Arc<Child>,
    pub settings: Settings,
    /// The agent's working folder, shown to approvers.
    pub cwd: String,
    /// The agent's `sessionId`, once `session/new` answered.
    acp_session: Mutex<String>,
    /// The client's tools for the agent; gone with the session.
    endpoint: Mutex<Option<Endpoint>>,
    /// Removed once the process is gone: nothing a session wrote there outlives it.
    scratch: Option<PathBuf>,
    /// The session's place in `max_sessions`, held while the process lives.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    state: Mutex<State>,
    /// Our own requests waiting for their answer.
    pending: Mutex<Vec<(u64, Answer)>>,
    next_request: AtomicU64,
    next_turn: AtomicU64,
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
            acp_session: Mutex::new(String::new()),
            endpoint: Mutex::new(None),
            scratch,
            permit: Mutex::new(Some(permit)),
            state: Mutex::new(State::default()),
            pending: Mutex::new(Vec::new()),
            next_request: AtomicU64::new(1),
            next_turn: AtomicU64::new(1),
            next_invocation,
            gone: AtomicBool::new(false),
            released: AtomicBool::new(false),
            alive: Arc::downgrade(alive),
            me: me.clone(),
        })
    }

    /// The bridge endpoint this session's agent reaches the client's tools at.
    pub fn set_endpoint(&self, endpoint: Endpoint) {
        *self.endpoint.lock() = Some(endpoint);
    }

    pub fn set_acp_session(&self, id: String) {
        *self.acp_session.lock() = id;
    }

    pub fn acp_session(&self) -> String {
        self.acp_session.lock().clone()
    }

    /// Writes one JSON-RPC message.
    pub fn write(&self, message: &Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.child.send(line);
    }

    /// Sends a request and waits for its answer.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, BackendError> {
        if !self.child.is_alive() {
            return Err(BackendError::Lost);
        }
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().push((id, tx));
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        tokio::select! {
            answer = tokio::time::timeout(REQUEST_TIMEOUT, rx) => match answer {
                Ok(Ok(Ok(v))) => Ok(v),
                Ok(Ok(Err(e))) => Err(BackendError::Rejected(format!("the agent refused `{method}`: {e}"))),
                Ok(Err(_)) => Err(BackendError::Lost),
                Err(_) => Err(BackendError::Unavailable(format!("the agent did not answer `{method}` in time"))),
            },
            () = self.child.dead().cancelled() => Err(BackendError::Lost),
        }
    }

    /// Starts a turn: `prompt` (text blocks) goes to the agent; its events go to `events`.
    pub fn open(&self, prompt: Vec<String>, events: UnboundedSender<TurnEvent>, meter: Meter) {
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let mut metering = Metering::default();
        metering.sent(prompt.iter().map(String::len).sum());
        *self.state.lock() = State {
            route: Some(Route {
                turn: self.next_turn.fetch_add(1, Ordering::Relaxed),
                prompt: id,
                events,
                meter,
                metering,
                finished: false,
                interrupted: false,
            }),
            ..State::default()
        };
        let blocks: Vec<Value> = prompt
            .into_iter()
            .map(|t| json!({"type": "text", "text": t}))
            .collect();
        self.write(
            &json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt",
            "params": {"sessionId": self.acp_session(), "prompt": blocks}}),
        );
    }

    fn live(state: &State) -> bool {
        state.route.as_ref().is_some_and(|r| !r.finished)
    }

    /// Meters `u` (what a round or the prompt's report adds) and reports it to the turn.
    fn metered(&self, state: &mut State, u: Usage) {
        if u.total_tokens == 0 && u.cached_tokens == 0 && u.cache_write_tokens == 0 {
            return;
        }
        if let Some(r) = state.route.as_ref() {
            (r.meter)(u);
        }
        self.emit(state, TurnEvent::Usage(u));
    }

    fn emit(&self, state: &mut State, ev: TurnEvent) {
        if let Some(r) = state.route.as_ref() {
            // A closed receiver means the execution is gone; the event has no one to reach.
            let _ = r.events.unbounded_send(ev);
        }
    }

    /// Ends the turn once with `ev`; calls it never answered are answered by nobody now.
    fn end(&self, state: &mut State, ev: TurnEvent) {
        state.held.clear();
        let Some(r) = state.route.as_mut().filter(|r| !r.finished) else {
            return;
        };
        r.finished = true;
        let _ = r.events.unbounded_send(ev);
    }

    fn on_update(&self, update: &Value) {
        let mut state = self.state.lock();
        if !Self::live(&state) {
            return;
        }
        let text = || {
            let content = &update["content"];
            (content["type"] == "text")
                .then(|| content["text"].as_str())
                .flatten()
                .filter(|t| !t.is_empty())
                .map(str::to_string)
        };
        match update["sessionUpdate"].as_str().unwrap_or_default() {
            "agent_message_chunk" => {
                if let Some(t) = text() {
                    state.metering(|m| m.said(t.len()));
                    self.emit(&mut state, TurnEvent::Delta(t));
                }
            }
            "agent_thought_chunk" => {
                if let Some(t) = text() {
                    state.metering(|m| m.said(t.len()));
                    self.emit(&mut state, TurnEvent::Reasoning(t));
                }
            }
            "tool_call" => {
                let id = update["toolCallId"].as_str();
                let name = update["_meta"]["claudeCode"]["toolName"].as_str();
                if let (Some(id), Some(name)) = (id, name) {
                    if state.announced.len() == ANNOUNCED {
                        state.announced.pop_front();
                    }
                    state
                        .announced
                        .push_back((id.to_string(), name.to_string()));
                }
            }
            "usage_update" => {
                if let Some(used) = update["used"].as_u64() {
                    state.metering(|m| m.context(used));
                }
            }
            other => {
                tracing::trace!(
                    backend_process = self.child.id,
                    update = other,
                    "acp update"
                );
            }
        }
    }

    /// The `session/prompt` response: the turn's usage, then its end.
    fn on_prompt_done(&self, result: Result<Value, String>) {
        let mut state = self.state.lock();
        let interrupted = state.route.as_ref().is_some_and(|r| r.interrupted);
        let ev = match result {
            Ok(result) => {
                let report = super::metering::reported(&result);
                if let Some(r) = state.route.as_mut().filter(|r| !r.finished) {
                    let rest = r.metering.rest(report);
                    self.metered(&mut state, rest);
                }
                match result["stopReason"].as_str().unwrap_or_default() {
                    "end_turn" | "max_tokens" | "max_turn_requests" => TurnEvent::Completed,
                    _ if interrupted => TurnEvent::Interrupted,
                    other => TurnEvent::Failed(format!("the agent's turn ended: {other}")),
                }
            }
            Err(_) if interrupted => TurnEvent::Interrupted,
            Err(e) => TurnEvent::Failed(format!("the agent's turn failed: {e}")),
        };
        self.end(&mut state, ev);
    }

    fn on_request(&self, id: Value, method: &str, params: &Value) {
        match method {
            "session/request_permission" => self.on_permission(id, params),
            other => {
                tracing::debug!(
                    backend_process = self.child.id,
                    method = other,
                    "unknown agent request refused"
                );
                self.write(&json!({"jsonrpc": "2.0", "id": id,
                    "error": {"code": -32601, "message": format!("method not found: {other}")}}));
            }
        }
    }

    /// A permission request: the client's own tools are allowed once at once; anything else
    /// goes to the approval policy, which answers with the agent's own once-options.
    fn on_permission(&self, id: Value, params: &Value) {
        let tool_call = &params["toolCall"];
        let options = &params["options"];
        let announced = {
            let state = self.state.lock();
            let id = tool_call["toolCallId"].as_str().unwrap_or_default();
            (state.announced.iter())
                .find(|(a, _)| a == id)
                .map(|(_, name)| name.clone())
        };
        if permission::is_bridge_call(tool_call, &self.settings.names, announced.as_deref()) {
            let chosen = permission::option(options, true);
            return self.write(&permission::response(&id, chosen.as_deref()));
        }
        let ask = permission::ask(self.me.clone(), &self.cwd, id, tool_call, options);
        let mut state = self.state.lock();
        match Self::live(&state) {
            true => self.emit(&mut state, TurnEvent::Approval(Box::new(ask))),
            // No turn owns the session: the responder's drop declines.
            false => drop(ask),
        }
    }

    /// The running turn was asked to stop, or none runs.
    pub fn cancelling(&self) -> bool {
        let state = self.state.lock();
        state
            .route
            .as_ref()
            .is_none_or(|r| r.interrupted || r.finished)
    }

    /// The agent's whole turn is being cancelled (`session/cancel`).
    fn cancel(&self) {
        let session = self.acp_session();
        self.write(&json!({"jsonrpc": "2.0", "method": "session/cancel",
            "params": {"sessionId": session}}));
    }
}

impl Host for Session {
    fn tools(&self) -> Vec<Value> {
        self.settings.tools.clone()
    }

    fn running(&self) -> Option<u64> {
        let state = self.state.lock();
        state.route.as_ref().filter(|r| !r.finished).map(|r| r.turn)
    }

    fn call(
        &self,
        turn: u64,
        name: &str,
        arguments: String,
        answer: oneshot::Sender<Answered>,
    ) -> bool {
        let mut state = self.state.lock();
        let runs = state
            .route
            .as_ref()
            .is_some_and(|r| !r.finished && r.turn == turn);
        if !runs || !self.settings.names.iter().any(|n| n == name) || !self.child.is_alive() {
            return false;
        }
        // The round that asked for this call ends here: metered now, so a per-execution cap
        // acts at the continuation.
        let round = state.route.as_mut().map(|r| {
            r.metering.said(name.len() + arguments.len());
            r.metering.round()
        });
        if let Some(u) = round {
            self.metered(&mut state, u);
        }
        let invocation = self.next_invocation.fetch_add(1, Ordering::Relaxed);
        state.held.push(Held { invocation, answer });
        let call = HeldCall {
            invocation,
            name: name.to_string(),
            arguments,
        };
        self.emit(&mut state, TurnEvent::ToolCall(call));
        true
    }
}

impl AgentSession for Session {
    fn id(&self) -> u64 {
        self.id
    }

    /// Answers a held client call with the client's result (and any text sent beside it).
    fn answer(&self, invocation: u64, text: &str, failed: bool) -> bool {
        let mut state = self.state.lock();
        let Some(pos) = state.held.iter().position(|h| h.invocation == invocation) else {
            return false;
        };
        if !Self::live(&state) || !self.child.is_alive() {
            return false;
        }
        let held = state.held.swap_remove(pos);
        let beside = std::mem::take(&mut state.beside);
        if let Some(r) = state.route.as_mut() {
            r.metering
                .sent(text.len() + beside.iter().map(String::len).sum::<usize>());
        }
        drop(state);
        held.answer
            .send(Answered {
                text: text.to_string(),
                failed,
                beside,
            })
            .is_ok()
    }

    /// An ACP agent takes no input into a running turn: the text goes with the next answer.
    fn steer(&self, input: Vec<String>) -> bool {
        let mut state = self.state.lock();
        let running = Self::live(&state);
        if running {
            state.beside.extend(input);
        }
        running
    }

    fn interrupt(&self) {
        let mut state = self.state.lock();
        let Some(route) = state.route.as_mut().filter(|r| !r.finished) else {
            return;
        };
        if std::mem::replace(&mut route.interrupted, true) || !self.child.is_alive() {
            return;
        }
        drop(state);
        self.cancel();
    }

    fn is_alive(&self) -> bool {
        self.child.is_alive()
    }

    fn finished(&self) -> bool {
        self.state.lock().route.as_ref().is_none_or(|r| r.finished)
    }

    fn usable(&self) -> bool {
        self.child.is_alive()
            && !self.released.load(Ordering::SeqCst)
            && self.permit.lock().is_some()
    }

    fn close_route(&self) {
        self.state.lock().route = None;
    }

    /// The process group is asked to exit and killed if it has not within `RELEASE_GRACE`; the
    /// bridge endpoint goes at once, the place and scratch folder once the process is gone.
    fn release(&self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        self.endpoint.lock().take();
        // Asked to exit first: an agent left to clean up (Gemini CLI releases its file locks)
        // does not leave the next session waiting on them.
        self.child.terminate(RELEASE_GRACE);
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

impl Output for Session {
    fn line(self: &Arc<Self>, line: &[u8]) {
        let Ok(msg) = serde_json::from_slice::<Value>(line) else {
            tracing::debug!(
                backend_process = self.child.id,
                bytes = line.len(),
                "a line that is not JSON ignored"
            );
            return;
        };
        let method = msg["method"].as_str();
        match (method, msg.get("id")) {
            (Some(m), Some(id)) => self.on_request(id.clone(), m, &msg["params"]),
            (Some("session/update"), None) => self.on_update(&msg["params"]["update"]),
            (Some(_), None) => {}
            (None, Some(id)) => {
                let result = match msg.get("error") {
                    Some(e) => Err(e["message"].as_str().unwrap_or("error").to_string()),
                    None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
                };
                let Some(id) = id.as_u64() else { return };
                let prompt = self.state.lock().route.as_ref().map(|r| r.prompt);
                if prompt == Some(id) {
                    return self.on_prompt_done(result);
                }
                let mut pending = self.pending.lock();
                if let Some(pos) = pending.iter().position(|(p, _)| *p == id) {
                    let (_, tx) = pending.swap_remove(pos);
                    let _ = tx.send(result);
                }
            }
            (None, None) => {}
        }
    }

    fn ended(&self, why: &str) {
        self.child.mark_dead();
        self.pending.lock().clear();
        self.endpoint.lock().take();
        if self.child.reaped().is_cancelled() {
            self.permit.lock().take();
        }
        let mut state = self.state.lock();
        self.end(&mut state, TurnEvent::Lost(why.to_string()));
        drop(state);
        if !self.gone.swap(true, Ordering::SeqCst) {
            if let Some(alive) = self.alive.upgrade() {
                alive.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}
