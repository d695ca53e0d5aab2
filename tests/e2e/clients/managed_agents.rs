//! The Managed Agents API (`/v1/agents`, `/v1/environments`, `/v1/sessions` and their events)
//! driven by the pinned `anthropic` Python SDK (`tests/clients/anthropic_managed.py`).

use super::sdk::run_script_with;
use crate::support::*;

/// Agent, environment, session; a held custom tool use answered once (a duplicate 409, an
/// unknown use 404, another principal's objects 404); a second turn on the same session;
/// the history paged and filtered; a stream reconnected with `Last-Event-ID`; versions,
/// refusals, listing, archive and delete.
#[tokio::test]
async fn managed_agents_sdk_session_with_a_held_custom_tool() {
    let gw = Gateway::start().await;
    run_script_with(
        &gw,
        "anthropic_managed.py",
        "",
        &[("MANAGED_PART", "all".into())],
    )
    .await;
}

/// A session's budget on a priced model ($1 per model request after each of three calls): it
/// withdraws the held use that follows the request that crossed it (`budget_reached`, the use 410), starts no turn once spent, and is raised,
/// never lowered below the spend, removed and never re-added.
#[tokio::test]
async fn managed_agents_session_budget_stops_the_session() {
    let gw = Gateway::start_raw(Opts::default(), |o, dir| {
        let price = "{ input_per_mtok = 50000.0, output_per_mtok = 100000.0 }";
        let model =
            "\n[[models]]\nid = \"p-metered\"\nbackend = \"demo\"\nbackend_model = \"metered\"\n";
        format!("{}{model}price = {price}\n", config_text(o, dir))
    })
    .await;
    let env = [
        ("MANAGED_PART", "budget".to_string()),
        ("MANAGED_PRICED", "p-metered".into()),
    ];
    run_script_with(&gw, "anthropic_managed.py", "", &env).await;
}

/// A session's turns carry on its kept backend thread; idle past `[continuity]
/// idle_ttl_seconds` it is released, and the next turn runs from the transcript.
#[tokio::test]
async fn managed_agents_idle_session_releases_its_thread_and_resumes_by_transcript() {
    let gw = Gateway::start_with(Opts {
        continuity: "idle_ttl_seconds = 1",
        ..Opts::default()
    })
    .await;
    run_script_with(
        &gw,
        "anthropic_managed.py",
        "",
        &[("MANAGED_PART", "release".into())],
    )
    .await;
}

/// The backend's own tools under the agent's `always_ask`, on the demo's command approval:
/// `agent.tool_use` (ask) and `requires_action`, the one approval queue, allowed then denied
/// (409 twice, 404 for another principal); a model whose policy denies is never widened.
#[tokio::test]
async fn managed_agents_tool_confirmations_settle_the_approval_queue() {
    let gw = Gateway::start().await;
    let env = [
        ("MANAGED_PART", "confirm".to_string()),
        ("MANAGED_MODEL", "cmd-allow".into()),
        ("MANAGED_PROMPT", "clean up".into()),
        ("MANAGED_ALLOWED", "Command ran.".into()),
        ("MANAGED_DENIED", "Command declined.".into()),
        ("MANAGED_DENY_MODEL", "cmd-deny".into()),
    ];
    run_script_with(&gw, "anthropic_managed.py", "", &env).await;
}

/// A session held on a custom tool use when the gateway restarts: the history is intact, the
/// use answers 410, the session shows `session.error` and `retries_exhausted`, and goes on.
#[tokio::test]
async fn managed_agents_restart_settles_the_held_use_and_keeps_the_history() {
    let mut gw = Gateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json").display().to_string();
    let part = |p: &str| {
        vec![
            ("MANAGED_PART", p.to_string()),
            ("MANAGED_STATE", state.clone()),
        ]
    };
    if !run_script_with(&gw, "anthropic_managed.py", "", &part("hold")).await {
        return;
    }
    gw.stop().await;
    gw.spawn().await;
    run_script_with(&gw, "anthropic_managed.py", "", &part("after_restart")).await;
}

/// One held custom tool use over the Managed Agents API on any backend kind: `model`'s
/// agent, asked `prompt`, calls `read_file` with `input`; `result` is sent back once (a
/// duplicate 409, another principal 404) and the final text contains `said`.
pub(crate) async fn managed_round_trip(
    gw: &Gateway,
    model: &str,
    prompt: &str,
    input: serde_json::Value,
    result: &str,
    said: &str,
) {
    let env = [
        ("MANAGED_PART", "roundtrip".to_string()),
        ("MANAGED_MODEL", model.into()),
        ("MANAGED_PROMPT", prompt.into()),
        ("MANAGED_INPUT", input.to_string()),
        ("MANAGED_RESULT", result.into()),
        ("MANAGED_SAID", said.into()),
    ];
    run_script_with(gw, "anthropic_managed.py", "", &env).await;
}
