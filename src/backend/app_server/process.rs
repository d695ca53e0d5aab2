//! One `codex app-server` process: its child (`agent::child`: spawn, stdin, stdout lines,
//! supervision), the `initialize` handshake, and the JSON-RPC state: pending requests and the
//! route of each thread its stdout lines are dispatched to. When the child dies, every pending
//! request fails and every routed thread receives `TurnEvent::Lost`.
//!
//! Threads are released with `thread/delete`, the one call of Codex 0.169.0 that unloads a
//! thread (it refuses ephemeral threads, so threads are started persisted; it also removes
//! the rollout). Measured: `thread/unsubscribe` leaves threads loaded; `thread/delete` (and
//! `thread/archive`) unload at once on a quiet process, but while other threads run turns
//! many deleted threads stay loaded for the life of the process, so under steady load only
//! recycling bounds memory (`mod.rs`). An unfinished turn is interrupted first and its thread
//! released once the turn has ended (its last usage report arrives before that), or after
//! `RELEASE_GRACE`. A retiring process (recycled) takes no new work and is killed once its
//! last turn is gone (it holds nothing by then).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::rpc::{self, Incoming, RpcError};
use crate::backend::agent::child::{Child, Output, EXIT_GRACE};
use crate::backend::{BackendError, HeldCall, Meter, TurnEvent};
use crate::config::AppServerConfig;
use crate::turn::Usage;

/// How long a request to the backend (handshake, thread/start, turn/start) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an interrupted turn gets to end before its thread is deleted anyway.
const RELEASE_GRACE: Duration = Duration::from_secs(10);

type Pending = HashMap<i64, oneshot::Sender<Result<Box<RawValue>, RpcError>>>;

/// The gateway side of one backend thread (= one execution's turn).
pub(super) struct Route {
    pub events: futures::channel::mpsc::UnboundedSender<TurnEvent>,
    /// Its held calls and streamed items, under one lock (a route sits behind every parked
    /// turn).
    calls: Mutex<Calls>,
    pub finished: AtomicBool,
    /// The execution let go of the thread before its turn ended: delete it when it does.
    releasing: AtomicBool,
    /// Client tools declared under another name (it would shadow a built-in): (declared,
    /// client's).
    pub renames: Vec<(String, String)>,
    /// Accounting: every usage report, whether or not the execution still listens.
    meter: Meter,
}

impl Route {
    pub fn new(
        events: futures::channel::mpsc::UnboundedSender<TurnEvent>,
        renames: Vec<(String, String)>,
        meter: Meter,
    ) -> Self {
        Route {
            renames,
            meter,
            releasing: AtomicBool::new(false),
            events,
            calls: Mutex::new(Calls::default()),
            finished: AtomicBool::new(false),
        }
    }

    pub fn take_held(&self, invocation: u64) -> Option<Value> {
        let held = &mut self.calls.lock().held;
        let pos = held.iter().position(|(i, _)| *i == invocation)?;
        Some(held.swap_remove(pos).1)
    }

    /// Notes `delta` as forwarded for agent-message `item`.
    fn streamed(&self, item: &str, delta: &str) {
        let streamed = &mut self.calls.lock().streamed;
        match streamed.iter_mut().find(|(id, _)| id == item) {
            Some((_, text)) => text.push_str(delta),
            None => {
                streamed.reserve_exact(1);
                streamed.push((item.to_string(), delta.to_string()));
            }
        }
    }

    /// The text forwarded for agent-message `item` (empty if none), forgotten.
    fn take_streamed(&self, item: &str) -> String {
        let streamed = &mut self.calls.lock().streamed;
        let Some(pos) = streamed.iter().position(|(id, _)| id == item) else {
            return String::new();
        };
        let (_, text) = streamed.swap_remove(pos);
        if streamed.is_empty() {
            *streamed = Vec::new();
        }
        text
    }

    fn emit(&self, ev: TurnEvent) {
        // A closed receiver means the execution is gone; the event has no one to reach.
        let _ = self.events.unbounded_send(ev);
    }
}

#[derive(Default)]
struct Calls {
    /// invocation -> the backend's JSON-RPC request id of the held `item/tool/call`.
    /// A short list: a turn holds a handful of calls at once.
    held: Vec<(u64, Value)>,
    /// Text already forwarded per agent-message item, to reconcile `item/completed`.
    /// A short list (an item at a time), freed when empty: thousands of turns are parked.
    streamed: Vec<(String, String)>,
}

pub(super) struct Proc {
    pub id: u64,
    child: Arc<Child>,
    pending: Mutex<Pending>,
    routes: Mutex<HashMap<Arc<str>, Arc<Route>>>,
    next_id: AtomicI64,
    next_invocation: Arc<AtomicU64>,
    pub active: AtomicUsize,
    pub user_agent: Mutex<String>,
    /// Threads started on this process (the recycle count).
    pub threads: AtomicU64,
    /// A replacement is being started.
    pub recycling: AtomicBool,
    /// Replaced: takes no new work and exits once its last turn is gone.
    retiring: AtomicBool,
}

