//! `kind = "claude-code"`: Claude Code (`claude -p` speaking stream-json with the host's
//! control protocol), one process per session, on the agent substrate (`agent/`).
//!
//! Each execution gets a session of its own: a `claude` process started for it with the
//! client's tools served by an in-process ("sdk") MCP server the gateway answers
//! (`session.rs`), the model's instructions appended to Claude Code's system prompt, and a
//! scratch `HOME` (and working folder, unless `cwd` is set) removed with it. A session holds
//! one of `max_sessions` places while its process lives: running, suspended or kept idle for
//! the conversation's next turn, which then sends only the new messages. When every place is
//! taken, the longest idle session is ended to make room; otherwise a turn waits up to the
//! acquire timeout, then fails with `BackendError::Capacity`.

mod approval;
mod control;
mod names;
mod session;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::names::Names;
use self::session::{Session, Settings};
use super::agent::child::Child;
use super::agent::pool::Permits;
use super::agent::render;
use super::agent::sessions::{scratch_dir, Places, Starting};
use super::{
    Backend, BackendError, BackendInfo, Hold, Holds, LegRequest, Resume, SessionStats, Turn,
};
use crate::config::{ApprovalPolicy, ClaudeCodeConfig, Decision, ModelConfig};
use crate::turn::{Effort, TurnInput};

pub struct ClaudeCode {
    name: String,
    cfg: ClaudeCodeConfig,
    version: String,
    /// The session permits and the sessions kept idle.
    places: Places<Session>,
    alive: Arc<AtomicU64>,
    next_session: AtomicU64,
    next_invocation: Arc<AtomicU64>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    deaths: Arc<tokio::sync::watch::Sender<u64>>,
}

/// `command --version`, run with the child's environment: the version the CLI reports.
pub async fn version(cfg: &ClaudeCodeConfig) -> Result<String, BackendError> {
    // The child's own command and environment, with `--version` and nothing to read.
    let mut cmd = super::agent::child::command(&cfg.child);
    cmd.arg("--version").stdin(std::process::Stdio::null());
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), cmd.output())
        .await
        .map_err(|_| BackendError::Unavailable("`--version` did not answer in 30 s".into()))?
        .map_err(|e| {
            BackendError::Unavailable(format!("cannot start {}: {e}", cfg.child.command[0]))
        })?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || text.is_empty() {
        return Err(BackendError::Unavailable(format!(
            "`{} --version` failed ({})",
            cfg.child.command[0], out.status
        )));
    }
    Ok(text)
}

impl ClaudeCode {
    /// Checks that the CLI runs (its version) so that a backend that cannot start is refused
    /// at gateway startup; sessions start on demand.
    pub async fn start(name: &str, cfg: ClaudeCodeConfig) -> Result<Arc<ClaudeCode>, BackendError> {
        let version = version(&cfg).await?;
        Ok(Arc::new(ClaudeCode {
            name: name.to_string(),
            places: Places::new(Permits::new(cfg.max_sessions, cfg.acquire_timeout)),
            cfg,
            version,
            alive: Arc::new(AtomicU64::new(0)),
            next_session: AtomicU64::new(1),
            next_invocation: Arc::new(AtomicU64::new(1)),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            deaths: Arc::new(tokio::sync::watch::Sender::new(0)),
        }))
    }

    /// The flags the gateway needs, after the configured command.
    fn argv(&self, model: &ModelConfig, input: &TurnInput, names: &Names) -> Vec<String> {
        let mut argv = self.cfg.child.command.clone();
        let mcp = json!({"mcpServers": {names::SERVER: {"type": "sdk", "name": names::SERVER}}});
        let (enabled, denied) = builtins(&self.cfg.builtin_tools, &model.approvals);
        for flag in [
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
            "--strict-mcp-config",
            "--no-session-persistence",
            "--permission-prompt-tool",
            "stdio",
            "--setting-sources",
            "",
        ] {
            argv.push(flag.into());
        }
        argv.extend(["--mcp-config".into(), mcp.to_string()]);
        argv.extend(["--tools".into(), enabled.join(",")]);
        let allowed: Vec<String> = names.allowed().collect();
        if !allowed.is_empty() {
            argv.extend(["--allowedTools".into(), allowed.join(",")]);
        }
        if !denied.is_empty() {
            argv.extend(["--disallowedTools".into(), denied.join(",")]);
        }
        if let Some(m) = &model.backend_model {
            argv.extend(["--model".into(), m.clone()]);
        }
        if let Some(e) = input.effort {
            argv.extend(["--effort".into(), effort(e).into()]);
        }
        argv
    }

