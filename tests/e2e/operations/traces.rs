//! Traces into a real trace store: the gateway exports to Arize Phoenix over OTLP/HTTP, and
//! the tests read the spans back through Phoenix's REST API. A held round trip reads as one
//! trace under the client's `traceparent` (server span, two `invoke_agent` legs, the
//! `execute_tool` span covering the client's wait); an approval-gated turn has its
//! `await_approval` span with the decision; no prompt, argument, result, token or key is in
//! any attribute.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::fake_upstream;
use crate::support::phoenix::{self, Phoenix};
use crate::support::*;

const PROMPT_CANARY: &str = "prompt-canary-7f3a91";
const ARG_CANARY: &str = "/arg-canary-5be2c0";
const RESULT_CANARY: &str = "result-canary-c4d118";
/// The client's own trace: the gateway's spans of the first request belong to it.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
/// How long the client "runs" its tool before answering.
const CLIENT_WAIT: Duration = Duration::from_millis(400);

fn telemetry(endpoint: &str) -> String {
    format!(
        "\n[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"turnstile-e2e\"\nsample_ratio = 1.0\n"
    )
}

async fn traced_gateway(p: &Phoenix) -> Gateway {
    let endpoint = p.endpoint();
    Gateway::start_raw(Opts::default(), move |o, dir| {
        config_text(o, dir) + &telemetry(&endpoint)
    })
    .await
}

