//! Claude Code's protocol on a session (`agent::session`): what its stdout lines mean. The
//! CLI streams each model call as Messages API events (text and thinking go to the turn as
//! they arrive; the call's usage is metered when its `message_delta` reports it), asks the
//! host for the session's MCP server (`mcp_message`: the client's tools, held on
//! `tools/call`), and asks before a built-in runs (`hook_callback` PreToolUse, or
//! `can_use_tool`): the approval policy answers. A `result` ends the turn.
//!
//! The calls of one model message are one batch: Claude Code starts a call as soon as its
//! block is complete, so the calls are kept back until the message has ended, then handed on
//! together, and `Yield` follows once every client call the message made has arrived (a call
//! that waits behind a built-in arrives later, and the engine's debounce sends what came).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};

use super::approval::{self, Answer};
use super::control::{self, Frame};
use super::names::Names;
use super::ClaudeCode;
use crate::backend::agent::session::{Session, State};
use crate::backend::agent::{mcp_tools, Opening, Protocol, Structured};
use crate::backend::{BackendError, HeldCall, TurnEvent};
use crate::turn::{ToolDef, Usage};

type Claude = Session<ClaudeCode>;

/// A client call the CLI is waiting on: the `mcp_message` control request to answer.
pub struct Held {
    request: String,
    rpc_id: Value,
}

/// What a running turn keeps.
#[derive(Default)]
pub struct Turn {
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
}

/// Our control requests are numbered `req_<n>`.
fn request_id(n: u64) -> String {
    format!("req_{n}")
}

