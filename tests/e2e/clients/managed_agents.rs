//! The Managed Agents API (`/v1/agents`, `/v1/environments`, `/v1/sessions` and their events)
//! driven by the pinned `anthropic` Python SDK (`tests/clients/anthropic_managed.py`).

use super::sdk::run_script_with;
use crate::support::*;

/// Runs the SDK script's part `name` against `gw`, with `env` besides; false when skipped.
pub(crate) async fn part(gw: &Gateway, name: &str, env: &[(&str, String)]) -> bool {
    let mut all = vec![("MANAGED_PART", name.to_string())];
    all.extend(env.iter().cloned());
    run_script_with(gw, "anthropic_managed.py", "", &all).await
}

/// Agent, environment, session; a held custom tool use answered once (a duplicate 409, an
/// unknown use 404, another principal's objects 404); a second turn on the same session;
/// the history paged and filtered; a stream reconnected with `Last-Event-ID`; versions,
/// refusals, listing, archive and delete.
#[tokio::test]
async fn managed_agents_sdk_session_with_a_held_custom_tool() {
    let gw = Gateway::start().await;
    part(&gw, "all", &[]).await;
    // Each session's turns ran in its own folder under the workspace root, gone with it.
    let root = gw.dir.path().join("data/workspaces");
    let starts = gw.thread_starts();
    assert!(!starts.is_empty());
    for s in starts {
        let cwd = std::path::PathBuf::from(s["cwd"].as_str().unwrap_or_default());
        let session = cwd.file_name().unwrap_or_default().to_string_lossy();
        assert!(
            cwd.parent().and_then(|env| env.parent()) == Some(root.as_path())
                && session.starts_with("sesn_"),
            "{s}"
        );
        assert!(!cwd.exists(), "{} outlived its session", cwd.display());
    }
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
    let env = [("MANAGED_PRICED", "p-metered".into())];
    part(&gw, "budget", &env).await;
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
    part(&gw, "release", &[]).await;
}

/// The backend's own tools under the agent's `always_ask`, on the demo's command approval:
/// `agent.tool_use` (ask) and `requires_action`, the one approval queue, allowed then denied
/// (409 twice, 404 for another principal); a model whose policy denies is never widened.
#[tokio::test]
async fn managed_agents_tool_confirmations_settle_the_approval_queue() {
    let gw = Gateway::start().await;
    let env = [
        ("MANAGED_MODEL", "cmd-allow".into()),
        ("MANAGED_PROMPT", "clean up".into()),
        ("MANAGED_ALLOWED", "Command ran.".into()),
        ("MANAGED_DENIED", "Command declined.".into()),
        ("MANAGED_DENY_MODEL", "cmd-deny".into()),
    ];
    part(&gw, "confirm", &env).await;
}

/// A result larger than what is left of the principal's stored event bytes is refused (429)
/// before the held turn is claimed: it consumes nothing, and a smaller one resumes the turn.
#[tokio::test]
async fn managed_agents_a_result_over_the_event_bound_consumes_nothing() {
    let gw = Gateway::start_raw(Opts::default(), |o, dir| {
        // Results up to 64 KiB pass the continuation's own bound.
        let text = config_text(o, dir).replace(
            "max_tool_result_bytes = 4096\n",
            "max_tool_result_bytes = 65536\n",
        );
        format!("{text}\n[managed_agents]\nmax_event_bytes_per_client = 30000\n")
    })
    .await;
    part(&gw, "bound", &[]).await;
}

/// A held custom tool use not answered before its execution's deadline (1 s here) expires by
/// itself: `session.error` and `retries_exhausted` without any request, the use then 410.
#[tokio::test]
async fn managed_agents_a_hold_past_its_deadline_expires_and_the_session_says_so() {
    let gw = Gateway::start_with(Opts {
        execution_ttl_seconds: 1,
        ..Opts::default()
    })
    .await;
    part(&gw, "expire", &[]).await;
}

/// A session held on a custom tool use when the gateway restarts: the history is intact, the
/// use answers 410, the session shows `session.error` and `retries_exhausted`, and goes on.
#[tokio::test]
async fn managed_agents_restart_settles_the_held_use_and_keeps_the_history() {
    let mut gw = Gateway::start().await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json").display().to_string();
    let env = [("MANAGED_STATE", state)];
    if !part(&gw, "hold", &env).await {
        return;
    }
    gw.stop().await;
    gw.spawn().await;
    part(&gw, "after_restart", &env).await;
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
        ("MANAGED_MODEL", model.into()),
        ("MANAGED_PROMPT", prompt.into()),
        ("MANAGED_INPUT", input.to_string()),
        ("MANAGED_RESULT", result.into()),
        ("MANAGED_SAID", said.into()),
    ];
    part(gw, "roundtrip", &env).await;
}

/// Two replicas on PostgreSQL: a session runs on the replica it was made on (A), and its
/// stream, message and result sent through B are relayed there: the held turn resumes once
/// on A's backend, B's never runs a turn. With A killed, B takes the session over once A's
/// lease lapses: the use it held answers 410 and the next turn runs on B.
#[tokio::test]
async fn managed_agents_on_two_replicas_a_result_sent_to_the_non_owner_reaches_the_owner_once() {
    use crate::operations::cluster::replica_config;
    let db = crate::support::postgres::database();
    let replica = async |id: &str| {
        let (id, db) = (id.to_string(), db.clone());
        Gateway::start_raw(Opts::default(), move |o, dir| {
            replica_config(o, dir, &id, &db, None, None)
        })
        .await
    };
    let (mut a, b) = (replica("a").await, replica("b").await);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json").display().to_string();
    let env = [
        ("MANAGED_STATE", state),
        ("MANAGED_OTHER_URL", b.url.clone()),
    ];
    if !part(&a, "cluster", &env).await {
        return;
    }
    assert!(
        a.spy_events("stale_answer").is_empty(),
        "a result reached A twice"
    );
    assert!(b.spy_events("turn_start").is_empty(), "a turn ran on B");
    let (_, m) = get_text(&b, ROOT, "/metrics").await;
    assert!(
        m.contains("turnstile_forwarded_total{kind=\"session\",status=\"200\"}"),
        "{m}"
    );
    a.signal("KILL");
    let _ = a.child.take().map(|mut c| c.wait());
    part(&b, "cluster_taken", &env).await;
    assert!(
        !b.spy_events("turn_start").is_empty(),
        "B ran the next turn"
    );
}
