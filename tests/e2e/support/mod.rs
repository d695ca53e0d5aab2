//! E2e harness: spawns the real `turnstile` binary on port 0 with a generated config whose
//! backend is the real demo backend binary, reads its "listening on" line, and offers small
//! HTTP helpers. Every wait is bounded; nothing sleeps to synchronise.

pub mod agents;
pub mod fake_gemini;
pub mod fake_messages;
pub mod fake_responses;
pub mod fake_upstream;
pub mod gemini;
pub mod messages;
pub mod node;
pub mod phoenix;
pub mod postgres;
pub mod responses;
pub mod schema;
pub mod tls;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

pub const ALICE: &str = "sk-alice-test-key";
pub const BOB: &str = "sk-bob-test-key";
pub const CAROL: &str = "sk-carol-test-key";
/// The upstream key the gateway reads from `TURNSTILE_TEST_UPSTREAM_KEY` (a canary for logs).
pub const UPSTREAM_KEY: &str = "sk-upstream-canary-8812";
/// The replicas' shared key, and the variable the config names for it.
pub const CLUSTER_KEY: &str = "cluster-test-key-0123456789abcdef";
pub const CLUSTER_KEY_ENV: &str = "TURNSTILE_CLUSTER_KEY";
/// A client with the `approver` role.
pub const ROOT: &str = "sk-root-approver-key";

/// Scenario models served by the demo backend (model id = backend_model).
pub const SCENARIOS: &[&str] = &[
    "echo",
    "tool",
    "text_then_tool",
    "parallel",
    "rounds3",
    "metered",
    "hang",
    "slow",
    "reasoning",
    "crash",
    "fail",
    "garbage",
];

