//! The official `openai`, `anthropic` and `google-genai` Python packages against the real binary. `.ci/run` installs it into
//! `.cache/venv`; when that interpreter is missing the test says so loudly and returns.

use std::path::PathBuf;
use std::process::Command;

use crate::support::*;

pub(crate) fn python() -> Option<PathBuf> {
    let p = std::env::var_os("TURNSTILE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/venv/bin/python")
        });
    p.exists().then_some(p)
}

/// Runs one SDK script against a fresh gateway (base URL + `/v1`); it must print `ALL OK`.
async fn run_script(name: &str) {
    run_script_at(name, "/v1").await
}

/// Runs one SDK script with `TURNSTILE_URL` = the gateway's URL + `path`.
pub(crate) async fn run_script_at(name: &str, path: &'static str) {
    run_script_on(&Gateway::start().await, name, path).await;
}

/// Runs one SDK script against `gw`; `false` when the venv is missing (a loud skip).
pub(crate) async fn run_script_on(gw: &Gateway, name: &str, path: &'static str) -> bool {
    run_script_with(gw, name, path, &[]).await
}

/// [`run_script_on`] with more environment for the script.
pub(crate) async fn run_script_with(
    gw: &Gateway,
    name: &str,
    path: &'static str,
    env: &[(&str, String)],
) -> bool {
    let Some(py) = python() else {
        eprintln!("\n!!!!! SKIPPED openai SDK test: no venv at .cache/venv (run .ci/run to install it) !!!!!\n");
        if std::env::var_os("CI").is_some() {
            panic!("the openai SDK venv must exist in CI");
        }
        return false;
    };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(name);
    let url = format!("{}{path}", gw.url);
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(py)
            .arg(script)
            .env("TURNSTILE_URL", url)
            .env("TURNSTILE_KEY", ALICE)
            .env("TURNSTILE_OTHER_KEY", BOB)
            .envs(env)
            .output()
            .expect("run python")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let log = gw.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(60)..].join("\n");
        panic!(
            "SDK script failed:\n{stdout}\n{stderr}\n--- the gateway's log, last lines:\n{tail}"
        );
    }
    assert!(stdout.contains("ALL OK"), "{stdout}");
    true
}

#[tokio::test]
async fn openai_python_sdk_plain_stream_tools_and_errors() {
    run_script("openai_sdk.py").await;
}

#[tokio::test]
async fn anthropic_python_sdk_messages_stream_tools_and_errors() {
    run_script_at("anthropic_sdk.py", "").await;
}

/// The Gemini API through `google-genai`: a manual function-calling loop through held turns,
/// streamed and not, its errors, paging and token counts (`tests/clients/gemini_sdk.py`).
#[tokio::test]
async fn google_genai_python_sdk_manual_function_loop_and_errors() {
    run_script_at("gemini_sdk.py", "").await;
}

#[tokio::test]
async fn openai_python_sdk_responses_create_and_stream() {
    run_script("openai_responses.py").await;
}

/// The Responses WebSocket mode through the `openai` package's `responses.connect()`; its
/// last socket closes while a leg runs, which interrupts that leg.
#[tokio::test]
async fn openai_python_sdk_responses_over_websocket() {
    let gw = Gateway::start().await;
    if !run_script_on(&gw, "openai_ws.py", "/v1").await {
        return;
    }
    wait_for("the leg of a closed socket interrupted", async || {
        gw.log()
            .contains("client went away mid-leg; interrupting the turn")
            .then_some(())
    })
    .await;
    wait_until("three sockets' log lines", || {
        gw.log().matches("socket opened").count() >= 3
    })
    .await;
    let log = gw.log();
    let opened = log.matches("socket opened").count();
    assert!(opened >= 3, "{opened} sockets opened\n{log}");
    assert!(log.contains(r#"transport="websocket""#), "{log}");
}

/// A socket holds a place among its principal's streams, and an idle one is closed.
#[tokio::test]
async fn responses_websocket_bounds_streams_and_idle_sockets() {
    let gw = Gateway::start_with(Opts {
        server: "websocket_idle_timeout_seconds = 1\nmax_streams_per_client = 1",
        ..Opts::default()
    })
    .await;
    if run_script_on(&gw, "openai_ws_bounds.py", "/v1").await {
        wait_until("the idle close's log line", || {
            gw.log().contains(r#"reason="idle""#)
        })
        .await;
    }
}
