//! Resume-path benchmark (not a test): `cargo bench --bench resume`.
//!
//! 1. Latency from posting the tool results (chat `role:"tool"`, Responses
//!    `function_call_output`, Messages `tool_result`) to the first byte of the continued
//!    turn, through the gateway, for conversations of 1 KB, 100 KB and 1 MB, against the demo
//!    backend's own answer time measured directly over stdio JSON-RPC in the same run
//!    (tool answer written -> first `item/agentMessage/delta` read).
//!    The floor beside them: the same two process hops (HTTP in, stdio to the same demo
//!    backend) through a bare bridge that does none of the gateway's work
//!    (`bench/resume_floor.rs`); "over floor" is what the gateway's own work adds.
//! 2. Gateway memory per suspended execution with 10,000 held (RSS of a fresh gateway process
//!    before and after, divided by the count; the demo backend's own state is in its own
//!    processes), and per tombstone (10,000 turns held and answered 64 at a time on a
//!    gateway of their own); the median of several runs.
//!
//! Environment: `BENCH_ITERS` (default 40), `BENCH_HELD` (default 10000),
//! `BENCH_MEMORY_RUNS` (default 3).

// Tests and benchmarks: unwrap is the assertion, and wall-clock time is what they measure.
#![allow(clippy::unwrap_used, clippy::disallowed_types)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[path = "common.rs"]
mod common;
#[path = "resume_floor.rs"]
mod floor;

use common::{tools, KEY};

/// The demo backend driven directly: one thread, one turn, one tool call per sample.
fn direct_samples(size: usize, iters: usize) -> Vec<f64> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_turnstile-demo-backend"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("demo backend");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut send = |v: Value| {
        writeln!(stdin, "{v}").expect("write");
        stdin.flush().expect("flush");
    };
    let mut read_until = |pred: &dyn Fn(&Value) -> bool| -> Value {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                out.read_line(&mut line).expect("read") > 0,
                "demo backend exited"
            );
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if pred(&v) {
                    return v;
                }
            }
        }
    };
    send(
        json!({"id": 1, "method": "initialize", "params": {"clientInfo": {"name": "bench", "version": "0"}, "capabilities": {"experimentalApi": true}}}),
    );
    read_until(&|v| v["id"] == 1);
    send(json!({"method": "initialized"}));
    let text = "x".repeat(size);
    let mut samples = Vec::new();
    for i in 0..iters {
        let id = 10 + i as i64 * 3;
        send(
            json!({"id": id, "method": "thread/start", "params": {"ephemeral": true, "model": "tool",
            "dynamicTools": [{"type": "function", "name": "read_file", "description": "Read a file",
                              "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]}}),
        );
        let thread = read_until(&|v| v["id"] == id)["result"]["thread"]["id"].clone();
        send(
            json!({"id": id + 1, "method": "turn/start", "params": {"threadId": thread,
            "input": [{"type": "text", "text": format!("{text} /tmp/f")}]}}),
        );
        let call = read_until(&|v| v["method"] == "item/tool/call");
        let started = Instant::now();
        send(
            json!({"id": call["id"], "result": {"success": true, "contentItems": [{"type": "inputText", "text": "R"}]}}),
        );
        read_until(&|v| v["method"] == "item/agentMessage/delta");
        samples.push(started.elapsed().as_secs_f64() * 1e3);
        read_until(&|v| v["method"] == "turn/completed");
    }
    drop(stdin);
    let _ = child.wait();
    samples
}

fn gateway(max: usize) -> common::Gateway {
    common::Gateway::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
max_body_bytes = 16777216
[store]
path = "bench.db"
[[clients]]
id = "bench"
key_sha256 = "{}"
[[models]]
id = "tool"
backend = "demo"
backend_model = "tool"
[backends.demo]
kind = "app-server"
command = ["{}"]
max_sessions = {max}
processes = 2
[continuations]
max_pending = {max}
max_pending_per_client = {max}
tombstones_per_client = {max}
max_tool_result_bytes = 16777216
"#,
        turnstile::auth::hash_key(KEY),
        env!("CARGO_BIN_EXE_turnstile-demo-backend"),
    ))
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

async fn suspend(http: &reqwest::Client, url: &str, prompt: &str) -> (Value, Value) {
    let req = json!({"model": "tool", "messages": [{"role": "user", "content": prompt}], "tools": tools()});
    let resp: Value = http
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&req)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(resp["choices"][0]["finish_reason"], "tool_calls", "{resp}");
    (req, resp)
}

/// The API surfaces a harness reaches the gateway by.
#[derive(Clone, Copy)]
enum Surface {
    Chat,
    Responses,
    Messages,
}

impl Surface {
    fn name(self) -> &'static str {
        match self {
            Surface::Chat => "chat",
            Surface::Responses => "responses",
            Surface::Messages => "messages",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Surface::Chat => "/v1/chat/completions",
            Surface::Responses => "/v1/responses",
            Surface::Messages => "/v1/messages",
        }
    }

    /// A fresh request whose turn calls `read_file` once.
    fn fresh(self, prompt: &str) -> Value {
        let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]});
        match self {
            Surface::Chat => {
                json!({"model": "tool", "messages": [{"role": "user", "content": prompt}], "tools": tools()})
            }
            Surface::Responses => {
                json!({"model": "tool", "input": [{"role": "user", "content": prompt}],
                "tools": [{"type": "function", "name": "read_file", "description": "Read a file", "parameters": schema}]})
            }
            Surface::Messages => json!({"model": "tool", "max_tokens": 256,
                "messages": [{"role": "user", "content": prompt}],
                "tools": [{"name": "read_file", "description": "Read a file", "input_schema": schema}]}),
        }
    }

    /// The continuation of `req` answering the one call of `resp` with "R", streamed.
    fn continuation(self, mut req: Value, resp: &Value) -> Value {
        match self {
            Surface::Chat => {
                let msg = &resp["choices"][0]["message"];
                let id = msg["tool_calls"][0]["id"].clone();
                let messages = req["messages"].as_array_mut().expect("messages");
                messages.push(
                    json!({"role": "assistant", "content": null, "tool_calls": msg["tool_calls"]}),
                );
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": "R"}));
            }
            Surface::Responses => {
                let output = resp["output"].as_array().expect("output");
                let call = output
                    .iter()
                    .find(|i| i["type"] == "function_call")
                    .expect("a function call");
                let input = req["input"].as_array_mut().expect("input");
                input.extend(output.iter().cloned());
                input.push(json!({"type": "function_call_output", "call_id": call["call_id"], "output": "R"}));
            }
            Surface::Messages => {
                let content = resp["content"].clone();
                let id = content
                    .as_array()
                    .and_then(|c| c.iter().find(|b| b["type"] == "tool_use"))
                    .expect("a tool_use block")["id"]
                    .clone();
                let messages = req["messages"].as_array_mut().expect("messages");
                messages.push(json!({"role": "assistant", "content": content}));
                messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "R"}]}));
            }
        }
        req["stream"] = json!(true);
        req
    }
}

