//! `kind = "acp"`: any agent that speaks the Agent Client Protocol (JSON-RPC 2.0 over stdio:
//! Gemini CLI's `--acp`, Claude's ACP adapter, …), one process per session, on the agent
//! substrate (`agent/`).
//!
//! The framing is our own on the substrate's bounded lines rather than the
//! `agent-client-protocol` crate: the gateway needs a dozen fields of five messages, and the
//! crate's own runtime (its connection futures, `!Send` handlers) would sit beside the
//! substrate's child supervision rather than on it.
//!
//! Each execution gets a session of its own: an agent process started for it, `initialize`d
//! with no `fs` or `terminal` capability (the agent uses its own tools, gated by the approval
//! policy), and `session/new` with the client's tools as an HTTP MCP server on the bridge
//! (`agent::bridge`: one endpoint per session, a random bearer handed over only there) and a
//! scratch folder as its working folder and `HOME`, removed with it. The conversation is
//! rendered into the first `session/prompt`; a kept session gets only the new input. A
//! session holds one of `max_sessions` places while its process lives.

mod metering;
mod permission;
mod session;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::session::{Session, Settings};
use super::agent::bridge::{Bridge, Host};
use super::agent::child::Child;
use super::agent::pool::Permits;
use super::agent::render;
use super::agent::sessions::{scratch_dir, AgentSession, Places, Starting};
use super::{
    Backend, BackendError, BackendInfo, Hold, Holds, LegRequest, Resume, SessionStats, Turn,
};
use crate::config::{AcpConfig, ModelConfig};
use crate::error::Param;
use crate::turn::{Effort, TurnInput};

/// The ACP protocol version the gateway speaks.
const PROTOCOL_VERSION: u64 = 1;

