//! `turnstile-demo-backend`: a scripted stand-in for OpenAI's Codex `app-server`.
//!
//! It speaks the same newline-delimited JSON-RPC 2.0 over stdin/stdout as the real binary (see
//! `codex-app-server.md`): `"jsonrpc"` omitted on output and tolerated on input, `emittedAtMs` on
//! notifications, server->client request ids counting 0, 1, 2... per connection. The e2e tests
//! and the bundled demo config spawn it in place of `codex app-server`; it is not shipped in the
//! Docker image. Client requests handled: `initialize`, `thread/start`, `turn/start` (steers
//! when a turn is already active), `turn/interrupt`; anything else gets -32600.
//!
//! # Scenarios
//! Chosen by `thread/start.model` (default `echo`), overridable per turn by a `scenario=NAME`
//! token in the turn's last text input. Other directives: `delay=MS`, `tool=NAME`, `arg=VALUE`.
//! - `echo`: streams `You said: <text>`.
//! - `tool` / `text_then_tool`: (`Let me check.` first, then) one `item/tool/call`; streams
//!   `Tool result: <output>`.
//! - `parallel`: two concurrent tool calls; `Results: <o1> | <o2>`.
//! - `rounds3`: three sequential tool calls; `Done after 3 rounds: <o1>, <o2>, <o3>`.
//! - `hang`: nothing until interrupted. `slow`: waits `delay` ms (default 3000), then `echo`.
//! - `crash`: one delta `partial `, then exits with code 3.
//! - `fail`: `error` notification, then a `failed` turn.
//! - `garbage`: a non-JSON line, an unknown notification and an unknown server request, then
//!   `echo`.
//! - `approval` / `file_approval`: a command / file-change approval request, then acts on the
//!   decision (`Command ran.` / `Command declined.`, `File changed.` / `File change declined.`;
//!   `cancel` interrupts the turn).
//!
//! # Spy
//! When `TURNSTILE_DEMO_SPY` names a file, one JSON object per line is appended to it (one
//! write per line, so several processes may share the file). Events, by `event`:
//! - `started {pid}`, `request {method, pid}` (every client request), `exit {pid}` (stdin EOF);
//! - `thread_start {thread, model, ephemeral, dynamic_tools, developer_instructions,
//!   base_instructions, cwd, approval_policy, sandbox}` (raw `thread/start` params);
//! - `turn_start {thread, turn, input}`, `steer {thread}`, `interrupt {thread, turn}`;
//! - `tool_result {thread, call_id, success, text, error}` (`text` is the output the model sees);
//! - `approval_decision {thread, method, answer}`, `server_request_answer {thread, id, method,
//!   answer}`, `stale_answer {id}` (answer to an unknown or abandoned server request).

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

const USER_AGENT: &str = "turnstile-demo/0.1.0 (demo)";
const SCENARIOS: &[&str] = &[
    "echo",
    "tool",
    "text_then_tool",
    "parallel",
    "rounds3",
    "hang",
    "slow",
    "crash",
    "fail",
    "garbage",
    "approval",
    "file_approval",
];
const DEMO_ERROR: &str = "demo model failure";
const COMMAND: &str = "/bin/bash -lc 'rm -rf build'";

// ---------------------------------------------------------------------------------------------
// Spy log and small helpers

static SPY: OnceLock<Option<Mutex<File>>> = OnceLock::new();
/// Notification methods the client opted out of in `initialize` (set once).
static OPT_OUT: OnceLock<HashSet<String>> = OnceLock::new();

fn spy(event: Value) {
    let Some(Some(file)) = SPY.get() else { return };
    let line = format!("{event}\n");
    let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = file.write_all(line.as_bytes()).and_then(|()| file.flush()) {
        eprintln!("demo-backend: spy write failed: {e}");
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn rand_hex<const N: usize>() -> String {
    hex::encode(rand::random::<[u8; N]>())
}

/// A random UUIDv7-looking id.
fn uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x70;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    [&h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..]].join("-")
}

/// `base` with the members of `extra` appended (both are JSON objects).
fn merge(mut base: Value, extra: Value) -> Value {
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

/// The `turn` of a `turn/completed` notification.
fn ended_turn(id: &str, status: &str, error: Value) -> Value {
    let turn = json!({"id": id, "status": status, "error": error, "items": []});
    merge(turn, json!({"itemsView": "summary", "durationMs": 1}))
}

/// Value of a `key=VALUE` token anywhere in `text` (VALUE runs to the next whitespace).
fn directive<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("{key}=");
    let mut from = 0;
    while let Some(pos) = text[from..].find(&pat) {
        let start = from + pos;
        let prev = text[..start].chars().next_back();
        if prev.is_none_or(|c| !(c.is_alphanumeric() || c == '_')) {
            let rest = &text[start + pat.len()..];
            return Some(&rest[..rest.find(char::is_whitespace).unwrap_or(rest.len())]);
        }
        from = start + pat.len();
    }
    None
}

