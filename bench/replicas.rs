//! Replica load benchmark (not a test): `bench/replicas.sh` starts PostgreSQL and runs it.
//!
//! Replicas of the gateway (release build, the demo backend holding each turn) share one
//! PostgreSQL. Closed-loop clients first start fresh turns round the replicas, each held on a
//! client tool call, then answer them all: every third continuation at a replica that does
//! not hold the turn, which forwards it to the owner. Run on one replica (the baseline: every
//! continuation direct) and on three. Reports fresh turns/s, continuations/s, continuation
//! p50/p99 direct and forwarded, the CPU the replicas, PostgreSQL and the whole machine spent,
//! and, one at a time, each kind's p50 and store round trips per continuation (from
//! `turnstile_store_round_trips_total`).
//!
//! Environment: `BENCH_PG_URL` (`postgres://user@host:port`, no database), `BENCH_PG_PASSWORD`,
//! `BENCH_CLUSTER_KEY`, `BENCH_CLIENTS` (16), `BENCH_TURNS` (3000), `BENCH_REPLICAS` (3),
//! `BENCH_POOL_SIZE` (`[store] pool_size`; unset: the default), `BENCH_GATEWAY` (another build
//! of the gateway to measure).

// Tests and benchmarks: unwrap is the assertion, and wall-clock time is what they measure.
#![allow(clippy::unwrap_used, clippy::disallowed_types)]

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};

#[path = "common.rs"]
mod common;

use common::{post, tools, KEY};
/// Held calls answered in the round-trip probe.
const PROBE: u64 = 100;

fn start_replica(id: &str, db: &str) -> common::Gateway {
    let pool =
        std::env::var("BENCH_POOL_SIZE").map_or(String::new(), |n| format!("pool_size = {n}\n"));
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\
         [store]\nurl = \"{db}\"\npassword_env = \"BENCH_PG_PASSWORD\"\n{pool}\
         [cluster]\nreplica_id = \"{id}\"\ninternal_listen = \"127.0.0.1:0\"\nkey_env = \"BENCH_CLUSTER_KEY\"\n\
         [[clients]]\nid = \"bench\"\nkey_sha256 = \"{}\"\n\
         [[models]]\nid = \"tool\"\nbackend = \"demo\"\nbackend_model = \"tool\"\n\
         [backends.demo]\nkind = \"app-server\"\ncommand = [\"{}\"]\nmax_sessions = 8192\nprocesses = 1\n\
         [continuations]\nmax_pending = 100000\nmax_pending_per_client = 100000\ntombstones_per_client = 100000\n",
        turnstile::auth::hash_key(KEY),
        env!("CARGO_BIN_EXE_turnstile-demo-backend"),
    );
    let bin = std::env::var("BENCH_GATEWAY")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_turnstile").to_string());
    common::Gateway::start_with(&bin, &config)
}

/// A fresh database on the server; its URL.
async fn database(server: &str, password: &str, name: &str) -> String {
    let mut config: tokio_postgres::Config = format!("{server}/postgres").parse().expect("url");
    config.password(password);
    let (client, conn) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    for sql in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        client.batch_execute(&sql).await.expect("create database");
    }
    format!("{server}/{name}")
}

/// A fresh turn held on a tool call; the continuation that answers it.
async fn hold(client: &reqwest::Client, url: &str, i: u64) -> Option<Value> {
    let mut req = json!({"model": "tool", "messages": [{"role": "user", "content": format!("read /tmp/f{i}")}], "tools": tools()});
    let resp = post(client, url, &req).await?;
    let calls = resp["choices"][0]["message"]["tool_calls"].clone();
    let id = calls[0]["id"].clone();
    let messages = req["messages"].as_array_mut().expect("messages");
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
    messages.push(json!({"role": "tool", "tool_call_id": id, "content": "contents"}));
    Some(req)
}

async fn answer(client: &reqwest::Client, url: &str, next: &Value) -> bool {
    post(client, url, next)
        .await
        .is_some_and(|v| v["choices"][0]["finish_reason"] == "stop")
}

