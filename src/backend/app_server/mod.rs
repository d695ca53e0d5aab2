//! The `codex app-server` backend: a warm pool of child processes speaking JSON-RPC over stdio.
//!
//! Each execution gets its own ephemeral thread (never shared between executions or
//! principals) on the least-loaded live process, and holds one of `max_sessions` permits for
//! as long as its turn lives, suspended or not. When all permits are taken a new turn waits up
//! to `acquire_timeout`, then fails with `BackendError::Capacity`. A dead process is reaped
//! by its supervisor and replaced on the next turn.

mod process;
mod render;
pub mod rpc;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::process::{Proc, Route};
use super::{
    Backend, BackendError, BackendKind, Hold, LegRequest, Resume, SessionStats, Turn, TurnControl,
};
use crate::config::BackendConfig;
use crate::turn::{ToolChoice, ToolDef, TurnInput};

pub struct AppServer {
    name: String,
    cfg: BackendConfig,
    procs: Mutex<Vec<Option<Arc<Proc>>>>,
    /// Serialises spawning so that a burst of requests starts one replacement, not many.
    spawn_lock: tokio::sync::Mutex<()>,
    permits: Arc<Semaphore>,
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
    pub async fn start(name: &str, cfg: BackendConfig) -> Result<Arc<AppServer>, BackendError> {
        let server = Arc::new(AppServer {
            name: name.to_string(),
            procs: Mutex::new(vec![None; cfg.processes]),
            permits: Arc::new(Semaphore::new(cfg.max_sessions)),
            cfg,
            spawn_lock: tokio::sync::Mutex::new(()),
            next_proc: AtomicU64::new(1),
            next_invocation: Arc::new(AtomicU64::new(1)),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            deaths: Arc::new(tokio::sync::watch::Sender::new(0)),
        });
        let first = server.live_proc().await?;
        // Version guard: a backend that cannot take dynamic tools is refused now, not
        // mid-request. The probe thread is ephemeral and never gets a turn.
        first
            .call(
                "thread/start",
                json!({"ephemeral": true, "dynamicTools": [{
                    "type": "function", "name": "turnstile_probe",
                    "description": "Startup probe; never called.",
                    "inputSchema": {"type": "object", "properties": {}},
                }]}),
            )
            .await
            .map_err(|e| {
                BackendError::Unavailable(format!("thread/start with dynamicTools failed: {e}"))
            })?;
        // Warm the rest of the pool.
        for i in 0..server.cfg.processes {
            server.ensure_slot(i).await?;
        }
        Ok(server)
    }

    /// The backend's `userAgent` as reported by `initialize` (carries its version).
    pub fn user_agent(&self) -> Option<String> {
        let procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        procs
            .iter()
            .flatten()
            .map(|p| {
                p.user_agent
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
            })
            .next()
    }

    async fn ensure_slot(&self, i: usize) -> Result<Arc<Proc>, BackendError> {
        let current = self.procs.lock().unwrap_or_else(|e| e.into_inner())[i].clone();
        if let Some(p) = current.filter(|p| p.is_alive()) {
            return Ok(p);
        }
        if self.shutdown.is_cancelled() {
            return Err(BackendError::Unavailable("shutting down".into()));
        }
        let id = self.next_proc.fetch_add(1, Ordering::Relaxed);
        let p = Proc::spawn(
            id,
            &self.cfg,
            &self.tracker,
            &self.shutdown,
            self.next_invocation.clone(),
            self.deaths.clone(),
        )
        .await
        .inspect_err(|e| tracing::error!(backend = %self.name, error = %e, "backend process failed to start"))?;
        self.procs.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(p.clone());
        Ok(p)
    }

    /// A live process with the fewest active threads, replacing dead ones first.
    async fn live_proc(&self) -> Result<Arc<Proc>, BackendError> {
        let _spawning = self.spawn_lock.lock().await;
        let mut best: Option<Arc<Proc>> = None;
        let mut last_err = None;
        for i in 0..self.cfg.processes {
            match self.ensure_slot(i).await {
                Ok(p) => {
                    let better = best.as_ref().is_none_or(|b| {
                        p.active.load(Ordering::Relaxed) < b.active.load(Ordering::Relaxed)
                    });
                    if better {
                        best = Some(p);
                    }
                }
                Err(e) => last_err = Some(e),
            }
        }
        best.ok_or_else(|| {
            last_err.unwrap_or_else(|| BackendError::Unavailable("no process".into()))
        })
    }

