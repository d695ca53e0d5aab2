//! Chat Completions: plain turns, response shapes, model filtering and error shapes (keys
//! and refused models are the surface contract's, `contract.rs`).

use serde_json::{json, Value};

use crate::support::*;

/// Checks `v` is an OpenAI error body with `code`.
pub(super) fn assert_error_shape(v: &Value, code: &str) {
    let e = &v["error"];
    assert_eq!(e["code"], code, "{v}");
    assert!(e["message"].is_string() && e["type"].is_string(), "{v}");
    assert!(e.as_object().unwrap().contains_key("param"), "{v}");
}

#[tokio::test]
async fn plain_turn_non_streaming() {
    let gw = Gateway::start().await;
    let (status, v) = gw
        .chat(ALICE, &json!({"model": "echo", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]}
        ], "max_completion_tokens": 10, "store": false}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(v["created"].as_u64().unwrap() > 1_700_000_000);
    assert_eq!(v["model"], "echo");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(content(&v), "You said: hello there");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 10);
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["usage"]["total_tokens"], 15);
    // The system message became instructions on a fresh thread, persisted so that it can
    // be unloaded (`thread/delete`) when released.
    let starts = gw.thread_starts();
    assert_eq!(starts[0]["ephemeral"], false);
    assert_eq!(starts[0]["developer_instructions"], "be brief");
}

