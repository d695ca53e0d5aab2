//! Claude Code 2.1.332 (the pinned harness) on what it does in 2026 beyond a plain `-p` round
//! trip: gateway model discovery (`CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY=1`: its
//! `GET /v1/models?limit=1000` lists only the caller's models, read back from Claude Code's own
//! cache and debug log) and thinking blocks from a backend that reasons (read from its
//! `stream-json` output), and the gateway protocol's refusals as the client reads them: a spent
//! daily cap (429 `billing_error`, `x-should-retry: false`) and a bad key (401, likewise) each
//! stop it at once, with the gateway's message, after one request. The `-p` round trips
//! themselves, with the 2026 body, are in `coding_harnesses.rs`.

use serde_json::{json, Value};

use std::path::Path;

use crate::clients::coding_harnesses::{
    claude_env, claude_in, command, harness_config, run_bounded, Scene, CLAUDE, RUN_LIMIT,
};
use crate::support::*;

/// The e2e config with Claude-named models (Claude Code lists gateway models whose id starts
/// with `claude`): `claude-turnstile-echo` and `claude-turnstile-think` for alice, and
/// `claude-turnstile-other`, which she may not use.
async fn gateway() -> Gateway {
    gateway_with(|s| s).await
}

/// [`gateway`] with its config text passed through `edit` first.
async fn gateway_with(edit: impl FnOnce(String) -> String) -> Gateway {
    let opts = Opts {
        alice_models: r#"["claude-turnstile-echo", "claude-turnstile-think", "fake-model"]"#,
        ..Opts::default()
    };
    Gateway::start_raw(opts, |o, dir| {
        let mut s = edit(harness_config(o, dir));
        for (id, scenario) in [
            ("claude-turnstile-echo", "echo"),
            ("claude-turnstile-think", "reasoning"),
            ("claude-turnstile-other", "echo"),
        ] {
            s.push_str(&format!(
                "\n[[models]]\nid = \"{id}\"\nbackend = \"demo\"\nbackend_model = \"{scenario}\"\n"
            ));
        }
        s
    })
    .await
}

#[tokio::test]
async fn claude_code_discovers_the_callers_models_from_the_gateway() {
    let Some(bin) = CLAUDE.locate() else {
        return;
    };
    let gw = gateway().await;
    let scene = Scene::new(&gw);
    let home = scene.home.clone();
    let (stdout, why) = claude_in(
        &bin,
        &gw,
        &scene,
        &["-p", "hello", "--model", "claude-turnstile-echo", "--debug"],
        Some(("CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY", "1")),
    )
    .await;
    assert!(stdout.contains("You said:"), "{why}");
    // Claude Code's own record of what the gateway offered.
    let cache = home.join(".claude/cache/gateway-models.json");
    let cached: Value = wait_for("Claude Code's gateway model cache", async || {
        let text = std::fs::read_to_string(&cache).ok()?;
        serde_json::from_str(&text).ok()
    })
    .await;
    let mut ids: Vec<&str> = cached["models"]
        .as_array()
        .unwrap_or_else(|| panic!("{cached}\n{why}"))
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        ["claude-turnstile-echo", "claude-turnstile-think"],
        "{cached}\n{why}"
    );
    let debug = std::fs::read_dir(home.join(".claude/debug"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .collect::<String>()
        })
        .unwrap_or_default();
    assert!(
        debug.contains("[gatewayDiscovery] cached 2 models"),
        "{why}"
    );
    // Log lines are written by a thread of their own: wait (bounded) for the request's.
    let listed = |log: &str| {
        log.lines()
            .any(|l| l.contains("route=/v1/models") && l.contains("status=200"))
    };
    wait_until("the models request's log line", || listed(&gw.log())).await;
    let log = gw.log();
    assert!(listed(&log), "{log}");
}

