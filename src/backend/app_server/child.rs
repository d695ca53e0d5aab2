//! What an agent backend's child process is given and what of it reaches the gateway's log:
//! its command with an environment built from an allowlist (never the gateway's own secrets:
//! the agent may run commands that read its environment), and its stderr, forwarded
//! verbatim only until the handshake is done.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{ChildStderr, Command};
use tokio_util::task::TaskTracker;

use crate::backend::BackendError;
use crate::config::BackendConfig;

/// The child's command: the config's argv, cwd and `env`, plus only the variables of the
/// gateway's environment that `env_passthrough` names (the config's resolved pass list).
pub(super) fn command(cfg: &BackendConfig) -> Result<Command, BackendError> {
    let passed = cfg
        .env_passthrough
        .iter()
        .filter_map(|k| Some((k, std::env::var_os(k)?)));
    let mut cmd = Command::new(&cfg.command[0]);
    cmd.args(&cfg.command[1..])
        .env_clear()
        .envs(passed)
        .envs(&cfg.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(cwd) = &cfg.cwd {
        cmd.current_dir(cwd);
    }
    // CODEX_HOME must exist before the child starts.
    if let Some(home) = cfg.env.get("CODEX_HOME") {
        std::fs::create_dir_all(home)
            .map_err(|e| BackendError::Unavailable(format!("cannot create CODEX_HOME: {e}")))?;
    }
    Ok(cmd)
}

/// Forwards the child's stderr (its own log) at debug. Until the returned flag is set (the
/// handshake is done) a line can only be about starting (a bad flag, a config the backend
/// refuses) and is logged as it is; after it a line may quote a prompt or a tool's output,
/// so only its size is logged.
pub(super) fn forward_stderr(
    tracker: &TaskTracker,
    id: u64,
    stderr: ChildStderr,
) -> Arc<AtomicBool> {
    let initialized = Arc::new(AtomicBool::new(false));
    let started = initialized.clone();
    tracker.spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if started.load(Ordering::Relaxed) {
                tracing::debug!(
                    backend_process = id,
                    bytes = line.len(),
                    "backend stderr line (content withheld)"
                );
            } else {
                tracing::debug!(backend_process = id, "backend stderr: {line}");
            }
        }
    });
    initialized
}
