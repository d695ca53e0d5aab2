//! Harnesses signed in without a long-lived secret: `turnstile login` (a scripted device
//! approval at the real OpenID provider), then Claude Code 2.1.332 with
//! `apiKeyHelper = "turnstile token"` and Codex CLI 0.171.0 with the provider auth command
//! `turnstile token`, each running a held round trip across a forced token expiry.
//!
//! The backend asks for the harness's shell tool to `cat` a named pipe. While the harness
//! waits on the pipe (the turn held at the gateway), the user's groups change at the provider
//! and the sign-in is refreshed, so the token the harness holds stops verifying; then the
//! pipe gets the secret. The harness's continuation is refused 401, it runs `turnstile token`
//! again (which finds its kept token refused and refreshes), retries, and the same held turn
//! answers `Tool result: <secret>`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::backends::codex::codex_bin;
use crate::clients::coding_harnesses::{command, run_bounded, tail, Scene, CLAUDE, RUN_LIMIT};
use crate::operations::oidc::Idp;
use crate::operations::sign_in::{kept, login, opts, refresh, SECRET_ENV};
use crate::support::*;

const MODEL: &str = "fake-model";

/// A gateway whose developers may use every model, signing in through `idp`.
async fn gateway(idp: &Idp) -> Gateway {
    let keys = format!(
        "client_id = \"turnstile\"\nclient_secret_env = \"{SECRET_ENV}\"\nscopes = [\"openid\", \"offline_access\", \"groups\"]\n"
    );
    let section = idp.section(&keys)
        + "\n[[groups]]\nname = \"developers\"\nmodels = [\"*\"]\n\n[[groups]]\nname = \"approvers\"\nroles = [\"approver\"]\n";
    Gateway::start_raw(opts(), move |o, d| {
        crate::clients::coding_harnesses::harness_config(o, d) + &section
    })
    .await
}

/// `turnstile token` as a harness runs it: the binary, its credentials file.
fn helper(creds: &Path) -> (String, Vec<String>) {
    let bin = env!("CARGO_BIN_EXE_turnstile").to_string();
    (
        bin,
        vec![
            "token".into(),
            "--credentials".into(),
            creds.display().to_string(),
        ],
    )
}

/// The scene with `secret.txt` a named pipe, and the prompt asking for `tool` on it.
fn piped_scene(gw: &Gateway, tool: &str) -> (Scene, PathBuf, String) {
    let mut scene = Scene::new(gw);
    let pipe = scene.project.join("secret.txt");
    std::fs::remove_file(&pipe).unwrap();
    let made = Command::new("mkfifo").arg(&pipe).status().expect("mkfifo");
    assert!(made.success());
    scene.prompt = format!("scenario=tool tool={tool} arg={}", pipe.display());
    let secret = scene.secret.clone();
    (scene, pipe, secret)
}

/// Waits (bounded) until the harness reads the pipe, then forces the expiry of the token it
/// holds (bob leaves the approvers; the sign-in refreshed), then writes the secret.
async fn expire_then_answer(idp: &Idp, gw: &Gateway, creds: &Path, pipe: &Path, secret: &str) {
    // Linux's O_NONBLOCK: opening a pipe for writing fails (ENXIO) until a reader has it open.
    const O_NONBLOCK: i32 = 0o4000;
    let mut writer = wait_for_within(
        "the harness reading the pipe (the turn held)",
        RUN_LIMIT,
        || tail(&gw.log(), 30),
        async || {
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(O_NONBLOCK)
                .open(pipe)
                .ok()
        },
    )
    .await;
    idp.call(reqwest::Method::POST, "/groups?user=bob&group=developers")
        .await;
    let (status, _) = refresh(gw, &kept(creds, "refresh_token")).await;
    assert_eq!(status, 200);
    let old = kept(creds, "access_token");
    let (s, _) = get(gw, &old, "/v1/whoami").await;
    assert_eq!(s, 401, "the harness's token no longer verifies");
    writer.write_all(format!("{secret}\n").as_bytes()).unwrap();
}