#[tokio::test]
async fn claude_code_shows_thinking_from_a_backend_that_reasons() {
    let Some(bin) = CLAUDE.locate() else {
        return;
    };
    let gw = gateway().await;
    let scene = Scene::new(&gw);
    let (stdout, why) = claude_in(
        &bin,
        &gw,
        &scene,
        &[
            "-p",
            "ponder this",
            "--model",
            "claude-turnstile-think",
            "--output-format",
            "stream-json",
            "--verbose",
        ],
        None,
    )
    .await;
    let blocks: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["type"] == "assistant")
        .flat_map(|m| {
            m["message"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let thought = blocks
        .iter()
        .find(|b| b["type"] == "thinking")
        .and_then(|b| b["thinking"].as_str())
        .unwrap_or_else(|| panic!("no thinking block\n{why}"));
    assert!(thought.starts_with("Thinking about: "), "{thought}");
    assert!(
        thought.ends_with("ponder this\n\nAnswering now."),
        "{thought}"
    );
    let result = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|m| m["type"] == "result")
        .unwrap_or_else(|| panic!("no result\n{why}"));
    assert!(
        result["result"]
            .as_str()
            .is_some_and(|r| r.ends_with("ponder this")),
        "{result}"
    );
}

/// Runs `claude -p hello` as `key` on the echo model, whatever its exit: its exit status,
/// stdout and stderr.
async fn claude_refused(bin: &Path, gw: &Gateway, key: &str) -> (bool, String, String) {
    let scene = Scene::new(gw);
    let (mut cmd, stdout_path, stderr_path) = command(bin, &scene);
    claude_env(&scene, &mut cmd);
    cmd.env("ANTHROPIC_API_KEY", key);
    cmd.args(["-p", "hello", "--model", "claude-turnstile-echo"]);
    let (status, _) = tokio::task::spawn_blocking(move || run_bounded(cmd, RUN_LIMIT))
        .await
        .expect("join");
    let status = status.expect("Claude Code gave up within its bound");
    let stdout = std::fs::read_to_string(&stdout_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    (status.success(), stdout, stderr)
}

/// The `POST /v1/messages` answers the gateway counted, by status.
async fn messages_answers(gw: &Gateway) -> Vec<(String, u64)> {
    let (_, metrics) = get_text(gw, ROOT, "/metrics").await;
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("turnstile_requests_total{route=\"/v1/messages\",status=\""))
        .filter_map(|rest| {
            let (status, n) = rest.split_once("\"} ")?;
            Some((status.to_string(), n.parse().ok()?))
        })
        .collect()
}

#[tokio::test]
async fn claude_code_stops_at_a_spent_daily_cap_without_retrying() {
    let Some(bin) = CLAUDE.locate() else {
        return;
    };
    // One demo turn is 15 tokens: the first spends alice's day.
    let gw = gateway_with(|s| {
        crate::operations::budgets::priced(s, &[("alice", "{ tokens_per_day = 15 }")])
    })
    .await;
    let spend = json!({"model": "claude-turnstile-echo", "messages": [user("hi")]});
    assert_eq!(gw.chat(ALICE, &spend).await.0, 200);
    wait_for("the day's tokens on the ledger", async || {
        let (_, v) = get(&gw, ALICE, "/v1/usage").await;
        (v["budget"]["tokens_per_day"]["used"] == 15).then_some(())
    })
    .await;
    let (ok, stdout, stderr) = claude_refused(&bin, &gw, ALICE).await;
    let said = format!("{stdout}{stderr}");
    assert!(!ok, "{said}");
    assert!(
        said.contains("Budget exceeded") && said.contains("tokens_per_day"),
        "Claude Code did not report the gateway's message:\n{said}"
    );
    // One refused request, never retried.
    assert_eq!(
        messages_answers(&gw).await,
        [("429".to_string(), 1)],
        "{said}"
    );
}

#[tokio::test]
async fn claude_code_does_not_retry_a_401() {
    let Some(bin) = CLAUDE.locate() else {
        return;
    };
    let gw = gateway().await;
    let (ok, stdout, stderr) = claude_refused(&bin, &gw, "sk-not-a-key").await;
    let said = format!("{stdout}{stderr}");
    assert!(!ok, "{said}");
    assert_eq!(
        messages_answers(&gw).await,
        [("401".to_string(), 1)],
        "{said}"
    );
}
