//! Codex CLI 0.171.0 itself as the harness (`codex exec`, a custom model provider whose
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

use crate::backends::codex::{codex_bin, config, root};
use crate::clients::coding_harnesses::{
    command, harness_config, reads_secret, run_bounded, Scene, RUN_LIMIT,
};
use crate::support::fake_responses::{self as fake, FakeResponses, Reply};
use crate::support::*;

pub(crate) const VERSION: &str = "0.171.0";

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
pub(crate) fn client_home() -> tempfile::TempDir {
    let homes = root().join(".cache/codex-homes");
    std::fs::create_dir_all(&homes).expect("create .cache/codex-homes");
    tempfile::Builder::new()
        .prefix("cli-")
        .tempdir_in(&homes)
        .expect("codex home")
}

/// The demo backend received a tool result holding `secret`.
fn demo_saw(gw: &Gateway, secret: &str) -> bool {
    gw.spy_events("tool_result")
        .iter()
        .any(|e| e["text"].as_str().is_some_and(|t| t.contains(secret)))
}

#[tokio::test]
async fn codex_cli_reads_secret_through_a_held_demo_turn() {
    let Some(bin) = codex_bin() else {
        return;
    };
    let gw = Gateway::start_raw(Opts::default(), harness_config).await;
    let home = client_home();
    let spy_saw = |secret: &str| demo_saw(&gw, secret);
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

/// Codex CLI's built-in `openai` provider at the gateway, as most people set it up:
/// `openai_base_url` in `config.toml` and the key saved as `codex login --with-api-key`
/// saves it. It speaks the Responses API over a WebSocket first and compacts remotely.
pub(crate) fn builtin_home(codex_home: &Path, base_url: &str, extra: &str) {
    let config = format!(
        "openai_base_url = \"{base_url}\"\n{extra}\n[analytics]\nenabled = false\n\
         [features]\nplugins = false\napps = false\n"
    );
    std::fs::write(codex_home.join("config.toml"), config).expect("config.toml");
    let auth = json!({"auth_mode": "apikey", "OPENAI_API_KEY": ALICE});
    std::fs::write(codex_home.join("auth.json"), auth.to_string()).expect("auth.json");
}

/// `codex exec` on `model` with its home in `codex_home` (its config written there).
pub(crate) fn exec(model: &str, codex_home: &Path, cmd: &mut Command, args: &[&str]) {
    cmd.env("CODEX_HOME", codex_home)
        .env("RUST_LOG", "codex_api=info,codex_core=warn")
        .args(["exec", "--skip-git-repo-check", "--sandbox", "read-only"])
        .args(["-m", model])
        .args(args);
}

/// What shows that Codex CLI gave up on the WebSocket (its own stderr).
const FELL_BACK: &[&str] = &[
    "Falling back from WebSockets",
    "Reconnecting",
    "failed to connect to Responses WebSocket",
];

#[tokio::test]
async fn codex_cli_builtin_provider_holds_a_turn_over_websocket() {
    let Some(bin) = codex_bin() else {
        return;
    };
    let gw = Gateway::start_raw(Opts::default(), harness_config).await;
    let home = client_home();
    let spy_saw = |secret: &str| demo_saw(&gw, secret);
    let (stderr, elapsed) = reads_secret(&gw, "codex-cli", VERSION, &bin, spy_saw, |s, cmd| {
        builtin_home(home.path(), &s.base_url, "");
        exec("fake-model", home.path(), cmd, &[&s.prompt]);
    })
    .await;
    for sign in FELL_BACK {
        assert!(!stderr.contains(sign), "Codex CLI: {sign}\n{stderr}");
    }
    let opened =
        |log: &str| log.contains("socket opened") && log.contains(r#"transport="websocket""#);
    wait_until("the socket's log lines", || opened(&gw.log())).await;
    let log = gw.log();
    assert!(opened(&log), "{log}");
    assert!(
        !log.contains("method=POST route=/v1/responses"),
        "Codex CLI fell back to HTTP\n{log}"
    );
    eprintln!(
        "codex-cli {VERSION}, built-in provider over WebSocket: a held round trip in {:.2} s",
        elapsed.as_secs_f64()
    );
}

/// Runs `codex exec` with `args` in `scene`'s environment; it must exit 0. Its stdout and
/// stderr.
async fn codex_in(bin: &Path, scene: &Scene, setup: impl FnOnce(&mut Command)) -> (String, String) {
    let (mut cmd, out, err) = command(bin, scene);
    setup(&mut cmd);
    let (status, _) = tokio::task::spawn_blocking(move || run_bounded(cmd, RUN_LIMIT))
        .await
        .expect("join");
    let stdout = std::fs::read_to_string(out).unwrap_or_default();
    let stderr = std::fs::read_to_string(err).unwrap_or_default();
    assert!(
        status.is_some_and(|s| s.success()),
        "codex exec: {status:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    (stdout, stderr)
}

/// A session whose context fills (a compaction limit of 10 tokens against the demo's 15 per
/// turn) compacts before its next turn and carries on. With the built-in provider Codex CLI
/// compacts remotely (a `compaction_trigger` over the WebSocket, the `compaction` item carried
/// back); with a custom provider it compacts locally, with an ordinary request over HTTP.
async fn compacts_and_carries_on(builtin: bool) {
    let Some(bin) = codex_bin() else {
        return;
    };
    let gw = Gateway::start_raw(Opts::default(), harness_config).await;
    let home = client_home();
    let scene = Scene::new(&gw);
    let limit = "model_auto_compact_token_limit = 10";
    if builtin {
        builtin_home(home.path(), &scene.base_url, limit);
    } else {
        let provider = format!(
            "model_provider = \"ts\"\n{limit}\n[model_providers.ts]\nname = \"turnstile\"\n\
             base_url = \"{}\"\nenv_key = \"TS_KEY\"\nwire_api = \"responses\"\n\
             request_max_retries = 0\nstream_max_retries = 0\n[analytics]\nenabled = false\n",
            scene.base_url
        );
        std::fs::write(home.path().join("config.toml"), provider).expect("config.toml");
    }
    let run = |args: &'static [&'static str]| {
        let home = home.path().to_path_buf();
        move |cmd: &mut Command| {
            cmd.env("TS_KEY", ALICE);
            exec("echo", &home, cmd, args)
        }
    };
    let (first, _) = codex_in(&bin, &scene, run(&["first question"])).await;
    assert!(first.contains("You said: first question"), "{first}");
    let (second, stderr) =
        codex_in(&bin, &scene, run(&["resume", "--last", "second question"])).await;
    assert!(
        second.contains("You said: second question"),
        "{second}\n{stderr}"
    );
    let both = format!("{second}\n{stderr}");
    assert!(both.contains("context compacted"), "{both}");
    let inputs: Vec<String> = gw
        .spy_events("turn_start")
        .iter()
        .map(|e| e["input"].to_string())
        .collect();
    let log = gw.log();
    if builtin {
        for sign in FELL_BACK {
            assert!(!stderr.contains(sign), "Codex CLI: {sign}\n{stderr}");
        }
        // The summary turn ran on the backend, and nothing went over HTTP.
        assert!(
            inputs
                .iter()
                .any(|i| i.contains("You are compacting a conversation")),
            "{inputs:?}"
        );
        assert!(!log.contains("method=POST route=/v1/responses"), "{log}");
    } else {
        assert!(
            inputs
                .iter()
                .any(|i| i.contains("CONTEXT CHECKPOINT COMPACTION")),
            "{inputs:?}"
        );
        assert!(!log.contains("socket opened"), "{log}");
    }
}

#[tokio::test]
async fn codex_cli_builtin_provider_compacts_remotely_and_carries_on() {
    compacts_and_carries_on(true).await;
}

#[tokio::test]
async fn codex_cli_custom_provider_compacts_over_http_and_carries_on() {
    compacts_and_carries_on(false).await;
}