    async fn open_turn(&self, leg: LegRequest<'_>) -> Result<Turn, BackendError> {
        let rendered = render::render(&leg.input.messages)?;
        let permit = tokio::time::timeout(
            self.cfg.acquire_timeout,
            self.permits.clone().acquire_owned(),
        )
        .await
        .map_err(|_| BackendError::Capacity)?
        .map_err(|_| BackendError::Unavailable("shutting down".into()))?;
        let proc = self.live_proc().await?;
        proc.active.fetch_add(1, Ordering::Relaxed);
        // From here on the guard gives the slot back on every path.
        let mut turn = AppServerTurn {
            proc: proc.clone(),
            route: None,
            thread: String::new(),
            turn: String::new(),
            _permit: permit,
        };

        let mut params = Map::new();
        params.insert("ephemeral".into(), json!(true));
        if let Some(m) = &leg.model.backend_model {
            params.insert("model".into(), json!(m));
        }
        if let Some(cwd) = &self.cfg.cwd {
            params.insert("cwd".into(), json!(cwd.display().to_string()));
        }
        if let Some(p) = &leg.model.approval_policy {
            params.insert("approvalPolicy".into(), json!(p));
        }
        if let Some(s) = &leg.model.sandbox {
            params.insert("sandbox".into(), json!(s));
        }
        if let Some(i) = &rendered.instructions {
            params.insert("developerInstructions".into(), json!(i));
        }
        let tools = leg.input.tools.as_deref().unwrap_or_default();
        let renames = renames(tools, &self.cfg.reserved_tool_names);
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
        let started = proc.call("thread/start", Value::Object(params)).await?;
        let thread = started["thread"]["id"]
            .as_str()
            .ok_or_else(|| BackendError::Rejected("thread/start returned no thread id".into()))?
            .to_string();
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let route = Arc::new(Route::new(tx, renames));
        proc.add_route(&thread, route.clone());
        turn.thread = thread.clone();
        turn.route = Some(route);

        let mut input = Vec::new();
        if let Some(h) = &rendered.history {
            input.push(json!({"type": "text", "text": h, "text_elements": []}));
        }
        input.push(json!({"type": "text", "text": rendered.input, "text_elements": []}));
        let result = proc
            .call("turn/start", json!({"threadId": thread, "input": input}))
            .await?;
        turn.turn = result["turn"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        tracing::debug!(backend = %self.name, execution = %leg.execution_id, backend_process = proc.id, "backend turn started");
        Ok(Turn::new(rx, Box::new(turn)))
    }
}

impl Backend for AppServer {
    fn kind(&self) -> BackendKind {
        BackendKind::Agent
    }

    /// An agent cannot be forced to call a tool, takes only well-formed function tools, and
    /// needs a user message as the turn's input.
    fn validate(&self, input: &TurnInput) -> Result<(), BackendError> {
        match input.tool_choice {
            ToolChoice::Auto | ToolChoice::None => {}
            ToolChoice::Required | ToolChoice::Named(_) => {
                return Err(BackendError::UnsupportedToolChoice)
            }
            ToolChoice::Invalid => {
                return Err(BackendError::Invalid {
                    message: "`tool_choice` must be \"auto\", \"none\", \"required\" or a function"
                        .into(),
                    param: "tool_choice",
                })
            }
        }
        input.tools.as_ref().map_err(|why| BackendError::Invalid {
            message: why.clone(),
            param: "tools",
        })?;
        render::input_index(&input.messages).map(|_| ())
    }

    fn start<'a>(&'a self, leg: LegRequest<'a>) -> BoxFuture<'a, Result<Turn, BackendError>> {
        Box::pin(self.open_turn(leg))
    }

    /// Answers each held call with the client's result, verbatim, on the same turn.
    fn resume<'a>(
        &'a self,
        hold: Hold,
        r: Resume<'a>,
    ) -> BoxFuture<'a, Result<Turn, BackendError>> {
        Box::pin(async move {
            let Hold::Live { turn, invocations } = hold else {
                return Err(BackendError::Lost);
            };
            for a in &r.answers {
                turn.control.answer_tool(invocations[a.call], a.text)?;
            }
            Ok(turn)
        })
    }

    fn deaths(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.deaths.subscribe())
    }

    fn stats(&self) -> SessionStats {
        let procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        SessionStats {
            busy: self.cfg.max_sessions - self.permits.available_permits(),
            capacity: self.cfg.max_sessions,
            processes_alive: procs.iter().flatten().filter(|p| p.is_alive()).count(),
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

/// One execution's hold on a thread. Dropping it interrupts an unfinished turn, forgets the
/// thread's route and returns the session permit.
struct AppServerTurn {
    proc: Arc<Proc>,
    route: Option<Arc<Route>>,
    thread: String,
    turn: String,
    _permit: OwnedSemaphorePermit,
}

impl TurnControl for AppServerTurn {
    fn answer_tool(&self, invocation: u64, text: &str) -> Result<(), BackendError> {
        let route = self.route.as_ref().ok_or(BackendError::Lost)?;
        if !self.proc.is_alive() || route.finished.load(Ordering::SeqCst) {
            return Err(BackendError::Lost);
        }
        let id = route.take_held(invocation).ok_or(BackendError::Lost)?;
        self.proc.send(rpc::response(
            &id,
            json!({"success": true, "contentItems": [{"type": "inputText", "text": text}]}),
        ));
        Ok(())
    }

    fn is_alive(&self) -> bool {
        self.route_alive()
    }

    fn interrupt(&self) {
        let finished = self
            .route
            .as_ref()
            .is_none_or(|r| r.finished.load(Ordering::SeqCst));
        if !finished && !self.turn.is_empty() && self.proc.is_alive() {
            self.proc.cast(
                "turn/interrupt",
                json!({"threadId": self.thread, "turnId": self.turn}),
            );
        }
    }
}

impl AppServerTurn {
    fn route_alive(&self) -> bool {
        self.proc.is_alive()
            && self
                .route
                .as_ref()
                .is_some_and(|r| !r.finished.load(Ordering::SeqCst))
    }
}

impl Drop for AppServerTurn {
    fn drop(&mut self) {
        self.interrupt();
        if !self.thread.is_empty() {
            self.proc.remove_route(&self.thread);
        }
        self.proc.active.fetch_sub(1, Ordering::Relaxed);
    }
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
