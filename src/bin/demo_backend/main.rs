//! `turnstile-demo-backend`: a scripted stand-in for OpenAI's Codex `app-server`.
//!
//! It speaks the same newline-delimited JSON-RPC 2.0 over stdin/stdout as the real binary (see
//! `codex-app-server.md`): `"jsonrpc"` omitted on output and tolerated on input, `emittedAtMs` on
//! notifications, server->client request ids counting 0, 1, 2... per connection. The e2e tests
//! and the bundled demo config spawn it in place of `codex app-server`; it is not shipped in the
//! Docker image. Client requests handled: `initialize`, `thread/start`, `turn/start` (steers
//! when a turn is already active), `turn/interrupt`; anything else gets -32600.
//!
//! Module map: `protocol` (stdout writer, output helpers, line classification), `requests`
//! (client request handlers), `state` (per-connection state), `turn` (a running turn's
//! emissions), `tools` (dynamic tool calls), `scenarios` (the scripts, documented there),
//! `spy` (the spy file, documented there), `util` (small helpers).
//!
//! It deliberately shares no code with the library's own JSON-RPC client: a fake should not
//! reuse the parser it tests.

mod protocol;
mod requests;
mod scenarios;
mod spy;
mod state;
mod tools;
mod turn;
mod util;

use parking_lot::Mutex;
use std::sync::Arc;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

use crate::protocol::{handle_line, writer, Ctx, Out};
use crate::spy::spy;
use crate::state::State;

#[tokio::main]
async fn main() {
    spy::init();
    let pid = std::process::id();
    spy(json!({"event": "started", "pid": pid}));

    let (tx, rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(writer(rx));
    let ctx = Ctx {
        state: Arc::new(Mutex::new(State::default())),
        out: tx,
    };
    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match stdin.read_until(b'\n', &mut buf).await {
            Ok(0) => break,
            Ok(_) => handle_line(&ctx, &String::from_utf8_lossy(&buf)),
            Err(e) => {
                eprintln!("demo-backend: stdin read failed: {e}");
                break;
            }
        }
    }
    spy(json!({"event": "exit", "pid": pid}));
    let _ = ctx.out.send(Out::Exit(0));
    let _ = writer.await;
}
