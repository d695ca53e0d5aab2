//! A real Arize Phoenix for the tracing tests: `.ci/run` installs it into `.cache/venv`, and
//! the first test that needs it starts `phoenix serve` on free loopback ports with a temporary
//! working folder. One server per test process, under a small shell that waits on its stdin:
//! when the test process exits, the pipe closes and the shell stops Phoenix.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;

pub struct Phoenix {
    /// The HTTP port: the UI, the REST API and the OTLP/HTTP receiver (`/v1/traces`).
    pub port: u16,
    _stdin: Mutex<ChildStdin>,
    _child: Mutex<Child>,
    _dir: tempfile::TempDir,
}

/// The `phoenix` command of the test venv, if installed.
fn command() -> Option<PathBuf> {
    let bin = crate::clients::sdk::python()?.with_file_name("phoenix");
    bin.exists().then_some(bin)
}

/// The process-wide Phoenix, started on first use; None (a loud skip, a failure in CI) when
/// the venv has none.
pub async fn server() -> Option<&'static Phoenix> {
    static SERVER: OnceLock<Option<Phoenix>> = OnceLock::new();
    if SERVER.get().is_none() {
        let started = tokio::task::spawn_blocking(start).await.expect("start");
        let _ = SERVER.set(started);
    }
    let server = SERVER.get().and_then(Option::as_ref);
    if server.is_none() {
        eprintln!("\n!!!!! SKIPPED tracing test: no Phoenix in .cache/venv (run .ci/run to install it) !!!!!\n");
        if std::env::var_os("CI").is_some() {
            panic!("Phoenix must be installed in CI");
        }
    }
    if let Some(p) = server {
        wait_ready(p.port).await;
    }
    server
}

fn start() -> Option<Phoenix> {
    let bin = command()?;
    let dir = tempfile::tempdir().expect("tempdir");
    let (port, grpc) = (super::postgres::free_port(), super::postgres::free_port());
    let script = format!(
        "'{}' serve >'{}/phoenix.log' 2>&1 & pid=$!; cat >/dev/null; kill $pid; wait $pid",
        bin.display(),
        dir.path().display()
    );
    let mut child = Command::new("sh")
        .args(["-c", &script])
        .env("PHOENIX_WORKING_DIR", dir.path())
        .env("PHOENIX_HOST", "127.0.0.1")
        .env("PHOENIX_PORT", port.to_string())
        .env("PHOENIX_GRPC_PORT", grpc.to_string())
        .env("PHOENIX_TELEMETRY_ENABLED", "false")
        .env("DO_NOT_TRACK", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // A group of its own: Phoenix signals its whole process group when it stops, which
        // must not reach the tests (or the script that runs them).
        .process_group(0)
        .spawn()
        .expect("spawn phoenix");
    let stdin = child.stdin.take().expect("stdin");
    Some(Phoenix {
        port,
        _stdin: Mutex::new(stdin),
        _child: Mutex::new(child),
        _dir: dir,
    })
}

/// Phoenix takes a few seconds to import and migrate its store.
async fn wait_ready(port: u16) {
    let url = format!("http://127.0.0.1:{port}/healthz");
    let client = reqwest::Client::new();
    super::wait_for_within(
        "Phoenix to answer /healthz",
        Duration::from_secs(120),
        String::new,
        async || {
            let r = client.get(&url).send().await.ok()?;
            r.status().is_success().then_some(())
        },
    )
    .await;
}

impl Phoenix {
    /// Where a gateway exports (`[telemetry] otlp_endpoint`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span of the default project (newest first), through the REST API.
    pub async fn spans(&self) -> Vec<Value> {
        let client = reqwest::Client::new();
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut url = format!(
                "http://127.0.0.1:{}/v1/projects/default/spans?limit=1000",
                self.port
            );
            if let Some(c) = &cursor {
                url.push_str(&format!("&cursor={c}"));
            }
            let r = client.get(&url).send().await.expect("phoenix spans");
            assert!(r.status().is_success(), "phoenix spans: {}", r.status());
            let v: Value = r.json().await.expect("json");
            out.extend(v["data"].as_array().cloned().unwrap_or_default());
            match v["next_cursor"].as_str() {
                Some(c) if !c.is_empty() => cursor = Some(c.to_string()),
                _ => return out,
            }
        }
    }
}
