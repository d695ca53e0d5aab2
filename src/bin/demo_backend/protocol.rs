//! JSON-RPC framing and output: the stdout writer task, the `Ctx` output helpers (responses,
//! errors, notifications honouring the client's opt-outs) and the classification of input lines.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::requests::{
    handle_answer, initialize, thread_delete, thread_start, turn_interrupt, turn_start, turn_steer,
};
use crate::spy::spy;
use crate::state::State;
use crate::util::now_ms;

pub(crate) enum Out {
    Line(String),
    Exit(i32),
}

/// Notification methods the client opted out of in `initialize` (set once).
pub(crate) static OPT_OUT: OnceLock<HashSet<String>> = OnceLock::new();

#[derive(Clone)]
pub(crate) struct Ctx {
    pub(crate) state: Arc<Mutex<State>>,
    pub(crate) out: mpsc::UnboundedSender<Out>,
}

impl Ctx {
    pub(crate) fn send(&self, msg: Value) {
        // The writer task lives until the process exits, so a send error cannot matter.
        let _ = self.out.send(Out::Line(msg.to_string()));
    }
    pub(crate) fn notify(&self, method: &str, params: Value) {
        if OPT_OUT.get().is_some_and(|s| s.contains(method)) {
            return;
        }
        self.send(json!({"method": method, "params": params, "emittedAtMs": now_ms()}));
    }
    pub(crate) fn respond(&self, id: &Value, result: Value) {
        self.send(json!({"id": id, "result": result}));
    }
    pub(crate) fn error(&self, id: &Value, message: &str) {
        self.send(json!({"id": id, "error": {"code": -32600, "message": message}}));
    }
}

pub(crate) fn handle_line(ctx: &Ctx, line: &str) {
    let line = line.trim();
    if line.is_empty() {
        return;
    }
    let msg = match serde_json::from_str::<Value>(line) {
        Ok(msg) if msg.is_object() => msg,
        _ => return eprintln!("demo-backend: ignoring a line that is not a JSON object: {line}"),
    };
    let id = msg.get("id").filter(|v| !v.is_null());
    match (msg["method"].as_str(), id) {
        (Some(method), Some(id)) => {
            spy(json!({"event": "request", "method": method, "pid": std::process::id()}));
            let params = &msg["params"];
            if method == "initialize" {
                return initialize(ctx, id, params);
            }
            if !ctx.state.lock().initialized {
                return ctx.error(id, "Not initialized");
            }
            match method {
                "thread/start" => thread_start(ctx, id, params),
                "turn/start" => turn_start(ctx, id, params),
                "turn/interrupt" => turn_interrupt(ctx, id, params),
                "turn/steer" => turn_steer(ctx, id, params),
                "thread/delete" => thread_delete(ctx, id, params),
                other => ctx.error(id, &format!("Invalid request: unknown variant `{other}`")),
            }
        }
        (Some("initialized"), None) => {}
        (Some(method), None) => eprintln!("demo-backend: ignoring notification {method}"),
        (None, Some(_)) if msg.get("result").is_some() || msg.get("error").is_some() => {
            handle_answer(ctx, msg)
        }
        _ => eprintln!("demo-backend: ignoring unclassifiable message: {line}"),
    }
}

/// Owns stdout: writes each message as one line and flushes it.
pub(crate) async fn writer(mut rx: mpsc::UnboundedReceiver<Out>) {
    let mut stdout = tokio::io::stdout();
    while let Some(out) = rx.recv().await {
        match out {
            Out::Line(mut line) => {
                line.push('\n');
                let written = stdout.write_all(line.as_bytes()).await;
                if let Err(e) = written.and(stdout.flush().await) {
                    eprintln!("demo-backend: stdout write failed: {e}");
                    std::process::exit(1);
                }
            }
            Out::Exit(code) => {
                let _ = stdout.flush().await;
                std::process::exit(code);
            }
        }
    }
}
