//! Plain-path benchmark for the `openai` backend kind (not a test):
//! `cargo bench --bench upstream`.
//!
//! An in-repo zero-delay mock upstream (canned JSON, and canned SSE for `stream:true`) runs in
//! this process; the gateway (release binary) runs as its own process in front of it. A fixed
//! rate of requests is sent, open loop (each request is timed from its scheduled start, so a
//! stall is not hidden), first directly to the mock and then through the gateway, alternating
//! rounds, and p50/p90/p99, throughput, the gateway's CPU per request (from /proc) and the
//! gateway/direct ratios are printed.
//!
//! Environment: `BENCH_RATE` (req/s, default 2000), `BENCH_SECONDS` (per round, default 5),
//! `BENCH_ROUNDS` (default 2), `BENCH_STREAM=1` to measure the streaming relay instead.
//! `BENCH_TRACE=dead` adds a third gateway in each round, tracing every request (sampled
//! 100%) to a collector that is down (a port where nothing listens), and prints its ratio to
//! the gateway without traces: a dead collector must not slow requests.

// Tests and benchmarks: unwrap is the assertion, and wall-clock time is what they measure.
#![allow(clippy::unwrap_used, clippy::disallowed_types)]

use std::sync::Arc;

#[path = "common.rs"]
mod common;

use common::{cpu_ticks, report};

use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::json;

const KEY: &str = "sk-bench";

const JSON_BODY: &str = r#"{"id":"chatcmpl-mock","object":"chat.completion","created":1,"model":"mock","choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the mock upstream."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}}"#;

fn sse_body() -> String {
    let chunk = |delta: &str, finish: &str| {
        format!("data: {{\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"mock\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n")
    };
    let mut s = chunk(r#"{"role":"assistant","content":""}"#, "null");
    for w in ["Hello ", "from ", "the ", "mock."] {
        s.push_str(&chunk(&format!("{{\"content\":\"{w}\"}}"), "null"));
    }
    s.push_str(&chunk("{}", "\"stop\""));
    s.push_str("data: [DONE]\n\n");
    s
}

async fn mock(body: axum::body::Bytes) -> axum::response::Response {
    let stream = memchr_stream(&body);
    if stream {
        ([("content-type", "text/event-stream")], sse_body()).into_response()
    } else {
        ([("content-type", "application/json")], JSON_BODY).into_response()
    }
}

/// Cheap check for `"stream":true` without parsing (the mock must cost nothing).
fn memchr_stream(body: &[u8]) -> bool {
    body.windows(13).any(|w| w == b"\"stream\":true")
}

fn gateway(upstream: &str, more: &str) -> common::Gateway {
    common::Gateway::start(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[store]\npath = \"b.db\"\n\
         [[clients]]\nid = \"bench\"\nkey_sha256 = \"{}\"\n\
         [[models]]\nid = \"mock\"\nbackend = \"mock\"\n\
         [backends.mock]\nkind = \"openai\"\nbase_url = \"{upstream}\"\nmax_idle_connections = 256\n{more}",
        turnstile::auth::hash_key(KEY)
    ))
}

/// `[telemetry]` towards a collector that is down: a loopback port nothing listens on.
fn dead_collector() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    format!("[telemetry]\notlp_endpoint = \"http://127.0.0.1:{port}\"\n")
}

/// One fixed-rate round of plain chat requests against `url`.
async fn load(url: &str, rate: u64, secs: u64, stream: bool) -> common::Round {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(512)
        .tcp_nodelay(true)
        .build()
        .expect("client");
    let body = Arc::new(
        serde_json::to_vec(&json!({"model": "mock", "stream": stream,
            "messages": [{"role": "user", "content": "Say hello."}]}))
        .expect("body"),
    );
    let url = format!("{url}/chat/completions");
    common::drive(rate, secs, |_| {
        let (client, body, url) = (client.clone(), body.clone(), url.clone());
        async move {
            match client
                .post(url)
                .bearer_auth(KEY)
                .header("content-type", "application/json")
                .body(body.as_ref().clone())
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
                _ => false,
            }
        }
    })
    .await
}

fn main() {
    let rate: u64 = std::env::var("BENCH_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let secs: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let rounds: u64 = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let stream = std::env::var("BENCH_STREAM").is_ok_and(|v| v == "1");
    let dead = std::env::var("BENCH_TRACE").is_ok_and(|v| v == "dead");

    // The mock gets its own single-threaded runtime on its own thread.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(l.local_addr().expect("addr")).expect("send");
            let app = axum::Router::new().route("/v1/chat/completions", post(mock));
            let l = axum::serve::ListenerExt::tap_io(l, |t| {
                let _ = t.set_nodelay(true);
            });
            axum::serve(l, app).await.expect("serve");
        });
    });
    let upstream = format!("http://{}/v1", rx.recv().expect("mock addr"));
    let gw = gateway(&upstream, "");
    let gw_url = format!("{}/v1", gw.url);
    let traced = dead.then(|| gateway(&upstream, &dead_collector()));
    let traced_url = traced.as_ref().map(|g| format!("{}/v1", g.url));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("rt");

    println!(
        "{} req/s for {secs} s per round, {rounds} rounds, stream={stream}",
        rate
    );
    rt.block_on(async {
        // Warm both paths (connection pools, allocator).
        load(&upstream, 200, 1, stream).await;
        load(&gw_url, 200, 1, stream).await;
        if let Some(url) = &traced_url {
            load(url, 200, 1, stream).await;
        }
        let (mut direct, mut via, mut via_dead) = (Vec::new(), Vec::new(), Vec::new());
        let mut cpu_us_per_req = Vec::new();
        for _ in 0..rounds {
            let mut d = load(&upstream, rate, secs, stream).await;
            direct.push(report("direct", &mut d));
            let before = cpu_ticks(gw.child.id());
            let mut g = load(&gw_url, rate, secs, stream).await;
            let ticks = cpu_ticks(gw.child.id()) - before;
            // USER_HZ is 100 on Linux.
            let us = ticks as f64 * 10_000.0 / g.lat_ms.len().max(1) as f64;
            cpu_us_per_req.push(us);
            via.push(report("gateway", &mut g));
            println!("          gateway CPU {us:.0} µs/request");
            if let Some(url) = &traced_url {
                let mut t = load(url, rate, secs, stream).await;
                via_dead.push(report("dead-otlp", &mut t));
            }
        }
        let avg = |v: &[(f64, f64, f64)], f: fn(&(f64, f64, f64)) -> f64| v.iter().map(f).sum::<f64>() / v.len() as f64;
        let (d50, g50) = (avg(&direct, |x| x.0), avg(&via, |x| x.0));
        let (d99, g99) = (avg(&direct, |x| x.2), avg(&via, |x| x.2));
        println!(
            "\nratio gateway/direct: p50 {:.2}x ({:+.3} ms), p99 {:.2}x ({:+.3} ms); gateway CPU {:.0} µs/request",
            g50 / d50,
            g50 - d50,
            g99 / d99,
            g99 - d99,
            cpu_us_per_req.iter().sum::<f64>() / cpu_us_per_req.len() as f64
        );
        if !via_dead.is_empty() {
            let (t50, t99) = (avg(&via_dead, |x| x.0), avg(&via_dead, |x| x.2));
            println!(
                "ratio traced to a dead collector/untraced gateway: p50 {:.2}x ({:+.3} ms), p99 {:.2}x ({:+.3} ms)",
                t50 / g50,
                t50 - g50,
                t99 / g99,
                t99 - g99
            );
        }
    });
}