#[tokio::test]
async fn plain_turn_streaming_has_exact_chunks() {
    let gw = Gateway::start().await;
    let (status, ct, body) = gw
        .chat_stream(
            ALICE,
            &json!({"model": "echo", "messages": [user("hi")],
                                     "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(status, 200);
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let (events, done) = sse_events(&body);
    assert_eq!(done, 1);
    assert!(body.trim_end().ends_with("data: [DONE]"));
    let id = events[0]["id"].clone();
    assert!(events.iter().all(|e| e["id"] == id && e["model"] == "echo"));
    assert_eq!(
        events[0]["choices"][0]["delta"],
        json!({"role": "assistant"})
    );
    let chunks: Vec<&Value> = events
        .iter()
        .filter(|e| !e["choices"].as_array().unwrap().is_empty())
        .collect();
    assert!(chunks
        .iter()
        .all(|e| e["object"] == "chat.completion.chunk" && e["usage"].is_null()));
    let text: String = chunks
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "You said: hi");
    let finishes: Vec<&Value> = chunks
        .iter()
        .copied()
        .filter(|e| !e["choices"][0]["finish_reason"].is_null())
        .collect();
    assert_eq!(finishes.len(), 1);
    assert_eq!(finishes[0]["choices"][0]["finish_reason"], "stop");
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["total_tokens"], 15);

    // Without include_usage there is no usage chunk and no usage key.
    let (_, _, body) = gw
        .chat_stream(ALICE, &json!({"model": "echo", "messages": [user("x")]}))
        .await;
    let (events, done) = sse_events(&body);
    assert_eq!(done, 1);
    assert!(events.iter().all(|e| e.get("usage").is_none()));
}

#[tokio::test]
async fn models_are_filtered_per_client() {
    let gw = Gateway::start().await;
    let list = |key: &'static str| {
        let gw = &gw;
        async move {
            let resp = gw
                .http
                .get(format!("{}/v1/models", gw.url))
                .bearer_auth(key)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["object"], "list");
            v["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(list(CAROL).await, ["echo"]);
    assert_eq!(
        list(ALICE).await.len(),
        SCENARIOS.len() + APPROVAL_MODELS.len()
    );
    let resp = gw
        .http
        .get(format!("{}/v1/models", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
}

#[tokio::test]
async fn request_shape_errors() {
    let gw = Gateway::start_with(Opts {
        max_body_bytes: 4096,
        ..Opts::default()
    })
    .await;
    let url = format!("{}/v1/chat/completions", gw.url);
    // 413 before anything else, even without credentials.
    let big = json!({"model": "echo", "messages": [user(&"x".repeat(10_000))]});
    let resp = gw.http.post(&url).json(&big).send().await.unwrap();
    assert_eq!(resp.status(), 413);
    assert_error_shape(&resp.json().await.unwrap(), "request_too_large");
    // Malformed JSON and wrong shapes: 400.
    let resp = gw
        .http
        .post(&url)
        .bearer_auth(ALICE)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_error_shape(&resp.json().await.unwrap(), "invalid_request");
    for bad in [
        json!({"model": "echo"}),
        json!({"model": "echo", "messages": []}),
        json!({"messages": [user("x")]}),
        json!({"model": "echo", "messages": [{"role": "assistant", "content": "x"}]}),
    ] {
        let (status, v) = gw.chat(ALICE, &bad).await;
        assert_eq!(status, 400, "{bad}");
        assert_error_shape(&v, "invalid_request");
    }
    // Unknown route and wrong method.
    let resp = gw
        .http
        .get(format!("{}/v1/nothing", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert_error_shape(&resp.json().await.unwrap(), "not_found");
    let resp = gw.http.get(&url).bearer_auth(ALICE).send().await.unwrap();
    assert_eq!(resp.status(), 405);
    assert_error_shape(&resp.json().await.unwrap(), "method_not_allowed");
    // Unsupported tool_choice values are refused before anything runs.
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "read_file"}}),
    ] {
        let mut req = tool_request("tool", "x");
        req["tool_choice"] = choice;
        let (status, v) = gw.chat(ALICE, &req).await;
        assert_eq!(status, 400);
        assert_error_shape(&v, "unsupported_tool_choice");
    }
    assert!(gw.thread_starts().is_empty());
}

#[tokio::test]
async fn garbage_from_the_backend_is_tolerated() {
    let gw = Gateway::start().await;
    let (status, v) = gw
        .chat(
            ALICE,
            &json!({"model": "garbage", "messages": [user("still fine")]}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(content(&v), "You said: still fine");
    let answers = gw.wait_spy("server_request_answer", 1).await;
    assert_eq!(answers[0]["answer"]["error"]["code"], -32601, "{answers:?}");
}

#[tokio::test]
async fn failed_turn_is_502() {
    let gw = Gateway::start().await;
    let (status, v) = gw
        .chat(ALICE, &json!({"model": "fail", "messages": [user("x")]}))
        .await;
    assert_eq!(status, 502);
    assert_error_shape(&v, "upstream_error");
    assert!(!v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("demo model failure"));
}

#[tokio::test]
async fn health_endpoints() {
    let gw = Gateway::start().await;
    let r = gw
        .http
        .get(format!("{}/healthz", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = gw
        .http
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn metrics_count_and_logs_never_carry_secrets() {
    let gw = Gateway::start_with(Opts {
        log_json: true,
        ..Opts::default()
    })
    .await;
    let req = json!({"model": "tool", "messages": [user("CANARY-PROMPT-7781 read /tmp/CANARY-ARG-5521")],
                     "tools": [read_tool()]});
    let (_, resp) = gw.chat(ALICE, &req).await;
    let token = calls(&resp)[0]["id"].as_str().unwrap().to_string();
    let mut drift = continuation(&req, &resp, |_, _| json!("CANARY-RESULT-3390"));
    drift["messages"][0]["content"] = json!("CANARY-DRIFT-1204");
    assert_eq!(gw.chat(ALICE, &drift).await.0, 400);
    let next = continuation(&req, &resp, |_, _| json!("CANARY-RESULT-3390"));
    let (status, done) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(gw.chat(ALICE, &next).await.0, 409);

    let text = gw
        .http
        .get(format!("{}/metrics", gw.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |line: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(line))
            .unwrap_or_else(|| panic!("no {line} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(
        value("turnstile_requests_total{route=\"/v1/chat/completions\",status=\"200\"}"),
        2.0
    );
    assert_eq!(
        value("turnstile_requests_total{route=\"/v1/chat/completions\",status=\"400\"}"),
        1.0
    );
    assert_eq!(
        value("turnstile_continuation_rejections_total{code=\"continuation_mismatch\"}"),
        1.0
    );
    assert_eq!(
        value("turnstile_continuation_rejections_total{code=\"continuation_already_resolved\"}"),
        1.0
    );
    assert_eq!(value("turnstile_gateway_overhead_seconds_count"), 2.0);
    assert!(value("turnstile_time_to_first_byte_seconds_count") >= 2.0);
    assert_eq!(value("turnstile_suspended_executions"), 0.0);
    assert_eq!(value("turnstile_pending_continuations"), 0.0);
    assert_eq!(value("turnstile_tombstones"), 1.0);
    assert_eq!(value("turnstile_pending_approvals"), 0.0);
    assert_eq!(
        value("turnstile_backend_sessions{backend=\"demo\",state=\"busy\"}"),
        0.0
    );

    // Log lines are written by a thread of their own: the last request's may come a moment
    // after its answer.
    let request_lines = |log: &str| {
        log.lines()
            .filter(|l| l.contains("\"message\":\"request\"") && l.contains("/v1/chat/completions"))
            .count()
    };
    wait_until("every request's log line", || request_lines(&gw.log()) >= 4).await;
    let log = gw.log();
    for secret in [
        "CANARY-PROMPT-7781",
        "CANARY-ARG-5521",
        "CANARY-RESULT-3390",
        "CANARY-DRIFT-1204",
        ALICE,
        &token,
        &token[5..],
    ] {
        assert!(!log.contains(secret), "log leaks {secret}");
    }
    // One JSON line per request, with the execution id.
    let lines: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v["fields"]["message"] == "request" && v["fields"]["route"] == "/v1/chat/completions"
        })
        .collect();
    assert_eq!(lines.len(), 4, "{log}");
    assert!(lines
        .iter()
        .all(|l| l["fields"]["request"].as_str().unwrap().starts_with("req-")));
    assert!(lines[0]["fields"]["execution"]
        .as_str()
        .unwrap()
        .starts_with("exe-"));
}

#[tokio::test]
async fn client_tools_reserved_by_the_backend_are_mapped_not_refused() {
    let gw = Gateway::start().await;
    let mut req = tool_request("tool", "tool=client_request_user_input arg=why");
    req["tools"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "function",
        "function": {"name": "request_user_input", "parameters": {"type": "object", "required": ["q"]}}}));
    let (status, v) = gw.chat(ALICE, &req).await;
    assert_eq!(status, 200, "{v}");
    // Declared under another name, seen by the client under its own.
    let declared = gw.thread_starts()[0]["dynamic_tools"].clone();
    assert_eq!(
        declared,
        json!(["read_file", "list_dir", "client_request_user_input"])
    );
    let c = calls(&v);
    assert_eq!(c[0]["function"]["name"], "request_user_input", "{v}");
    let next = continuation(&req, &v, |_, _| json!("because"));
    let (status, done) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(content(&done), "Tool result: because");
}
