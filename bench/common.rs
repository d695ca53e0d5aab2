//! Shared pieces of the load benchmarks: an open-loop fixed-rate driver, percentiles,
//! reports and the gateway process's CPU time.

#![allow(dead_code)]

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The benchmarks' client key.
pub const KEY: &str = "sk-bench";

/// One client function tool: what a held turn calls.
pub fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "read_file", "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}])
}

/// A chat completion through the gateway: its JSON, or None for a failure.
pub async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Option<Value> {
    let r = client
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(body)
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

/// The gateway's release binary, running on port 0 with a config written into its own
/// temporary folder; stopped with SIGTERM when dropped.
pub struct Gateway {
    pub child: Child,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Gateway {
    /// `BENCH_GATEWAY` names another build to run instead (a before-and-after comparison).
    pub fn start(config: &str) -> Gateway {
        let bin = std::env::var("BENCH_GATEWAY")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_turnstile").to_string());
        Gateway::start_with(&bin, config)
    }

    /// The gateway binary at `bin` (another build, for a before-and-after comparison).
    pub fn start_with(bin: &str, config: &str) -> Gateway {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("bench.toml"), config).expect("config");
        let mut child = Command::new(bin)
            .args(["serve", "--config"])
            .arg(dir.path().join("bench.toml"))
            .env("TURNSTILE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("gateway");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("line");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .expect("announce")
            .to_string();
        Gateway {
            child,
            url,
            _dir: dir,
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the command name.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

pub struct Round {
    pub lat_ms: Vec<f64>,
    pub errors: usize,
    pub elapsed: Duration,
}

/// Open-loop fixed-rate load: operation i is scheduled at start + i/rate and timed from its
/// scheduled start, so a stall in the system under test is not hidden (no coordinated
/// omission). `op(i)` returns whether the operation succeeded.
pub async fn drive<F, Fut>(rate: u64, secs: u64, op: F) -> Round
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = bool> + Send + 'static,
{
    let total = rate * secs;
    let start = Instant::now() + Duration::from_millis(50);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let at = start + Duration::from_nanos(i * 1_000_000_000 / rate);
        tokio::time::sleep_until(at.into()).await;
        let fut = op(i);
        tasks.spawn(async move {
            let ok = fut.await;
            (at.elapsed().as_secs_f64() * 1e3, ok)
        });
    }
    let mut round = Round {
        lat_ms: Vec::new(),
        errors: 0,
        elapsed: Duration::ZERO,
    };
    while let Some(r) = tasks.join_next().await {
        let (ms, ok) = r.expect("join");
        if ok {
            round.lat_ms.push(ms);
        } else {
            round.errors += 1;
        }
    }
    round.elapsed = start.elapsed();
    round
}

pub fn report(label: &str, r: &mut Round) -> (f64, f64, f64) {
    let n = r.lat_ms.len();
    if n == 0 {
        println!("{label:>8}  no successful requests ({} errors)", r.errors);
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let (p50, p90, p99) = (
        percentile(&mut r.lat_ms, 0.5),
        percentile(&mut r.lat_ms, 0.9),
        percentile(&mut r.lat_ms, 0.99),
    );
    println!(
        "{label:>8}  p50 {p50:7.3} ms  p90 {p90:7.3} ms  p99 {p99:7.3} ms  {:8.0} req/s  errors {}",
        n as f64 / r.elapsed.as_secs_f64(),
        r.errors
    );
    (p50, p90, p99)
}