/// Models whose demo scenario asks for approval, with their policy.
pub const APPROVAL_MODELS: &[(&str, &str, &str)] = &[
    ("cmd-allow", "approval", r#"{ command = "allow" }"#),
    ("cmd-deny", "approval", r#"{ command = "deny" }"#),
    ("cmd-default", "approval", "{}"),
    ("cmd-ask", "approval", r#"{ command = "ask" }"#),
    ("file-ask", "file_approval", r#"{ file_change = "ask" }"#),
];

#[derive(Clone)]
pub struct Opts {
    pub max_sessions: usize,
    pub acquire_timeout_ms: u64,
    pub execution_ttl_seconds: u64,
    pub max_body_bytes: u64,
    pub keepalive_seconds: u64,
    pub max_tool_result_bytes: usize,
    pub max_rounds: u32,
    pub max_pending_per_client: usize,
    pub alice_models: &'static str,
    pub approval_ttl_seconds: u64,
    /// Run the gateway with `--log-format json`.
    pub log_json: bool,
    /// `backends.demo.recycle_after_threads`.
    pub recycle_after_threads: u64,
    /// The body of a `[continuity]` section (none when empty).
    pub continuity: &'static str,
    /// More lines of the `[server]` section.
    pub server: &'static str,
    /// More lines of the `[continuations]` section.
    pub continuations: &'static str,
    /// Keep the SQLite store even when the suite runs on PostgreSQL (the test inspects or
    /// locks the SQLite file itself).
    pub sqlite: bool,
    /// More environment variables of the gateway process.
    pub env: Vec<(String, String)>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            max_sessions: 16,
            acquire_timeout_ms: 500,
            execution_ttl_seconds: 60,
            max_body_bytes: 1 << 20,
            keepalive_seconds: 1,
            max_tool_result_bytes: 4096,
            max_rounds: 32,
            max_pending_per_client: 64,
            alice_models: r#"["*"]"#,
            approval_ttl_seconds: 60,
            log_json: false,
            recycle_after_threads: 1000,
            continuity: "",
            server: "",
            continuations: "",
            sqlite: false,
            env: Vec::new(),
        }
    }
}

pub fn hash(key: &str) -> String {
    turnstile::auth::hash_key(key)
}

pub fn config_text(o: &Opts, dir: &std::path::Path) -> String {
    let mut s = format!(
        r#"
[server]
listen = "127.0.0.1:0"
max_body_bytes = {max_body}
keepalive_seconds = {keepalive}
{server}

[store]
path = "turnstile.db"

[[clients]]
id = "alice"
key_sha256 = "{alice}"
models = {alice_models}

[[clients]]
id = "bob"
key_sha256 = "{bob}"
models = ["*"]

[[clients]]
id = "carol"
key_sha256 = "{carol}"
models = ["echo"]

[[clients]]
id = "root"
key_sha256 = "{root}"
models = []
roles = ["approver"]

[approvals]
ttl_seconds = {approval_ttl}

[backends.demo]
kind = "app-server"
command = ["{demo}"]
env = {{ TURNSTILE_DEMO_SPY = "{spy}" }}
max_sessions = {max_sessions}
acquire_timeout_ms = {acquire}
reserved_tool_names = ["request_user_input"]
recycle_after_threads = {recycle}

[continuations]
execution_ttl_seconds = {ttl}
max_tool_result_bytes = {max_result}
max_rounds = {max_rounds}
max_pending_per_client = {per_client}
batch_debounce_ms = 25
{continuations}
"#,
        max_body = o.max_body_bytes,
        keepalive = o.keepalive_seconds,
        server = o.server,
        continuations = o.continuations,
        alice = hash(ALICE),
        bob = hash(BOB),
        carol = hash(CAROL),
        root = hash(ROOT),
        approval_ttl = o.approval_ttl_seconds,
        alice_models = o.alice_models,
        demo = env!("CARGO_BIN_EXE_turnstile-demo-backend"),
        spy = dir.join("spy.jsonl").display(),
        max_sessions = o.max_sessions,
        acquire = o.acquire_timeout_ms,
        ttl = o.execution_ttl_seconds,
        max_result = o.max_tool_result_bytes,
        max_rounds = o.max_rounds,
        per_client = o.max_pending_per_client,
        recycle = o.recycle_after_threads,
    );
    if !o.continuity.is_empty() {
        s.push_str(&format!("\n[continuity]\n{}\n", o.continuity));
    }
    for m in SCENARIOS {
        s.push_str(&format!(
            "\n[[models]]\nid = \"{m}\"\nbackend = \"demo\"\nbackend_model = \"{m}\"\n"
        ));
    }
    for (id, scenario, policy) in APPROVAL_MODELS {
        s.push_str(&format!(
            "\n[[models]]\nid = \"{id}\"\nbackend = \"demo\"\nbackend_model = \"{scenario}\"\napprovals = {policy}\n"
        ));
    }
    s
}

pub struct Gateway {
    pub child: Option<Child>,
    pub url: String,
    pub dir: tempfile::TempDir,
    pub opts: Opts,
    pub http: reqwest::Client,
    stderr_log: PathBuf,
}

impl Gateway {
    pub async fn start() -> Gateway {
        Self::start_with(Opts::default()).await
    }

    pub async fn start_with(opts: Opts) -> Gateway {
        Self::start_raw(opts, config_text).await
    }

    /// Starts with a config produced by `text(opts, folder)`; the folder is the gateway's own
    /// temporary folder (config, store, spy and log live there).
    pub async fn start_raw(
        opts: Opts,
        text: impl FnOnce(&Opts, &std::path::Path) -> String,
    ) -> Gateway {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut text = text(&opts, dir.path());
        if postgres::suite_on_postgres() && !opts.sqlite && !text.contains("\nurl = \"postgres://")
        {
            text = text.replace("[store]\npath = \"turnstile.db\"\n", "");
            text.push_str(&postgres::store_section(&postgres::database()));
        }
        std::fs::write(dir.path().join("turnstile.toml"), text).expect("write config");
        let mut gw = Gateway {
            child: None,
            url: String::new(),
            stderr_log: dir.path().join("gateway.log"),
            dir,
            opts,
            http: reqwest::Client::builder().build().expect("client"),
        };
        gw.spawn().await;
        gw
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("turnstile.toml")
    }

    pub fn spy_path(&self) -> PathBuf {
        self.dir.path().join("spy.jsonl")
    }

    /// Starts (or restarts) the binary on the same folder, store and config.
    pub async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr_log)
            .expect("log file");
        let format = if self.opts.log_json { "json" } else { "text" };
        let mut child = Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .args(["--log-format", format, "serve", "--config"])
            .arg(self.config_path())
            .env("TURNSTILE_LOG", "info,turnstile=debug")
            .env("TURNSTILE_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
            .env(postgres::PASSWORD_ENV, postgres::PASSWORD)
            .env(CLUSTER_KEY_ENV, CLUSTER_KEY)
            .envs(self.opts.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn turnstile");
        let stdout = child.stdout.take().expect("stdout");
        let line = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            reader.read_line(&mut line).ok();
            // Keep draining so the child never blocks on a full pipe.
            std::thread::spawn(move || {
                let mut sink = String::new();
                while reader.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
                    sink.clear();
                }
            });
            line
        });
        let line = tokio::time::timeout(Duration::from_secs(30), line)
            .await
            .expect("gateway did not announce itself in 30s")
            .expect("join");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}; log: {}", self.log()))
            .to_string();
        self.url = url;
        self.child = Some(child);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Sends SIGTERM and waits (bounded) for a clean exit; returns the exit code.
    pub async fn stop(&mut self) -> Option<i32> {
        self.signal("TERM");
        let mut child = self.child.take().expect("running");
        let status = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Some(s) = child.try_wait().expect("wait") {
                    return Some(s);
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    return None;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await
        .expect("join");
        status.and_then(|s| s.code())
    }

    pub fn spy(&self) -> Vec<Value> {
        std::fs::read_to_string(self.spy_path())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    pub fn spy_events(&self, event: &str) -> Vec<Value> {
        self.spy()
            .into_iter()
            .filter(|e| e["event"] == event)
            .collect()
    }

    /// `thread_start` events of executions (the startup probe thread excluded).
    pub fn thread_starts(&self) -> Vec<Value> {
        self.spy_events("thread_start")
            .into_iter()
            .filter(|e| e["dynamic_tools"] != json!(["turnstile_probe"]))
            .collect()
    }

    /// Polls the spy (bounded) until `n` events of the kind exist.
    pub async fn wait_spy(&self, event: &str, n: usize) -> Vec<Value> {
        wait_for_within(
            &format!("the spy to see {n} `{event}` events"),
            WAIT,
            || format!("saw {:?}", self.spy()),
            async || {
                let found = self.spy_events(event);
                (found.len() >= n).then_some(found)
            },
        )
        .await
    }

    pub fn post(&self, key: &str, body: &Value) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}/v1/chat/completions", self.url))
            .bearer_auth(key)
            .json(body)
    }

    /// Opens a streaming request on the demo `hang` scenario and returns the live response:
    /// a turn that holds a backend session until the response is dropped.
    pub async fn hold_stream(&self, key: &str) -> reqwest::Response {
        let body = json!({"model": "hang", "stream": true, "messages": [user("x")]});
        let resp = self.post(key, &body).send().await.expect("send");
        assert_eq!(resp.status(), 200);
        resp
    }

    /// Non-streaming chat: status and parsed JSON body.
    pub async fn chat(&self, key: &str, body: &Value) -> (StatusCode, Value) {
        let resp = self.post(key, body).send().await.expect("send");
        let status = resp.status();
        let text = resp.text().await.expect("body");
        let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON body {text:?}"));
        schema::check_openai(status.as_u16(), &v, schema::Wire::ChatCompletion);
        (status, v)
    }

    /// Streaming chat: status, content-type and the raw body.
    pub async fn chat_stream(&self, key: &str, body: &Value) -> (StatusCode, String, String) {
        let mut body = body.clone();
        body["stream"] = json!(true);
        let resp = self.post(key, &body).send().await.expect("send");
        let status = resp.status();
        let ct = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap_or_default().to_string())
            .unwrap_or_default();
        let text = resp.text().await.expect("body");
        if status == 200 {
            for e in sse_events(&text).0 {
                match e.get("error") {
                    Some(_) => schema::check(schema::Wire::OpenAiError, &e),
                    None => schema::check(schema::Wire::ChatChunk, &e),
                }
            }
        }
        (status, ct, text)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Parsed `data:` events of an SSE body (excluding `[DONE]`), plus the count of `[DONE]`.