impl Protocol for ClaudeCode {
    const KIND: &'static str = "claude-code";
    const PROVIDER: &'static str = "anthropic";
    const AGENT: &'static str = "claude";
    const SCRATCH: (&'static str, &'static [&'static str]) = ("claude", &[".claude", "work"]);
    const STRUCTURED: Structured = Structured::Refused(
        "Claude Code takes a JSON schema per process (`--json-schema`), not per turn of a kept session: this model cannot give its answer in your schema. Use a model served by app-server (Codex) or an OpenAI-compatible upstream.",
    );
    type Names = Names;
    type Turn = Turn;
    type Held = Held;
    type Extra = ();

    fn names(&self, tools: &[ToolDef]) -> Names {
        Names::new(
            tools.iter().map(|t| t.name.as_str()),
            &self.cfg.builtin_tools,
        )
    }

    fn declare(names: &Names, tools: &[ToolDef]) -> Vec<Value> {
        mcp_tools(tools, |n| names.declared(n).to_string())
    }

    fn env(scratch: &Path) -> Vec<(&'static str, String)> {
        vec![
            (
                "CLAUDE_CONFIG_DIR",
                scratch.join(".claude").display().to_string(),
            ),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ("DISABLE_AUTOUPDATER", "1".into()),
        ]
    }

    fn argv(&self, command: &mut Vec<String>, o: &Opening<'_>) {
        let tools = o.input.tools.as_deref().unwrap_or_default();
        self.flags(command, o.model, o.input, &self.names(tools));
    }

    /// `initialize`, with the policy hook when built-ins are enabled and the instructions
    /// appended to Claude Code's system prompt.
    async fn handshake<'a>(
        &'a self,
        session: &'a Arc<Claude>,
        opening: &'a Opening<'a>,
    ) -> Result<(), BackendError> {
        let mut init = json!({"subtype": "initialize"});
        if !self.cfg.builtin_tools.is_empty() {
            // Every use of a built-in reaches the policy, even one Claude Code would let run.
            init["hooks"] =
                json!({"PreToolUse": [{"matcher": null, "hookCallbackIds": ["policy"]}]});
        }
        if let Some(i) = opening.instructions {
            init["appendSystemPrompt"] = json!(i);
        }
        let started = session
            .request("initialize", |id| control::request(&request_id(id), init))
            .await;
        started
            .map(|_| ())
            .map_err(|e| BackendError::Unavailable(format!("claude did not start: {e}")))
    }

    /// The instructions went to `initialize`: the history and the input, as one message.
    fn first_prompt(rendered: crate::backend::agent::render::Rendered) -> Vec<String> {
        let mut parts: Vec<String> = rendered.history.into_iter().collect();
        parts.extend(rendered.input);
        parts
    }

    fn begin(_session: &Claude, _turn: &mut Turn, prompt: Vec<String>) -> String {
        control::user(&prompt.join("\n\n"))
    }

    fn line(session: &Arc<Claude>, line: &[u8]) {
        match control::parse(line) {
            Frame::Stream { event, parent } => on_stream(session, &event, parent),
            Frame::Request { id, request } => on_request(session, &id, &request),
            Frame::Response { id, result } => {
                let ours = id.strip_prefix("req_").and_then(|n| n.parse().ok());
                if let Some(n) = ours {
                    session.answered(n, result);
                }
            }
            Frame::Cancel { id } => {
                // The CLI gave up on a call (its turn is being interrupted): nothing to answer.
                session.state().forget(|h| h.request == id);
            }
            Frame::Result { subtype, is_error } => on_result(session, &subtype, is_error),
            Frame::ToolResults(ended) => {
                let state = session.state();
                for t in ended {
                    state.emit(TurnEvent::ToolEnded(t));
                }
            }
            Frame::Other => {}
        }
    }

    /// The result is the client's text, then any text it sent beside its results.
    fn answer(session: &Claude, held: Held, text: &str, failed: bool, beside: Vec<String>) -> bool {
        let mut content = vec![json!({"type": "text", "text": text})];
        content.extend(beside.iter().map(|t| json!({"type": "text", "text": t})));
        let result = json!({"content": content, "isError": failed});
        session.write(control::mcp(&held.request, &held.rpc_id, Ok(result)));
        true
    }

    /// An `interrupt` control request; the CLI's `result` follows.
    fn interrupt(session: &Claude) {
        let id = request_id(session.next_request());
        session.write(control::request(&id, json!({"subtype": "interrupt"})));
    }
}

fn on_stream(session: &Claude, event: &Value, parent: Option<String>) {
    let mut state = session.state();
    let turn = &mut state.turn;
    match event["type"].as_str().unwrap_or_default() {
        "message_start" => {
            let started = usage_started(&event["message"]["usage"]);
            turn.calls.retain(|(p, _)| *p != parent);
            if parent.is_none() {
                turn.streaming = true;
                turn.batch.clear();
                turn.arrived.clear();
            }
            turn.calls.push((parent, started));
        }
        // The call's final usage: metered now, whatever the turn does next.
        "message_delta" => {
            let pos = turn.calls.iter().position(|(p, _)| *p == parent);
            let started = pos.map(|i| turn.calls.swap_remove(i).1);
            state.meter(usage_ended(started.unwrap_or_default(), &event["usage"]));
        }
        "message_stop" if parent.is_none() => {
            turn.streaming = false;
            flush(&mut state);
        }
        _ if parent.is_some() => {}
        "content_block_start" => {
            let block = &event["content_block"];
            if block["type"] == "tool_use" {
                let name = block["name"].as_str().unwrap_or_default();
                if session.settings.names.is_client_tool(name) {
                    if let Some(id) = block["id"].as_str() {
                        turn.batch.push(id.to_string());
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
                        state.emit(TurnEvent::Delta(t.to_string()));
                    }
                }
                Some("thinking_delta") => {
                    if let Some(t) = text("thinking") {
                        state.emit(TurnEvent::Reasoning(t.to_string()));
                    }
                }
                _ => {}
            }
        }
        _ => {}
    }
}

/// Hands on the calls kept back, and `Yield` once the message's batch is complete.
fn flush(state: &mut State<ClaudeCode>) {
    if state.turn.streaming {
        return;
    }
    let calls = std::mem::take(&mut state.turn.kept_back);
    let handed = !calls.is_empty();
    for call in calls {
        state.emit(TurnEvent::ToolCall(call));
    }
    let turn = &state.turn;
    let complete = turn.batch.iter().all(|id| turn.arrived.contains(id));
    if handed && complete {
        state.emit(TurnEvent::Yield);
    }
}

fn on_request(session: &Claude, id: &str, request: &Value) {
    match request["subtype"].as_str().unwrap_or_default() {
        "mcp_message" => on_mcp(session, id, &request["message"]),
        "hook_callback" => {
            let input = &request["input"];
            let tool = input["tool_name"].as_str().unwrap_or_default();
            let use_id = input["tool_use_id"].as_str().unwrap_or_default();
            decide(
                session,
                id,
                tool,
                &input["tool_input"],
                use_id,
                Answer::Hook,
            );
        }
        "can_use_tool" => {
            let tool = request["tool_name"].as_str().unwrap_or_default();
            let use_id = request["tool_use_id"].as_str().unwrap_or_default();
            decide(session, id, tool, &request["input"], use_id, Answer::CanUse);
        }
        other => {
            tracing::debug!(
                backend_process = session.child.id,
                subtype = other,
                "unknown claude request refused"
            );
            session.write(control::error(id, &format!("unsupported request: {other}")));
        }
    }
}

fn on_mcp(session: &Claude, id: &str, message: &Value) {
    let rpc_id = message.get("id").cloned().unwrap_or(Value::Null);
    let method = message["method"].as_str().unwrap_or_default();
    let reply = |result: Result<Value, (i64, &str)>| {
        session.write(control::mcp(id, &rpc_id, result));
    };
    match method {
        "initialize" => reply(Ok(json!({
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "turnstile", "version": env!("CARGO_PKG_VERSION")},
        }))),
        "tools/list" => reply(Ok(json!({"tools": session.settings.tools}))),
        "tools/call" => on_call(session, id, rpc_id, &message["params"]),
        m if m.starts_with("notifications/") => reply(Ok(json!({}))),
        "ping" => reply(Ok(json!({}))),
        _ => reply(Err((-32601, "method not found"))),
    }
}