impl Proc {
    /// Spawns the child, starts its tasks and completes the `initialize` handshake.
    pub async fn spawn(
        id: u64,
        cfg: &AppServerConfig,
        tracker: &TaskTracker,
        shutdown: &CancellationToken,
        next_invocation: Arc<AtomicU64>,
        deaths: Arc<tokio::sync::watch::Sender<u64>>,
    ) -> Result<Arc<Proc>, BackendError> {
        // CODEX_HOME must exist before the child starts.
        if let Some(home) = cfg.child.env.get("CODEX_HOME") {
            std::fs::create_dir_all(home)
                .map_err(|e| BackendError::Unavailable(format!("cannot create CODEX_HOME: {e}")))?;
        }
        let (child, io) = Child::spawn(id, &cfg.child, tracker, shutdown)?;
        let proc = Arc::new(Proc {
            id,
            child: child.clone(),
            pending: Mutex::new(HashMap::new()),
            routes: Mutex::new(HashMap::new()),
            next_id: AtomicI64::new(1),
            next_invocation,
            active: AtomicUsize::new(0),
            user_agent: Mutex::new(String::new()),
            threads: AtomicU64::new(0),
            recycling: AtomicBool::new(false),
            retiring: AtomicBool::new(false),
        });
        child.attach(io, proc.clone(), deaths);
        let init = proc
            .call(
                "initialize",
                json!({
                    "clientInfo": {"name": "turnstile", "title": "Turnstile", "version": env!("CARGO_PKG_VERSION")},
                    "capabilities": {"experimentalApi": true},
                }),
            )
            .await
            .map_err(|e| BackendError::Unavailable(format!("initialize failed: {e}")))?;
        let ua = rpc::string_at(&init, &["userAgent"]).unwrap_or_else(|| "unknown".into());
        tracing::info!(backend_process = id, user_agent = %ua, "backend initialized");
        proc.child.handshake_done();
        *proc.user_agent.lock() = ua;
        proc.send(rpc::notification("initialized"));
        Ok(proc)
    }

    pub fn is_alive(&self) -> bool {
        self.child.is_alive()
    }

    /// Alive and not replaced: may take new work (a kept thread may continue on it).
    pub fn takes_work(&self) -> bool {
        self.is_alive() && !self.retiring.load(Ordering::SeqCst)
    }

    /// Replaced by a fresh process: no new work; exits once drained.
    pub fn retire(&self) {
        self.retiring.store(true, Ordering::SeqCst);
        self.exit_if_drained();
    }

    /// A retiring process with no turn left (and no interrupted turn still reporting its
    /// last usage) closes its stdin, and the child exits.
    pub fn exit_if_drained(&self) {
        if self.retiring.load(Ordering::SeqCst)
            && self.active.load(Ordering::SeqCst) == 0
            && self.routes.lock().is_empty()
            && !self.child.is_closed()
        {
            tracing::info!(
                backend_process = self.id,
                "recycled backend process drained; closing it"
            );
            self.child.close();
        }
    }

    /// Unloads a thread and forgets its route.
    pub fn delete_thread(&self, thread: &str) {
        self.remove_route(thread);
        if self.is_alive() && !self.child.is_closed() {
            self.cast("thread/delete", json!({"threadId": thread}));
        }
        self.exit_if_drained();
    }

    /// The execution lets go of a thread: deleted now if its turn is over, else once the
    /// (just interrupted) turn has ended, or after `RELEASE_GRACE`.
    pub fn release_thread(self: &Arc<Self>, thread: &str, route: &Route) {
        if route.finished.load(Ordering::SeqCst) || !self.is_alive() {
            return self.delete_thread(thread);
        }
        route.releasing.store(true, Ordering::SeqCst);
        // The turn may have ended between the check and the flag: the reader saw no flag.
        if route.finished.load(Ordering::SeqCst) {
            return self.delete_thread(thread);
        }
        let (proc, thread) = (self.clone(), thread.to_string());
        self.child.spawn_task(async move {
            tokio::select! {
                _ = tokio::time::sleep(RELEASE_GRACE) => proc.delete_thread(&thread),
                _ = proc.child.dead().cancelled() => {}
                _ = proc.child.stopping().cancelled() => {}
            }
        });
    }

    pub fn send(&self, line: String) {
        self.child.send(line);
    }

