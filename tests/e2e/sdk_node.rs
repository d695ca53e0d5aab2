//! The official `openai` npm package (pinned in `tests/clients/package.json`) against the real
//! binary: `tests/clients/openai_sdk.mjs` mirrors the Python script and adds the 429 class.
//! `.ci/run` installs it with `npm ci` into `tests/clients/node_modules`; when that is missing
//! the test says so loudly and returns, except under `CI`, where it fails.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use crate::support::*;

/// Bound on the whole script (it takes about a second).
const SCRIPT_LIMIT: Duration = Duration::from_secs(120);

fn clients_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// `node` (or `TURNSTILE_NODE`) when the pinned package is installed, else `None` after a
/// loud skip message (a failure under `CI`).
fn node_with_openai() -> Option<PathBuf> {
    let node = std::env::var_os("TURNSTILE_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("node"));
    let installed = clients_dir()
        .join("node_modules/openai/package.json")
        .exists();
    let runs = std::process::Command::new(&node)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if installed && runs {
        return Some(node);
    }
    let why = if runs {
        "no tests/clients/node_modules (run `npm ci --prefix tests/clients`, as .ci/run does)"
    } else {
        "no `node` on PATH (or TURNSTILE_NODE)"
    };
    eprintln!("\n!!!!! SKIPPED openai npm SDK test: {why} !!!!!\n");
    if std::env::var_os("CI").is_some() {
        panic!("the openai npm package must be installed in CI: {why}");
    }
    None
}

#[tokio::test]
async fn openai_node_sdk_plain_stream_tools_and_errors() {
    let Some(node) = node_with_openai() else {
        return;
    };
    // One pending call per client, so the script can provoke 429 `capacity_exhausted`.
    let gw = Gateway::start_with(Opts {
        max_pending_per_client: 1,
        ..Opts::default()
    })
    .await;
    let child = tokio::process::Command::new(node)
        .arg(clients_dir().join("openai_sdk.mjs"))
        .current_dir(clients_dir())
        .env("TURNSTILE_URL", format!("{}/v1", gw.url))
        .env("TURNSTILE_KEY", ALICE)
        .env("TURNSTILE_OTHER_KEY", BOB)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn node");
    let out = tokio::time::timeout(SCRIPT_LIMIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the SDK script did not finish in {SCRIPT_LIMIT:?}"))
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "SDK script failed ({}):\n{stdout}\n{stderr}\n--- gateway log\n{}",
        out.status,
        gw.log()
    );
    assert!(stdout.contains("ALL OK"), "{stdout}");
}
