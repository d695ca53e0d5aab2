//! Codex CLI 0.169.0 itself as the harness (`codex exec`, a custom model provider whose
//! `base_url` is the gateway, `wire_api = "responses"`, read-only sandbox, fully offline):
//! the backend asks for Codex CLI's own `exec_command` tool to read a file the test created,
//! the gateway holds that turn and hands Codex CLI an `srct-` call, Codex CLI runs the command
//! itself and posts the output, and the same held turn answers `Tool result: <output>`, which
//! Codex CLI prints. Once against the demo backend, once against the real `codex app-server`
//! backend with the scripted fake Responses model behind it.
//!
//! The binary is the one `.ci/run` installs for `codex.rs` (same skip rules). Codex CLI gets
//! its own empty `CODEX_HOME` under `.cache/codex-homes/`.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::codex::{codex_bin, config, root};
use crate::coding_harnesses::{harness_config, reads_secret, Scene};
use crate::support::fake_responses::{self as fake, FakeResponses, Reply};
use crate::support::*;

const VERSION: &str = "0.169.0";

/// `codex exec` against the gateway as model `model`, with its home in `codex_home`.
fn configure(model: &str, codex_home: &Path, s: &Scene, cmd: &mut Command) {
    let provider = format!(
        r#"model_providers.ts={{name="turnstile",base_url="{}",env_key="TS_KEY",wire_api="responses",request_max_retries=0,stream_max_retries=0}}"#,
        s.base_url
    );
    cmd.env("CODEX_HOME", codex_home)
        .env("TS_KEY", ALICE)
        .args(["exec", "--skip-git-repo-check", "--sandbox", "read-only"])
        .args(["-c", &format!("model={}", serde_json::json!(model))])
        .args(["-c", r#"model_provider="ts""#, "-c", &provider])
        .args(["-c", "features.plugins=false", "-c", "features.apps=false"])
        .args(["-c", "analytics.enabled=false"])
        .arg(&s.prompt);
}

/// A fresh, empty `CODEX_HOME` for the client (Codex refuses its helper aliases under /tmp).
fn client_home() -> tempfile::TempDir {
    let homes = root().join(".cache/codex-homes");
    std::fs::create_dir_all(&homes).expect("create .cache/codex-homes");
    tempfile::Builder::new()
        .prefix("cli-")
        .tempdir_in(&homes)
        .expect("codex home")
}

#[tokio::test]
async fn codex_cli_reads_secret_through_a_held_demo_turn() {
    let Some(bin) = codex_bin() else {
        return;
    };
    let gw = Gateway::start_raw(Opts::default(), harness_config).await;
    let home = client_home();
    let spy_saw = |secret: &str| {
        gw.spy_events("tool_result")
            .iter()
            .any(|e| e["text"].as_str().is_some_and(|t| t.contains(secret)))
    };
    reads_secret(&gw, "codex-cli", VERSION, &bin, spy_saw, |s, cmd| {
        configure("fake-model", home.path(), s, cmd)
    })
    .await;
    // Codex CLI's own tools were declared to the backend, built-in names mapped.
    let declared = gw.thread_starts()[0]["dynamic_tools"].clone();
    let names: Vec<&str> = declared
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(names.contains(&"exec_command"), "{names:?}");
    assert!(names.contains(&"client_request_user_input"), "{names:?}");
    assert!(!names.contains(&"request_user_input"), "{names:?}");
}

/// The text of a `function_call_output`'s output (a string or content items).
fn output_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        other => other.to_string(),
    }
}

/// The path of the secret file named in the user's prompt.
fn secret_path(body: &Value) -> Option<String> {
    fake::user_texts(body)
        .iter()
        .flat_map(|t| t.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .find(|w| w.ends_with("/secret.txt"))
}

#[tokio::test]
async fn codex_cli_reads_secret_through_a_held_codex_app_server_turn() {
    let Some(bin) = codex_bin() else {
        return;
    };
    // The model behind the backend: asks for the client's `exec_command` (declared to Codex
    // as `client_exec_command`: the name is one of its built-ins), then answers with what
    // came back.
    let model = FakeResponses::start(|_, body| {
        if let Some(out) = fake::output_for(body, "call_cli_1") {
            return Reply::text(&format!("Tool result: {}", output_text(&out)), 3);
        }
        match secret_path(body) {
            Some(path) => Reply::call(
                "call_cli_1",
                "client_exec_command",
                json!({"cmd": format!("cat {path}")}),
            ),
            None => Reply::text("nothing to do", 1),
        }
    })
    .await;
    let homes = root().join(".cache/codex-homes");
    std::fs::create_dir_all(&homes).expect("create .cache/codex-homes");
    let backend_home = tempfile::Builder::new()
        .prefix("e2e-")
        .tempdir_in(&homes)
        .expect("codex home");
    std::fs::create_dir_all(backend_home.path().join("work")).expect("work folder");
    let (base_url, folder) = (model.base_url.clone(), backend_home.path().to_path_buf());
    let backend_bin = bin.clone();
    let gw = Gateway::start_raw(Opts::default(), move |o, _| {
        config(o, &backend_bin, &base_url, &folder, false)
    })
    .await;
    let home = client_home();
    let model_saw = |secret: &str| {
        model.requests().iter().any(|body| {
            fake::output_for(body, "call_cli_1").is_some_and(|o| output_text(&o).contains(secret))
        })
    };
    reads_secret(&gw, "codex-cli", VERSION, &bin, model_saw, |s, cmd| {
        configure("codex", home.path(), s, cmd)
    })
    .await;
    // The backend's model was offered Codex CLI's tools (built-in names mapped, hosted
    // tools dropped, the namespace flattened).
    let first = &model.requests()[0];
    let names = fake::tool_names(first);
    assert!(
        names.iter().any(|n| n == "client_exec_command"),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n == "client_request_user_input"),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n == "web_search"), "{names:?}");
}