    /// Sends a request and waits for its answer.
    pub async fn call(&self, method: &str, params: Value) -> Result<Box<RawValue>, BackendError> {
        if !self.is_alive() {
            return Err(BackendError::Lost);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = oneshot::channel();
        self.pending.lock().insert(id, tx);
        self.send(rpc::request(id, method, params));
        let answer = tokio::select! {
            r = tokio::time::timeout(REQUEST_TIMEOUT, &mut rx) => r,
            _ = self.child.dead().cancelled() => {
                // The lines a dying child wrote are still dispatched (its answer may be one
                // of them); the pending entry goes when the reader has seen them all.
                let r = tokio::time::timeout(EXIT_GRACE, &mut rx).await;
                self.pending.lock().remove(&id);
                match r {
                    Ok(Ok(answer)) => Ok(Ok(answer)),
                    _ => return Err(BackendError::Lost),
                }
            }
        };
        match answer {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(e))) => Err(BackendError::Rejected(format!(
                "{method}: {} ({})",
                e.message, e.code
            ))),
            Ok(Err(_)) => Err(BackendError::Lost),
            Err(_) => {
                self.pending.lock().remove(&id);
                Err(BackendError::Unavailable(format!("{method} timed out")))
            }
        }
    }

    /// Sends a request whose answer nobody waits for (e.g. `turn/interrupt` on cleanup).
    pub fn cast(&self, method: &str, params: Value) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.send(rpc::request(id, method, params));
    }

    pub fn add_route(&self, thread: Arc<str>, route: Arc<Route>) {
        self.routes.lock().insert(thread, route);
        if !self.is_alive() {
            // Died between thread/start and here: make sure the turn learns it.
            self.die("backend process exited");
        }
    }

    pub fn remove_route(&self, thread: &str) {
        self.routes.lock().remove(thread);
    }

    fn route(&self, thread: Option<&str>) -> Option<Arc<Route>> {
        self.routes.lock().get(thread?).cloned()
    }

    /// Marks the process dead: pending calls fail, routed turns are lost.
    fn die(&self, why: &str) {
        self.child.mark_dead();
        self.pending.lock().clear();
        let routes: Vec<_> = self.routes.lock().drain().map(|(_, r)| r).collect();
        for r in routes {
            if !r.finished.swap(true, Ordering::SeqCst) {
                r.emit(TurnEvent::Lost(why.to_string()));
            }
        }
    }
}

impl Output for Proc {
    /// One stdout line: a JSON-RPC message, or skipped.
    fn line(self: &Arc<Self>, line: &[u8]) {
        match std::str::from_utf8(line).ok().and_then(rpc::parse_line) {
            Some(msg) => self.dispatch(msg),
            None if !line.trim_ascii().is_empty() => {
                tracing::debug!(
                    backend_process = self.id,
                    bytes = line.len(),
                    "skipped a backend line that is not a JSON-RPC message"
                );
            }
            None => {}
        }
    }

    fn ended(&self, why: &str) {
        self.die(why);
    }
}

impl Proc {
    fn dispatch(self: &Arc<Self>, msg: Incoming) {
        match msg {
            Incoming::Response { id, result } => {
                let Some(id) = id.as_i64() else { return };
                if let Some(tx) = self.pending.lock().remove(&id) {
                    let _ = tx.send(result);
                }
            }
            Incoming::Notification { method, params } => self.on_notification(&method, &params),
            Incoming::Request { id, method, params } => self.on_request(id, &method, &params),
        }
    }