/// A client call: held, never answered by the gateway itself.
fn on_call(session: &Claude, id: &str, rpc_id: Value, params: &Value) {
    let declared = params["name"].as_str().unwrap_or_default();
    let mut state = session.state();
    let running = state.live();
    let Some(name) = session.settings.names.client(declared).filter(|_| running) else {
        drop(state);
        let result = json!({"content": [{"type": "text", "text": "no live execution for this call"}], "isError": true});
        session.write(control::mcp(id, &rpc_id, Ok(result)));
        return;
    };
    let held = Held {
        request: id.to_string(),
        rpc_id,
    };
    let arguments = match &params["arguments"] {
        Value::Null => "{}".to_string(),
        v => v.to_string(),
    };
    let call = session.hold(&mut state, held, name, arguments);
    let use_id = params["_meta"]["claudecode/toolUseId"].as_str();
    match use_id.filter(|u| state.turn.batch.iter().any(|b| b == u)) {
        // A call of the session's own model message: part of its batch.
        Some(use_id) => {
            state.turn.arrived.push(use_id.to_string());
            state.turn.kept_back.push(call);
        }
        // A subagent's: handed on at once, and the engine's debounce batches it.
        None => state.emit(TurnEvent::ToolCall(call)),
    }
    flush(&mut state);
}

/// A tool about to run: a client tool is the client's to allow; a built-in goes to the
/// approval policy, whose answer is written in the shape the request expects.
fn decide(session: &Claude, id: &str, tool: &str, input: &Value, use_id: &str, answer: Answer) {
    if session.settings.names.is_client_tool(tool)
        || (answer == Answer::CanUse
            && !use_id.is_empty()
            && session.state().turn.allowed.contains(use_id))
    {
        return session.write(answer.write(id, true, input, None));
    }
    let asked = use_id.to_string();
    let (request, written, use_id) = (id.to_string(), input.clone(), use_id.to_string());
    let reply = session.later(
        move |s: &Claude, (approve, reason): (bool, Option<String>)| {
            if approve && !use_id.is_empty() {
                s.state().turn.allowed.insert(use_id);
            }
            s.write(answer.write(&request, approve, &written, reason.as_deref()));
        },
    );
    session.ask(approval::ask((&session.cwd, &asked), tool, input, reply));
}

fn on_result(session: &Claude, subtype: &str, is_error: bool) {
    let mut state = session.state();
    // Calls the turn never got to are answered by nobody now.
    state.turn.kept_back.clear();
    state.finish(match (subtype, is_error) {
        ("success", false) => Ok(()),
        _ => Err(format!("claude turn ended: {subtype}")),
    });
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