async fn post_surface(http: &reqwest::Client, url: &str, surface: Surface, body: &Value) -> Value {
    http.post(format!("{url}{}", surface.path()))
        .bearer_auth(KEY)
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json")
}

async fn gateway_samples(
    gw: &common::Gateway,
    surface: Surface,
    size: usize,
    iters: usize,
) -> Vec<f64> {
    let http = reqwest::Client::new();
    let text = "x".repeat(size);
    let mut samples = Vec::new();
    for _ in 0..iters {
        let req = surface.fresh(&format!("{text} /tmp/f"));
        let resp = post_surface(&http, &gw.url, surface, &req).await;
        let body = serde_json::to_vec(&surface.continuation(req, &resp)).expect("body");
        let post = http
            .post(format!("{}{}", gw.url, surface.path()))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01")
            .body(body);
        samples.push(floor::first_byte_ms(post).await);
    }
    samples
}

#[tokio::main]
async fn main() {
    if std::env::args().nth(1).as_deref() == Some("serve") {
        // This binary run as the floor's bridge (what `common::Gateway` starts).
        return floor::serve().await;
    }
    let iters: usize = std::env::var("BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let held: usize = std::env::var("BENCH_HELD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);

    println!(
        "resume path: POST role:tool -> first byte of the continued turn ({iters} samples each)"
    );
    println!(
        "{:>10} {:>8} {:>12} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "surface",
        "size",
        "direct p50",
        "floor p50",
        "gateway p50",
        "direct p99",
        "gateway p99",
        "p50 added",
        "over floor"
    );
    let gw = gateway(held + 1000);
    let bridge = (iters > 0).then(|| {
        let me = std::env::current_exe().expect("this binary");
        common::Gateway::start_with(me.to_str().expect("path"), "")
    });
    let sizes: &[(&str, usize)] = if iters == 0 {
        &[]
    } else {
        &[("1 KB", 1_000), ("100 KB", 100_000), ("1 MB", 1_000_000)]
    };
    for &(label, size) in sizes {
        let n = if size >= 1_000_000 {
            iters.min(20)
        } else {
            iters
        };
        // Direct, floor and gateway alternate per surface, so the baselines are of the same
        // minute; the floor's continuation is as large as the gateway's.
        let continuation =
            serde_json::to_vec(&Surface::Chat.fresh(&format!("{} /tmp/f", "x".repeat(size))))
                .expect("body");
        let bridge = bridge.as_ref().expect("the floor's bridge");
        for surface in [Surface::Chat, Surface::Responses, Surface::Messages] {
            let mut d = tokio::task::spawn_blocking(move || direct_samples(size, n))
                .await
                .expect("direct");
            let mut f = floor::samples(&bridge.url, size, &continuation, n).await;
            let mut g = gateway_samples(&gw, surface, size, n).await;
            let (d50, f50, g50) = (
                common::percentile(&mut d, 0.5),
                common::percentile(&mut f, 0.5),
                common::percentile(&mut g, 0.5),
            );
            let (d99, g99) = (
                common::percentile(&mut d, 0.99),
                common::percentile(&mut g, 0.99),
            );
            println!(
                "{:>10} {label:>8} {d50:>10.3}ms {f50:>10.3}ms {g50:>10.3}ms {d99:>10.3}ms {g99:>10.3}ms {:>8.3}ms {:>8.3}ms",
                surface.name(),
                g50 - d50,
                g50 - f50
            );
        }
    }

    drop(gw);
    // Each run on fresh gateways; their RSS moves by a few hundred bytes per execution from
    // run to run (what the allocator keeps of the requests' transient memory), so the median
    // of the runs is the figure.
    let runs: usize = std::env::var("BENCH_MEMORY_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    println!("\nmemory: {held} suspended executions held at once ({runs} runs)");
    let (mut held_bytes, mut tomb_bytes) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        held_bytes.push(per_suspended(held).await);
        tomb_bytes.push(per_tombstone(held).await);
    }
    println!(
        "median of {runs} runs: {:.0} bytes per suspended execution, {:.0} bytes per tombstone",
        common::percentile(&mut held_bytes, 0.5),
        common::percentile(&mut tomb_bytes, 0.5)
    );
}