    /// A notification of a routed thread, its params read as typed members borrowed from
    /// the line (most of a turn's lines; only an ended command's or file change's item is
    /// built as a tree).
    fn on_notification(&self, method: &str, p: &rpc::Params<'_>) {
        let thread = rpc::text(p.thread_id);
        let Some(route) = self.route(thread.as_deref()) else {
            return;
        };
        match method {
            "item/agentMessage/delta" => {
                let (Some(item), Some(delta)) = (rpc::text(p.item_id), rpc::text(p.delta)) else {
                    return;
                };
                if delta.is_empty() {
                    return;
                }
                route.streamed(&item, &delta);
                route.emit(TurnEvent::Delta(delta.into_owned()));
            }
            // Reasoning summaries; a new part after the first is a new paragraph.
            "item/reasoning/summaryTextDelta" => {
                if let Some(d) = rpc::text(p.delta).filter(|d| !d.is_empty()) {
                    route.emit(TurnEvent::Reasoning(d.into_owned()));
                }
            }
            "item/reasoning/summaryPartAdded" if rpc::number(p.summary_index) > Some(0) => {
                route.emit(TurnEvent::Reasoning("\n\n".into()));
            }
            "item/completed" => {
                let item: rpc::Item<'_> = rpc::members(p.item);
                let kind = rpc::text(item.kind);
                if kind.as_deref() != Some("agentMessage") {
                    if matches!(kind.as_deref(), Some("commandExecution" | "fileChange")) {
                        let tree = p.item.and_then(|i| serde_json::from_str(i.get()).ok());
                        if let Some(ended) = tree.and_then(|t| super::approval::ended(&t)) {
                            route.emit(TurnEvent::ToolEnded(ended));
                        }
                    }
                    return;
                }
                let (Some(id), Some(text)) = (rpc::text(item.id), rpc::text(item.text)) else {
                    return;
                };
                // The completed item is authoritative: forward whatever the deltas missed.
                let sent = route.take_streamed(&id);
                if let Some(rest) = text.strip_prefix(sent.as_str()) {
                    if !rest.is_empty() {
                        route.emit(TurnEvent::Delta(rest.to_string()));
                    }
                }
            }
            "thread/tokenUsage/updated" => {
                let usage: rpc::TokenUsage<'_> = rpc::members(p.token_usage);
                let last: rpc::Counts<'_> = rpc::members(usage.last);
                let n = |v| rpc::number(v).unwrap_or(0);
                let usage = Usage {
                    prompt_tokens: n(last.input_tokens),
                    completion_tokens: n(last.output_tokens),
                    total_tokens: n(last.total_tokens),
                    cached_tokens: n(last.cached_input_tokens),
                    reasoning_tokens: n(last.reasoning_output_tokens),
                    // Codex's token usage reports cache reads only.
                    cache_write_tokens: 0,
                };
                (route.meter)(usage);
                route.emit(TurnEvent::Usage(usage));
            }
            "error" if rpc::flag(p.will_retry) == Some(false) => {
                tracing::warn!(backend_process = self.id, "backend reported a turn error");
            }
            "turn/completed" => {
                let released = route.releasing.load(Ordering::SeqCst);
                if released {
                    if let Some(thread) = thread.as_deref() {
                        self.delete_thread(thread);
                    }
                }
                if route.finished.swap(true, Ordering::SeqCst) || released {
                    return;
                }
                let turn: rpc::Turn<'_> = rpc::members(p.turn);
                let ev = match rpc::text(turn.status).as_deref() {
                    Some("completed") => TurnEvent::Completed,
                    Some("interrupted") => TurnEvent::Interrupted,
                    _ => {
                        let error: rpc::TurnError<'_> = rpc::members(turn.error);
                        let message = rpc::text(error.message);
                        TurnEvent::Failed(message.as_deref().unwrap_or("turn failed").to_string())
                    }
                };
                route.emit(ev);
            }
            _ => {}
        }
    }

    fn on_request(self: &Arc<Self>, id: Value, method: &str, params: &Value) {
        let route = self.route(params.get("threadId").and_then(Value::as_str));
        match (method, route) {
            ("item/tool/call", Some(route)) if !route.finished.load(Ordering::SeqCst) => {
                let invocation = self.next_invocation.fetch_add(1, Ordering::Relaxed);
                let tool = params
                    .get("tool")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let name = match params.get("namespace").and_then(Value::as_str) {
                    Some(ns) if !ns.is_empty() => format!("{ns}.{tool}"),
                    _ => tool.to_string(),
                };
                let name = match route.renames.iter().find(|(declared, _)| *declared == name) {
                    Some((_, client)) => client.clone(),
                    None => name,
                };
                let arguments = match params.get("arguments") {
                    None | Some(Value::Null) => "{}".to_string(),
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                };
                let mut calls = route.calls.lock();
                let held = &mut calls.held;
                // Exact growth: a turn usually holds one call, and thousands may be parked.
                held.reserve_exact(1);
                held.push((invocation, id));
                route.emit(TurnEvent::ToolCall(HeldCall {
                    invocation,
                    name,
                    arguments,
                }));
            }
            ("item/tool/call", None) | ("item/tool/call", Some(_)) => {
                self.send(rpc::error_response(
                    &id,
                    -32000,
                    "no live execution for this thread",
                ));
            }
            (
                "item/commandExecution/requestApproval"
                | "item/fileChange/requestApproval"
                | "item/permissions/requestApproval"
                | "mcpServer/elicitation/request",
                route,
            ) => {
                let proc = Arc::downgrade(self);
                let reply = move |answer| {
                    if let Some(p) = proc.upgrade() {
                        p.send(rpc::response(&id, answer));
                    }
                };
                let ask = super::approval::ask(method, params, reply);
                match route.filter(|r| !r.finished.load(Ordering::SeqCst)) {
                    Some(route) => route.emit(TurnEvent::Approval(Box::new(ask))),
                    // No execution owns the thread: the responder's drop declines.
                    None => drop(ask),
                }
            }
            _ => {
                tracing::debug!(
                    backend_process = self.id,
                    method,
                    "unknown backend request answered -32601"
                );
                self.send(rpc::error_response(
                    &id,
                    -32601,
                    &format!("method not supported by this client: {method}"),
                ));
            }
        }
    }
}
