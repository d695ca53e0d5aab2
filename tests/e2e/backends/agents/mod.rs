//! The agent-kind contract: every one-process-per-session agent behind the gateway, on the
//! same scenarios, written once. Claude Code (`kind = "claude-code"`, the real `claude` CLI)
//! and Claude's ACP adapter (`claude-agent-acp`, over the Claude Code it bundles) against the
//! scripted Messages API (`support/fake_messages.rs`); Gemini CLI (`gemini --acp`) against the
//! scripted Gemini API (`support/fake_gemini.rs`); all installed by `.ci/run`. Where agents
//! differ the scenario asks the capability table (`rig.rs`: [`Agent::caps`]); a kind's own behaviour
//! (Claude Code's effort, thinking, built-in tools, session bound) is tested in its module.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

mod rig;

use self::rig::{path_of, rig, rig_edited, Agent};
use crate::clients::managed_agents::managed_round_trip;
use crate::clients::sdk::run_script_with;
use crate::support::agents::{agent_processes, agents, no_agent_left};
use crate::support::gemini as google;
use crate::support::{messages, responses, *};

/// Scenario functions as `#[tokio::test]`s for one agent.
macro_rules! tests {
    ($agent:ident: $($test:ident),* $(,)?) => {
        $(#[tokio::test] async fn $test() { super::$test(super::Agent::$agent).await })*
    };
}

/// The contract: every scenario, for one agent.
macro_rules! contract {
    ($agent:ident) => {
        tests!($agent:
            a_held_round_trip_on_chat_completions,
            a_held_round_trip_on_responses,
            a_held_round_trip_on_messages_with_text_beside_and_an_error_result,
            a_held_round_trip_on_gemini_with_text_beside_and_an_error_result,
            two_parallel_calls_answered_in_swapped_order,
            a_call_held_for_40_seconds_is_answered,
            an_agent_permission_under_ask_approved_then_denied,
            a_follow_up_continues_the_kept_session,
            an_expired_turn_ends_its_session,
            a_client_gone_mid_leg_cancels_the_session,
            a_killed_agent_loses_its_held_turn,
            a_per_execution_cap_stops_the_agent_at_its_next_round,
            a_managed_agents_session_holds_a_custom_tool,
            a_managed_agents_tool_confirmation_allowed_then_denied,
        );
    };
}

mod claude_code {
    contract!(ClaudeCode);
}

/// ACP's permission requests name the tool they run: both ACP agents also get the
/// masquerading tool.
mod gemini {
    contract!(Gemini);
    tests!(Gemini: an_agent_tool_titled_like_a_client_tool_goes_to_the_policy);
}

mod claude_agent_acp {
    contract!(ClaudeAcp);
    tests!(ClaudeAcp: an_agent_tool_titled_like_a_client_tool_goes_to_the_policy);
}

async fn a_held_round_trip_on_chat_completions(agent: Agent) {
    let Some((fake, gw)) = rig(agent, Opts::default()).await else {
        return;
    };
    let mut req = tool_request("agent-one", "read a.txt");
    if !agent.caps().effort {
        // An effort this kind cannot honour is refused, naming the field.
        req["reasoning_effort"] = json!("high");
        let (status, v) = gw.chat(ALICE, &req).await;
        assert_eq!(
            (status.as_u16(), &v["error"]["param"]),
            (400, &json!("reasoning_effort")),
            "{v}"
        );
        req.as_object_mut().unwrap().remove("reasoning_effort");
    }
    let (status, resp) = gw.chat(ALICE, &req).await;
    assert_eq!(status, 200, "{resp}\n{}", gw.log());
    let c = calls(&resp);
    assert_eq!(c.len(), 1, "{resp}\n{}", gw.log());
    assert!(c[0]["id"].as_str().unwrap().starts_with("srct-"), "{resp}");
    assert_eq!(c[0]["function"]["name"], "read_file");
    let args: Value =
        serde_json::from_str(c[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"path": "a.txt"}));
    // Drift (an edited history) is refused and consumes nothing.
    let mut drifted = continuation(&req, &resp, |_, _| json!("contents of a"));
    drifted["messages"][0]["content"] = json!("read b.txt");
    let (status, v) = gw.chat(ALICE, &drifted).await;
    assert_eq!(
        (status.as_u16(), error_code(&v)),
        (400, "continuation_mismatch".into()),
        "{v}"
    );
    let next = continuation(&req, &resp, |_, _| json!("contents of a"));
    let (status, done) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 200, "{done}\n{}", gw.log());
    assert_eq!(content(&done), "results: contents of a");
    assert_eq!(fake.bodies("one").len(), 2, "the model was asked twice");
    // A replay of the answered token is refused.
    let (status, v) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 409, "{v}");
    // The turn's usage was metered.
    let total = usage_total(&gw, ALICE, |t| t["output_tokens"].as_u64() >= Some(40)).await;
    assert_eq!(total["output_tokens"], 40, "{total}");
}

