//! Gemini CLI 0.61.0 (the pinned harness) as a client of the Gemini API surface
//! (`GOOGLE_GEMINI_BASE_URL` = the gateway, `GEMINI_API_KEY` = alice's key), non-interactive
//! (`-p … -m MODEL --yolo -o json`): the backend asks for Gemini CLI's own `read_file` (or
//! `run_shell_command`) on a secret file the test made, the gateway holds that turn and hands
//! Gemini CLI an `srct-` call, Gemini CLI runs it and sends the `functionResponse`, and the
//! same held turn answers `Tool result: <secret>`, which Gemini CLI prints. On the demo
//! backend (both tools), the Codex app-server, Claude Code and a Chat Completions upstream.
//!
//! What Gemini CLI sends (read from its bundle and checked here): `x-goog-api-key`,
//! `:streamGenerateContent?alt=sse` for every model turn, `functionCall.id` kept in the model
//! turn it sends back and echoed as `functionResponse.id` (so no matching by name and position
//! is needed), its text parts merged, thought parts dropped, a `thoughtSignature` added to the
//! first call. With `-m` it asks no other model; `general.maxAttempts = 1` keeps a refused
//! request from being retried.

use std::process::Command;

use serde_json::{json, Value};

use crate::backends::codex::{codex_bin, Rig, Setup};
use crate::clients::coding_harnesses::{
    command, harness_config, reads_secret, run_bounded, Scene, GEMINI, RUN_LIMIT,
};
use crate::support::fake_messages::FakeMessages;
use crate::support::fake_responses::{self as fake, FakeResponses, Reply};
use crate::support::*;

const VERSION: &str = "0.61.0";

/// Gemini CLI's user settings: API-key auth (its base URL from the environment), nothing sent
/// anywhere else, no retries, only the two tools the tests use.
fn settings() -> Value {
    json!({
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": false}},
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
        "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false,
                    "maxAttempts": 1},
        "ide": {"enabled": false},
        "tools": {"core": ["read_file", "run_shell_command"]},
        "skills": {"enabled": false},
        "context": {"includeDirectoryTree": false},
        "model": {"disableLoopDetection": true}
    })
}

/// `gemini -p PROMPT -m MODEL --yolo -o json` at `gw_url` as `key`.
fn configure(s: &Scene, cmd: &mut Command, gw_url: &str, key: &str, model: &str, prompt: &str) {
    s.write(&s.home.join(".gemini/settings.json"), &settings());
    cmd.env("GOOGLE_GEMINI_BASE_URL", gw_url)
        .env("GEMINI_API_KEY", key)
        .env("GEMINI_CLI_TRUST_WORKSPACE", "true")
        .env("GEMINI_CLI_NO_RELAUNCH", "true")
        .args(["-p", prompt, "-m", model, "--yolo", "-o", "json"]);
}

/// The scene's prompt with the path also as the demo backend's `arg=` directive (Gemini
/// CLI's session context, in the same user turn, names other absolute paths first).
fn prompt(s: &Scene, extra: &str) -> String {
    format!(
        "{} arg={}/secret.txt {extra}",
        s.prompt,
        s.project.display()
    )
}

/// Runs Gemini CLI on `model` of `gw` and checks both ends (see `reads_secret`).
async fn gemini_reads_secret(
    gw: &Gateway,
    model: &str,
    extra: &'static str,
    backend_saw: impl Fn(&str) -> bool,
) {
    let Some(bin) = GEMINI.locate() else {
        return;
    };
    let url = gw.url.clone();
    reads_secret(gw, "gemini-cli", VERSION, &bin, backend_saw, |s, cmd| {
        let p = prompt(s, extra);
        configure(s, cmd, &url, ALICE, model, &p)
    })
    .await;
    // Every model turn went to the Gemini surface, as a stream, and answered 200.
    let log = gw.log();
    let turns: Vec<&str> = (log.lines())
        .filter(|l| l.contains("route=/v1beta/models/{call}"))
        .collect();
    assert!(turns.len() >= 2, "{log}");
    assert!(turns.iter().all(|l| l.contains("status=200")), "{log}");
}

/// The demo backend received a tool result holding `secret`.
fn demo_saw(gw: &Gateway, secret: &str) -> bool {
    gw.spy_events("tool_result")
        .iter()
        .any(|e| e["text"].as_str().is_some_and(|t| t.contains(secret)))
}

#[tokio::test]
async fn gemini_cli_reads_secret_through_a_held_demo_turn() {
    let gw = Gateway::start_raw(Opts::default(), harness_config).await;
    gemini_reads_secret(&gw, "fake-model", "", |s| demo_saw(&gw, s)).await;
    // Gemini CLI's own two tools were the backend thread's.
    let threads = gw.thread_starts();
    let tools = threads[0]["dynamic_tools"].to_string();
    assert!(
        tools.contains("read_file") && tools.contains("run_shell_command"),
        "{tools}"
    );
}