/// Turns suspended before the first reading: allocator arenas and pools warmed, at the
/// measured phase's concurrency, so the client's connections (and the gateway's side of them)
/// are open before it, not charged to the executions.
const WARM: usize = 256;

/// Gateway RSS growth per suspended execution with `held` held at once.
async fn per_suspended(held: usize) -> f64 {
    let (before, after, took) = rss_growth(held, "held", |http, url, prompt| async move {
        suspend(&http, &url, &prompt).await;
    })
    .await;
    let per = (after.saturating_sub(before) as f64 * 1024.0) / held as f64;
    println!(
        "gateway RSS {before} KiB -> {after} KiB: {per:.0} bytes per suspended execution ({:.1} s to suspend them)",
        took.as_secs_f64()
    );
    per
}

/// Gateway RSS growth per tombstone: turns held and answered 64 at a time, so what stays is
/// the tombstones (the ring is sized to keep them all).
async fn per_tombstone(held: usize) -> f64 {
    let (before, after, _) = rss_growth(held, "settled", |http, url, prompt| async move {
        let (req, resp) = suspend(&http, &url, &prompt).await;
        answer(&http, &url, &with_result(&req, &resp)).await;
    })
    .await;
    let per = (after.saturating_sub(before) as f64 * 1024.0) / held as f64;
    println!(
        "{held} tombstones (turns held and answered 64 at a time): gateway RSS {before} KiB -> {after} KiB: {per:.0} bytes per tombstone"
    );
    per
}

/// A fresh gateway's RSS (KiB) after `WARM` turns of `turn` and after `held` more (and how
/// long those took), each turn given the client, the gateway's URL and its prompt.
async fn rss_growth<Fut>(
    held: usize,
    label: &str,
    turn: fn(reqwest::Client, String, String) -> Fut,
) -> (u64, u64, Duration)
where
    Fut: std::future::Future<Output = ()>,
{
    let gw = gateway(held + 1000);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .expect("client");
    let run = |label: &str| {
        let (http, url, label) = (&http, &gw.url, label.to_string());
        move |i: usize| turn(http.clone(), url.clone(), format!("{label} {i} /tmp/f"))
    };
    at_once(0..WARM, run("warm")).await;
    let before = rss_kib(gw.child.id());
    let started = Instant::now();
    at_once(0..held, run(label)).await;
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    (before, rss_kib(gw.child.id()), took)
}

/// Runs `one(i)` for every `i` of `range`, 64 at a time.
async fn at_once<F, Fut>(range: std::ops::Range<usize>, one: F)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let ids: Vec<usize> = range.collect();
    for batch in ids.chunks(64) {
        futures::future::join_all(batch.iter().map(|&i| one(i))).await;
    }
}

async fn answer(http: &reqwest::Client, url: &str, next: &Value) {
    let r = http
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(next)
        .send()
        .await
        .expect("send");
    assert!(r.status().is_success(), "answer: {}", r.status());
    let _ = r.bytes().await;
}

/// The continuation answering the one call of a suspended chat turn.
fn with_result(req: &Value, resp: &Value) -> Value {
    let calls = resp["choices"][0]["message"]["tool_calls"].clone();
    let mut next = req.clone();
    let messages = next["messages"].as_array_mut().expect("messages");
    messages.push(json!({"role": "tool", "tool_call_id": calls[0]["id"], "content": "ok"}));
    messages.insert(
        messages.len() - 1,
        json!({"role": "assistant", "content": null, "tool_calls": calls}),
    );
    next
}