pub fn sse_events(body: &str) -> (Vec<Value>, usize) {
    let mut events = Vec::new();
    let mut done = 0;
    for block in body.split("\n\n") {
        for line in block.lines() {
            if let Some(data) = line.strip_prefix("data: ") {
                if data == "[DONE]" {
                    done += 1;
                } else {
                    events.push(
                        serde_json::from_str(data).unwrap_or_else(|_| panic!("bad event {data}")),
                    );
                }
            }
        }
    }
    (events, done)
}

pub fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

pub fn read_tool() -> Value {
    json!({"type": "function", "function": {"name": "read_file", "description": "Read a file",
           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}})
}

pub fn list_tool() -> Value {
    json!({"type": "function", "function": {"name": "list_dir", "description": "List a folder",
           "parameters": {"type": "object", "properties": {"dir": {"type": "string"}}}}})
}

/// A fresh tool-using request.
pub fn tool_request(model: &str, prompt: &str) -> Value {
    json!({"model": model, "messages": [user(prompt)], "tools": [read_tool(), list_tool()]})
}

/// The tool calls of a non-streaming response.
pub fn calls(resp: &Value) -> Vec<Value> {
    resp["choices"][0]["message"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Builds the continuation of `req` after `resp`: the assistant echo plus one tool message
/// per call, with `result(i, call)` as content.
pub fn continuation(req: &Value, resp: &Value, result: impl Fn(usize, &Value) -> Value) -> Value {
    let msg = &resp["choices"][0]["message"];
    let mut next = req.clone();
    let messages = next["messages"].as_array_mut().expect("messages");
    messages.push(
        json!({"role": "assistant", "content": msg["content"], "tool_calls": msg["tool_calls"]}),
    );
    for (i, c) in calls(resp).iter().enumerate() {
        messages.push(json!({"role": "tool", "tool_call_id": c["id"], "content": result(i, c)}));
    }
    next
}

pub fn content(resp: &Value) -> String {
    resp["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

pub fn error_code(v: &Value) -> String {
    v["error"]["code"].as_str().unwrap_or_default().to_string()
}

/// Kills the first demo backend process with SIGKILL and waits (bounded) until it is reaped.
pub async fn kill_demo_backend(gw: &Gateway) {
    let pid = gw.spy_events("started")[0]["pid"]
        .as_u64()
        .expect("demo pid");
    assert!(Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill")
        .success());
    wait_until("killed child reaped", || !pid_alive(pid)).await;
}

/// True while a process with this pid exists (zombies included until reaped).
pub fn pid_alive(pid: u64) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// `GET {path}` as `key`: the status and the JSON body.
/// The caller's usage `total` once `flushed` says it holds what the test ran (usage is
/// written in the background, within a second or so).
pub async fn usage_total(gw: &Gateway, key: &str, flushed: impl Fn(&Value) -> bool) -> Value {
    let seen = std::sync::Mutex::new(Value::Null);
    wait_for_within(
        "usage flushed",
        std::time::Duration::from_secs(15),
        || seen.lock().unwrap().to_string(),
        async || {
            let (_, v) = get(gw, key, "/v1/usage").await;
            *seen.lock().unwrap() = v.clone();
            let t = v["total"].clone();
            flushed(&t).then_some(t)
        },
    )
    .await
}

pub async fn get(gw: &Gateway, key: &str, path: &str) -> (u16, Value) {
    let (status, text) = get_text(gw, key, path).await;
    (status, serde_json::from_str(&text).unwrap())
}

/// `GET {path}` as `key`: the status and the raw body.
pub async fn get_text(gw: &Gateway, key: &str, path: &str) -> (u16, String) {
    let r = gw
        .http
        .get(format!("{}{path}", gw.url))
        .bearer_auth(key)
        .send()
        .await
        .expect("send");
    (r.status().as_u16(), r.text().await.expect("body"))
}

/// Waits (bounded) until `key` sees a pending approval; returns the first one listed.
pub async fn pending(gw: &Gateway, key: &str) -> Value {
    wait_for("a pending approval to appear", async || {
        let (status, v) = get(gw, key, "/v1/approvals?state=pending").await;
        assert_eq!(status, 200, "{v}");
        v["data"].as_array().and_then(|d| d.first()).cloned()
    })
    .await
}

/// The direct children of a process (the gateway's: its backend processes).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Another connection holding the SQLite store's write lock (as a backup or an operator's
/// shell would) until it is dropped.
pub struct SqliteLock(std::process::Child);

impl SqliteLock {
    pub fn take(db: &std::path::Path) -> SqliteLock {
        let mut locker = Command::new("python3")
            .args(["-c", "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1],isolation_level=None)\nc.execute('BEGIN IMMEDIATE')\nprint('locked',flush=True)\nsys.stdin.readline()", db.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(locker.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "locked");
        SqliteLock(locker)
    }
}

impl Drop for SqliteLock {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

/// The bound of a wait that names none.
pub const WAIT: Duration = Duration::from_secs(15);
/// How often a bounded wait polls.
const POLL: Duration = Duration::from_millis(20);

/// Polls `done` until it holds; fails the test past [`WAIT`].
pub async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    wait_for(what, async || done().then_some(())).await
}

/// Polls `f` until it yields `Some` and returns that value; fails the test past [`WAIT`].
pub async fn wait_for<T>(what: &str, f: impl AsyncFnMut() -> Option<T>) -> T {
    wait_for_within(what, WAIT, String::new, f).await
}

/// [`wait_for`] bounded by `within`; a timeout's message ends with `detail()`, taken then
/// (what was seen so far, a log tail).
pub async fn wait_for_within<T>(
    what: &str,
    within: Duration,
    detail: impl Fn() -> String,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() >= deadline {
            let detail = detail();
            let sep = if detail.is_empty() { "" } else { "\n" };
            panic!("timed out after {within:?} waiting for {what}{sep}{detail}");
        }
        tokio::time::sleep(POLL).await;
    }
}
