//! The Agent Client Protocol on a session (`agent::session`): JSON-RPC 2.0 over stdio and
//! what its lines mean. The handshake is `initialize`, a sign-in where the agent asks for one
//! by environment variable, `session/new` with the client's tools on the bridge, then the
//! model and effort. A turn is a `session/prompt` whose response (with its `stopReason` and
//! usage) ends it; `session/update` notifications stream its text and thoughts; the agent asks
//! `session/request_permission` before acting on its own (the approval policy answers) and
//! calls the client's tools through the session's bridge endpoint ([`Host`]: each call is held
//! until the client's result arrives).

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::metering::Metering;
use super::{config_option, env_auth, permission, Acp};
use crate::backend::agent::bridge::{Answered, Endpoint, Host};
use crate::backend::agent::session::{Session, State};
use crate::backend::agent::{mcp_tools, Opening, Protocol, Structured};
use crate::backend::{BackendError, TurnEvent};
use crate::error::Param;
use crate::turn::{Effort, ToolDef, Usage};

type Agent = Session<Acp>;

/// The ACP protocol version the gateway speaks.
const PROTOCOL_VERSION: u64 = 1;

/// How long a released agent gets to exit before its group is killed.
const RELEASE_GRACE: Duration = Duration::from_secs(2);

/// How many announced tool calls a turn remembers (a model answer's calls are asked about
/// right after they are announced).
const ANNOUNCED: usize = 32;

/// What a session keeps of the agent.
#[derive(Default)]
pub struct Extra {
    /// The agent's `sessionId`, once `session/new` answered.
    acp_session: Mutex<String>,
    /// The client's tools for the agent; gone with the session.
    endpoint: Mutex<Option<Endpoint>>,
}

/// What a running turn keeps.
#[derive(Default)]
pub struct Turn {
    /// The JSON-RPC id of its `session/prompt`.
    prompt: u64,
    /// What the turn cost so far, metered as its rounds end.
    metering: Metering,
    /// The tools the turn's latest `tool_call` updates named (`toolCallId`,
    /// `_meta.claudeCode.toolName`), for the permission requests that follow them.
    announced: VecDeque<(String, String)>,
}

fn write(session: &Agent, message: &Value) {
    let mut line = message.to_string();
    line.push('\n');
    session.write(line);
}

/// Sends a request and waits for its answer.
async fn request(session: &Agent, method: &str, params: Value) -> Result<Value, BackendError> {
    let line = |id| {
        let mut line =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        line.push('\n');
        line
    };
    session.request(method, line).await
}

fn acp_session(session: &Agent) -> String {
    session.extra.acp_session.lock().clone()
}

