//! The `codex app-server` backend: a warm pool of child processes speaking JSON-RPC over stdio.
//!
//! Each execution gets its own thread (never shared between principals or running
//! executions) on the least-loaded live process, and holds one of `max_sessions` permits for
//! as long as its turn lives, suspended or not. When all permits are taken a new turn waits up
//! to `acquire_timeout`, then fails with `BackendError::Capacity`. A completed turn's thread
//! may be kept idle (no permit) for the same conversation's next execution, which then sends
//! only the new messages (`LegRequest::kept`). A dead process is reaped by its supervisor and
//! replaced on the next turn; a process that has started `recycle_after_threads` threads is
//! replaced by a fresh one started in the background, and drains (`thread.rs`, `process.rs`).

mod approval;
mod process;
pub mod rpc;
mod thread;

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::process::{Proc, Route};
use self::thread::{AppServerTurn, KeptThread};
use super::agent::pool::Permits;
use super::agent::render;
use super::{
    Backend, BackendError, BackendInfo, Hold, Holds, LegRequest, Resume, SessionStats, Turn,
};
use crate::config::AppServerConfig;
use crate::turn::{ToolDef, TurnInput};

pub struct AppServer {
    name: String,
    /// The backend itself, for the task that starts a replacement process in the background.
    me: Weak<AppServer>,
    cfg: AppServerConfig,
    procs: Mutex<Vec<Option<Arc<Proc>>>>,
    /// Serialises spawning so that a burst of requests starts one replacement, not many.
    spawn_lock: tokio::sync::Mutex<()>,
    permits: Permits,
    next_proc: AtomicU64,
    next_invocation: Arc<AtomicU64>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    /// Counts process deaths, so the engine settles the held turns of a dead process at once.
    deaths: Arc<tokio::sync::watch::Sender<u64>>,
}

impl AppServer {
    /// Starts every process of the pool and completes their handshakes, so a backend that
    /// cannot start is refused at gateway startup rather than mid-request.
    pub async fn start(name: &str, cfg: AppServerConfig) -> Result<Arc<AppServer>, BackendError> {
        let server = Arc::new_cyclic(|me| AppServer {
            name: name.to_string(),
            me: me.clone(),
            procs: Mutex::new(vec![None; cfg.processes]),
            permits: Permits::new(cfg.max_sessions, cfg.acquire_timeout),
            cfg,
            spawn_lock: tokio::sync::Mutex::new(()),
            next_proc: AtomicU64::new(1),
            next_invocation: Arc::new(AtomicU64::new(1)),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            deaths: Arc::new(tokio::sync::watch::Sender::new(0)),
        });
        let (_, first) = server.live_proc().await?;
        // Version guard: a backend that cannot take dynamic tools is refused now, not
        // mid-request. The probe thread never gets a turn.
        let probe = first
            .call(
                "thread/start",
                json!({"ephemeral": false, "dynamicTools": [{
                    "type": "function", "name": "turnstile_probe",
                    "description": "Startup probe; never called.",
                    "inputSchema": {"type": "object", "properties": {}},
                }]}),
            )
            .await
            .map_err(|e| {
                BackendError::Unavailable(format!("thread/start with dynamicTools failed: {e}"))
            })?;
        if let Some(thread) = rpc::string_at(&probe, &["thread", "id"]) {
            first.delete_thread(&thread);
        }
        // Warm the rest of the pool.
        for i in 0..server.cfg.processes {
            server.ensure_slot(i).await?;
        }
        Ok(server)
    }

    /// The backend's `userAgent` as reported by `initialize` (carries its version).
    fn user_agent(&self) -> Option<String> {
        let procs = self.procs.lock();
        procs
            .iter()
            .flatten()
            .map(|p| p.user_agent.lock().clone())
            .next()
    }

    async fn spawn_proc(&self) -> Result<Arc<Proc>, BackendError> {
        if self.shutdown.is_cancelled() {
            return Err(BackendError::Unavailable("shutting down".into()));
        }
        let id = self.next_proc.fetch_add(1, Ordering::Relaxed);
        Proc::spawn(
            id,
            &self.cfg,
            &self.tracker,
            &self.shutdown,
            self.next_invocation.clone(),
            self.deaths.clone(),
        )
        .await
        .inspect_err(|e| tracing::error!(backend = %self.name, error = %e, "backend process failed to start"))
    }

    fn slot(&self, i: usize) -> Option<Arc<Proc>> {
        self.procs.lock()[i].clone()
    }

    async fn ensure_slot(&self, i: usize) -> Result<Arc<Proc>, BackendError> {
        if let Some(p) = self.slot(i).filter(|p| p.is_alive()) {
            return Ok(p);
        }
        let p = self.spawn_proc().await?;
        self.procs.lock()[i] = Some(p.clone());
        Ok(p)
    }