/// How many answers of `route` had `status`.
async fn answered(gw: &Gateway, route: &str, status: u16) -> f64 {
    let (_, text) = get_text(gw, ROOT, "/metrics").await;
    let line = format!("turnstile_requests_total{{route=\"{route}\",status=\"{status}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line)?.parse().ok())
        .unwrap_or(0.0)
}

/// Runs `cmd` while the pipe is answered after a forced expiry; the harness must exit 0 and
/// print the held turn's answer with the secret, after at least one 401 on `route`.
async fn round_trip(
    idp: &Idp,
    gw: &Gateway,
    creds: &Path,
    cmd: Command,
    scene: &Scene,
    pipe: &Path,
    route: &str,
) {
    let secret = scene.secret.clone();
    let run = tokio::task::spawn_blocking(move || run_bounded(cmd, RUN_LIMIT));
    expire_then_answer(idp, gw, creds, pipe, &secret).await;
    let (status, _) = run.await.unwrap();
    let stdout = std::fs::read_to_string(scene.tmp.path().join("stdout.txt")).unwrap_or_default();
    let stderr = std::fs::read_to_string(scene.tmp.path().join("stderr.txt")).unwrap_or_default();
    let why = format!(
        "--- stdout\n{stdout}\n--- stderr\n{}\n--- gateway log\n{}",
        tail(&stderr, 40),
        tail(&gw.log(), 40)
    );
    assert!(status.is_some_and(|s| s.success()), "{why}");
    // The held turn's answer (Codex CLI's shell output carries its own header lines).
    assert!(
        stdout.contains("Tool result: ") && stdout.contains(&secret),
        "{why}"
    );
    assert!(
        answered(gw, route, 401).await >= 1.0,
        "no 401 on {route}: {why}"
    );
    assert!(
        gw.spy_events("tool_result")
            .iter()
            .any(|e| e["text"].as_str().is_some_and(|t| t.contains(&secret))),
        "the held turn got the secret: {why}"
    );
}

#[tokio::test]
async fn claude_code_with_api_key_helper_keeps_working_across_a_forced_expiry() {
    let (Some(bin), Some(idp)) = (CLAUDE.locate(), Idp::start()) else {
        return;
    };
    let gw = gateway(&idp).await;
    let (scene, pipe, _) = piped_scene(&gw, "Bash");
    let creds = scene.home.join(".config/turnstile/credentials.json");
    login(&idp, &gw, &creds, "bob").await;
    let (helper_bin, args) = helper(&creds);
    scene.write(
        &scene.home.join(".claude/settings.json"),
        &json!({"apiKeyHelper": format!("{helper_bin} {}", args.join(" "))}),
    );
    let (mut cmd, _, _) = command(&bin, &scene);
    cmd.env("ANTHROPIC_BASE_URL", &gw.url)
        .env("DISABLE_TELEMETRY", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .args([
            "-p",
            &scene.prompt,
            "--model",
            MODEL,
            "--allowedTools",
            "Bash",
        ]);
    round_trip(&idp, &gw, &creds, cmd, &scene, &pipe, "/v1/messages").await;
}

#[tokio::test]
async fn codex_cli_with_an_auth_command_keeps_working_across_a_forced_expiry() {
    let (Some(bin), Some(idp)) = (codex_bin(), Idp::start()) else {
        return;
    };
    let gw = gateway(&idp).await;
    let (scene, pipe, _) = piped_scene(&gw, "exec_command");
    let creds = scene.home.join(".config/turnstile/credentials.json");
    login(&idp, &gw, &creds, "bob").await;
    let (helper_bin, args) = helper(&creds);
    let home = crate::clients::codex_cli::client_home();
    let provider = format!(
        r#"model_providers.ts={{name="turnstile",base_url="{}",wire_api="responses",request_max_retries=0,stream_max_retries=0,auth={{command={},args={}}}}}"#,
        scene.base_url,
        json!(helper_bin),
        json!(args)
    );
    let (mut cmd, _, _) = command(&bin, &scene);
    cmd.env("CODEX_HOME", home.path())
        .args(["exec", "--skip-git-repo-check", "--sandbox", "read-only"])
        .args(["-c", &format!("model={}", json!(MODEL))])
        .args(["-c", r#"model_provider="ts""#, "-c", &provider])
        .args(["-c", "features.plugins=false", "-c", "features.apps=false"])
        .args(["-c", "analytics.enabled=false"])
        .arg(&scene.prompt);
    round_trip(&idp, &gw, &creds, cmd, &scene, &pipe, "/v1/responses").await;
}