pub struct Acp {
    name: String,
    cfg: AcpConfig,
    /// The agent's name and version, as its `initialize` reported them.
    version: String,
    bridge: Arc<Bridge>,
    places: Places<Session>,
    alive: Arc<AtomicU64>,
    next_session: AtomicU64,
    next_invocation: Arc<AtomicU64>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    deaths: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Acp {
    /// Starts the bridge and one agent process to check that it speaks ACP and takes an HTTP
    /// MCP server, so that a backend that cannot work is refused at gateway startup; sessions
    /// start on demand.
    pub async fn start(name: &str, cfg: AcpConfig) -> Result<Arc<Acp>, BackendError> {
        let bridge = Bridge::shared(cfg.mcp_bridge, cfg.max_sessions)?;
        let mut acp = Acp {
            name: name.to_string(),
            places: Places::new(Permits::new(cfg.max_sessions, cfg.acquire_timeout)),
            cfg,
            version: String::new(),
            bridge,
            alive: Arc::new(AtomicU64::new(0)),
            next_session: AtomicU64::new(1),
            next_invocation: Arc::new(AtomicU64::new(1)),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            deaths: Arc::new(tokio::sync::watch::Sender::new(0)),
        };
        let settings = Settings {
            model: None,
            effort: None,
            names: Vec::new(),
            tools: Vec::new(),
        };
        let (session, init) = acp.spawn(settings).await?;
        session.release();
        let agent = &init["agentInfo"];
        let version = format!(
            "{} {}",
            agent["name"].as_str().unwrap_or("acp-agent"),
            agent["version"].as_str().unwrap_or("")
        );
        acp.version = version.trim().to_string();
        Ok(Arc::new(acp))
    }

    /// Starts a session's process and completes `initialize`; returns its answer.
    async fn spawn(&self, settings: Settings) -> Result<(Arc<Session>, Value), BackendError> {
        if self.shutdown.is_cancelled() {
            return Err(BackendError::Unavailable("shutting down".into()));
        }
        let permit = self.places.place(&self.name).await?;
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let scratch = scratch_dir("acp", id, &["work"])?;
        let cwd = match &self.cfg.child.cwd {
            Some(cwd) => cwd.clone(),
            None => scratch.join("work"),
        };
        let mut child_cfg = self.cfg.child.clone();
        child_cfg.cwd = Some(cwd.clone());
        for (k, v) in [
            ("HOME", scratch.display().to_string()),
            // Claude Code's per-call limit for MCP tools (ms): a held call waits as long as
            // its continuation lives, which the gateway bounds.
            ("MCP_TOOL_TIMEOUT", "86400000".into()),
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
        let init = session
            .request(
                "initialize",
                json!({"protocolVersion": PROTOCOL_VERSION,
                       "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false},
                                              "terminal": false},
                       "clientInfo": {"name": "turnstile", "version": env!("CARGO_PKG_VERSION")}}),
            )
            .await
            .map_err(|e| BackendError::Unavailable(format!("the agent did not start: {e}")))?;
        if init["agentCapabilities"]["mcpCapabilities"]["http"] != true {
            return Err(BackendError::Unavailable(
                "the agent does not take an HTTP MCP server (agentCapabilities.mcpCapabilities.http)"
                    .into(),
            ));
        }
        Ok((starting.done()?, init))
    }

    /// A new session for this turn: the agent started, its ACP session opened with the
    /// client's tools on the bridge, and the model and effort chosen.
    async fn open_session(
        &self,
        model: &ModelConfig,
        input: &TurnInput,
    ) -> Result<Arc<Session>, BackendError> {
        let tools = input.tools.as_deref().unwrap_or_default();
        let declared = super::agent::mcp_tools(tools, str::to_string);
        let settings = Settings {
            model: model.backend_model.clone(),
            effort: input.effort,
            names: tools.iter().map(|t| t.name.clone()).collect(),
            tools: declared,
        };
        let (session, init) = self.spawn(settings).await?;
        let starting = Starting::new(session.clone());
        let child = &self.cfg.child;
        let has = |var: &str| {
            child.env.contains_key(var)
                || (child.env_passthrough.iter().any(|p| p == var)
                    && std::env::var_os(var).is_some())
        };
        if let Some(method) = env_auth(&init, has) {
            session
                .request("authenticate", json!({"methodId": method}))
                .await?;
        }
        let host: Arc<dyn Host> = session.clone();
        let endpoint = self.bridge.open(Arc::downgrade(&host));
        let server = json!({"type": "http", "name": permission::SERVER, "url": endpoint.url,
            "headers": [{"name": "Authorization", "value": endpoint.authorization()}]});
        session.set_endpoint(endpoint);
        let opened = session
            .request(
                "session/new",
                json!({"cwd": session.cwd, "mcpServers": [server]}),
            )
            .await?;
        let acp_session = opened["sessionId"]
            .as_str()
            .ok_or_else(|| BackendError::Unavailable("session/new gave no sessionId".into()))?;
        session.set_acp_session(acp_session.to_string());
        if let Some(m) = &model.backend_model {
            choose_model(&session, &opened, m).await?;
        }
        if let Some(e) = input.effort {
            choose_effort(&session, &opened, e).await?;
        }
        session.child.handshake_done();
        tracing::debug!(backend = %self.name, session = session.id, "acp session started");
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
        let names: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
        // A kept session continues only a turn that asks what it was started with.
        let fits = |s: &Session| {
            s.settings.model == model.backend_model
                && s.settings.effort == input.effort
                && s.settings.names == names
        };
        let continued = self.places.continue_kept(kept, fits, |from| {
            render::continued(&input.messages[from..])
        })?;
        let (session, prompt) = match continued {
            Some(continued) => continued,
            None => {
                let rendered = render::render(&input.messages)?;
                let session = self.open_session(model, input).await?;
                let mut parts: Vec<String> = rendered.instructions.into_iter().collect();
                parts.extend(rendered.history);
                parts.extend(rendered.input);
                (session, parts)
            }
        };
        let (tx, rx) = futures::channel::mpsc::unbounded();
        session.open(prompt, tx, meter);
        tracing::debug!(backend = %self.name, execution = %execution_id, session = session.id, "acp turn started");
        Ok(Turn::new(rx, Box::new(self.places.turn(session))))
    }
}

/// `backend_model` through what the agent advertises: its session models
/// (`session/set_model`, which both tested agents take verbatim), else a session config option
/// of category `model` (which takes only the values it lists).
async fn choose_model(session: &Session, opened: &Value, model: &str) -> Result<(), BackendError> {
    let sid = session.acp_session();
    if opened["models"].is_object() {
        let params = json!({"sessionId": sid, "modelId": model});
        session.request("session/set_model", params).await?;
        return Ok(());
    }
    if let Some(option) = config_option(opened, "model") {
        let params = json!({"sessionId": sid, "configId": option, "value": model});
        session.request("session/set_config_option", params).await?;
        return Ok(());
    }
    Err(BackendError::Unavailable(
        "the agent offers no model choice (no session models, no `model` config option): leave `backend_model` unset".into(),
    ))
}

/// The request's effort through the agent's session config option of category
/// `thought_level`; an agent without one cannot honour it (400).
async fn choose_effort(
    session: &Session,
    opened: &Value,
    effort: Effort,
) -> Result<(), BackendError> {
    let Some(option) = config_option(opened, "thought_level") else {
        return Err(BackendError::Invalid {
            message: "this model's agent takes no reasoning effort; leave it unset".into(),
            param: Param::Effort,
        });
    };
    let params = json!({"sessionId": session.acp_session(), "configId": option,
                        "value": effort.as_str()});
    session.request("session/set_config_option", params).await?;
    Ok(())
}

/// The agent's sign-in by environment variable whose variables the child has (`authMethods`
/// of type `env_var`, as codex-acp's `OPENAI_API_KEY`), if it offers one.
fn env_auth(init: &Value, has: impl Fn(&str) -> bool) -> Option<String> {
    init["authMethods"]
        .as_array()?
        .iter()
        .filter(|m| m["type"] == "env_var")
        .find(|m| {
            let vars = m["vars"].as_array();
            vars.is_some_and(|v| {
                !v.is_empty() && v.iter().all(|v| v["name"].as_str().is_some_and(&has))
            })
        })
        .and_then(|m| m["id"].as_str())
        .map(str::to_string)
}

/// The id of the session config option of `category`, if the agent has one.
fn config_option(opened: &Value, category: &str) -> Option<String> {
    opened["configOptions"]
        .as_array()?
        .iter()
        .find(|o| o["category"] == category)
        .and_then(|o| o["id"].as_str())
        .map(str::to_string)
}

impl Backend for Acp {
    fn describe(&self) -> BackendInfo {
        BackendInfo {
            kind: "acp",
            provider: "acp",
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
            "acp",
            super::agent::Structured::Refused(
                "The Agent Client Protocol has no structured-output request: this model cannot give its answer in your schema. Use a model served by app-server (Codex) or an OpenAI-compatible upstream.",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_in_by_a_variable_the_child_has() {
        let init = json!({"authMethods": [
            {"id": "chatgpt", "name": "Login"},
            {"type": "env_var", "id": "codex-api-key", "vars": [{"name": "CODEX_API_KEY"}]},
            {"type": "env_var", "id": "openai-api-key", "vars": [{"name": "OPENAI_API_KEY"}]},
        ]});
        assert_eq!(
            env_auth(&init, |v| v == "OPENAI_API_KEY").as_deref(),
            Some("openai-api-key")
        );
        assert_eq!(env_auth(&init, |_| false), None);
        assert_eq!(env_auth(&json!({"authMethods": []}), |_| true), None);
    }

    #[test]
    fn model_and_effort_options_by_category() {
        let opened = json!({"configOptions": [
            {"id": "mode", "category": "mode"},
            {"id": "model", "category": "model"},
            {"id": "reasoning_effort", "category": "thought_level"},
        ]});
        assert_eq!(config_option(&opened, "model").as_deref(), Some("model"));
        assert_eq!(
            config_option(&opened, "thought_level").as_deref(),
            Some("reasoning_effort")
        );
        assert_eq!(config_option(&json!({}), "model"), None);
    }
}
