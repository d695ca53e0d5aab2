//! The `openai` backend kind hardened: TLS upstreams (a private CA trusted by `ca_file`, an
//! untrusted one refused with the reason logged, HTTP/2 by ALPN), the retry line of a
//! stateless continuation (a forward that failed before the upstream answered keeps its
//! tokens; once the answer has begun reaching the client they are spent), and client-owned
//! tool history relayed untouched.

use serde_json::{json, Value};

use crate::support::fake_upstream::FakeUpstream;
use crate::support::tls::TestCa;
use crate::support::*;

/// A gateway with `up` (the fake, plain or TLS, trusted by `ca_file` when given) and, for a
/// TLS fake, `untrusted` (the same address without the CA).
async fn start_with_upstream(fake: &FakeUpstream, ca: Option<&TestCa>) -> Gateway {
    start_with_timeout(fake, ca, 1000).await
}

async fn start_with_timeout(
    fake: &FakeUpstream,
    ca: Option<&TestCa>,
    first_byte_ms: u64,
) -> Gateway {
    let url = fake.url.clone();
    let ca_pem = ca.map(|c| c.ca_pem.clone());
    Gateway::start_raw(Opts::default(), move |o, dir| {
        let mut s = config_text(o, dir);
        s.push_str(&format!(
            "\n[backends.up]\nkind = \"openai\"\nbase_url = \"{url}\"\napi_key_env = \"TURNSTILE_TEST_UPSTREAM_KEY\"\n\
             first_byte_timeout_ms = {first_byte_ms}\nidle_timeout_ms = 1000\n"
        ));
        if let Some(pem) = ca_pem {
            std::fs::write(dir.join("private-ca.pem"), pem).unwrap();
            s.push_str("ca_file = \"private-ca.pem\"\n");
            s.push_str(&format!(
                "\n[backends.untrusted]\nkind = \"openai\"\nbase_url = \"{url}\"\napi_key_env = \"TURNSTILE_TEST_UPSTREAM_KEY\"\n\
                 \n[[models]]\nid = \"u-untrusted\"\nbackend = \"untrusted\"\nbackend_model = \"up-echo\"\n"
            ));
        }
        for (id, model) in [("u-echo", "up-echo"), ("u-tool", "up-tool")] {
            s.push_str(&format!(
                "\n[[models]]\nid = \"{id}\"\nbackend = \"up\"\nbackend_model = \"{model}\"\n"
            ));
        }
        s
    })
    .await
}

