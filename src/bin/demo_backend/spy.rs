//! The spy file: an append-only JSON-lines log of what the backend saw, for the e2e tests.
//!
//! When `TURNSTILE_DEMO_SPY` names a file, one JSON object per line is appended to it (one
//! write per line, so several processes may share the file). Events, by `event`:
//! - `started {pid}`, `request {method, pid}` (every client request), `exit {pid}` (stdin EOF);
//! - `thread_start {thread, model, ephemeral, dynamic_tools, developer_instructions,
//!   base_instructions, cwd, approval_policy, sandbox}` (raw `thread/start` params);
//! - `turn_start {thread, turn, input, effort}`, `steer {thread, input}`, `interrupt {thread, turn}`,
//!   `thread_delete {thread, loaded}` (`loaded`: threads still loaded after it);
//! - `tool_result {thread, call_id, success, text, error}` (`text` is the output the model sees);
//! - `approval_decision {thread, method, answer}`, `server_request_answer {thread, id, method,
//!   answer}`, `stale_answer {id}` (answer to an unknown or abandoned server request).

use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::sync::OnceLock;

use serde_json::Value;

static SPY: OnceLock<Option<Mutex<File>>> = OnceLock::new();

pub(crate) fn spy(event: Value) {
    let Some(Some(file)) = SPY.get() else { return };
    let line = format!("{event}\n");
    let mut file = file.lock();
    if let Err(e) = file.write_all(line.as_bytes()).and_then(|()| file.flush()) {
        eprintln!("demo-backend: spy write failed: {e}");
    }
}

/// Opens the spy file named by `TURNSTILE_DEMO_SPY`, if any (call once, before any `spy`).
pub(crate) fn init() {
    let spy_file = std::env::var_os("TURNSTILE_DEMO_SPY").and_then(|path| {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| {
                eprintln!(
                    "demo-backend: cannot open spy file {}: {e}",
                    path.to_string_lossy()
                )
            })
            .ok()
    });
    let _ = SPY.set(spy_file.map(Mutex::new));
}