/// The Managed Agents API (the `anthropic` SDK's `beta.sessions`) on this kind: the custom
/// tool use is held, answered once, and the agent ends its turn with the result.
async fn a_managed_agents_session_holds_a_custom_tool(agent: Agent) {
    let Some((_fake, gw)) = rig(agent, Opts::default()).await else {
        return;
    };
    let input = json!({"path": "a.txt"});
    let said = "results: contents of a";
    managed_round_trip(&gw, "agent-one", "read a.txt", input, "contents of a", said).await;
    // The session was deleted: nothing of its agent is left.
    no_agent_left(&gw, agent.caps().scratch).await;
}

/// The agent's `bash` under the session's `always_ask` (the model's policy allows it): a
/// `user.tool_confirmation` allows it (it runs), then denies it, and Claude Code's model
/// hears the `deny_message`.
async fn a_managed_agents_tool_confirmation_allowed_then_denied(agent: Agent) {
    let Some((_fake, gw)) = rig(agent, Opts::default()).await else {
        return;
    };
    let seen = match agent {
        Agent::ClaudeCode => "1",
        _ => "0",
    };
    let env = [
        ("MANAGED_PART", "confirm".to_string()),
        ("MANAGED_MODEL", "agent-bash".into()),
        ("MANAGED_PROMPT", "run it".into()),
        ("MANAGED_ALLOWED", "results: ".into()),
        ("MANAGED_DENIED", "results: !".into()),
        ("MANAGED_DENY_SEEN", seen.into()),
    ];
    run_script_with(&gw, "anthropic_managed.py", "", &env).await;
    // Allowed once, it ran, in the session's own folder (not the backend's `cwd`).
    assert!(!gw.dir.path().join("work/bash-ran.txt").exists());
    let root = gw.dir.path().join("data/workspaces");
    let ran: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .flat_map(|env| std::fs::read_dir(env.unwrap().path()).unwrap())
        .filter_map(|s| std::fs::read_to_string(s.unwrap().path().join("bash-ran.txt")).ok())
        .collect();
    assert_eq!(ran, ["gateway\n"], "{}", root.display());
}