#[tokio::test]
async fn https_upstream_trusted_by_ca_file_over_http2_and_untrusted_refused_with_reason() {
    let ca = TestCa::new("upstream");
    let fake = FakeUpstream::start_tls(&ca.cert_pem, &ca.key_pem).await;
    assert!(fake.url.starts_with("https://127.0.0.1:"));
    let gw = start_with_upstream(&fake, Some(&ca)).await;

    let (s, v) = gw
        .chat(
            ALICE,
            &json!({"model": "u-echo", "messages": [user("over tls")]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(content(&v), "echo: over tls");
    let (s, _, body) = gw
        .chat_stream(
            ALICE,
            &json!({"model": "u-echo", "messages": [user("streamed tls")]}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(sse_events(&body).1, 1);
    // A tool round trip over the same connection pool.
    let req = json!({"model": "u-tool", "messages": [user("read")], "tools": [read_tool()]});
    let (_, resp) = gw.chat(ALICE, &req).await;
    let next = continuation(&req, &resp, |_, _| json!("R"));
    let (s, done) = gw.chat(ALICE, &next).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(content(&done), "Results: call_up_1=R");
    let versions = fake.versions();
    assert_eq!(versions.len(), 4);
    assert!(
        versions.iter().all(|v| *v == axum::http::Version::HTTP_2),
        "the upstream offered h2: {versions:?}"
    );

    // The same upstream without its CA: a clear 502, the reason in the log, never the key.
    let (s, v) = gw
        .chat(
            ALICE,
            &json!({"model": "u-untrusted", "messages": [user("x")]}),
        )
        .await;
    assert_eq!(s, 502, "{v}");
    assert_eq!(error_code(&v), "upstream_error");
    // Log lines are written by a thread of their own: wait (bounded) for the failure's.
    let failure = |log: &str| {
        log.lines()
            .find(|l| l.contains("upstream request failed") && l.contains("backend=untrusted"))
            .map(str::to_string)
    };
    let line = wait_for("the failure's log line", async || failure(&gw.log())).await;
    assert!(
        line.contains("invalid peer certificate") && line.contains("UnknownIssuer"),
        "the certificate problem is named: {line}"
    );
    assert!(!gw.log().contains(UPSTREAM_KEY));
    assert_eq!(
        fake.versions().len(),
        4,
        "no request crossed the refused handshake"
    );
}

#[tokio::test]
async fn ca_file_that_holds_no_certificate_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), "not a certificate").unwrap();
    let cfg = dir.path().join("t.toml");
    let mut text = config_text(&Opts::default(), dir.path());
    text.push_str("\n[backends.up]\nkind = \"openai\"\nbase_url = \"https://127.0.0.1:1/v1\"\nca_file = \"ca.pem\"\n");
    std::fs::write(&cfg, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["check", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("backends.up.ca_file") && err.contains("no PEM certificate"),
        "{err}"
    );
}

fn tool_call_req() -> Value {
    json!({"model": "u-tool", "messages": [user("read it")], "tools": [read_tool()], "stream": false})
}

#[tokio::test]
async fn failed_forward_before_the_upstream_answered_keeps_the_tokens() {
    let fake = FakeUpstream::start().await;
    let mut gw = start_with_upstream(&fake, None).await;
    let req = tool_call_req();
    let (_, resp) = gw.chat(ALICE, &req).await;
    let next = continuation(&req, &resp, |_, _| json!("FILE"));

    // A 5xx with no body: 502, the tokens stay pending (same deadline), a retry resumes.
    fake.seen
        .fail_next
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let (s, v) = gw.chat(ALICE, &next).await;
    assert_eq!(s, 502, "{v}");
    assert_eq!(error_code(&v), "upstream_error");

    // No headers before the first-byte timeout: 504, still pending; it survives a restart.
    fake.seen
        .stall_next
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let (s, v) = gw.chat(ALICE, &next).await;
    assert_eq!(s, 504, "{v}");
    assert_eq!(error_code(&v), "upstream_timeout");
    gw.stop().await;
    gw.spawn().await;

    let (s, done) = gw.chat(ALICE, &next).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(content(&done), "Results: call_up_1=FILE");
    assert_eq!(
        fake.bodies().len(),
        4,
        "one fresh request and three forwards"
    );
    // Answered once: the replay is 409.
    assert_eq!(gw.chat(ALICE, &next).await.0, 409);
}

#[tokio::test]
async fn a_client_that_leaves_before_the_upstream_answered_keeps_the_tokens() {
    let fake = FakeUpstream::start().await;
    // The upstream stalls 5 s and the gateway would wait 30: only the client leaves.
    let gw = start_with_timeout(&fake, None, 30_000).await;
    let req = tool_call_req();
    let (_, resp) = gw.chat(ALICE, &req).await;
    let next = continuation(&req, &resp, |_, _| json!("FILE"));
    fake.seen
        .stall_next
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let gone = gw
        .post(ALICE, &next)
        .timeout(std::time::Duration::from_millis(300))
        .send()
        .await;
    assert!(gone.is_err(), "the client gave up");
    // The gateway dropped the forward with the request and put the batch back.
    let done = wait_for("the batch to be pending again", async || {
        let (s, v) = gw.chat(ALICE, &next).await;
        assert!(s == 200 || s == 409, "{s}: {v}");
        (s == 200).then_some(v)
    })
    .await;
    assert_eq!(content(&done), "Results: call_up_1=FILE");
}

#[tokio::test]
async fn once_the_answer_reached_the_client_the_tokens_are_spent() {
    let fake = FakeUpstream::start().await;
    let gw = start_with_upstream(&fake, None).await;
    let mut req = tool_call_req();
    req["stream"] = json!(true);
    let (_, _, body) = gw.chat_stream(ALICE, &req).await;
    let (events, _) = sse_events(&body);
    let token = events
        .iter()
        .find_map(|e| e["choices"][0]["delta"]["tool_calls"][0]["id"].as_str())
        .expect("a streamed tool call")
        .to_string();
    let mut next = req.clone();
    let msgs = next["messages"].as_array_mut().unwrap();
    msgs.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": token, "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"/x\"}"}}]}));
    msgs.push(json!({"role": "tool", "tool_call_id": token, "content": "FILE"}));

    // The upstream answers 200 and breaks off after its first chunk: the client got bytes.
    fake.seen
        .break_next
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let (s, _, body) = gw.chat_stream(ALICE, &next).await;
    assert_eq!(s, 200);
    assert!(body.contains("chat.completion.chunk"), "{body}");
    assert!(
        body.contains("upstream_timeout"),
        "the stream ended in an error: {body}"
    );
    let (s, v) = gw.chat(ALICE, &next).await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(error_code(&v), "continuation_already_resolved");
    assert_eq!(fake.bodies().len(), 2);
}

