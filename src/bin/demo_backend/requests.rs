//! Client requests: `initialize`, `thread/start`, `turn/start` (steering a busy thread),
//! `turn/interrupt`, and answers to our own server requests.

use serde_json::{json, Value};

use crate::protocol::{Ctx, OPT_OUT};
use crate::scenarios::{run_scenario, TurnSpec, SCENARIOS};
use crate::spy::spy;
use crate::state::{ActiveTurn, Thread, ToolSpec};
use crate::tools::tool_outcome;
use crate::turn::Turn;
use crate::util::{directive, ended_turn, merge, now_ms, uuid};

pub(crate) const USER_AGENT: &str = "turnstile-demo/0.1.0 (demo)";

pub(crate) fn parse_tools(value: &Value) -> Result<Vec<ToolSpec>, String> {
    pub(crate) fn function(v: &Value, namespace: Option<String>) -> Result<ToolSpec, String> {
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

pub(crate) fn initialize(ctx: &Ctx, id: &Value, params: &Value) {
    let mut st = ctx.state.lock();
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

pub(crate) fn thread_start(ctx: &Ctx, id: &Value, p: &Value) {
    let mut st = ctx.state.lock();
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
        ephemeral,
    };
    st.threads.insert(thread_id, thread);
}

pub(crate) fn turn_start(ctx: &Ctx, id: &Value, p: &Value) {
    let Some(thread_id) = p["threadId"].as_str() else {
        return ctx.error(id, "Invalid request: missing field `threadId`");
    };
    let Some(input) = p["input"].as_array() else {
        return ctx.error(id, "Invalid request: missing field `input`");
    };
    let mut st = ctx.state.lock();
    let Some(thread) = st.threads.get_mut(thread_id) else {
        return ctx.error(id, &format!("thread not found: {thread_id}"));
    };
    let turn_obj = |turn_id: &str| {
        let turn = json!({"id": turn_id, "status": "inProgress", "items": []});
        merge(turn, json!({"itemsView": "notLoaded", "error": null}))
    };
    let texts: Vec<&str> = input
        .iter()
        .filter(|i| i["type"] == "text")
        .filter_map(|i| i["text"].as_str())
        .collect();
    if let Some(active) = &thread.active {
        // Like the real binary: input for a busy thread steers the active turn.
        spy(json!({"event": "steer", "thread": thread_id, "input": texts}));
        return ctx.respond(id, json!({"turn": turn_obj(&active.id)}));
    }
    let turn_id = uuid();
    spy(
        json!({"event": "turn_start", "thread": thread_id, "turn": turn_id, "input": texts,
               "effort": p["effort"], "outputSchema": p["outputSchema"]}),
    );
    let text = texts.last().copied().unwrap_or("").to_owned();
    // Like a backend logging verbosely: its stderr quotes the input (the gateway must not
    // carry that into its own log).
    eprintln!("demo-backend: turn input: {text}");
    let scenario = directive(&text, "scenario").filter(|s| SCENARIOS.contains(s));
    let scenario = scenario.unwrap_or(&thread.scenario).to_owned();
    let spec = TurnSpec {
        scenario,
        text,
        tools: thread.tools.clone(),
        schema: p.get("outputSchema").filter(|s| s.is_object()).cloned(),
    };
    let active = ActiveTurn {
        id: turn_id.clone(),
        open_calls: Vec::new(),
        task: None,
        unreported: false,
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

/// `turn/steer {threadId, input, expectedTurnId}`: input for the active turn, which must be
/// the expected one (recorded; the scripted model does not read it).
pub(crate) fn turn_steer(ctx: &Ctx, id: &Value, p: &Value) {
    let (Some(thread_id), Some(expected)) = (p["threadId"].as_str(), p["expectedTurnId"].as_str())
    else {
        return ctx.error(
            id,
            "Invalid request: missing field `threadId` or `expectedTurnId`",
        );
    };
    let texts: Vec<&str> = p["input"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["type"] == "text")
        .filter_map(|i| i["text"].as_str())
        .collect();
    let st = ctx.state.lock();
    let active = st.threads.get(thread_id).and_then(|t| t.active.as_ref());
    if active.is_none_or(|a| a.id != expected) {
        return ctx.error(id, "no active turn to steer");
    }
    spy(json!({"event": "steer", "thread": thread_id, "input": texts}));
    ctx.respond(id, json!({"turnId": expected}));
}

pub(crate) fn turn_interrupt(ctx: &Ctx, id: &Value, p: &Value) {
    let (Some(thread_id), Some(turn_id)) = (p["threadId"].as_str(), p["turnId"].as_str()) else {
        return ctx.error(id, "Invalid request: missing field `threadId` or `turnId`");
    };
    let mut st = ctx.state.lock();
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
    if active.unreported {
        crate::turn::report_usage(ctx, &mut st, thread_id, turn_id);
    }
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

/// `thread/delete`: unloads a persisted thread (an ephemeral one is refused, as by the real
/// binary); its running turn, if any, is aborted.
pub(crate) fn thread_delete(ctx: &Ctx, id: &Value, p: &Value) {
    let Some(thread_id) = p["threadId"].as_str() else {
        return ctx.error(id, "Invalid request: missing field `threadId`");
    };
    let mut st = ctx.state.lock();
    match st.threads.get(thread_id).map(|t| t.ephemeral) {
        None => return ctx.error(id, &format!("thread not found: {thread_id}")),
        Some(true) => {
            let message = format!("thread is not persisted and cannot be deleted: {thread_id}");
            return ctx.error(id, &message);
        }
        Some(false) => {}
    }
    if let Some(task) = st
        .threads
        .remove(thread_id)
        .and_then(|t| t.active)
        .and_then(|a| a.task)
    {
        task.abort();
    }
    st.pending.retain(|_, p| p.thread != thread_id);
    spy(json!({"event": "thread_delete", "thread": thread_id, "loaded": st.threads.len()}));
    ctx.respond(id, json!({}));
    ctx.notify("thread/deleted", json!({"threadId": thread_id}));
}

/// Routes the answer to one of our server requests to the waiting scenario.
pub(crate) fn handle_answer(ctx: &Ctx, msg: Value) {
    let id = msg["id"].clone();
    let Some(p) = id
        .as_u64()
        .and_then(|n| ctx.state.lock().pending.remove(&n))
    else {
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