/// Splits `text` into at most three non-empty, roughly equal chunks.
fn chunks(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len().min(3);
    let bound = |i: usize| i * chars.len() / n;
    (0..n)
        .map(|i| chars[bound(i)..bound(i + 1)].iter().collect())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Shared state

enum Out {
    Line(String),
    Exit(i32),
}

#[derive(Clone)]
struct ToolSpec {
    name: String,
    namespace: Option<String>,
    schema: Value,
}

struct ActiveTurn {
    id: String,
    /// `dynamicToolCall` items started but not yet completed (in-progress shape).
    open_calls: Vec<Value>,
    task: Option<AbortHandle>,
}

struct Thread {
    scenario: String,
    tools: Vec<ToolSpec>,
    usage_reports: u64,
    active: Option<ActiveTurn>,
}

/// One of our server->client requests awaiting its answer.
struct Pending {
    thread: String,
    turn: String,
    method: String,
    call_id: Option<String>,
    tx: oneshot::Sender<Value>,
}

#[derive(Default)]
struct State {
    initialized: bool,
    experimental: bool,
    next_request_id: u64,
    threads: HashMap<String, Thread>,
    pending: HashMap<u64, Pending>,
}

impl State {
    fn active_mut(&mut self, thread: &str) -> Option<&mut ActiveTurn> {
        self.threads.get_mut(thread)?.active.as_mut()
    }
}

#[derive(Clone)]
struct Ctx {
    state: Arc<Mutex<State>>,
    out: mpsc::UnboundedSender<Out>,
}

impl Ctx {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn send(&self, msg: Value) {
        // The writer task lives until the process exits, so a send error cannot matter.
        let _ = self.out.send(Out::Line(msg.to_string()));
    }
    fn notify(&self, method: &str, params: Value) {
        if OPT_OUT.get().is_some_and(|s| s.contains(method)) {
            return;
        }
        self.send(json!({"method": method, "params": params, "emittedAtMs": now_ms()}));
    }
    fn respond(&self, id: &Value, result: Value) {
        self.send(json!({"id": id, "result": result}));
    }
    fn error(&self, id: &Value, message: &str) {
        self.send(json!({"id": id, "error": {"code": -32600, "message": message}}));
    }
}

// ---------------------------------------------------------------------------------------------
// A running turn, as seen by its scenario task

/// The turn was interrupted (or otherwise ended): the scenario must stop.
struct Stopped;
type Step<T = ()> = Result<T, Stopped>;

struct Turn {
    ctx: Ctx,
    thread: String,
    id: String,
}

impl Turn {
    /// Runs `f` under the state lock, but only while this turn is still the thread's active
    /// turn: emissions are thereby atomic with respect to `turn/interrupt`.
    fn guarded<R>(&self, f: impl FnOnce(&mut State) -> R) -> Step<R> {
        let mut st = self.ctx.lock();
        match st.active_mut(&self.thread) {
            Some(a) if a.id == self.id => Ok(f(&mut st)),
            _ => Err(Stopped),
        }
    }
    /// Emits a notification whose params start with this turn's `threadId` and `turnId`.
    fn notify(&self, method: &str, extra: Value) -> Step {
        let params = merge(json!({"threadId": self.thread, "turnId": self.id}), extra);
        self.guarded(|_| self.ctx.notify(method, params))
    }
    fn item_started(&self, item: Value) -> Step {
        self.notify(
            "item/started",
            json!({"startedAtMs": now_ms(), "item": item}),
        )
    }
    fn item_completed(&self, item: Value) -> Step {
        self.notify(
            "item/completed",
            json!({"completedAtMs": now_ms(), "item": item}),
        )
    }
    fn status(&self, flags: &[&str]) -> Step {
        let status = json!({"type": "active", "activeFlags": flags});
        self.guarded(|_| {
            let params = json!({"threadId": self.thread, "status": status});
            self.ctx.notify("thread/status/changed", params)
        })
    }
    fn stream_text(&self, text: &str) -> Step {
        let id = format!("msg_{}", rand_hex::<8>());
        self.item_started(json!({"type": "agentMessage", "id": id, "text": ""}))?;
        for delta in chunks(text) {
            self.notify(
                "item/agentMessage/delta",
                json!({"itemId": id, "delta": delta}),
            )?;
        }
        self.item_completed(json!({"type": "agentMessage", "id": id, "text": text}))
    }
    fn report_usage(&self) -> Step {
        self.guarded(|st| {
            let n = st.threads.get_mut(&self.thread).map_or(1, |th| {
                th.usage_reports += 1;
                th.usage_reports
            });
            let usage = |k: u64| {
                json!({"totalTokens": 15 * k, "inputTokens": 10 * k, "cachedInputTokens": 0,
                    "cacheWriteInputTokens": 0, "outputTokens": 5 * k, "reasoningOutputTokens": 0})
            };
            let token_usage =
                json!({"total": usage(n), "last": usage(1), "modelContextWindow": 200000});
            let params =
                json!({"threadId": self.thread, "turnId": self.id, "tokenUsage": token_usage});
            self.ctx.notify("thread/tokenUsage/updated", params);
            self.ctx
                .notify("account/rateLimits/updated", json!({"rateLimits": {}}));
        })
    }
    /// Emits `thread/status/changed` idle and `turn/completed`, and retires the turn.
    fn finish(&self, turn: Value) -> Step {
        self.guarded(|st| {
            let idle = json!({"threadId": self.thread, "status": {"type": "idle"}});
            self.ctx.notify("thread/status/changed", idle);
            self.ctx.notify(
                "turn/completed",
                json!({"threadId": self.thread, "turn": turn}),
            );
            if let Some(th) = st.threads.get_mut(&self.thread) {
                th.active = None;
            }
        })
    }
    fn complete(&self) -> Step {
        self.finish(ended_turn(&self.id, "completed", Value::Null))
    }
    /// Sends a server request (registering `open_call` as an open tool item, if given).
    fn request(
        &self,
        method: &str,
        params: Value,
        open_call: Option<Value>,
    ) -> Step<(u64, oneshot::Receiver<Value>)> {
        let (tx, rx) = oneshot::channel();
        self.guarded(|st| {
            let id = st.next_request_id;
            st.next_request_id += 1;
            let call_id = open_call
                .as_ref()
                .map(|c| c["id"].as_str().unwrap_or("").to_owned());
            if let (Some(call), Some(active)) = (open_call, st.active_mut(&self.thread)) {
                active.open_calls.push(call);
            }
            let (thread, turn, method) = (self.thread.clone(), self.id.clone(), method.to_owned());
            self.ctx
                .send(json!({"id": id, "method": method, "params": params}));
            st.pending.insert(
                id,
                Pending {
                    thread,
                    turn,
                    method,
                    call_id,
                    tx,
                },
            );
            (id, rx)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Dynamic tool calls

struct ToolOutcome {
    success: Option<bool>,
    text: String,
    error: Value,
    content_items: Value,
}

/// Interprets an answer to `item/tool/call` the way the real binary does.
fn tool_outcome(answer: &Value) -> ToolOutcome {
    let failed = |text: &str, error: Value| ToolOutcome {
        success: None,
        text: text.to_owned(),
        error,
        content_items: json!([{"type": "inputText", "text": text}]),
    };
    if let Some(err) = answer.get("error") {
        return failed("dynamic tool request failed", err.clone());
    }
    let parsed = answer.get("result").and_then(|r| {
        let success = r.get("success")?.as_bool()?;
        let mut text = String::new();
        for item in r.get("contentItems")?.as_array()? {
            match item.get("type")?.as_str()? {
                "inputText" => text.push_str(item.get("text")?.as_str()?),
                "inputImage" => _ = item.get("imageUrl")?.as_str()?,
                "inputAudio" => _ = item.get("audioUrl")?.as_str()?,
                _ => return None,
            }
        }
        Some((success, text, r["contentItems"].clone()))
    });
    match parsed {
        Some((success, text, items)) => ToolOutcome {
            success: Some(success),
            text,
            error: Value::Null,
            content_items: items,
        },
        None => failed("dynamic tool response was invalid", Value::Null),
    }
}

/// Emits `item/started` plus the `item/tool/call` request; returns the call item and receiver.
fn start_call(
    turn: &Turn,
    tool: &ToolSpec,
    args: Value,
) -> Step<(Value, oneshot::Receiver<Value>)> {
    let call_id = format!("call_{}", rand_hex::<12>());
    let item = json!({"type": "dynamicToolCall", "id": call_id, "namespace": tool.namespace,
        "tool": tool.name, "arguments": args, "status": "inProgress", "contentItems": null,
        "success": null});
    turn.item_started(item.clone())?;
    let params = json!({"threadId": turn.thread, "turnId": turn.id, "callId": call_id,
        "namespace": tool.namespace, "tool": tool.name, "arguments": args});
    let (_, rx) = turn.request("item/tool/call", params, Some(item.clone()))?;
    Ok((item, rx))
}

/// Waits for the answer, emits the completed item and returns the tool output text.
async fn finish_call(
    turn: &Turn,
    (mut item, rx): (Value, oneshot::Receiver<Value>),
) -> Step<String> {
    let answer = rx.await.map_err(|_| Stopped)?;
    let outcome = tool_outcome(&answer);
    let success = outcome.success.unwrap_or(false);
    item["status"] = json!(if success { "completed" } else { "failed" });
    item["success"] = json!(success);
    item["contentItems"] = outcome.content_items;
    item["durationMs"] = json!(1);
    let id = item["id"].clone();
    turn.guarded(|st| {
        if let Some(active) = st.active_mut(&turn.thread) {
            active.open_calls.retain(|c| c["id"] != id);
        }
    })?;
    turn.item_completed(item)?;
    Ok(outcome.text)
}

// ---------------------------------------------------------------------------------------------
// Scenarios

struct TurnSpec {
    scenario: String,
    text: String,
    tools: Vec<ToolSpec>,
}

impl TurnSpec {
    /// The tool to call, per `tool=NAME`, else the first "read" tool, else the first tool.
    fn tool(&self) -> Option<ToolSpec> {
        if let Some(name) = directive(&self.text, "tool") {
            let found = self.tools.iter().find(|t| t.name == name).cloned();
            return Some(found.unwrap_or(ToolSpec {
                name: name.to_owned(),
                namespace: None,
                schema: Value::Null,
            }));
        }
        let read = self
            .tools
            .iter()
            .find(|t| t.name.to_lowercase().contains("read"));
        read.or(self.tools.first()).cloned()
    }
    fn args(&self, tool: &ToolSpec, suffix: &str) -> Value {
        let key = tool.schema["required"][0].as_str().map(str::to_owned);
        let first_prop = || {
            tool.schema["properties"]
                .as_object()?
                .keys()
                .next()
                .cloned()
        };
        let key = key
            .or_else(first_prop)
            .unwrap_or_else(|| "input".to_owned());
        let value = directive(&self.text, "arg")
            .or_else(|| self.text.split_whitespace().find(|w| w.starts_with('/')))
            .unwrap_or(&self.text);
        json!({ key: format!("{value}{suffix}") })
    }
}

async fn run_scenario(turn: &Turn, spec: &TurnSpec) -> Step {
    let echo = |turn: &Turn| {
        turn.stream_text(&format!("You said: {}", spec.text))?;
        turn.report_usage()?;
        turn.complete()
    };
    match spec.scenario.as_str() {
        "tool" | "text_then_tool" | "parallel" | "rounds3" => {
            if spec.scenario == "text_then_tool" {
                turn.stream_text("Let me check.")?;
            }
            let Some(tool) = spec.tool() else {
                turn.stream_text("No tools available.")?;
                turn.report_usage()?;
                return turn.complete();
            };
            let text = match spec.scenario.as_str() {
                "parallel" => {
                    let first = start_call(turn, &tool, spec.args(&tool, " #1"))?;
                    let second = start_call(turn, &tool, spec.args(&tool, " #2"))?;
                    let (a, b) = tokio::join!(finish_call(turn, first), finish_call(turn, second));
                    format!("Results: {} | {}", a?, b?)
                }
                "rounds3" => {
                    let mut outs = Vec::new();
                    for round in 1..=3 {
                        let call =
                            start_call(turn, &tool, spec.args(&tool, &format!(" round {round}")))?;
                        outs.push(finish_call(turn, call).await?);
                    }
                    format!("Done after 3 rounds: {}", outs.join(", "))
                }
                _ => {
                    let call = start_call(turn, &tool, spec.args(&tool, ""))?;
                    format!("Tool result: {}", finish_call(turn, call).await?)
                }
            };
            turn.report_usage()?;
            turn.stream_text(&text)?;
            turn.complete()
        }
        "hang" => std::future::pending().await,
        "slow" => {
            let delay = directive(&spec.text, "delay").and_then(|d| d.parse().ok());
            tokio::time::sleep(Duration::from_millis(delay.unwrap_or(3000))).await;
            echo(turn)
        }
        "crash" => {
            let id = format!("msg_{}", rand_hex::<8>());
            turn.item_started(json!({"type": "agentMessage", "id": id, "text": ""}))?;
            turn.notify(
                "item/agentMessage/delta",
                json!({"itemId": id, "delta": "partial "}),
            )?;
            // The writer flushes everything queued before this and then exits the process.
            let _ = turn.ctx.out.send(Out::Exit(3));
            std::future::pending().await
        }
        "fail" => {
            let error = json!({"message": DEMO_ERROR, "codexErrorInfo": "internalServerError"});
            turn.notify("error", json!({"willRetry": false, "error": error}))?;
            turn.finish(ended_turn(&turn.id, "failed", error))
        }
        "garbage" => {
            turn.guarded(|_| {
                let _ = turn
                    .ctx
                    .out
                    .send(Out::Line("this is not json {".to_owned()));
                turn.ctx.send(json!({"method": "demo/unknownNotification",
                    "params": {"threadId": turn.thread, "payload": {"nested": [1, 2, 3]}},
                    "emittedAtMs": now_ms(), "extraTopLevel": "ignore me"}));
            })?;
            let params = json!({"threadId": turn.thread});
            let (_, rx) = turn.request("demo/unknownRequest", params, None)?;
            rx.await.map_err(|_| Stopped)?;
            echo(turn)
        }
        "approval" | "file_approval" => {
            // `delay=MS` postpones the request (lets a test act between turn start and ask).
            if let Some(ms) = directive(&spec.text, "delay").and_then(|d| d.parse().ok()) {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            approval(turn, spec.scenario == "file_approval").await
        }
        _ => echo(turn),
    }
}

/// The `approval` (command) and `file_approval` (file change) scenarios.
async fn approval(turn: &Turn, file: bool) -> Step {
    let (prefix, ran, declined) = match file {
        true => ("pe", "File changed.", "File change declined."),
        false => ("sh", "Command ran.", "Command declined."),
    };
    let item_id = format!("call_{prefix}_{}", rand_hex::<6>());
    let mut item = if file {
        let change = json!({"path": "/w/demo.txt", "kind": {"type": "add"}, "diff": "hello\n"});
        json!({"type": "fileChange", "id": item_id, "changes": [change], "status": "inProgress"})
    } else {
        json!({
            "type": "commandExecution", "id": item_id, "command": COMMAND, "cwd": "/w",
            "status": "inProgress", "commandActions": [], "source": "agent",
        })
    };
    turn.item_started(item.clone())?;
    let (t, u) = (&turn.thread, &turn.id);
    let base = json!({"threadId": t, "turnId": u, "itemId": item_id, "startedAtMs": now_ms()});
    let (method, params) = if file {
        let extra = json!({"reason": null, "grantRoot": null});
        ("item/fileChange/requestApproval", merge(base, extra))
    } else {
        let params = merge(json!({"kind": "command"}), base);
        let extra = json!({
            "environmentId": "local", "reason": "clean the build", "command": COMMAND,
            "cwd": "/w", "commandActions": [], "availableDecisions": ["accept", "cancel"],
        });
        (
            "item/commandExecution/requestApproval",
            merge(params, extra),
        )
    };
    turn.status(&["waitingOnApproval"])?;
    let (request_id, rx) = turn.request(method, params, None)?;
    let answer = rx.await.map_err(|_| Stopped)?;
    turn.guarded(|_| {
        let params = json!({"threadId": t, "requestId": request_id});
        turn.ctx.notify("serverRequest/resolved", params)
    })?;
    turn.status(&[])?;

    let decision = &answer["result"]["decision"];
    let accepted = matches!(decision.as_str(), Some("accept" | "acceptForSession"))
        || (!file && decision.get("acceptWithExecpolicyAmendment").is_some());
    if accepted {
        item["status"] = json!("completed");
        if !file {
            item = merge(
                item,
                json!({"exitCode": 0, "aggregatedOutput": "", "durationMs": 1}),
            );
        }
        turn.item_completed(item)?;
        if file {
            turn.notify("turn/diff/updated", json!({"diff": "+hello\n"}))?;
        }
        turn.stream_text(ran)?;
    } else {
        item["status"] = json!("declined");
        turn.item_completed(item)?;
        if decision.as_str() == Some("cancel") {
            return turn.finish(ended_turn(u, "interrupted", Value::Null));
        }
        turn.stream_text(declined)?;
    }
    turn.report_usage()?;
    turn.complete()
}

// ---------------------------------------------------------------------------------------------
// Client requests

fn parse_tools(value: &Value) -> Result<Vec<ToolSpec>, String> {
    fn function(v: &Value, namespace: Option<String>) -> Result<ToolSpec, String> {
        let name = v.get("name").and_then(Value::as_str);
        let name = name
            .ok_or("Invalid request: missing field `name`")?
            .to_owned();
        let namespace = namespace.or_else(|| v["namespace"].as_str().map(str::to_owned));
        Ok(ToolSpec {
            name,
            namespace,
            schema: v["inputSchema"].clone(),
        })
    }
    let list = value
        .as_array()
        .ok_or("Invalid request: invalid type for `dynamicTools`")?;
    let mut tools = Vec::new();
    for v in list {
        match v.get("type").and_then(Value::as_str) {
            None | Some("function") => tools.push(function(v, None)?),
            Some("namespace") => {
                let ns = v["name"]
                    .as_str()
                    .ok_or("Invalid request: missing field `name`")?;
                for inner in v["tools"].as_array().into_iter().flatten() {
                    tools.push(function(inner, Some(ns.to_owned()))?);
                }
            }
            Some(other) => {
                return Err(format!(
                    "Invalid request: unknown variant `{other}`, expected `function` or `namespace`"
                ))
            }
        }
    }
    Ok(tools)
}

fn initialize(ctx: &Ctx, id: &Value, params: &Value) {
    let mut st = ctx.lock();
    if st.initialized {
        return ctx.error(id, "Already initialized");
    }
    if params.get("clientInfo").is_none_or(Value::is_null) {
        return ctx.error(id, "Invalid request: missing field `clientInfo`");
    }
    let caps = &params["capabilities"];
    st.initialized = true;
    st.experimental = caps["experimentalApi"].as_bool().unwrap_or(false);
    let opt_out = caps["optOutNotificationMethods"]
        .as_array()
        .into_iter()
        .flatten();
    let _ = OPT_OUT.set(
        opt_out
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
    );
    let result = json!({
        "userAgent": USER_AGENT, "codexHome": "/nonexistent",
        "platformFamily": "unix", "platformOs": "linux",
    });
    ctx.respond(id, result);
    let warning = json!({"summary": "demo backend", "details": null});
    ctx.notify("configWarning", warning);
}

fn thread_start(ctx: &Ctx, id: &Value, p: &Value) {
    let mut st = ctx.lock();
    let dynamic = p.get("dynamicTools").filter(|v| !v.is_null());
    if dynamic.is_some() && !st.experimental {
        let message = "thread/start.dynamicTools requires experimentalApi capability";
        return ctx.error(id, message);
    }
    let tools = match dynamic.map(parse_tools).transpose() {
        Ok(tools) => tools.unwrap_or_default(),
        Err(message) => return ctx.error(id, &message),
    };
    let thread_id = uuid();
    let model = p["model"].as_str().unwrap_or("demo");
    let cwd = p["cwd"].as_str().unwrap_or("/");
    let ephemeral = p["ephemeral"].as_bool().unwrap_or(false);
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    spy(json!({
        "event": "thread_start", "thread": thread_id, "model": p["model"],
        "ephemeral": ephemeral, "dynamic_tools": names,
        "developer_instructions": p["developerInstructions"],
        "base_instructions": p["baseInstructions"], "cwd": p["cwd"],
        "approval_policy": p["approvalPolicy"], "sandbox": p["sandbox"],
    }));
    let thread = json!({
        "id": thread_id, "ephemeral": ephemeral, "status": {"type": "idle"}, "turns": [],
        "cliVersion": "0.0.0-demo", "model": model, "modelProvider": "demo", "cwd": cwd,
    });
    let policy = p.get("approvalPolicy").filter(|v| !v.is_null());
    ctx.respond(
        id,
        json!({
            "thread": thread, "model": model, "modelProvider": "demo", "cwd": cwd,
            "approvalPolicy": policy.cloned().unwrap_or(json!("never")),
            "sandbox": {"type": "readOnly", "networkAccess": false},
        }),
    );
    ctx.notify("thread/started", json!({"thread": thread}));
    let scenario = Some(model)
        .filter(|m| SCENARIOS.contains(m))
        .unwrap_or("echo");
    let thread = Thread {
        scenario: scenario.to_owned(),
        tools,
        usage_reports: 0,
        active: None,
    };
    st.threads.insert(thread_id, thread);
}

fn turn_start(ctx: &Ctx, id: &Value, p: &Value) {
    let Some(thread_id) = p["threadId"].as_str() else {
        return ctx.error(id, "Invalid request: missing field `threadId`");
    };
    let Some(input) = p["input"].as_array() else {
        return ctx.error(id, "Invalid request: missing field `input`");
    };
    let mut st = ctx.lock();
    let Some(thread) = st.threads.get_mut(thread_id) else {
        return ctx.error(id, &format!("thread not found: {thread_id}"));
    };
    let turn_obj = |turn_id: &str| {
        let turn = json!({"id": turn_id, "status": "inProgress", "items": []});
        merge(turn, json!({"itemsView": "notLoaded", "error": null}))
    };
    if let Some(active) = &thread.active {
        // Like the real binary: input for a busy thread steers the active turn.
        spy(json!({"event": "steer", "thread": thread_id}));
        return ctx.respond(id, json!({"turn": turn_obj(&active.id)}));
    }
    let turn_id = uuid();
    let texts: Vec<&str> = input
        .iter()
        .filter(|i| i["type"] == "text")
        .filter_map(|i| i["text"].as_str())
        .collect();
    spy(json!({"event": "turn_start", "thread": thread_id, "turn": turn_id, "input": texts}));
    let text = texts.last().copied().unwrap_or("").to_owned();
    let scenario = directive(&text, "scenario").filter(|s| SCENARIOS.contains(s));
    let scenario = scenario.unwrap_or(&thread.scenario).to_owned();
    let spec = TurnSpec {
        scenario,
        text,
        tools: thread.tools.clone(),
    };
    let active = ActiveTurn {
        id: turn_id.clone(),
        open_calls: Vec::new(),
        task: None,
    };
    thread.active = Some(active);

    let (t, u) = (thread_id, turn_id.as_str());
    ctx.respond(id, json!({"turn": turn_obj(u)}));
    let status = json!({"type": "active", "activeFlags": []});
    ctx.notify(
        "thread/status/changed",
        json!({"threadId": t, "status": status}),
    );
    ctx.notify("turn/started", json!({"threadId": t, "turn": turn_obj(u)}));
    let item = json!({"type": "userMessage", "id": uuid(), "content": input});
    let started = json!({"threadId": t, "turnId": u, "startedAtMs": now_ms(), "item": item});
    ctx.notify("item/started", started);
    let completed = json!({"threadId": t, "turnId": u, "completedAtMs": now_ms(), "item": item});
    ctx.notify("item/completed", completed);

    let turn = Turn {
        ctx: ctx.clone(),
        thread: t.to_owned(),
        id: turn_id,
    };
    // The task blocks on the state lock until this function returns, so `task` is set first.
    let task = tokio::spawn(async move {
        let _ = run_scenario(&turn, &spec).await;
    });
    if let Some(active) = st.active_mut(thread_id) {
        active.task = Some(task.abort_handle());
    }
}

fn turn_interrupt(ctx: &Ctx, id: &Value, p: &Value) {
    let (Some(thread_id), Some(turn_id)) = (p["threadId"].as_str(), p["turnId"].as_str()) else {
        return ctx.error(id, "Invalid request: missing field `threadId` or `turnId`");
    };
    let mut st = ctx.lock();
    let thread = st.threads.get_mut(thread_id);
    let Some(active) = thread.and_then(|th| th.active.take_if(|a| a.id == turn_id)) else {
        return ctx.error(id, "no active turn to interrupt");
    };
    spy(json!({"event": "interrupt", "thread": thread_id, "turn": turn_id}));
    // Forget the turn's outstanding server requests: late answers become stale.
    let abandoned: Vec<u64> = st
        .pending
        .iter()
        .filter(|(_, p)| p.turn == turn_id)
        .map(|(k, _)| *k)
        .collect();
    let mut approvals = Vec::new();
    for key in abandoned {
        let pending = st.pending.remove(&key);
        if pending.is_some_and(|p| p.method.ends_with("requestApproval")) {
            approvals.push(key);
        }
    }
    approvals.sort_unstable();

    ctx.respond(id, json!({}));
    for item in active.open_calls {
        let item = merge(
            item,
            json!({"status": "failed", "success": false, "contentItems": []}),
        );
        let at = now_ms();
        let params =
            json!({"threadId": thread_id, "turnId": turn_id, "completedAtMs": at, "item": item});
        ctx.notify("item/completed", params);
    }
    let idle = json!({"threadId": thread_id, "status": {"type": "idle"}});
    ctx.notify("thread/status/changed", idle);
    let turn = ended_turn(turn_id, "interrupted", Value::Null);
    ctx.notify(
        "turn/completed",
        json!({"threadId": thread_id, "turn": turn}),
    );
    for request_id in approvals {
        let params = json!({"threadId": thread_id, "requestId": request_id});
        ctx.notify("serverRequest/resolved", params);
    }
    if let Some(task) = active.task {
        task.abort();
    }
}

/// Routes the answer to one of our server requests to the waiting scenario.
fn handle_answer(ctx: &Ctx, msg: Value) {
    let id = msg["id"].clone();
    let Some(p) = id.as_u64().and_then(|n| ctx.lock().pending.remove(&n)) else {
        return spy(json!({"event": "stale_answer", "id": id}));
    };
    let (thread, method) = (&p.thread, &p.method);
    spy(if let Some(call_id) = &p.call_id {
        let o = tool_outcome(&msg);
        json!({
            "event": "tool_result", "thread": thread, "call_id": call_id,
            "success": o.success, "text": o.text, "error": o.error,
        })
    } else if method.ends_with("requestApproval") {
        json!({"event": "approval_decision", "thread": thread, "method": method, "answer": msg})
    } else {
        json!({
            "event": "server_request_answer", "thread": thread, "id": id,
            "method": method, "answer": msg,
        })
    });
    // The scenario may have been aborted meanwhile; then nobody needs the answer.
    let _ = p.tx.send(msg);
}

fn handle_line(ctx: &Ctx, line: &str) {
    let line = line.trim();
    if line.is_empty() {
        return;
    }
    let msg = match serde_json::from_str::<Value>(line) {
        Ok(msg) if msg.is_object() => msg,
        _ => return eprintln!("demo-backend: ignoring a line that is not a JSON object: {line}"),
    };
    let id = msg.get("id").filter(|v| !v.is_null());
    match (msg["method"].as_str(), id) {
        (Some(method), Some(id)) => {
            spy(json!({"event": "request", "method": method, "pid": std::process::id()}));
            let params = &msg["params"];
            if method == "initialize" {
                return initialize(ctx, id, params);
            }
            if !ctx.lock().initialized {
                return ctx.error(id, "Not initialized");
            }
            match method {
                "thread/start" => thread_start(ctx, id, params),
                "turn/start" => turn_start(ctx, id, params),
                "turn/interrupt" => turn_interrupt(ctx, id, params),
                other => ctx.error(id, &format!("Invalid request: unknown variant `{other}`")),
            }
        }
        (Some("initialized"), None) => {}
        (Some(method), None) => eprintln!("demo-backend: ignoring notification {method}"),
        (None, Some(_)) if msg.get("result").is_some() || msg.get("error").is_some() => {
            handle_answer(ctx, msg)
        }
        _ => eprintln!("demo-backend: ignoring unclassifiable message: {line}"),
    }
}

/// Owns stdout: writes each message as one line and flushes it.
async fn writer(mut rx: mpsc::UnboundedReceiver<Out>) {
    let mut stdout = tokio::io::stdout();
    while let Some(out) = rx.recv().await {
        match out {
            Out::Line(mut line) => {
                line.push('\n');
                let written = stdout.write_all(line.as_bytes()).await;
                if let Err(e) = written.and(stdout.flush().await) {
                    eprintln!("demo-backend: stdout write failed: {e}");
                    std::process::exit(1);
                }
            }
            Out::Exit(code) => {
                let _ = stdout.flush().await;
                std::process::exit(code);
            }
        }
    }
}

#[tokio::main]
async fn main() {
    let spy_file = std::env::var_os("TURNSTILE_DEMO_SPY").and_then(|path| {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| {
                eprintln!(
                    "demo-backend: cannot open spy file {}: {e}",
                    path.to_string_lossy()
                )
            })
            .ok()
    });
    let _ = SPY.set(spy_file.map(Mutex::new));
    let pid = std::process::id();
    spy(json!({"event": "started", "pid": pid}));

    let (tx, rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(writer(rx));
    let ctx = Ctx {
        state: Arc::new(Mutex::new(State::default())),
        out: tx,
    };
    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match stdin.read_until(b'\n', &mut buf).await {
            Ok(0) => break,
            Ok(_) => handle_line(&ctx, &String::from_utf8_lossy(&buf)),
            Err(e) => {
                eprintln!("demo-backend: stdin read failed: {e}");
                break;
            }
        }
    }
    spy(json!({"event": "exit", "pid": pid}));
    let _ = ctx.out.send(Out::Exit(0));
    let _ = writer.await;
}