/// `initialize` with no `fs` or `terminal` capability: the agent's answer, if it takes an
/// HTTP MCP server.
async fn initialize(session: &Agent) -> Result<Value, BackendError> {
    let init = request(
        session,
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
    Ok(init)
}

impl Protocol for Acp {
    const KIND: &'static str = "acp";
    const PROVIDER: &'static str = "acp";
    const AGENT: &'static str = "the agent";
    const SCRATCH: (&'static str, &'static [&'static str]) = ("acp", &["work"]);
    const STRUCTURED: Structured = Structured::Refused(
        "The Agent Client Protocol has no structured-output request: this model cannot give its answer in your schema. Use a model served by app-server (Codex) or an OpenAI-compatible upstream.",
    );
    type Names = Vec<String>;
    type Turn = Turn;
    type Held = oneshot::Sender<Answered>;
    type Extra = Extra;

    /// One agent process started to check that it speaks ACP and takes an HTTP MCP server:
    /// the name and version its `initialize` reports.
    const PROBE: bool = true;

    async fn probe(session: &Arc<Agent>) -> Result<String, BackendError> {
        let init = initialize(session).await?;
        let agent = &init["agentInfo"];
        let version = format!(
            "{} {}",
            agent["name"].as_str().unwrap_or("acp-agent"),
            agent["version"].as_str().unwrap_or("")
        );
        Ok(version.trim().to_string())
    }

    fn names(&self, tools: &[ToolDef]) -> Vec<String> {
        tools.iter().map(|t| t.name.clone()).collect()
    }

    fn declare(_names: &Vec<String>, tools: &[ToolDef]) -> Vec<Value> {
        mcp_tools(tools, str::to_string)
    }

    /// Claude Code's per-call limit for MCP tools (ms), for Claude's adapter: a held call
    /// waits as long as its continuation lives, which the gateway bounds.
    fn env(_scratch: &Path) -> Vec<(&'static str, String)> {
        vec![("MCP_TOOL_TIMEOUT", "86400000".into())]
    }

    /// `initialize`, a sign-in by a variable the child has, `session/new` with the client's
    /// tools on the bridge, and the model and effort chosen.
    async fn handshake<'a>(
        &'a self,
        session: &'a Arc<Agent>,
        opening: &'a Opening<'a>,
    ) -> Result<(), BackendError> {
        let init = initialize(session).await?;
        let child = &self.cfg.agent.child;
        let has = |var: &str| {
            child.env.contains_key(var)
                || (child.env_passthrough.iter().any(|p| p == var)
                    && std::env::var_os(var).is_some())
        };
        if let Some(method) = env_auth(&init, has) {
            request(session, "authenticate", json!({"methodId": method})).await?;
        }
        let host: Arc<dyn Host> = session.clone();
        let endpoint = self.bridge.open(Arc::downgrade(&host));
        let server = json!({"type": "http", "name": permission::SERVER, "url": endpoint.url,
            "headers": [{"name": "Authorization", "value": endpoint.authorization()}]});
        *session.extra.endpoint.lock() = Some(endpoint);
        let params = json!({"cwd": session.cwd, "mcpServers": [server]});
        let opened = request(session, "session/new", params).await?;
        let acp_session = opened["sessionId"]
            .as_str()
            .ok_or_else(|| BackendError::Unavailable("session/new gave no sessionId".into()))?;
        *session.extra.acp_session.lock() = acp_session.to_string();
        if let Some(m) = &opening.model.backend_model {
            choose_model(session, &opened, m).await?;
        }
        if let Some(e) = opening.input.effort {
            choose_effort(session, &opened, e).await?;
        }
        Ok(())
    }

    fn begin(session: &Agent, turn: &mut Turn, prompt: Vec<String>) -> String {
        turn.prompt = session.next_request();
        turn.metering.sent(prompt.iter().map(String::len).sum());
        let blocks: Vec<Value> = prompt
            .into_iter()
            .map(|t| json!({"type": "text", "text": t}))
            .collect();
        let mut line = json!({"jsonrpc": "2.0", "id": turn.prompt, "method": "session/prompt",
            "params": {"sessionId": acp_session(session), "prompt": blocks}})
        .to_string();
        line.push('\n');
        line
    }

    fn line(session: &Arc<Agent>, line: &[u8]) {
        let Ok(msg) = serde_json::from_slice::<Value>(line) else {
            tracing::debug!(
                backend_process = session.child.id,
                bytes = line.len(),
                "a line that is not JSON ignored"
            );
            return;
        };
        let method = msg["method"].as_str();
        match (method, msg.get("id")) {
            (Some(m), Some(id)) => on_request(session, id.clone(), m, &msg["params"]),
            (Some("session/update"), None) => on_update(session, &msg["params"]["update"]),
            (Some(_), None) => {}
            (None, Some(id)) => {
                let result = match msg.get("error") {
                    Some(e) => Err(e["message"].as_str().unwrap_or("error").to_string()),
                    None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
                };
                let Some(id) = id.as_u64() else { return };
                let prompt = {
                    let state = session.state();
                    state.route.is_some().then_some(state.turn.prompt)
                };
                if prompt == Some(id) {
                    return on_prompt_done(session, result);
                }
                session.answered(id, result);
            }
            (None, None) => {}
        }
    }

    fn answering(turn: &mut Turn, text: &str, beside: &[String]) {
        let sent = text.len() + beside.iter().map(String::len).sum::<usize>();
        turn.metering.sent(sent);
    }

    fn answer(
        _session: &Agent,
        held: Self::Held,
        text: &str,
        failed: bool,
        beside: Vec<String>,
    ) -> bool {
        let answered = Answered {
            text: text.to_string(),
            failed,
            beside,
        };
        held.send(answered).is_ok()
    }

    /// The agent's whole turn is cancelled (`session/cancel`).
    fn interrupt(session: &Agent) {
        write(
            session,
            &json!({"jsonrpc": "2.0", "method": "session/cancel",
                    "params": {"sessionId": acp_session(session)}}),
        );
    }

    /// The process group is asked to exit and killed if it has not within `RELEASE_GRACE`;
    /// the bridge endpoint goes at once.
    fn release(session: &Agent) {
        session.extra.endpoint.lock().take();
        // Asked to exit first: an agent left to clean up (Gemini CLI releases its file locks)
        // does not leave the next session waiting on them.
        session.child.terminate(RELEASE_GRACE);
    }

    fn ended(session: &Agent) {
        session.extra.endpoint.lock().take();
    }
}

/// Meters what a round or the prompt's report adds, if anything.
fn metered(state: &State<Acp>, u: Usage) {
    if u.total_tokens == 0 && u.cached_tokens == 0 && u.cache_write_tokens == 0 {
        return;
    }
    state.meter(u);
}

fn on_update(session: &Agent, update: &Value) {
    let mut state = session.state();
    if !state.live() {
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
                state.turn.metering.said(t.len());
                state.emit(TurnEvent::Delta(t));
            }
        }
        "agent_thought_chunk" => {
            if let Some(t) = text() {
                state.turn.metering.said(t.len());
                state.emit(TurnEvent::Reasoning(t));
            }
        }
        "tool_call" => {
            let id = update["toolCallId"].as_str();
            let name = update["_meta"]["claudeCode"]["toolName"].as_str();
            if let (Some(id), Some(name)) = (id, name) {
                let announced = &mut state.turn.announced;
                if announced.len() == ANNOUNCED {
                    announced.pop_front();
                }
                announced.push_back((id.to_string(), name.to_string()));
            }
            // Reported already ended (an agent may skip the update).
            if let Some(ended) = permission::ended(update) {
                state.emit(TurnEvent::ToolEnded(ended));
            }
        }
        "tool_call_update" => {
            if let Some(ended) = permission::ended(update) {
                state.emit(TurnEvent::ToolEnded(ended));
            }
        }
        "usage_update" => {
            if let Some(used) = update["used"].as_u64() {
                state.turn.metering.context(used);
            }
        }
        other => {
            tracing::trace!(
                backend_process = session.child.id,
                update = other,
                "acp update"
            );
        }
    }
}

