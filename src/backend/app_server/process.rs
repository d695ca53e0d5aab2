//! One `codex app-server` child process: spawn, handshake, a writer task that owns stdin, a
//! reader task that classifies stdout lines and routes them to the thread they belong to, and a
//! supervisor task that reaps the child. When the child dies, every pending request fails and
//! every routed thread receives `TurnEvent::Lost`.
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::rpc::{self, Incoming, RpcError};
use crate::backend::{BackendError, HeldCall, Meter, TurnEvent};
use crate::config::BackendConfig;
use crate::turn::Usage;

/// How long a request to the backend (handshake, thread/start, turn/start) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a child gets to exit after stdin closes before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);
/// How long an interrupted turn gets to end before its thread is deleted anyway.
const RELEASE_GRACE: Duration = Duration::from_secs(10);

type Pending = HashMap<i64, oneshot::Sender<Result<Value, RpcError>>>;

/// The gateway side of one backend thread (= one execution's turn).
pub(super) struct Route {
    pub events: futures::channel::mpsc::UnboundedSender<TurnEvent>,
    /// invocation -> the backend's JSON-RPC request id of the held `item/tool/call`.
    /// A short list: a turn holds a handful of calls at once.
    held: Mutex<Vec<(u64, Value)>>,
    /// Text already forwarded per agent-message item, to reconcile `item/completed`.
    streamed: Mutex<HashMap<String, String>>,
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
            held: Mutex::new(Vec::new()),
            streamed: Mutex::new(HashMap::new()),
            finished: AtomicBool::new(false),
        }
    }

    pub fn take_held(&self, invocation: u64) -> Option<Value> {
        let mut held = lock(&self.held);
        let pos = held.iter().position(|(i, _)| *i == invocation)?;
        Some(held.swap_remove(pos).1)
    }

    fn emit(&self, ev: TurnEvent) {
        // A closed receiver means the execution is gone; the event has no one to reach.
        let _ = self.events.unbounded_send(ev);
    }
}

pub(super) struct Proc {
    pub id: u64,
    out: mpsc::UnboundedSender<String>,
    pending: Mutex<Pending>,
    routes: Mutex<HashMap<String, Arc<Route>>>,
    next_id: AtomicI64,
    next_invocation: Arc<AtomicU64>,
    pub dead: CancellationToken,
    /// Cancelled when the reader has seen the end of stdout (every line dispatched).
    reader_done: CancellationToken,
    pub active: AtomicUsize,
    pub user_agent: Mutex<String>,
    /// Threads started on this process (the recycle count).
    pub threads: AtomicU64,
    /// A replacement is being started.
    pub recycling: AtomicBool,
    /// Replaced: takes no new work and exits once its last turn is gone.
    retiring: AtomicBool,
    /// Cancelled to close stdin (the child then exits on its own).
    close: CancellationToken,
    stop: CancellationToken,
    tracker: TaskTracker,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked mid-update of a plain map; the map
    // itself is still usable, and refusing service would be worse.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Proc {
    /// Spawns the child, starts its tasks and completes the `initialize` handshake.
    pub async fn spawn(
        id: u64,
        cfg: &BackendConfig,
        tracker: &TaskTracker,
        shutdown: &CancellationToken,
        next_invocation: Arc<AtomicU64>,
        deaths: Arc<tokio::sync::watch::Sender<u64>>,
    ) -> Result<Arc<Proc>, BackendError> {
        let mut cmd = super::child::command(cfg)?;
        let mut child = cmd.spawn().map_err(|e| {
            BackendError::Unavailable(format!("cannot start {}: {e}", cfg.command[0]))
        })?;
        let pid = child.id();
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(BackendError::Unavailable("child stdio not piped".into()));
        };
        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<String>();
        let proc = Arc::new(Proc {
            id,
            out: out_tx,
            pending: Mutex::new(HashMap::new()),
            routes: Mutex::new(HashMap::new()),
            next_id: AtomicI64::new(1),
            next_invocation,
            dead: CancellationToken::new(),
            reader_done: CancellationToken::new(),
            active: AtomicUsize::new(0),
            user_agent: Mutex::new(String::new()),
            threads: AtomicU64::new(0),
            recycling: AtomicBool::new(false),
            retiring: AtomicBool::new(false),
            close: CancellationToken::new(),
            stop: shutdown.clone(),
            tracker: tracker.clone(),
        });
        tracing::info!(backend_process = id, pid, "backend process started");