async fn a_held_round_trip_on_responses(agent: Agent) {
    let Some((fake, gw)) = rig(agent, Opts::default()).await else {
        return;
    };
    let mut req = responses::request("agent-one", "read a.txt");
    if !agent.caps().effort {
        // An effort this kind cannot honour is refused, naming the field.
        let (s, ev) = responses::stream(&gw, ALICE, &req).await;
        assert_eq!(s, 400, "{ev:?}");
        assert_eq!(ev[0]["error"]["param"], "reasoning.effort", "{ev:?}");
        req["reasoning"].as_object_mut().unwrap().remove("effort");
    }
    let (s, ev) = responses::stream(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{ev:?}\n{}", gw.log());
    let resp = responses::last_response(&ev);
    let c = responses::response_calls(&resp);
    assert_eq!(c.len(), 1, "{resp}");
    assert_eq!(c[0]["name"], "read_file");
    assert!(responses::is_token(&c[0]["call_id"]), "{c:?}");
    assert_eq!(c[0]["arguments"], r#"{"path":"a.txt"}"#);
    let next = responses::stateful(&req, &resp, |_, _| "contents of a".into());
    let (s, ev) = responses::stream(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{ev:?}");
    let done = responses::last_response(&ev);
    assert_eq!(responses::response_text(&done), "results: contents of a");
    assert_eq!(done["id"], resp["id"], "one execution across legs");
    // The instructions reached the model (Claude Code: as its system prompt).
    let first = &fake.bodies("one")[0];
    let seen = match agent {
        Agent::ClaudeCode => &first["system"],
        _ => first,
    };
    assert!(seen.to_string().contains("be useful"), "{first}");
}

async fn a_held_round_trip_on_messages_with_text_beside_and_an_error_result(agent: Agent) {
    let Some((_fake, gw)) = rig(agent, Opts::default()).await else {
        return;
    };
    let mut req = messages::request("agent-one", "read a.txt");
    // The scripted models call the tool with `{"path": …}`; an agent checks it against the
    // schema.
    req["tools"] = json!([{"name": "read_file", "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                         "required": ["path"]}}]);
    if !agent.caps().effort {
        // An effort this kind cannot honour is refused (400); without it the turn runs.
        let (s, _, refused) = messages::stream(&gw, ALICE, &req).await;
        assert_eq!(s, 400, "{refused}");
        req.as_object_mut().unwrap().remove("output_config");
    }
    let (s, ev, resp) = messages::stream(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{ev:?}\n{}", gw.log());
    assert_eq!(resp["stop_reason"], "tool_use", "{resp}");
    let uses = messages::tool_uses(&resp);
    assert_eq!(uses.len(), 1, "{resp}");
    assert!(messages::is_token(&uses[0]["id"]), "{resp}");
    assert_eq!(uses[0]["name"], "read_file");
    let next = messages::answer(
        &req,
        &resp,
        |_, _| json!({"content": [{"type": "text", "text": "no such file"}], "is_error": true}),
        &["also look at b.txt"],
    );
    let (s, ev, done) = messages::stream(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{ev:?}");
    // The failed result reached the model as an error, with the text beside it.
    assert_eq!(
        messages::text(&done),
        "results: !no such file\nalso look at b.txt"
    );
    assert_eq!(done["stop_reason"], "end_turn");
}

async fn a_held_round_trip_on_gemini_with_text_beside_and_an_error_result(agent: Agent) {
    let Some((_fake, gw)) = rig(agent, Opts::default()).await else {
        return;
    };
    let mut req = google::request("agent-one", "read a.txt");
    req["tools"] = json!([{"functionDeclarations": [{"name": "read_file",
        "description": "Read a file", "parametersJsonSchema": {"type": "object",
        "properties": {"path": {"type": "string"}}, "required": ["path"]}}]}]);
    if !agent.caps().effort {
        // An effort this kind cannot honour is refused (400); without it the turn runs.
        let (s, _, refused) = google::stream(&gw, ALICE, &req).await;
        assert_eq!(s, 400, "{refused}");
        assert_eq!(refused["error"]["status"], "INVALID_ARGUMENT", "{refused}");
        req["generationConfig"]
            .as_object_mut()
            .unwrap()
            .remove("thinkingConfig");
    }
    let (s, ev, resp) = google::stream(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{ev:?}\n{}", gw.log());
    let calls = google::calls(&resp);
    assert_eq!(calls.len(), 1, "{resp}");
    assert!(messages::is_token(&calls[0]["id"]), "{resp}");
    assert_eq!(calls[0]["name"], "read_file");
    assert_eq!(calls[0]["args"], json!({"path": "a.txt"}));
    let mut next = google::answer(&req, &resp, |_, _| json!("unused"));
    let turn = &mut next["contents"][2]["parts"];
    turn[0]["functionResponse"]["response"] = json!({"error": "no such file"});
    turn.as_array_mut()
        .unwrap()
        .push(json!({"text": "also look at b.txt"}));
    let (s, ev, done) = google::stream(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{ev:?}");
    // The failed result reached the model as an error, with the text beside it.
    assert_eq!(
        google::text(&done),
        "results: !no such file\nalso look at b.txt"
    );
    assert_eq!(done["candidates"][0]["finishReason"], "STOP");
}

/// Claude Code and its ACP adapter run the two read-only calls together (one batch, here
/// answered in the other order); Gemini CLI runs an MCP server's calls one after the other
/// (two rounds). Either way each result reaches its own call.
async fn two_parallel_calls_answered_in_swapped_order(agent: Agent) {
    let Some((_fake, gw)) = rig(agent, Opts::default()).await else {
        return;
    };
    let caps = agent.caps();
    let mut req = tool_request("agent-parallel", "read two files");
    let mut asked = Vec::new();
    let done = loop {
        let (s, resp) = gw.chat(ALICE, &req).await;
        assert_eq!(s, 200, "{resp}\n{}", gw.log());
        let c = calls(&resp);
        if c.is_empty() {
            break resp;
        }
        assert!(asked.len() < 2, "more calls than the model made: {resp}");
        let paths: Vec<String> = c.iter().map(path_of).collect();
        if caps.batches {
            assert_eq!(paths, ["a.txt", "b.txt"], "one batch: {resp}");
            assert_ne!(c[0]["id"], c[1]["id"]);
        }
        asked.extend(paths.clone());
        req = continuation(&req, &resp, |i, _| {
            json!(format!("content of {}", paths[i]))
        });
        if c.len() == 2 {
            // Answered in the other order.
            let messages = req["messages"].as_array_mut().unwrap();
            let n = messages.len();
            messages.swap(n - 1, n - 2);
        }
    };
    asked.sort();
    assert_eq!(asked, ["a.txt", "b.txt"]);
    let text = content(&done);
    if caps.call_order {
        assert_eq!(text, "results: content of a.txt | content of b.txt");
    }
    let mut parts: Vec<&str> = text
        .strip_prefix("results: ")
        .unwrap_or_default()
        .split(" | ")
        .collect();
    parts.sort();
    assert_eq!(parts, ["content of a.txt", "content of b.txt"], "{done}");
}

async fn a_call_held_for_40_seconds_is_answered(agent: Agent) {
    let Some((_fake, gw)) = rig(agent, Opts::default()).await else {
        return;
    };
    let req = tool_request("agent-one", "read a.txt");
    let (s, resp) = gw.chat(ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    // The client runs its tool for 40 s.
    tokio::time::sleep(Duration::from_secs(40)).await;
    let next = continuation(&req, &resp, |_, _| json!("late contents"));
    let (s, done) = gw.chat(ALICE, &next).await;
    assert_eq!(s, 200, "{done}\n{}", gw.log());
    assert_eq!(content(&done), "results: late contents");
}

/// The approval of the pending ask, decided by the approver.
async fn decide(gw: &Gateway, agent: Agent, approve: bool) -> Value {
    let ask = pending(gw, ROOT).await;
    assert_eq!(ask["kind"], "command", "{ask}");
    assert!(
        ask["summary"]["command"]
            .as_str()
            .unwrap()
            .contains("bash-ran.txt"),
        "{ask}"
    );
    if agent == Agent::ClaudeCode {
        // The reason Claude Code's model gave for the command.
        assert_eq!(ask["summary"]["backend_reason"], "write a marker", "{ask}");
    }
    let decision = if approve { "approve" } else { "deny" };
    let r = gw
        .http
        .post(format!(
            "{}/v1/approvals/{}/decision",
            gw.url,
            ask["id"].as_str().unwrap()
        ))
        .bearer_auth(ROOT)
        .json(&json!({"decision": decision}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    ask
}

async fn an_agent_permission_under_ask_approved_then_denied(agent: Agent) {
    let Some((_fake, gw)) = rig(agent, Opts::default()).await else {
        return;
    };
    let marker = gw.dir.path().join("work/bash-ran.txt");
    // Approved: it runs.
    let req = json!({"model": "agent-bash-ask", "messages": [user("run it")]});
    let (answer, ask) = tokio::join!(gw.chat(ALICE, &req), decide(&gw, agent, true));
    assert_eq!(answer.0, 200, "{}\n{}", answer.1, gw.log());
    assert!(
        ask["summary"]["cwd"].as_str().unwrap().ends_with("/work"),
        "{ask}"
    );
    wait_until("the marker written", || marker.exists()).await;
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "gateway");
    std::fs::remove_file(&marker).unwrap();
    // Denied: it does not run, and the model hears so.
    let (answer, _) = tokio::join!(gw.chat(ALICE, &req), decide(&gw, agent, false));
    assert_eq!(answer.0, 200, "{}", answer.1);
    assert!(content(&answer.1).starts_with("results: !"), "{}", answer.1);
    assert!(!marker.exists());
    let (_, v) = get(&gw, ROOT, "/v1/approvals").await;
    assert_eq!(v["data"].as_array().unwrap().len(), 2, "{v}");
}

async fn a_follow_up_continues_the_kept_session(agent: Agent) {
    let Some((fake, gw)) = rig(agent, Opts::default()).await else {
        return;
    };
    let first = json!({"model": "agent-text", "messages": [user("hello there")]});
    let (s, resp) = gw.chat(ALICE, &first).await;
    assert_eq!(s, 200, "{resp}\n{}", gw.log());
    assert_eq!(content(&resp), "You said: hello there");
    let pids = agent_processes(&gw);
    assert!(!pids.is_empty());
    let follow = json!({"model": "agent-text", "messages": [
        user("hello there"),
        {"role": "assistant", "content": content(&resp)},
        user("and again"),
    ]});
    let (s, resp) = gw.chat(ALICE, &follow).await;
    assert_eq!(s, 200, "{resp}");
    assert_eq!(content(&resp), "You said: and again");
    // The same process, and the model got the new message after its own history.
    assert_eq!(agent_processes(&gw), pids);
    let last = fake.bodies("text").pop().unwrap();
    let text = last.to_string();
    assert!(!text.contains("The conversation so far"), "{last}");
    if agent.caps().messages_api {
        // Its own history, not a transcript: the user and assistant messages (the agent adds
        // system ones).
        let all = last["messages"].as_array().unwrap().iter();
        let history: Vec<&Value> = all.filter(|m| m["role"] != "system").collect();
        assert_eq!(history.len(), 3, "{last}");
        assert_eq!(history[1]["role"], "assistant");
    }
}

async fn an_expired_turn_ends_its_session(agent: Agent) {
    let opts = Opts {
        execution_ttl_seconds: 2,
        ..Opts::default()
    };
    let Some((_fake, gw)) = rig(agent, opts).await else {
        return;
    };
    let req = tool_request("agent-one", "read a.txt");
    let (s, resp) = gw.chat(ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    assert!(!agent_processes(&gw).is_empty());
    no_agent_left(&gw, agent.caps().scratch).await;
    let next = continuation(&req, &resp, |_, _| json!("too late"));
    let (s, v) = gw.chat(ALICE, &next).await;
    assert_eq!(s, 410, "{v}");
}

async fn a_client_gone_mid_leg_cancels_the_session(agent: Agent) {
    let Some((fake, gw)) = rig(agent, Opts::default()).await else {
        return;
    };
    fake.hold_next();
    let mut req = tool_request("agent-one", "read a.txt");
    req["stream"] = json!(true);
    let resp = gw.post(ALICE, &req).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    wait_until("the model call arrived", || fake.held() == 1).await;
    drop(resp);
    no_agent_left(&gw, agent.caps().scratch).await;
    fake.release();
    // The gateway still serves the backend.
    let (s, resp) = gw
        .chat(ALICE, &tool_request("agent-one", "read a.txt"))
        .await;
    assert_eq!(s, 200, "{resp}");
}

async fn a_killed_agent_loses_its_held_turn(agent: Agent) {
    let Some((_fake, gw)) = rig(agent, Opts::default()).await else {
        return;
    };
    let req = tool_request("agent-one", "read a.txt");
    let (s, resp) = gw.chat(ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    // The agent the gateway started (its direct child).
    let started = agents(&gw);
    assert!(!started.is_empty());
    for pid in &started {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    wait_until("the death settled", || gw.log().contains("reason=\"lost\"")).await;
    no_agent_left(&gw, agent.caps().scratch).await;
    let next = continuation(&req, &resp, |_, _| json!("after the crash"));
    let (s, v) = wait_for("the lost turn settled", async || {
        let (s, v) = gw.chat(ALICE, &next).await;
        (s != 409).then_some((s, v))
    })
    .await;
    assert_eq!(s, 410, "{v}\n{}", gw.log());
    // A fresh turn starts a fresh process.
    let (s, resp) = gw.chat(ALICE, &tool_request("agent-one", "again")).await;
    assert_eq!(s, 200, "{resp}");
}

/// ACP reports a prompt's usage only when it ends; the rounds before are metered as they end,
/// so a per-execution cap stops the execution at the next continuation, as on other kinds.
async fn a_per_execution_cap_stops_the_agent_at_its_next_round(agent: Agent) {
    let edit = |s: String| {
        crate::operations::budgets::priced(s, &[("alice", "{ usd_per_execution = 5.0 }")]).replace(
            "backend_model = \"rounds3\"\n",
            "backend_model = \"rounds3\"\nprice = { input_per_mtok = 1000000.0, output_per_mtok = 1000000.0 }\n",
        )
    };
    let Some((_fake, gw)) = rig_edited(agent, Opts::default(), edit).await else {
        return;
    };
    let req = tool_request("agent-rounds", "read three files");
    let (status, first) = gw.chat(ALICE, &req).await;
    assert_eq!(status, 200, "{first}\n{}", gw.log());
    assert_eq!(calls(&first).len(), 1, "{first}");
    let next = continuation(&req, &first, |_, _| json!("one"));
    let (status, v) = gw.chat(ALICE, &next).await;
    assert_eq!(
        (status.as_u16(), error_code(&v)),
        (402, "budget_exceeded".into()),
        "{v}\n{}",
        gw.log()
    );
    // The stopped execution leaves no agent behind.
    no_agent_left(&gw, agent.caps().scratch).await;
}

/// A permission request is taken for a client tool's only by what names the tool it runs
/// (never its title, which some agents write from the model's arguments): an agent's own
/// tool whose title reads like the client tool's goes to the approval policy.
async fn an_agent_tool_titled_like_a_client_tool_goes_to_the_policy(agent: Agent) {
    let Some((_fake, gw)) = rig(agent, Opts::default()).await else {
        return;
    };
    let req = tool_request("agent-masquerade", "plan it");
    let asked = async {
        let ask = pending(&gw, ROOT).await;
        let id = ask["id"].as_str().unwrap();
        let r = gw
            .http
            .post(format!("{}/v1/approvals/{id}/decision", gw.url))
            .bearer_auth(ROOT)
            .json(&json!({"decision": "deny"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        ask
    };
    let (answer, ask) = tokio::join!(gw.chat(ALICE, &req), asked);
    assert_eq!(answer.0, 200, "{}\n{}", answer.1, gw.log());
    assert!(calls(&answer.1).is_empty(), "{}", answer.1);
    let kind = match agent {
        Agent::Gemini => "permissions",
        _ => "command",
    };
    assert_eq!(ask["kind"], kind, "{ask}");
}