/// The `session/prompt` response: the turn's usage, then its end.
fn on_prompt_done(session: &Agent, result: Result<Value, String>) {
    let mut state = session.state();
    let outcome = match result {
        Ok(result) => {
            let report = super::metering::reported(&result);
            if state.live() {
                let rest = state.turn.metering.rest(report);
                metered(&state, rest);
            }
            match result["stopReason"].as_str().unwrap_or_default() {
                "end_turn" | "max_tokens" | "max_turn_requests" => Ok(()),
                other => Err(format!("the agent's turn ended: {other}")),
            }
        }
        Err(e) => Err(format!("the agent's turn failed: {e}")),
    };
    state.finish(outcome);
}

fn on_request(session: &Agent, id: Value, method: &str, params: &Value) {
    match method {
        "session/request_permission" => on_permission(session, id, params),
        other => {
            tracing::debug!(
                backend_process = session.child.id,
                method = other,
                "unknown agent request refused"
            );
            write(
                session,
                &json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": format!("method not found: {other}")}}),
            );
        }
    }
}

/// A permission request: the client's own tools are allowed once at once; anything else
/// goes to the approval policy, which answers with the agent's own once-options.
fn on_permission(session: &Agent, id: Value, params: &Value) {
    let tool_call = &params["toolCall"];
    let options = &params["options"];
    let announced = {
        let state = session.state();
        let id = tool_call["toolCallId"].as_str().unwrap_or_default();
        (state.turn.announced.iter())
            .find(|(a, _)| a == id)
            .map(|(_, name)| name.clone())
    };
    if permission::is_bridge_call(tool_call, &session.settings.names, announced.as_deref()) {
        let chosen = permission::option(options, true);
        return write(session, &permission::response(&id, chosen.as_deref()));
    }
    let reply = session.later(move |s: &Agent, chosen: Option<String>| {
        // After `session/cancel` a pending request is answered `cancelled` (as ACP asks).
        let chosen = chosen.filter(|_| !s.state().cancelling());
        write(s, &permission::response(&id, chosen.as_deref()));
    });
    session.ask(permission::ask(&session.cwd, tool_call, options, reply));
}