async fn round_trips(client: &reqwest::Client, replicas: &[common::Gateway]) -> u64 {
    let mut total = 0;
    for r in replicas {
        let text = client
            .get(format!("{}/metrics", r.url))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        total += text
            .lines()
            .find_map(|l| l.strip_prefix("turnstile_store_round_trips_total "))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

/// `PROBE` turns held on replica 0, answered one by one at replica `at` with nothing else
/// running: the store round trips per continuation, and its p50 (ms) unloaded.
async fn probe(client: &reqwest::Client, replicas: &[common::Gateway], at: usize) -> (f64, f64) {
    let mut held = Vec::new();
    for i in 0..PROBE {
        held.push(hold(client, &replicas[0].url, i).await.expect("held"));
    }
    let before = round_trips(client, replicas).await;
    let mut ms = Vec::new();
    for next in &held {
        let t = Instant::now();
        assert!(
            answer(client, &replicas[at].url, next).await,
            "probe answer"
        );
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let trips = (round_trips(client, replicas).await - before) as f64 / PROBE as f64;
    (trips, common::percentile(&mut ms, 0.5))
}

/// CPU ticks (1/100 s) of every `postgres` process, and of the whole machine (busy, total).
fn postgres_ticks() -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir("/proc").expect("proc").flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.contains("(postgres)") {
            total += common::cpu_ticks(pid);
        }
    }
    total
}

fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("stat");
    let cpu: Vec<u64> = stat
        .lines()
        .next()
        .expect("cpu line")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let idle = cpu.get(3).copied().unwrap_or(0) + cpu.get(4).copied().unwrap_or(0);
    let total: u64 = cpu.iter().take(8).sum();
    (total - idle, total)
}

/// CPU ticks so far: the replicas', PostgreSQL's, and the machine's (busy, total).
struct Cpu {
    replicas: u64,
    postgres: u64,
    machine: (u64, u64),
}

impl Cpu {
    fn now(pids: &[u32]) -> Cpu {
        Cpu {
            replicas: pids.iter().map(|p| common::cpu_ticks(*p)).sum(),
            postgres: postgres_ticks(),
            machine: machine_ticks(),
        }
    }

    /// What was spent since, per operation.
    fn per(&self, pids: &[u32], ops: usize, secs: f64) -> String {
        let now = Cpu::now(pids);
        let replicas = (now.replicas - self.replicas) as f64 / 100.0;
        let postgres = (now.postgres - self.postgres) as f64 / 100.0;
        let busy = (now.machine.0 - self.machine.0) as f64
            / (now.machine.1 - self.machine.1).max(1) as f64;
        format!(
            "replicas {:.0} µs ({:.2} cores), PostgreSQL {:.0} µs ({:.2} cores), machine {:.0}% busy",
            replicas * 1e6 / ops as f64,
            replicas / secs,
            postgres * 1e6 / ops as f64,
            postgres / secs,
            busy * 100.0
        )
    }
}

struct Outcome {
    turns_per_s: f64,
    continuations_per_s: f64,
    direct_p50: f64,
    forwarded_p50: f64,
    /// Continuation p50 one at a time: direct, forwarded.
    unloaded: (f64, f64),
}