    /// A live process with the fewest active threads (and its slot), replacing dead ones
    /// first.
    async fn live_proc(&self) -> Result<(usize, Arc<Proc>), BackendError> {
        let _spawning = self.spawn_lock.lock().await;
        let mut best: Option<(usize, Arc<Proc>)> = None;
        let mut last_err = None;
        for i in 0..self.cfg.processes {
            match self.ensure_slot(i).await {
                Ok(p) => {
                    let better = best.as_ref().is_none_or(|(_, b)| {
                        p.active.load(Ordering::Relaxed) < b.active.load(Ordering::Relaxed)
                    });
                    if better {
                        best = Some((i, p));
                    }
                }
                Err(e) => last_err = Some(e),
            }
        }
        best.ok_or_else(|| {
            last_err.unwrap_or_else(|| BackendError::Unavailable("no process".into()))
        })
    }

    /// Starts a fresh process for `slot` in the background; once it is ready it takes the
    /// slot, and `old` retires (no new work, exits when drained). Until then `old` serves.
    fn recycle(&self, slot: usize, old: &Arc<Proc>) {
        if old.recycling.swap(true, Ordering::SeqCst) {
            return;
        }
        let (Some(me), old) = (self.me.upgrade(), old.clone()) else {
            return;
        };
        self.tracker.spawn(async move {
            let _spawning = me.spawn_lock.lock().await;
            if !me.slot(slot).is_some_and(|p| Arc::ptr_eq(&p, &old)) {
                return; // It died and was replaced meanwhile.
            }
            match me.spawn_proc().await {
                Ok(new) => {
                    me.procs.lock()[slot] = Some(new.clone());
                    tracing::info!(
                        backend = %me.name, old_process = old.id, new_process = new.id,
                        threads = old.threads.load(Ordering::Relaxed),
                        "backend process recycled; the old one drains"
                    );
                    old.retire();
                }
                Err(_) => old.recycling.store(false, Ordering::SeqCst),
            }
        });
    }

    async fn open_turn(&self, leg: LegRequest<'_>) -> Result<Turn, BackendError> {
        let LegRequest {
            execution_id,
            principal: _,
            model,
            input,
            meter,
            kept,
            traceparent: _,
        } = leg;
        // A kept thread on a process that still takes work continues; else a fresh thread.
        let kept = kept
            .and_then(|k| {
                let any: Box<dyn std::any::Any + Send + Sync> = k.thread.0;
                Some((*any.downcast::<KeptThread>().ok()?, k.from))
            })
            .filter(|(t, _)| t.proc.takes_work());
        let rendered = match &kept {
            Some((_, from)) => render::Rendered {
                instructions: None,
                history: None,
                input: render::continued(&input.messages[*from..])?,
            },
            None => render::render(&input.messages)?,
        };
        let permit = self.permits.acquire().await?;
        // From here on the guard gives the slot back and releases the thread on every path.
        let (mut turn, thread, renames) = match kept {
            Some((kept, _)) => {
                let (proc, thread, renames) = kept.take();
                (AppServerTurn::new(proc, permit), thread, renames)
            }
            None => {
                let (slot, proc) = self.live_proc().await?;
                let turn = AppServerTurn::new(proc, permit);
                let renames = renames(
                    input.tools.as_deref().unwrap_or_default(),
                    &self.cfg.reserved_tool_names,
                );
                let params = self.thread_params(model, input, &rendered, &renames);
                let started = turn.proc.call("thread/start", params).await?;
                let thread: Arc<str> = rpc::string_at(&started, &["thread", "id"])
                    .ok_or_else(|| {
                        BackendError::Rejected("thread/start returned no thread id".into())
                    })?
                    .into();
                let started = turn.proc.threads.fetch_add(1, Ordering::Relaxed) + 1;
                if started >= self.cfg.recycle_after_threads {
                    self.recycle(slot, &turn.proc);
                }
                (turn, thread, renames)
            }
        };
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let route = Arc::new(Route::new(tx, renames, meter));
        turn.proc.add_route(thread.clone(), route.clone());
        turn.thread = thread;
        turn.route = Some(route);
        let mut items = Vec::new();
        if let Some(h) = &rendered.history {
            items.push(json!({"type": "text", "text": h, "text_elements": []}));
        }
        for text in &rendered.input {
            items.push(json!({"type": "text", "text": text, "text_elements": []}));
        }
        let mut params = json!({"threadId": &*turn.thread, "input": items});
        if let Some(e) = input.effort {
            params["effort"] = json!(e.as_str());
        }
        // This turn only: the final answer in the client's schema (checked by `validate`).
        let format = input.sampling.response_format.as_ref();
        if let Some(schema) = format.and_then(super::agent::output_schema) {
            params["outputSchema"] = schema.clone();
        }
        let result = turn.proc.call("turn/start", params).await?;
        turn.turn = rpc::string_at(&result, &["turn", "id"]).unwrap_or_default();
        tracing::debug!(backend = %self.name, execution = %execution_id, backend_process = turn.proc.id, "backend turn started");
        Ok(Turn::new(rx, Box::new(turn)))
    }

