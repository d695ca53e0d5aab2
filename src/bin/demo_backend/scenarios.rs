//! The scripted scenarios.
//!
//! Chosen by `thread/start.model` (default `echo`), overridable per turn by a `scenario=NAME`
//! token in the turn's last text input. Other directives: `delay=MS`, `tool=NAME`, `arg=VALUE`.
//! - `echo`: streams `You said: <text>`; with the turn's `outputSchema`, a JSON document of
//!   that shape instead (every property, strings saying `You said: <text>`).
//! - `tool` / `text_then_tool`: (`Let me check.` first, then) one `item/tool/call`; streams
//!   `Tool result: <output>`. The argument is `arg=VALUE` or the first absolute path of the
//!   text, under the tool's first required property; a shell tool (`cmd` / `command`) gets
//!   `cat <path>`.
//! - `parallel`: two concurrent tool calls; `Results: <o1> | <o2>`.
//! - `rounds3`: three sequential tool calls; `Done after 3 rounds: <o1>, <o2>, <o3>`.
//!   `metered`: the same, each request's usage reported as soon as its call is answered.
//! - `hang`: nothing until interrupted (then the usage of its one model request). `slow`: waits `delay` ms (default 3000), then `echo`.
//! - `crash`: one delta `partial `, then exits with code 3.
//! - `fail`: `error` notification, then a `failed` turn.
//! - `garbage`: a non-JSON line, an unknown notification and an unknown server request, then
//!   `echo`.
//! - `approval` / `file_approval`: a command / file-change approval request, then acts on the
//!   decision (`Command ran.` / `Command declined.`, `File changed.` / `File change declined.`;
//!   `cancel` interrupts the turn).
//!
//! Every model request reports usage 10 in / 5 out (2 reasoning); a request that issued tool
//! calls reports it once they are answered, or when the turn is interrupted. Threads keep
//! their turns' history (a later `turn/start` continues them) until `thread/delete`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::protocol::Out;
use crate::state::ToolSpec;
use crate::tools::{finish_call, start_call};
use crate::turn::{Step, Stopped, Turn};
use crate::util::{directive, ended_turn, merge, now_ms, rand_hex};

pub(crate) const SCENARIOS: &[&str] = &[
    "echo",
    "tool",
    "text_then_tool",
    "parallel",
    "rounds3",
    "metered",
    "hang",
    "slow",
    "reasoning",
    "crash",
    "fail",
    "garbage",
    "approval",
    "file_approval",
];
pub(crate) const DEMO_ERROR: &str = "demo model failure";
pub(crate) const COMMAND: &str = "/bin/bash -lc 'rm -rf build'";

pub(crate) struct TurnSpec {
    pub(crate) scenario: String,
    pub(crate) text: String,
    pub(crate) tools: Vec<ToolSpec>,
    /// The turn's `outputSchema`: the final answer is a JSON document of that shape.
    pub(crate) schema: Option<Value>,
}

impl TurnSpec {
    /// The tool to call, per `tool=NAME`, else the first "read" tool, else the first tool.
    pub(crate) fn tool(&self) -> Option<ToolSpec> {
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
    pub(crate) fn args(&self, tool: &ToolSpec, suffix: &str) -> Value {
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
        // A shell tool (Codex CLI's `exec_command`) reads the file with a command.
        if key == "cmd" || key == "command" {
            return json!({ key: format!("cat {value}{suffix}") });
        }
        json!({ key: format!("{value}{suffix}") })
    }
}

pub(crate) async fn run_scenario(turn: &Turn, spec: &TurnSpec) -> Step {
    let echo = |turn: &Turn| {
        let said = format!("You said: {}", spec.text);
        match &spec.schema {
            Some(schema) => turn.stream_text(&conforming(schema, &said).to_string())?,
            None => turn.stream_text(&said)?,
        }
        turn.report_usage()?;
        turn.complete()
    };
    match spec.scenario.as_str() {
        "tool" | "text_then_tool" | "parallel" | "rounds3" | "metered" => {
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
                "rounds3" | "metered" => {
                    let mut outs = Vec::new();
                    for round in 1..=3 {
                        let call =
                            start_call(turn, &tool, spec.args(&tool, &format!(" round {round}")))?;
                        outs.push(finish_call(turn, call).await?);
                        if spec.scenario == "metered" {
                            turn.report_usage()?;
                        }
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
        "reasoning" => {
            let about = format!("Thinking about: {}", spec.text);
            turn.stream_reasoning(&[&about, "Answering now."])?;
            echo(turn)
        }
        "hang" => {
            // A model request in flight: its usage is reported if the turn is interrupted.
            turn.usage_pending()?;
            std::future::pending().await
        }
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

/// A document of `schema`'s shape: every property present, strings saying `said`, the first
/// value of an enum, zero, `true`, empty arrays.
fn conforming(schema: &Value, said: &str) -> Value {
    if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
        return first.clone();
    }
    match schema["type"].as_str() {
        Some("object") => {
            let props = schema["properties"].as_object();
            let filled = props.into_iter().flatten();
            Value::Object(
                filled
                    .map(|(k, v)| (k.clone(), conforming(v, said)))
                    .collect(),
            )
        }
        Some("array") => json!([]),
        Some("integer" | "number") => json!(0),
        Some("boolean") => json!(true),
        Some("null") => Value::Null,
        _ => json!(said),
    }
}

/// The `approval` (command) and `file_approval` (file change) scenarios.
pub(crate) async fn approval(turn: &Turn, file: bool) -> Step {
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
