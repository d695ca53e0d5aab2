//! Claude Code 2.1.332 (the pinned harness) on what it does in 2026 beyond a plain `-p` round
//! trip: gateway model discovery (`CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY=1`: its
//! `GET /v1/models?limit=1000` lists only the caller's models, read back from Claude Code's own
//! cache and debug log) and thinking blocks from a backend that reasons (read from its
//! `stream-json` output). The `-p` round trips themselves, with the 2026 body, are in
//! `coding_harnesses.rs`.

use serde_json::Value;

use crate::coding_harnesses::{claude_in, harness_config, Scene, CLAUDE};
use crate::support::*;

/// The e2e config with Claude-named models (Claude Code lists gateway models whose id starts
/// with `claude`): `claude-turnstile-echo` and `claude-turnstile-think` for alice, and
/// `claude-turnstile-other`, which she may not use.
async fn gateway() -> Gateway {
    let opts = Opts {
        alice_models: r#"["claude-turnstile-echo", "claude-turnstile-think", "fake-model"]"#,
        ..Opts::default()
    };
    Gateway::start_raw(opts, |o, dir| {
        let mut s = harness_config(o, dir);
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