        // Writer: the only owner of stdin. Closing stdin (on shutdown or death) asks the child
        // to exit.
        let (dead, stop, close) = (proc.dead.clone(), shutdown.clone(), proc.close.clone());
        tracker.spawn(async move {
            loop {
                tokio::select! {
                    line = out_rx.recv() => {
                        let Some(line) = line else { break };
                        if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                            break;
                        }
                    }
                    _ = dead.cancelled() => break,
                    _ = stop.cancelled() => break,
                    _ = close.cancelled() => break,
                }
            }
            drop(stdin);
        });

        let initialized = super::child::forward_stderr(tracker, id, stderr);

        // Reader: classifies and routes every stdout line.
        let reader_proc = proc.clone();
        tracker.spawn(async move {
            let mut reader = BufReader::with_capacity(64 * 1024, stdout);
            let mut lines = rpc::Lines::new(rpc::MAX_LINE_BYTES);
            loop {
                let chunk = match reader.fill_buf().await {
                    Ok([]) | Err(_) => break,
                    Ok(chunk) => chunk,
                };
                let (n, dropped) = (chunk.len(), lines.dropped);
                lines.push(chunk, |line| {
                    let msg = std::str::from_utf8(line).ok().and_then(rpc::parse_line);
                    match msg {
                        Some(msg) => reader_proc.dispatch(msg),
                        None if !line.trim_ascii().is_empty() => {
                            tracing::debug!(
                                backend_process = id,
                                bytes = line.len(),
                                "skipped a backend line that is not a JSON-RPC message"
                            );
                        }
                        None => {}
                    }
                });
                reader.consume(n);
                if lines.dropped > dropped {
                    tracing::warn!(
                        backend_process = id,
                        max_bytes = rpc::MAX_LINE_BYTES,
                        "dropped a backend line over the line bound"
                    );
                }
            }
            reader_proc.die("backend closed its output");
            reader_proc.reader_done.cancel();
        });

        // Supervisor: reaps the child, killing it if it outlives the shutdown grace period.
        let (sup_proc, stop, close) = (proc.clone(), shutdown.clone(), proc.close.clone());
        tracker.spawn(async move {
            let status = tokio::select! {
                status = child.wait() => status.ok(),
                // A drained, retiring process holds nothing: it is killed at once (Codex takes
                // 1 to 4 s to exit on stdin EOF, and meanwhile the fresh process warms up
                // beside it, two processes' memory at once).
                _ = close.cancelled() => {
                    let _ = child.start_kill();
                    child.wait().await.ok()
                }
                _ = stop.cancelled() => {
                    match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
                        Ok(status) => status.ok(),
                        Err(_) => {
                            let _ = child.start_kill();
                            child.wait().await.ok()
                        }
                    }
                }
            };
            tracing::info!(backend_process = id, pid, status = ?status, "backend process exited");
            // Dead for new work at once, but the lines it wrote before exiting are delivered
            // before its turns learn they are lost: the reader settles them at end of output.
            // A grandchild holding stdout open must not delay that forever.
            sup_proc.dead.cancel();
            let _ = tokio::time::timeout(EXIT_GRACE, sup_proc.reader_done.cancelled()).await;
            sup_proc.die("backend process exited");
            deaths.send_modify(|n| *n += 1);
        });

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
        let ua = init
            .get("userAgent")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string();
        tracing::info!(backend_process = id, user_agent = %ua, "backend initialized");
        initialized.store(true, std::sync::atomic::Ordering::Relaxed);
        *lock(&proc.user_agent) = ua;
        proc.send(rpc::notification("initialized"));
        Ok(proc)
    }

    pub fn is_alive(&self) -> bool {
        !self.dead.is_cancelled()
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
            && lock(&self.routes).is_empty()
            && !self.close.is_cancelled()
        {
            tracing::info!(
                backend_process = self.id,
                "recycled backend process drained; closing it"
            );
            self.close.cancel();
        }
    }

    /// Unloads a thread and forgets its route.
    pub fn delete_thread(&self, thread: &str) {
        self.remove_route(thread);
        if self.is_alive() && !self.close.is_cancelled() {
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
        self.tracker.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(RELEASE_GRACE) => proc.delete_thread(&thread),
                _ = proc.dead.cancelled() => {}
                _ = proc.stop.cancelled() => {}
            }
        });
    }

    pub fn send(&self, line: String) {
        // If the writer is gone the process is dead and the reader reports it.
        let _ = self.out.send(line);
    }

    /// Sends a request and waits for its answer.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, BackendError> {
        if !self.is_alive() {
            return Err(BackendError::Lost);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        self.send(rpc::request(id, method, params));
        let answer = tokio::select! {
            r = tokio::time::timeout(REQUEST_TIMEOUT, &mut rx) => r,
            _ = self.dead.cancelled() => {
                // The lines a dying child wrote are still dispatched (its answer may be one
                // of them); the pending entry goes when the reader has seen them all.
                let r = tokio::time::timeout(EXIT_GRACE, &mut rx).await;
                lock(&self.pending).remove(&id);
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
                lock(&self.pending).remove(&id);
                Err(BackendError::Unavailable(format!("{method} timed out")))
            }
        }
    }

    /// Sends a request whose answer nobody waits for (e.g. `turn/interrupt` on cleanup).
    pub fn cast(&self, method: &str, params: Value) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.send(rpc::request(id, method, params));
    }

    pub fn add_route(&self, thread: &str, route: Arc<Route>) {
        lock(&self.routes).insert(thread.to_string(), route);
        if !self.is_alive() {
            // Died between thread/start and here: make sure the turn learns it.
            self.die("backend process exited");
        }
    }

    pub fn remove_route(&self, thread: &str) {
        lock(&self.routes).remove(thread);
    }

    fn route(&self, params: &Value) -> Option<Arc<Route>> {
        let thread = params.get("threadId")?.as_str()?;
        lock(&self.routes).get(thread).cloned()
    }

    /// Marks the process dead: pending calls fail, routed turns are lost.
    fn die(&self, why: &str) {
        self.dead.cancel();
        lock(&self.pending).clear();
        let routes: Vec<_> = lock(&self.routes).drain().map(|(_, r)| r).collect();
        for r in routes {
            if !r.finished.swap(true, Ordering::SeqCst) {
                r.emit(TurnEvent::Lost(why.to_string()));
            }
        }
    }

    fn dispatch(self: &Arc<Self>, msg: Incoming) {
        match msg {
            Incoming::Response { id, result } => {
                let Some(id) = id.as_i64() else { return };
                if let Some(tx) = lock(&self.pending).remove(&id) {
                    let _ = tx.send(result);
                }
            }
            Incoming::Notification { method, params } => self.on_notification(&method, &params),
            Incoming::Request { id, method, params } => self.on_request(id, &method, &params),
        }
    }

    fn on_notification(&self, method: &str, params: &Value) {
        let Some(route) = self.route(params) else {
            return;
        };
        match method {
            "item/agentMessage/delta" => {
                let (Some(item), Some(delta)) = (
                    params.get("itemId").and_then(Value::as_str),
                    params.get("delta").and_then(Value::as_str),
                ) else {
                    return;
                };
                if delta.is_empty() {
                    return;
                }
                lock(&route.streamed)
                    .entry(item.to_string())
                    .or_default()
                    .push_str(delta);
                route.emit(TurnEvent::Delta(delta.to_string()));
            }
            // Reasoning summaries; a new part after the first is a new paragraph.
            "item/reasoning/summaryTextDelta" => {
                if let Some(d) = params["delta"].as_str().filter(|d| !d.is_empty()) {
                    route.emit(TurnEvent::Reasoning(d.to_string()));
                }
            }
            "item/reasoning/summaryPartAdded" if params["summaryIndex"].as_u64() > Some(0) => {
                route.emit(TurnEvent::Reasoning("\n\n".into()));
            }
            "item/completed" => {
                let item = &params["item"];
                if item.get("type").and_then(Value::as_str) != Some("agentMessage") {
                    return;
                }
                let (Some(id), Some(text)) = (
                    item.get("id").and_then(Value::as_str),
                    item.get("text").and_then(Value::as_str),
                ) else {
                    return;
                };
                // The completed item is authoritative: forward whatever the deltas missed.
                let sent = lock(&route.streamed).remove(id).unwrap_or_default();
                if let Some(rest) = text.strip_prefix(sent.as_str()) {
                    if !rest.is_empty() {
                        route.emit(TurnEvent::Delta(rest.to_string()));
                    }
                }
            }
            "thread/tokenUsage/updated" => {
                let last = &params["tokenUsage"]["last"];
                let n = |k: &str| last.get(k).and_then(Value::as_u64).unwrap_or(0);
                let usage = Usage {
                    prompt_tokens: n("inputTokens"),
                    completion_tokens: n("outputTokens"),
                    total_tokens: n("totalTokens"),
                    cached_tokens: n("cachedInputTokens"),
                    reasoning_tokens: n("reasoningOutputTokens"),
                    // Codex's token usage reports cache reads only.
                    cache_write_tokens: 0,
                };
                (route.meter)(usage);
                route.emit(TurnEvent::Usage(usage));
            }
            "error" if params.get("willRetry").and_then(Value::as_bool) == Some(false) => {
                tracing::warn!(backend_process = self.id, "backend reported a turn error");
            }
            "turn/completed" => {
                let released = route.releasing.load(Ordering::SeqCst);
                if released {
                    if let Some(thread) = params.get("threadId").and_then(Value::as_str) {
                        self.delete_thread(thread);
                    }
                }
                if route.finished.swap(true, Ordering::SeqCst) || released {
                    return;
                }
                let turn = &params["turn"];
                let ev = match turn.get("status").and_then(Value::as_str) {
                    Some("completed") => TurnEvent::Completed,
                    Some("interrupted") => TurnEvent::Interrupted,
                    _ => TurnEvent::Failed(
                        turn["error"]["message"]
                            .as_str()
                            .unwrap_or("turn failed")
                            .to_string(),
                    ),
                };
                route.emit(ev);
            }
            _ => {}
        }
    }

    fn on_request(self: &Arc<Self>, id: Value, method: &str, params: &Value) {
        let route = self.route(params);
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
                let mut held = lock(&route.held);
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
                let ask = super::approval::ask(self, id, method, params);
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