    /// `thread/start`: the model's settings, the instructions and the client's tools.
    fn thread_params(
        &self,
        model: &crate::config::ModelConfig,
        input: &TurnInput,
        rendered: &render::Rendered,
        renames: &[(String, String)],
    ) -> Value {
        // Persisted, not ephemeral: only a persisted thread can be unloaded (`thread/delete`).
        let mut params = Map::new();
        params.insert("ephemeral".into(), json!(false));
        if let Some(m) = &model.backend_model {
            params.insert("model".into(), json!(m));
        }
        if let Some(cwd) = input.cwd.as_ref().or(self.cfg.child.cwd.as_ref()) {
            params.insert("cwd".into(), json!(cwd.display().to_string()));
        }
        if let Some(p) = &model.codex.approval_policy {
            params.insert("approvalPolicy".into(), json!(p));
        }
        if let Some(s) = &model.codex.sandbox {
            params.insert("sandbox".into(), json!(s));
        }
        if let Some(i) = &rendered.instructions {
            params.insert("developerInstructions".into(), json!(i));
        }
        let tools = input.tools.as_deref().unwrap_or_default();
        if !tools.is_empty() {
            let tools: Vec<Value> = tools
                .iter()
                .map(|t| {
                    let name = renames
                        .iter()
                        .find(|(_, client)| *client == t.name)
                        .map_or(&t.name, |(declared, _)| declared);
                    json!({"type": "function", "name": name, "description": t.description,
                           "inputSchema": t.parameters})
                })
                .collect();
            params.insert("dynamicTools".into(), Value::Array(tools));
        }
        Value::Object(params)
    }
}

impl Backend for AppServer {
    fn describe(&self) -> BackendInfo {
        BackendInfo {
            kind: "app-server",
            provider: "openai",
            holds: Holds::Turn,
        }
    }

    fn version(&self) -> Option<String> {
        self.user_agent()
    }

    fn ready(&self) -> bool {
        self.stats().processes_alive > 0
    }

    fn validate(&self, input: &TurnInput) -> Result<(), BackendError> {
        super::agent::validate(input, "app-server", super::agent::Structured::Schema)
    }

    fn start<'a>(&'a self, leg: LegRequest<'a>) -> BoxFuture<'a, Result<Turn, BackendError>> {
        Box::pin(self.open_turn(leg))
    }

    fn resume<'a>(
        &'a self,
        hold: Hold,
        r: Resume<'a>,
    ) -> BoxFuture<'a, Result<Turn, BackendError>> {
        Box::pin(super::agent::answer(&self.name, hold, r))
    }

    fn deaths(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.deaths.subscribe())
    }

    fn stats(&self) -> SessionStats {
        let procs = self.procs.lock();
        SessionStats {
            busy: self.permits.busy(),
            capacity: self.permits.capacity(),
            processes_alive: procs.iter().flatten().filter(|p| p.is_alive()).count(),
            ..SessionStats::default()
        }
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.permits.close();
            self.shutdown.cancel();
            self.tracker.close();
            self.tracker.wait().await;
        })
    }
}

/// The client tools whose names would shadow one of the backend's built-ins
/// (`reserved_tool_names`), each with the name it is declared under instead: `client_<name>`
/// (then `_2`, `_3`, ... until it is free). Calls come back under the client's name.
fn renames(tools: &[ToolDef], reserved: &[String]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for t in tools.iter().filter(|t| reserved.contains(&t.name)) {
        let base = format!("client_{}", t.name);
        let mut declared = base.clone();
        let mut n = 1;
        let taken = |name: &str, out: &[(String, String)]| {
            tools.iter().any(|t| t.name == name)
                || reserved.iter().any(|r| r == name)
                || out.iter().any(|(d, _)| d == name)
        };
        while taken(&declared, &out) {
            n += 1;
            declared = format!("{base}_{n}");
        }
        out.push((declared, t.name.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> ToolDef {
        ToolDef {
            name: name.into(),
            description: String::new(),
            parameters: json!({}),
        }
    }

    #[test]
    fn colliding_tools_get_a_free_name() {
        let tools = [tool("view_image"), tool("client_view_image"), tool("read")];
        let reserved = ["view_image".to_string(), "exec_command".to_string()];
        assert_eq!(
            renames(&tools, &reserved),
            [("client_view_image_2".to_string(), "view_image".to_string())]
        );
        assert!(renames(&[tool("read")], &reserved).is_empty());
    }
}
