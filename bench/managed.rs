//! Managed Agents resume benchmark (not a test): `cargo bench --bench managed`.
//!
//! The time from posting a `user.custom_tool_result` to the first agent event it brings
//! (`agent.message` on the session's open event stream), beside the same continuation over
//! Chat Completions (posting the `role:"tool"` message to the first content delta), on one
//! gateway and the demo backend, samples of the two alternating so that both are of the same
//! minute. The difference is what the session API adds: the result's checks, its events
//! stored before they are streamed, the session object rewritten, and the SSE relay.
//!
//! Environment: `BENCH_ITERS` (default 40).

// Benchmarks: unwrap is the assertion, and wall-clock time is what they measure.
#![allow(clippy::unwrap_used, clippy::disallowed_types)]

use std::time::Instant;

use serde_json::{json, Value};

#[path = "common.rs"]
mod common;

use common::{tools, KEY};

fn gateway() -> common::Gateway {
    common::Gateway::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
[store]
path = "bench.db"
[managed_agents]
workspace_root = "work"
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
processes = 2
"#,
        turnstile::auth::hash_key(KEY),
        env!("CARGO_BIN_EXE_turnstile-demo-backend"),
    ))
}

/// A session's event stream, read event by event.
struct Events {
    resp: reqwest::Response,
    buf: String,
}

impl Events {
    /// The next event: its type and body.
    async fn next(&mut self) -> (String, Value) {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let frame: String = self.buf.drain(..end + 2).collect();
                let field = |name: &str| {
                    frame
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .map(str::to_string)
                };
                if let (Some(kind), Some(data)) = (field("event: "), field("data: ")) {
                    return (kind, serde_json::from_str(&data).expect("event json"));
                }
                continue;
            }
            let chunk = self
                .resp
                .chunk()
                .await
                .expect("chunk")
                .expect("stream open");
            self.buf
                .push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        }
    }

    /// Events until the session goes idle; returns the idle event.
    async fn until_idle(&mut self) -> Value {
        loop {
            let (kind, v) = self.next().await;
            if kind == "session.status_idle" {
                return v;
            }
        }
    }
}

struct Api {
    http: reqwest::Client,
    url: String,
}

impl Api {
    async fn post(&self, path: &str, body: &Value) -> Value {
        let r = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(KEY)
            .header("anthropic-beta", "managed-agents-2026-04-01")
            .json(body)
            .send()
            .await
            .expect("send");
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.expect("json")
    }

    /// A session of an agent whose model calls the client tool `read_file`, and its stream.
    async fn session(&self) -> (String, Events) {
        let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]});
        let agent = self
            .post(
                "/v1/agents",
                &json!({"name": "bench", "model": "tool", "tools": [
                    {"type": "custom", "name": "read_file", "description": "Read a file", "input_schema": schema}]}),
            )
            .await;
        let env = self
            .post("/v1/environments", &json!({"name": "bench"}))
            .await;
        let session = self
            .post(
                "/v1/sessions",
                &json!({"agent": agent["id"], "environment_id": env["id"]}),
            )
            .await;
        let id = session["id"].as_str().expect("id").to_string();
        let resp = self
            .http
            .get(format!("{}/v1/sessions/{id}/events/stream", self.url))
            .bearer_auth(KEY)
            .header("anthropic-beta", "managed-agents-2026-04-01")
            .send()
            .await
            .expect("stream");
        assert_eq!(resp.status(), 200);
        let events = Events {
            resp,
            buf: String::new(),
        };
        (id, events)
    }

    /// One sample: a message held on its custom tool use, then the result, timed to the
    /// first `agent.message` it brings.
    async fn sample(&self, id: &str, events: &mut Events) -> f64 {
        let path = format!("/v1/sessions/{id}/events");
        let message =
            json!({"type": "user.message", "content": [{"type": "text", "text": "read /tmp/f"}]});
        self.post(&path, &json!({"events": [message]})).await;
        let idle = events.until_idle().await;
        assert_eq!(idle["stop_reason"]["type"], "requires_action", "{idle}");
        let use_id = idle["stop_reason"]["event_ids"][0].clone();
        let result = json!({"type": "user.custom_tool_result", "custom_tool_use_id": use_id,
            "content": [{"type": "text", "text": "R"}]});
        let started = Instant::now();
        self.post(&path, &json!({"events": [result]})).await;
        loop {
            if events.next().await.0 == "agent.message" {
                break;
            }
        }
        let took = started.elapsed().as_secs_f64() * 1e3;
        let idle = events.until_idle().await;
        assert_eq!(idle["stop_reason"]["type"], "end_turn", "{idle}");
        took
    }
}

/// The same continuation over Chat Completions: posting the tool result to the first
/// content delta of the streamed answer.
async fn chat_sample(http: &reqwest::Client, url: &str) -> f64 {
    let mut req = json!({"model": "tool", "messages": [{"role": "user", "content": "read /tmp/f"}],
        "tools": tools()});
    let resp = common::post(http, url, &req).await.expect("held");
    let msg = &resp["choices"][0]["message"];
    let messages = req["messages"].as_array_mut().expect("messages");
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": msg["tool_calls"]}));
    messages
        .push(json!({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "R"}));
    req["stream"] = json!(true);
    let started = Instant::now();
    let mut r = http
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&req)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let mut seen = String::new();
    let mut took = None;
    while let Some(chunk) = r.chunk().await.expect("chunk") {
        seen.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        if took.is_none() && seen.contains("\"content\":\"") {
            took = Some(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    took.expect("a content delta")
}

#[tokio::main]
async fn main() {
    let iters: usize = std::env::var("BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let gw = gateway();
    let api = Api {
        http: reqwest::Client::new(),
        url: gw.url.clone(),
    };
    let (id, mut events) = api.session().await;
    let (mut managed, mut chat) = (Vec::new(), Vec::new());
    for _ in 0..iters.max(1) {
        managed.push(api.sample(&id, &mut events).await);
        chat.push(chat_sample(&api.http, &gw.url).await);
    }
    let (m50, c50) = (
        common::percentile(&mut managed, 0.5),
        common::percentile(&mut chat, 0.5),
    );
    let (m99, c99) = (
        common::percentile(&mut managed, 0.99),
        common::percentile(&mut chat, 0.99),
    );
    println!("resume: tool result posted -> first agent text ({iters} samples each, demo backend)");
    println!(
        "  chat completions (role:tool -> first content delta): p50 {c50:.3} ms, p99 {c99:.3} ms"
    );
    println!("  managed agents (user.custom_tool_result -> agent.message): p50 {m50:.3} ms, p99 {m99:.3} ms");
    println!(
        "  ratio p50 managed/chat {:.2}, added {:.3} ms",
        m50 / c50,
        m50 - c50
    );
}
