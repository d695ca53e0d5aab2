//! The resume path's floor: the same two process hops as through the gateway, without the
//! gateway's work. This benchmark's own binary, run as `resume serve` (what
//! [`common::Gateway`] runs), is a bare HTTP-to-stdio bridge in front of one demo backend:
//! `POST /suspend` (`{"size": n}`) starts a turn whose prompt is `n` bytes and waits for its
//! tool call; `POST /answer` reads the whole body (the client's continuation, its bytes
//! unread), writes the tool answer to the backend and streams back from its first
//! `item/agentMessage/delta`. No authentication, parsing, store, suspension record or
//! journal: what is left is the HTTP hop, the pipes and the wake-ups between them.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;

/// The backend's pipes, one request at a time.
struct Backend {
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: i64,
    call: Value,
}

impl Backend {
    async fn send(&mut self, v: Value) {
        let mut line = v.to_string().into_bytes();
        line.push(b'\n');
        self.stdin.write_all(&line).await.expect("write");
        self.stdin.flush().await.expect("flush");
    }

    /// The next line whose JSON `pred` accepts.
    async fn until(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        loop {
            let line = self.lines.next_line().await.expect("read");
            let line = line.expect("demo backend exited");
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if pred(&v) {
                    return v;
                }
            }
        }
    }
}

type Shared = Arc<Mutex<Backend>>;

/// Runs the bridge (this process's whole life): announces `listening on URL` on stdout.
pub async fn serve() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_turnstile-demo-backend"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("demo backend");
    let mut b = Backend {
        stdin: child.stdin.take().expect("stdin"),
        lines: BufReader::new(child.stdout.take().expect("stdout")).lines(),
        next_id: 10,
        call: Value::Null,
    };
    b.send(json!({"id": 1, "method": "initialize", "params": {"clientInfo": {"name": "bench", "version": "0"}, "capabilities": {"experimentalApi": true}}}))
        .await;
    b.until(|v| v["id"] == 1).await;
    b.send(json!({"method": "initialized"})).await;
    let shared: Shared = Arc::new(Mutex::new(b));
    let app = Router::new()
        .route("/suspend", post(suspend))
        .route("/answer", post(answer))
        .with_state(shared);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    println!(
        "listening on http://{}",
        listener.local_addr().expect("addr")
    );
    axum::serve(listener, app).await.expect("serve");
    drop(child);
}

async fn suspend(State(b): State<Shared>, body: Bytes) -> &'static str {
    let size = serde_json::from_slice::<Value>(&body).expect("json")["size"]
        .as_u64()
        .expect("size") as usize;
    let mut b = b.lock().await;
    let id = b.next_id;
    b.next_id += 2;
    b.send(json!({"id": id, "method": "thread/start", "params": {"ephemeral": true, "model": "tool",
        "dynamicTools": [{"type": "function", "name": "read_file", "description": "Read a file",
                          "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}}]}}))
        .await;
    let thread = b.until(|v| v["id"] == id).await["result"]["thread"]["id"].clone();
    let text = format!("{} /tmp/f", "x".repeat(size));
    b.send(
        json!({"id": id + 1, "method": "turn/start", "params": {"threadId": thread,
        "input": [{"type": "text", "text": text}]}}),
    )
    .await;
    b.call = b.until(|v| v["method"] == "item/tool/call").await;
    "{}"
}

async fn answer(State(b): State<Shared>, _continuation: Bytes) -> Body {
    let mut b = b.lock_owned().await;
    let id = b.call["id"].clone();
    b.send(json!({"id": id, "result": {"success": true, "contentItems": [{"type": "inputText", "text": "R"}]}}))
        .await;
    let first = b.until(|v| v["method"] == "item/agentMessage/delta").await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let _ = tx.send(Ok(Bytes::from(format!("data: {first}\n\n")))).await;
    tokio::spawn(async move {
        b.until(|v| v["method"] == "turn/completed").await;
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    }))
}

/// Samples through the bridge at `url`: a turn of `size` suspended, then the continuation
/// (`body`, as large as the gateway's) posted and timed to its first byte.
pub async fn samples(url: &str, size: usize, body: &[u8], iters: usize) -> Vec<f64> {
    let http = reqwest::Client::new();
    let mut samples = Vec::new();
    for _ in 0..iters {
        let r = http
            .post(format!("{url}/suspend"))
            .json(&json!({ "size": size }))
            .send()
            .await
            .expect("suspend");
        assert_eq!(r.status(), 200);
        let post = http
            .post(format!("{url}/answer"))
            .header("content-type", "application/json")
            .body(Bytes::copy_from_slice(body));
        samples.push(first_byte_ms(post).await);
    }
    samples
}

/// Sends `post` (its body ready), and returns the milliseconds to the first byte of its 200
/// answer, read to its end.
pub async fn first_byte_ms(post: reqwest::RequestBuilder) -> f64 {
    let started = Instant::now();
    let mut r = post.send().await.expect("send");
    assert_eq!(r.status(), 200);
    let first = r.chunk().await.expect("chunk");
    let ms = started.elapsed().as_secs_f64() * 1e3;
    assert!(first.is_some());
    while r.chunk().await.expect("chunk").is_some() {}
    ms
}