/// A conversation that ran its own tool loop: the assistant's calls carry the client's ids.
fn foreign_history(model: &str) -> Value {
    json!({
        "model": model,
        "messages": [
            user("list it"),
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_own_1", "type": "function", "function": {"name": "list_dir", "arguments": "{\"dir\":\"/\"}"}},
                {"id": "toolu_01A", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "toolu_01A", "content": "B"},
            {"role": "tool", "tool_call_id": "call_own_1", "content": "A"}
        ],
        "tools": [read_tool(), list_tool()],
        "temperature": 0.25
    })
}

#[tokio::test]
async fn client_owned_tool_history_passes_through_a_stateless_upstream() {
    let fake = FakeUpstream::start().await;
    let gw = start_with_upstream(&fake, None).await;
    // Pretty-printed with odd spacing: relayed byte for byte apart from `model`.
    let sent = serde_json::to_string_pretty(&foreign_history("u-echo")).unwrap();
    let resp = gw
        .http
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(ALICE)
        .header("content-type", "application/json")
        .body(sent.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(content(&v), "Results: toolu_01A=B, call_own_1=A");
    let raw = fake.raw();
    assert_eq!(
        std::str::from_utf8(&raw[0]).unwrap(),
        sent.replacen("\"model\": \"u-echo\"", "\"model\": \"up-echo\"", 1)
    );

    // A mix of Turnstile tokens and the client's own ids in one message: a mismatch.
    let (_, resp) = gw.chat(ALICE, &tool_call_req()).await;
    let token = calls(&resp)[0]["id"].as_str().unwrap().to_string();
    let mut mix = foreign_history("u-echo");
    mix["messages"][1]["tool_calls"][1]["id"] = json!(token);
    mix["messages"][2]["tool_call_id"] = json!(token);
    let (s, v) = gw.chat(ALICE, &mix).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(error_code(&v), "continuation_mismatch");
    // Results that answer the client's own ids after an assistant message of tokens, too.
    let mut mix = tool_call_req();
    mix["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": null, "tool_calls": calls(&resp)}),
        json!({"role": "tool", "tool_call_id": "call_own_1", "content": "A"}),
    ]);
    let (s, v) = gw.chat(ALICE, &mix).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(error_code(&v), "continuation_mismatch");
    assert_eq!(
        fake.bodies().len(),
        2,
        "mismatches never reach the upstream"
    );
    // The token of that mix was not consumed.
    let next = continuation(&tool_call_req(), &resp, |_, _| json!("F"));
    assert_eq!(gw.chat(ALICE, &next).await.0, 200);

    // A malformed `srct-` id is still invalid.
    let mut bad = foreign_history("u-echo");
    bad["messages"][1]["tool_calls"][0]["id"] = json!("srct-123");
    bad["messages"][3]["tool_call_id"] = json!("srct-123");
    let (s, v) = gw.chat(ALICE, &bad).await;
    assert_eq!(
        (s.as_u16(), error_code(&v).as_str()),
        (400, "invalid_request")
    );
}

#[tokio::test]
async fn client_owned_tool_history_is_refused_by_a_stateful_backend() {
    let gw = Gateway::start().await;
    let (s, v) = gw.chat(ALICE, &foreign_history("echo")).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(error_code(&v), "invalid_request");
    assert_eq!(v["error"]["param"], "messages");
    assert!(gw.thread_starts().is_empty(), "nothing reached the backend");
}

#[tokio::test]
async fn client_owned_responses_history_passes_through_a_stateless_upstream() {
    let fake = FakeUpstream::start().await;
    let gw = start_with_upstream(&fake, None).await;
    let body = json!({"model": "u-echo", "input": [
        {"role": "user", "content": "list it"},
        {"type": "function_call", "call_id": "call_own_7", "name": "list_dir", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_own_7", "output": "A"}
    ], "tools": [{"type": "function", "name": "list_dir", "parameters": {"type": "object"}}]});
    let resp = gw
        .http
        .post(format!("{}/v1/responses", gw.url))
        .bearer_auth(ALICE)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["status"], "completed", "{v}");
    let sent = &fake.bodies()[0];
    assert_eq!(sent["messages"][1]["tool_calls"][0]["id"], "call_own_7");
    assert_eq!(sent["messages"][2]["tool_call_id"], "call_own_7");
    assert_eq!(sent["messages"][2]["content"], "A");
}
