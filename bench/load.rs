//! Load benchmark against the demo backend (not a test): `cargo bench --bench load`.
//!
//! Fixed-rate, open-loop load through the gateway (release binary) on two paths: a plain
//! turn, and a tool round trip (a request that suspends on a client tool call, then its
//! continuation, timed together). Prints p50/p90/p99 and throughput per path, and the view of
//! the gateway's own overhead histogram (`turnstile_gateway_overhead_seconds` from /metrics).
//!
//! Environment: `BENCH_RATE` (plain req/s, default 500), `BENCH_TOOL_RATE` (round trips/s,
//! default 200), `BENCH_SECONDS` (default 5).

// Tests and benchmarks: unwrap is the assertion, and wall-clock time is what they measure.
#![allow(clippy::unwrap_used, clippy::disallowed_types)]

use serde_json::json;

#[path = "common.rs"]
mod common;

use common::{post, tools, KEY};

fn gateway() -> common::Gateway {
    common::Gateway::start(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[store]\npath = \"b.db\"\n\
         [[clients]]\nid = \"bench\"\nkey_sha256 = \"{}\"\n\
         [[models]]\nid = \"echo\"\nbackend = \"demo\"\nbackend_model = \"echo\"\n\
         [[models]]\nid = \"tool\"\nbackend = \"demo\"\nbackend_model = \"tool\"\n\
         [backends.demo]\nkind = \"app-server\"\ncommand = [\"{}\"]\nmax_sessions = 512\nprocesses = 2\n\
         [continuations]\nmax_pending = 100000\nmax_pending_per_client = 100000\ntombstones_per_client = 100000\n",
        turnstile::auth::hash_key(KEY),
        env!("CARGO_BIN_EXE_turnstile-demo-backend"),
    ))
}

async fn round_trip(client: reqwest::Client, url: String, i: u64) -> bool {
    let mut req = json!({"model": "tool", "messages": [{"role": "user", "content": format!("read /tmp/f{i}")}], "tools": tools()});
    let Some(resp) = post(&client, &url, &req).await else {
        return false;
    };
    let msg = &resp["choices"][0]["message"];
    let id = msg["tool_calls"][0]["id"].clone();
    let messages = req["messages"].as_array_mut().expect("messages");
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": msg["tool_calls"]}));
    messages.push(json!({"role": "tool", "tool_call_id": id, "content": "contents"}));
    post(&client, &url, &req)
        .await
        .is_some_and(|v| v["choices"][0]["finish_reason"] == "stop")
}

/// Estimated quantile from Prometheus histogram buckets (upper bound of the bucket).
fn histogram_view(metrics: &str, name: &str) -> String {
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(&format!("{name}_bucket{{le=\"")) else {
            continue;
        };
        let (le, count) = rest.split_once("\"} ").unwrap_or(("", "0"));
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(0.0)
        };
        buckets.push((le, count.parse().unwrap_or(0.0)));
    }
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    let q = |p: f64| {
        buckets
            .iter()
            .find(|b| b.1 >= p * total)
            .map(|b| b.0 * 1e3)
            .unwrap_or(f64::NAN)
    };
    format!(
        "{total} samples, p50 <= {:.3} ms, p99 <= {:.3} ms",
        q(0.5),
        q(0.99)
    )
}

fn main() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (rate, tool_rate, secs) = (
        env("BENCH_RATE", 500),
        env("BENCH_TOOL_RATE", 200),
        env("BENCH_SECONDS", 5),
    );
    let gw = gateway();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        let client = reqwest::Client::builder().pool_max_idle_per_host(512).tcp_nodelay(true).build().expect("client");
        let plain = json!({"model": "echo", "messages": [{"role": "user", "content": "hello"}]});
        // Warm-up.
        for i in 0..50 {
            post(&client, &gw.url, &plain).await;
            round_trip(client.clone(), gw.url.clone(), i).await;
        }
        println!("plain turn through the gateway, {rate} req/s for {secs} s");
        let before = common::cpu_ticks(gw.child.id());
        let mut r = common::drive(rate, secs, |_| {
            let (client, url, body) = (client.clone(), gw.url.clone(), plain.clone());
            async move { post(&client, &url, &body).await.is_some() }
        })
        .await;
        let cpu = (common::cpu_ticks(gw.child.id()) - before) as f64 * 10_000.0 / r.lat_ms.len().max(1) as f64;
        common::report("plain", &mut r);
        println!("          gateway CPU {cpu:.0} µs/request (the demo backend runs in its own processes)");

        println!("\ntool round trip (suspend + resume) through the gateway, {tool_rate}/s for {secs} s");
        let mut r = common::drive(tool_rate, secs, |i| round_trip(client.clone(), gw.url.clone(), i)).await;
        common::report("tool rt", &mut r);

        let metrics = client.get(format!("{}/metrics", gw.url)).send().await.expect("metrics").text().await.expect("text");
        println!("\ngateway overhead histogram (time before the backend is engaged): {}", histogram_view(&metrics, "turnstile_gateway_overhead_seconds"));
        println!("time to first byte histogram: {}", histogram_view(&metrics, "turnstile_time_to_first_byte_seconds"));
    });
}