#[tokio::test]
async fn gemini_cli_runs_its_own_shell_through_a_held_demo_turn() {
    let gw = Gateway::start_raw(Opts::default(), harness_config).await;
    gemini_reads_secret(&gw, "fake-model", "tool=run_shell_command", |s| {
        demo_saw(&gw, s)
    })
    .await;
    // What came back is Gemini CLI's shell output (`Output: …`, the process group), not a
    // file read.
    let results = gw.spy_events("tool_result");
    let shell = |t: &str| t.contains("\nOutput: TS-SECRET-") && t.contains("Process Group PGID");
    assert!(
        results
            .iter()
            .any(|e| e["text"].as_str().is_some_and(shell)),
        "{results:?}"
    );
}

/// The path of the secret file named in a user text of the Responses request.
fn secret_path(body: &Value) -> Option<String> {
    fake::user_texts(body)
        .iter()
        .flat_map(|t| t.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .find(|w| w.ends_with("/secret.txt") && w.starts_with('/'))
}

#[tokio::test]
async fn gemini_cli_reads_secret_through_a_held_codex_app_server_turn() {
    let Some(bin) = codex_bin() else {
        return;
    };
    // The model behind Codex: calls the client's read_file (under whatever name Codex gives
    // it), then quotes what came back.
    let model = FakeResponses::start(|_, body| {
        if let Some(out) = fake::output_for(body, "call_gem_1") {
            let out = out.as_str().map_or_else(|| out.to_string(), str::to_string);
            return Reply::text(&format!("Tool result: {out}"), 3);
        }
        let names = fake::tool_names(body);
        let tool = names.iter().find(|n| n.ends_with("read_file"));
        match (secret_path(body), tool) {
            (Some(path), Some(tool)) => Reply::call("call_gem_1", tool, json!({"file_path": path})),
            _ => Reply::text("nothing to do", 1),
        }
    })
    .await;
    let rig = Rig::start(&bin, &model, Setup::default()).await;
    let saw = |secret: &str| {
        (model.requests().iter()).any(|b| {
            fake::output_for(b, "call_gem_1").is_some_and(|o| o.to_string().contains(secret))
        })
    };
    gemini_reads_secret(&rig.gw, "codex", "", saw).await;
}

#[tokio::test]
async fn gemini_cli_reads_secret_through_a_held_claude_code_turn() {
    let fake = FakeMessages::start().await;
    let Some(gw) = crate::backends::claude_backend::gateway(&fake, Opts::default()).await else {
        return;
    };
    let saw =
        |secret: &str| (fake.bodies("readfile").iter()).any(|b| b.to_string().contains(secret));
    gemini_reads_secret(&gw, "cc-harness", "", saw).await;
}

#[tokio::test]
async fn gemini_cli_reads_secret_through_a_chat_upstream() {
    let (gw, fake) =
        crate::support::fake_upstream::gateway_on_fake(Opts::default(), &[("gem-up", "up-read")])
            .await;
    let saw = |secret: &str| {
        (fake.bodies().iter()).any(|b| {
            b["messages"].as_array().is_some_and(|m| {
                m.iter()
                    .any(|m| m["role"] == "tool" && m.to_string().contains(secret))
            })
        })
    };
    gemini_reads_secret(&gw, "gem-up", "", saw).await;
    // The upstream's own call id went back to it, never a token.
    let bodies = fake.bodies();
    assert!(!bodies.iter().any(|b| b.to_string().contains("srct-")));
}

/// A refusal reaches Gemini CLI as Google's error, once: it stops, printing the gateway's
/// message, without retrying.
#[tokio::test]
async fn gemini_cli_stops_at_a_refused_key_without_retrying() {
    let Some(bin) = GEMINI.locate() else {
        return;
    };
    let gw = Gateway::start_raw(Opts::default(), harness_config).await;
    let scene = Scene::new(&gw);
    let (mut cmd, stdout_path, stderr_path) = command(&bin, &scene);
    configure(
        &scene,
        &mut cmd,
        &gw.url,
        "sk-not-a-key",
        "fake-model",
        "hello",
    );
    let (status, _) = tokio::task::spawn_blocking(move || run_bounded(cmd, RUN_LIMIT))
        .await
        .expect("join");
    let status = status.expect("Gemini CLI gave up within its bound");
    let said = std::fs::read_to_string(&stdout_path).unwrap_or_default()
        + &std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert!(!status.success(), "{said}");
    assert!(said.contains("invalid_api_key"), "{said}");
    let (_, metrics) = get_text(&gw, ROOT, "/metrics").await;
    let refused: Vec<&str> = (metrics.lines())
        .filter(|l| l.starts_with("turnstile_requests_total{route=\"/v1beta/models/{call}\""))
        .collect();
    assert_eq!(
        refused,
        [r#"turnstile_requests_total{route="/v1beta/models/{call}",status="401"} 1"#],
        "{said}"
    );
}