/// A chat turn of alice's sent under the client's span `span` of trace `trace`; its 200 body.
async fn traced_chat(gw: &Gateway, body: &Value, trace: &str, span: &str) -> Value {
    let r = gw
        .post(ALICE, body)
        .header("traceparent", format!("00-{trace}-{span}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// The span named `name`.
fn named<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    let found = spans.iter().find(|s| s["name"] == name);
    found.unwrap_or_else(|| panic!("no span {name} in {spans:?}"))
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

fn attr_str<'a>(span: &'a Value, key: &str) -> &'a str {
    attr(span, key).as_str().unwrap_or_default()
}

fn span_id(span: &Value) -> &str {
    span["context"]["span_id"].as_str().unwrap_or_default()
}

fn trace_id(span: &Value) -> &str {
    span["context"]["trace_id"].as_str().unwrap_or_default()
}

fn parent_id(span: &Value) -> &str {
    span["parent_id"].as_str().unwrap_or_default()
}

/// Seconds from a span's start to its end.
fn duration(span: &Value) -> f64 {
    let t = |k: &str| {
        let s = span[k].as_str().unwrap_or_default();
        chrono_seconds(s)
    };
    t("end_time") - t("start_time")
}

/// `2026-12-04T13:01:02.123456+00:00` (or `Z`) as seconds of the day, enough for a duration
/// within one test.
fn chrono_seconds(s: &str) -> f64 {
    let time = s.split('T').nth(1).unwrap_or_default();
    let time = time.trim_end_matches('Z');
    let time = time.split(['+', '-']).next().unwrap_or_default();
    let mut parts = time.split(':');
    let h: f64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let m: f64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let sec: f64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    h * 3600.0 + m * 60.0 + sec
}

/// The spans of the traces `traces`, once `done` holds for them.
async fn spans_of(
    p: &Phoenix,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
    traces: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    wait_for_within(what, Duration::from_secs(30), String::new, async || {
        let spans: Vec<Value> = p.spans().await.into_iter().filter(&traces).collect();
        done(&spans).then_some(spans)
    })
    .await
}

/// No canary, token or key anywhere in what the trace store holds of these spans.
fn assert_no_secrets(spans: &[Value], secrets: &[&str]) {
    let all = serde_json::to_string(spans).unwrap();
    for s in secrets.iter().chain([
        &PROMPT_CANARY,
        &ARG_CANARY,
        &RESULT_CANARY,
        &ALICE,
        &"srct-",
    ]) {
        assert!(!all.contains(s), "`{s}` reached the trace store: {all}");
    }
}

#[tokio::test]
async fn a_held_round_trip_is_one_trace_in_phoenix() {
    let Some(p) = phoenix::server().await else {
        return;
    };
    let gw = traced_gateway(p).await;
    let prompt = format!("read {ARG_CANARY} {PROMPT_CANARY}");
    let req = tool_request("tool", &prompt);
    let first = traced_chat(&gw, &req, CLIENT_TRACE, CLIENT_SPAN).await;
    let call = calls(&first)[0].clone();
    let token = call["id"].as_str().unwrap().to_string();
    assert!(token.starts_with("srct-"));
    assert!(call["function"]["arguments"]
        .as_str()
        .unwrap()
        .contains(ARG_CANARY));
    // The client runs its tool.
    tokio::time::sleep(CLIENT_WAIT).await;
    let next = continuation(&req, &first, |_, _| json!(RESULT_CANARY));
    let (s, second) = gw.chat(ALICE, &next).await;
    assert_eq!(s, 200, "{second}");
    let execution = format!(
        "exe-{}",
        first["id"]
            .as_str()
            .unwrap()
            .trim_start_matches("chatcmpl-")
    );

    let in_execution = |s: &Value| {
        trace_id(s) == CLIENT_TRACE || attr_str(s, "gen_ai.conversation.id") == execution
    };
    let spans = spans_of(
        p,
        "the held round trip's spans",
        |spans| {
            let named = |n: &str| spans.iter().filter(|s| s["name"] == n).count();
            named("invoke_agent tool") == 2
                && named("execute_tool read_file") == 1
                && named("POST /v1/chat/completions") == 2
        },
        in_execution,
    )
    .await;
    let by_name = |n: &str| -> Vec<&Value> { spans.iter().filter(|s| s["name"] == n).collect() };

    // The first request's server span is a child of the client's span.
    let servers = by_name("POST /v1/chat/completions");
    let root = servers
        .iter()
        .find(|s| trace_id(s) == CLIENT_TRACE)
        .expect("the first request's server span in the client's trace");
    assert_eq!(parent_id(root), CLIENT_SPAN);
    let status = attr(root, "http.response.status_code").to_string();
    assert_eq!(status.trim_matches('"'), "200", "{root}");
    // Both legs are in the client's trace, under the first request's span, and the second
    // links to the request that carried it.
    let legs = by_name("invoke_agent tool");
    for leg in &legs {
        assert_eq!(trace_id(leg), CLIENT_TRACE, "{leg}");
        assert_eq!(parent_id(leg), span_id(root), "{leg}");
        assert_eq!(attr_str(leg, "gen_ai.operation.name"), "invoke_agent");
        assert_eq!(attr_str(leg, "gen_ai.provider.name"), "openai");
        assert_eq!(attr_str(leg, "gen_ai.request.model"), "tool");
        assert_eq!(attr_str(leg, "gen_ai.conversation.id"), execution);
        assert_eq!(
            attr_str(leg, "gen_ai.response.id"),
            first["id"].as_str().unwrap()
        );
        assert!(!attr(leg, "gen_ai.usage.input_tokens").is_null(), "{leg}");
        assert!(!attr(leg, "gen_ai.usage.output_tokens").is_null(), "{leg}");
    }
    let rounds: HashMap<String, &Value> = legs
        .iter()
        .map(|l| {
            (
                attr(l, "turnstile.round")
                    .to_string()
                    .trim_matches('"')
                    .to_string(),
                *l,
            )
        })
        .collect();
    let (leg1, leg2) = (rounds["0"], rounds["1"]);
    let reported = |l: &Value| {
        let n = attr(l, "gen_ai.usage.output_tokens").to_string();
        n.trim_matches('"').parse::<i64>().unwrap_or(0)
    };
    assert!(reported(leg1) + reported(leg2) > 0, "{leg1} {leg2}");
    // The held call: under the leg that exposed it, from the exposure to the claim.
    let tool = by_name("execute_tool read_file")[0];
    assert_eq!(parent_id(tool), span_id(leg1));
    assert_eq!(trace_id(tool), CLIENT_TRACE);
    assert_eq!(attr_str(tool, "gen_ai.operation.name"), "execute_tool");
    assert_eq!(attr_str(tool, "gen_ai.tool.name"), "read_file");
    assert_eq!(
        attr(tool, "turnstile.tool.call.position")
            .to_string()
            .trim_matches('"'),
        "0"
    );
    assert!(
        duration(tool) >= CLIENT_WAIT.as_secs_f64(),
        "execute_tool lasted {} s",
        duration(tool)
    );
    assert!(
        chrono_seconds(tool["end_time"].as_str().unwrap())
            <= chrono_seconds(leg2["start_time"].as_str().unwrap()) + 0.001
    );
    // The second request's server span names the execution.
    let carrier = servers
        .iter()
        .find(|s| trace_id(s) != CLIENT_TRACE)
        .unwrap();
    assert_eq!(attr_str(carrier, "gen_ai.conversation.id"), execution);
    assert_no_secrets(&spans, &[&token]);
}

#[tokio::test]
async fn an_approval_wait_is_a_span_with_its_decision() {
    let Some(p) = phoenix::server().await else {
        return;
    };
    let gw = traced_gateway(p).await;
    let req = gw.post(
        ALICE,
        &json!({"model": "cmd-ask", "stream": true, "messages": [user(PROMPT_CANARY)]}),
    );
    let chat = tokio::spawn(async move {
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    });
    let a = pending(&gw, ALICE).await;
    let id = a["id"].as_str().unwrap().to_string();
    let execution = a["execution_id"].as_str().unwrap().to_string();
    let r = gw
        .http
        .post(format!("{}/v1/approvals/{id}/decision", gw.url))
        .bearer_auth(ALICE)
        .json(&json!({"decision": "approve", "reason": "fine"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (status, _) = tokio::time::timeout(WAIT, chat).await.unwrap().unwrap();
    assert_eq!(status, 200);

    let spans = spans_of(
        p,
        "the approval's spans",
        |spans| {
            spans.iter().any(|s| s["name"] == "await_approval command")
                && spans.iter().any(|s| s["name"] == "invoke_agent cmd-ask")
        },
        |s| {
            attr_str(s, "gen_ai.conversation.id") == execution
                || attr_str(s, "turnstile.approval.id") == id
        },
    )
    .await;
    let leg = named(&spans, "invoke_agent cmd-ask");
    let wait = named(&spans, "await_approval command");
    assert_eq!(parent_id(wait), span_id(leg));
    assert_eq!(trace_id(wait), trace_id(leg));
    assert_eq!(attr_str(wait, "turnstile.approval.kind"), "command");
    assert_eq!(attr_str(wait, "turnstile.approval.decision"), "approved");
    assert_eq!(attr_str(wait, "turnstile.approval.reason"), "human");
    assert!(duration(leg) >= duration(wait));
    assert_no_secrets(&spans, &[]);
}

#[tokio::test]
async fn an_upstream_leg_is_a_chat_span_whose_traceparent_the_upstream_gets() {
    let Some(p) = phoenix::server().await else {
        return;
    };
    let (gw, fake) = fake_upstream::gateway_on_fake_with(
        Opts::default(),
        &[("u-tool", "up-tool")],
        telemetry(&p.endpoint()),
    )
    .await;
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let req = tool_request("u-tool", PROMPT_CANARY);
    let first = traced_chat(&gw, &req, trace, "b7ad6b7169203331").await;
    let next = continuation(&req, &first, |_, _| json!(RESULT_CANARY));
    let (s, _) = gw.chat(ALICE, &next).await;
    assert_eq!(s, 200);

    let spans = spans_of(
        p,
        "the upstream legs' spans",
        |spans| spans.iter().filter(|s| s["name"] == "chat u-tool").count() == 2,
        |s| trace_id(s) == trace,
    )
    .await;
    let legs: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"] == "chat u-tool")
        .collect();
    // Each upstream request carried its own leg's span as the parent.
    let sent = fake.seen.traceparents.lock().unwrap().clone();
    assert_eq!(sent.len(), 2, "{sent:?}");
    for leg in &legs {
        assert_eq!(attr_str(leg, "gen_ai.operation.name"), "chat");
        assert_eq!(attr_str(leg, "gen_ai.provider.name"), "openai");
        let expected = format!("00-{trace}-{}-01", span_id(leg));
        assert!(sent.contains(&expected), "{expected} not in {sent:?}");
    }
    assert_no_secrets(&spans, &[UPSTREAM_KEY]);
}

#[tokio::test]
async fn a_dead_collector_drops_and_counts_spans_and_requests_go_on() {
    // A port nothing listens on.
    let dead = format!("http://127.0.0.1:{}", crate::support::postgres::free_port());
    let gw = Gateway::start_raw(Opts::default(), move |o, dir| {
        config_text(o, dir) + &telemetry(&dead)
    })
    .await;
    for _ in 0..5 {
        let (s, v) = gw
            .chat(ALICE, &json!({"model": "echo", "messages": [user("hi")]}))
            .await;
        assert_eq!(s, 200, "{v}");
    }
    let dropped = wait_for("spans counted as dropped", async || {
        let (_, text) = get_text(&gw, ROOT, "/metrics").await;
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("turnstile_trace_spans_dropped_total{reason=\"export_failed\"}")
            })?
            .to_string();
        let n: u64 = line.rsplit(' ').next()?.parse().ok()?;
        (n >= 10).then_some(text)
    })
    .await;
    assert!(
        dropped.contains("turnstile_trace_spans_exported_total 0"),
        "{dropped}"
    );
}

#[tokio::test]
async fn a_forward_to_the_owner_replica_is_a_client_span_the_owner_continues() {
    let Some(p) = phoenix::server().await else {
        return;
    };
    let db = crate::support::postgres::database();
    let endpoint = p.endpoint();
    let replica = |id: &'static str| {
        let (db, endpoint) = (db.clone(), endpoint.clone());
        Gateway::start_raw(Opts::default(), move |o, dir| {
            crate::operations::cluster::replica_config(o, dir, id, &db, None, None)
                + &telemetry(&endpoint)
        })
    };
    let (a, b) = (replica("a").await, replica("b").await);
    let req = tool_request("tool", PROMPT_CANARY);
    let (s, first) = a.chat(ALICE, &req).await;
    assert_eq!(s, 200, "{first}");
    // The continuation reaches B, which relays it to A, the owner of the held turn.
    let trace = "5b8aa5a2d2c872e8321cf37308d69df2";
    let next = continuation(&req, &first, |_, _| json!(RESULT_CANARY));
    traced_chat(&b, &next, trace, "051581bf3cb55c13").await;

    let spans = spans_of(
        p,
        "the forwarded continuation's spans",
        |spans| {
            spans.iter().any(|s| s["name"] == "POST forward")
                && spans
                    .iter()
                    .filter(|s| s["name"] == "POST /v1/chat/completions")
                    .count()
                    == 2
        },
        |s| trace_id(s) == trace,
    )
    .await;
    let forward = named(&spans, "POST forward");
    let servers: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"] == "POST /v1/chat/completions")
        .collect();
    let on_b = servers
        .iter()
        .find(|s| parent_id(s) == "051581bf3cb55c13")
        .expect("B's server span under the client's");
    let on_a = servers.iter().find(|s| parent_id(s) == span_id(forward));
    assert!(
        on_a.is_some(),
        "A's server span under the forward: {spans:?}"
    );
    assert_eq!(parent_id(forward), span_id(on_b));
    assert_eq!(attr_str(forward, "turnstile.replica.id"), "a");
    assert_no_secrets(&spans, &[CLUSTER_KEY]);
}

/// What a fake OTLP/HTTP collector received: each export's path and headers.
type Received = std::sync::Arc<std::sync::Mutex<Vec<(String, axum::http::HeaderMap)>>>;

/// A collector that takes every export (an empty protobuf answer) and remembers it.
async fn fake_collector() -> (String, Received) {
    let seen = Received::default();
    let keep = seen.clone();
    let app = axum::Router::new().fallback(
        move |uri: axum::http::Uri, headers: axum::http::HeaderMap| {
            let keep = keep.clone();
            async move {
                keep.lock().unwrap().push((uri.path().to_string(), headers));
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        },
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    (url, seen)
}

#[tokio::test]
async fn the_headers_variable_reaches_the_collector_and_nothing_else() {
    let (collector, seen) = fake_collector().await;
    let endpoint = format!("{collector}/otlp/v1/traces");
    let key = "otlp-canary-key-9d41";
    let opts = Opts {
        env: vec![(
            "TURNSTILE_TEST_OTLP_HEADERS".into(),
            format!("x-api-key={key},x-team=blue%20team"),
        )],
        ..Opts::default()
    };
    let gw = Gateway::start_raw(opts, move |o, dir| {
        config_text(o, dir)
            + &telemetry(&endpoint)
            + "headers_env = \"TURNSTILE_TEST_OTLP_HEADERS\"\n"
    })
    .await;
    let (s, v) = gw
        .chat(ALICE, &json!({"model": "echo", "messages": [user("hi")]}))
        .await;
    assert_eq!(s, 200, "{v}");
    let (path, headers) =
        wait_for("an export", async || seen.lock().unwrap().first().cloned()).await;
    // A URL with a path is used as given.
    assert_eq!(path, "/otlp/v1/traces");
    assert_eq!(headers["content-type"], "application/x-protobuf");
    assert_eq!(headers["x-api-key"], key);
    assert_eq!(headers["x-team"], "blue team");
    assert!(!gw.log().contains(key), "the export key reached the log");
}

#[tokio::test]
async fn a_headers_variable_that_is_not_set_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let text = config_text(&Opts::default(), dir.path())
        + &telemetry("http://127.0.0.1:9")
        + "headers_env = \"TURNSTILE_TEST_OTLP_UNSET\"\n";
    let path = dir.path().join("turnstile.toml");
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["serve", "--config"])
        .arg(&path)
        .env_remove("TURNSTILE_TEST_OTLP_UNSET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("telemetry.headers_env") && stderr.contains("TURNSTILE_TEST_OTLP_UNSET"),
        "{stderr}"
    );
}

/// A Managed Agents session is the conversation its traces name: both legs of its held round
/// trip (driven by the `anthropic` SDK) and its requests' server spans carry the session id.
#[tokio::test]
async fn a_managed_agents_session_is_the_conversation_of_its_spans() {
    let Some(p) = phoenix::server().await else {
        return;
    };
    let gw = traced_gateway(p).await;
    let env = [("MANAGED_PART", "roundtrip".to_string())];
    if !crate::clients::sdk::run_script_with(&gw, "anthropic_managed.py", "", &env).await {
        return;
    }
    let in_session = |s: &Value| attr_str(s, "gen_ai.conversation.id").starts_with("sesn_");
    let spans = spans_of(
        p,
        "the session's spans",
        |spans| {
            let legs = spans.iter().filter(|s| s["name"] == "invoke_agent tool");
            let sent = spans
                .iter()
                .filter(|s| s["name"] == "POST /v1/sessions/{id}/events");
            legs.count() == 2 && sent.count() >= 2
        },
        in_session,
    )
    .await;
    let session = attr_str(named(&spans, "invoke_agent tool"), "gen_ai.conversation.id");
    for s in &spans {
        assert_eq!(attr_str(s, "gen_ai.conversation.id"), session, "{s}");
    }
}