    /// Starts a session's process for this turn and completes its handshake.
    async fn spawn(
        &self,
        model: &ModelConfig,
        input: &TurnInput,
        names: Names,
        instructions: Option<&str>,
    ) -> Result<Arc<Session>, BackendError> {
        if self.shutdown.is_cancelled() {
            return Err(BackendError::Unavailable("shutting down".into()));
        }
        let permit = self.places.place(&self.name).await?;
        let tools = input.tools.as_deref().unwrap_or_default();
        let declared = super::agent::mcp_tools(tools, |n| names.declared(n).to_string());
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let scratch = scratch_dir("claude", id, &[".claude", "work"])?;
        let cwd = match &self.cfg.child.cwd {
            Some(cwd) => cwd.clone(),
            None => scratch.join("work"),
        };
        let mut child_cfg = self.cfg.child.clone();
        child_cfg.command = self.argv(model, input, &names);
        child_cfg.cwd = Some(cwd.clone());
        for (k, v) in [
            ("HOME", scratch.display().to_string()),
            (
                "CLAUDE_CONFIG_DIR",
                scratch.join(".claude").display().to_string(),
            ),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ("DISABLE_AUTOUPDATER", "1".into()),
        ] {
            child_cfg.env.entry(k.into()).or_insert(v);
        }
        let (child, io) = match Child::spawn(id, &child_cfg, &self.tracker, &self.shutdown) {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&scratch);
                return Err(e);
            }
        };
        let settings = Settings {
            model: model.backend_model.clone(),
            effort: input.effort,
            names,
            tools: declared,
        };
        let session = Session::new(
            id,
            child.clone(),
            settings,
            cwd.display().to_string(),
            Some(scratch),
            permit,
            self.next_invocation.clone(),
            &self.alive,
        );
        child.attach(io, session.clone(), self.deaths.clone());
        // Until the handshake is done, a dropped start (the client went away) ends it.
        let starting = Starting::new(session.clone());
        let mut init = json!({"subtype": "initialize"});
        if !self.cfg.builtin_tools.is_empty() {
            // Every use of a built-in reaches the policy, even one Claude Code would let run.
            init["hooks"] =
                json!({"PreToolUse": [{"matcher": null, "hookCallbackIds": ["policy"]}]});
        }
        if let Some(i) = instructions {
            init["appendSystemPrompt"] = json!(i);
        }
        let started = session.call(init).await;
        if let Err(e) = started {
            return Err(BackendError::Unavailable(format!(
                "claude did not start: {e}"
            )));
        }
        child.handshake_done();
        tracing::debug!(backend = %self.name, session = id, "claude session started");
        starting.done()
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
        let tools = input.tools.as_deref().unwrap_or_default();
        let names = Names::new(
            tools.iter().map(|t| t.name.as_str()),
            &self.cfg.builtin_tools,
        );
        // A kept session continues only a turn that asks what it was started with.
        let fits = |s: &Session| {
            s.settings.model == model.backend_model
                && s.settings.effort == input.effort
                && s.settings.names == names
        };
        let continued = self.places.continue_kept(kept, fits, |from| {
            Ok(render::continued(&input.messages[from..])?.join("\n\n"))
        })?;
        let (session, text) = match continued {
            Some(continued) => continued,
            None => {
                let rendered = render::render(&input.messages)?;
                let session = self
                    .spawn(model, input, names, rendered.instructions.as_deref())
                    .await?;
                let mut parts: Vec<String> = rendered.history.into_iter().collect();
                parts.extend(rendered.input);
                (session, parts.join("\n\n"))
            }
        };
        let (tx, rx) = futures::channel::mpsc::unbounded();
        session.open(&text, tx, meter);
        tracing::debug!(backend = %self.name, execution = %execution_id, session = session.id, "claude turn started");
        Ok(Turn::new(rx, Box::new(self.places.turn(session))))
    }
}

/// The enabled built-ins the policy does not deny, and those it denies outright.
fn builtins(tools: &[String], policy: &ApprovalPolicy) -> (Vec<String>, Vec<String>) {
    tools.iter().cloned().partition(|t| {
        let decision = match t.as_str() {
            "Bash" => policy.command,
            "Edit" | "Write" | "MultiEdit" | "NotebookEdit" => policy.file_change,
            _ => policy.permissions,
        };
        decision != Decision::Deny
    })
}

/// Claude Code's `--effort` for a request's effort: its levels are low to max, so `none`
/// and `minimal` ask for `low`.
fn effort(e: Effort) -> &'static str {
    match e {
        Effort::None | Effort::Minimal | Effort::Low => "low",
        Effort::Medium => "medium",
        Effort::High => "high",
        Effort::XHigh => "xhigh",
    }
}

impl Backend for ClaudeCode {
    fn describe(&self) -> BackendInfo {
        BackendInfo {
            kind: "claude-code",
            provider: "anthropic",
            holds: Holds::Turn,
        }
    }

    fn version(&self) -> Option<String> {
        Some(self.version.clone())
    }

    fn ready(&self) -> bool {
        !self.shutdown.is_cancelled()
    }

    fn validate(&self, input: &TurnInput) -> Result<(), BackendError> {
        super::agent::validate(
            input,
            "claude-code",
            super::agent::Structured::Refused(
                "Claude Code takes a JSON schema per process (`--json-schema`), not per turn of a kept session: this model cannot give its answer in your schema. Use a model served by app-server (Codex) or an OpenAI-compatible upstream.",
            ),
        )
    }

    fn start<'a>(&'a self, leg: LegRequest<'a>) -> BoxFuture<'a, Result<Turn, BackendError>> {
        Box::pin(self.open_turn(leg))
    }

    /// Answers each held call with the client's result, verbatim, on the same turn; text the
    /// client sent beside its results goes with the first answer.
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
        SessionStats {
            busy: self.places.permits.busy(),
            capacity: self.places.permits.capacity(),
            processes_alive: self.alive.load(Ordering::SeqCst) as usize,
            ..SessionStats::default()
        }
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.places.permits.close();
            self.shutdown.cancel();
            self.tracker.close();
            self.tracker.wait().await;
        })
    }
}