/// `backend_model` through what the agent advertises: its session models
/// (`session/set_model`, which both tested agents take verbatim), else a session config option
/// of category `model` (which takes only the values it lists).
async fn choose_model(session: &Agent, opened: &Value, model: &str) -> Result<(), BackendError> {
    let sid = acp_session(session);
    if opened["models"].is_object() {
        let params = json!({"sessionId": sid, "modelId": model});
        request(session, "session/set_model", params).await?;
        return Ok(());
    }
    if let Some(option) = config_option(opened, "model") {
        let params = json!({"sessionId": sid, "configId": option, "value": model});
        request(session, "session/set_config_option", params).await?;
        return Ok(());
    }
    Err(BackendError::Unavailable(
        "the agent offers no model choice (no session models, no `model` config option): leave `backend_model` unset".into(),
    ))
}

/// The request's effort through the agent's session config option of category
/// `thought_level`; an agent without one cannot honour it (400).
async fn choose_effort(
    session: &Agent,
    opened: &Value,
    effort: Effort,
) -> Result<(), BackendError> {
    let Some(option) = config_option(opened, "thought_level") else {
        return Err(BackendError::Invalid {
            message: "this model's agent takes no reasoning effort; leave it unset".into(),
            param: Param::Effort,
        });
    };
    let params = json!({"sessionId": acp_session(session), "configId": option,
                        "value": effort.as_str()});
    request(session, "session/set_config_option", params).await?;
    Ok(())
}

impl Host for Agent {
    fn tools(&self) -> Vec<Value> {
        self.settings.tools.clone()
    }

    fn running(&self) -> Option<u64> {
        let state = self.state();
        state
            .route
            .as_ref()
            .filter(|r| !r.finished)
            .map(|r| r.number)
    }

    fn call(
        &self,
        turn: u64,
        name: &str,
        arguments: String,
        answer: oneshot::Sender<Answered>,
    ) -> bool {
        let mut state = self.state();
        let runs = state.live() && state.route.as_ref().is_some_and(|r| r.number == turn);
        if !runs || !self.settings.names.iter().any(|n| n == name) || !self.child.is_alive() {
            return false;
        }
        // The round that asked for this call ends here: metered now, so a per-execution cap
        // acts at the continuation.
        state.turn.metering.said(name.len() + arguments.len());
        let round = state.turn.metering.round();
        metered(&state, round);
        let call = self.hold(&mut state, answer, name, arguments);
        state.emit(TurnEvent::ToolCall(call));
        true
    }
}
