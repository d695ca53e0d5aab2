//! Node.js client scripts in `tests/clients/` (packages pinned in its `package.json`, which
//! `.ci/run` installs with `npm ci`). A missing `node` or package is a loud skip, except under
//! `CI`, where it fails the test.

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

pub fn clients_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// `node` (or `TURNSTILE_NODE`) when `package` is installed in `tests/clients`, else `None`
/// after a loud skip message naming `test` (a failure under `CI`).
pub fn node_with(package: &str, test: &str) -> Option<PathBuf> {
    let node = std::env::var_os("TURNSTILE_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("node"));
    let installed = clients_dir()
        .join("node_modules")
        .join(package)
        .join("package.json")
        .exists();
    let runs = std::process::Command::new(&node)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if installed && runs {
        return Some(node);
    }
    let why = if runs {
        format!("no {package} in tests/clients/node_modules (run `npm ci --prefix tests/clients`, as .ci/run does)")
    } else {
        "no `node` on PATH (or TURNSTILE_NODE)".to_string()
    };
    skip(test, &why)
}

/// Says loudly that `test` is skipped, and fails under `CI`.
pub fn skip<T>(test: &str, why: &str) -> Option<T> {
    eprintln!("\n!!!!! SKIPPED {test}: {why} !!!!!\n");
    if std::env::var_os("CI").is_some() {
        panic!("{test} must run in CI: {why}");
    }
    None
}

/// Runs `tests/clients/{script}` with `env`, within `limit`.
pub async fn run(node: PathBuf, script: &str, env: &[(&str, String)], limit: Duration) -> Output {
    let mut cmd = tokio::process::Command::new(node);
    cmd.arg(clients_dir().join(script))
        .current_dir(clients_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn node");
    tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish in {limit:?}"))
        .expect("run node")
}

/// The script's stdout, after asserting that it exited 0 (else its output and the gateway's
/// log are the failure message).
pub fn succeeded(out: &Output, script: &str, gateway_log: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{stdout}\n{stderr}\n--- gateway log\n{gateway_log}",
        out.status,
    );
    stdout
}