async fn scenario(n: usize, server: &str, password: &str, clients: usize, turns: usize) -> Outcome {
    let db = database(server, password, &format!("bench_replicas_{n}")).await;
    let replicas: Vec<common::Gateway> = (0..n)
        .map(|i| start_replica(&format!("r{i}"), &db))
        .collect();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .expect("client");
    let urls: Arc<Vec<String>> = Arc::new(replicas.iter().map(|r| r.url.clone()).collect());
    // Warm-up: every replica's connections and statements.
    for i in 0..20 {
        let next = hold(&client, &urls[i % n], i as u64)
            .await
            .expect("warm-up");
        assert!(answer(&client, &urls[(i + 1) % n], &next).await, "warm-up");
    }
    let pids: Vec<u32> = replicas.iter().map(|r| r.child.id()).collect();

    // Fresh turns, round the replicas, each held on its tool call.
    let cpu = Cpu::now(&pids);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (client, urls) = (client.clone(), urls.clone());
        tasks.spawn(async move {
            let mut held = Vec::new();
            for i in (c..turns).step_by(clients) {
                let owner = i % urls.len();
                let next = hold(&client, &urls[owner], i as u64).await.expect("held");
                held.push((i, owner, next));
            }
            held
        });
    }
    let mut held = Vec::with_capacity(turns);
    while let Some(h) = tasks.join_next().await {
        held.extend(h.expect("join"));
    }
    let elapsed = start.elapsed().as_secs_f64();
    let turns_per_s = turns as f64 / elapsed;
    println!("{n} replica(s), {clients} clients: {turns_per_s:.0} fresh turns/s ({turns} held on a tool call)");
    println!("  CPU per turn: {}", cpu.per(&pids, turns, elapsed));

    // Their continuations: every third at a replica that does not hold the turn.
    held.sort_by_key(|h| h.0);
    let held = Arc::new(held);
    let cpu = Cpu::now(&pids);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (client, urls, held) = (client.clone(), urls.clone(), held.clone());
        tasks.spawn(async move {
            let (mut direct, mut forwarded, mut errors) = (Vec::new(), Vec::new(), 0);
            for (i, owner, next) in held.iter().skip(c).step_by(clients) {
                let away = urls.len() > 1 && i % 3 == 2;
                let at = if away {
                    (owner + 1) % urls.len()
                } else {
                    *owner
                };
                let t = Instant::now();
                if !answer(&client, &urls[at], next).await {
                    errors += 1;
                    continue;
                }
                let ms = t.elapsed().as_secs_f64() * 1e3;
                if away {
                    forwarded.push(ms)
                } else {
                    direct.push(ms)
                }
            }
            (direct, forwarded, errors)
        });
    }
    let (mut direct, mut forwarded, mut errors) = (Vec::new(), Vec::new(), 0);
    while let Some(r) = tasks.join_next().await {
        let (d, f, e) = r.expect("join");
        direct.extend(d);
        forwarded.extend(f);
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let continuations_per_s = (direct.len() + forwarded.len()) as f64 / elapsed;
    println!("  {continuations_per_s:.0} continuations/s, errors {errors}");
    let show = |label: &str, v: &mut Vec<f64>| {
        if v.is_empty() {
            return f64::NAN;
        }
        let (p50, p99) = (common::percentile(v, 0.5), common::percentile(v, 0.99));
        println!(
            "  continuation {label:>9}: p50 {p50:7.3} ms  p99 {p99:7.3} ms  ({} of them)",
            v.len()
        );
        p50
    };
    let direct_p50 = show("direct", &mut direct);
    let forwarded_p50 = show("forwarded", &mut forwarded);
    println!("  CPU per continuation: {}", cpu.per(&pids, turns, elapsed));
    let (trips, p50) = probe(&client, &replicas, 0).await;
    println!(
        "  one at a time: direct p50 {p50:.3} ms, {trips:.2} store round trips per continuation"
    );
    let mut unloaded = (p50, f64::NAN);
    if n > 1 {
        let (trips, p50) = probe(&client, &replicas, 1).await;
        println!("  one at a time: forwarded p50 {p50:.3} ms, {trips:.2} store round trips per continuation");
        unloaded.1 = p50;
    }
    Outcome {
        turns_per_s,
        continuations_per_s,
        direct_p50,
        forwarded_p50,
        unloaded,
    }
}

fn main() {
    let env = |k: &str| {
        std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: run bench/replicas.sh"))
    };
    let num = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (server, password) = (env("BENCH_PG_URL"), env("BENCH_PG_PASSWORD"));
    env("BENCH_CLUSTER_KEY");
    let (clients, turns, n) = (
        num("BENCH_CLIENTS", 16) as usize,
        num("BENCH_TURNS", 3000) as usize,
        num("BENCH_REPLICAS", 3) as usize,
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        let one = scenario(1, &server, &password, clients, turns).await;
        let many = scenario(n, &server, &password, clients, turns).await;
        println!(
            "\n{n} replicas / 1 replica: fresh turns/s {:.2}, continuations/s {:.2} (target >= 0.9)",
            many.turns_per_s / one.turns_per_s,
            many.continuations_per_s / one.continuations_per_s
        );
        println!(
            "forwarding adds {:.3} ms p50 one at a time (target <= 1 ms), {:.3} ms under the load; 1 replica's direct p50 {:.3} ms under the load",
            many.unloaded.1 - many.unloaded.0,
            many.forwarded_p50 - many.direct_p50,
            one.direct_p50
        );
    });
}
