//! The `openai` backend kind (spec section 6) against an in-test fake upstream: relay, tool
//! calls under the continuation contract, restart survival, failures and cancellation.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::fake_upstream::{gateway_on_fake, FakeUpstream};
use crate::support::*;

const MODELS: &[(&str, &str, &str)] = &[
    ("u-echo", "up", "up-echo"),
    ("u-tool", "up", "up-tool"),
    ("u-parallel", "up", "up-parallel"),
    ("u-oneshot", "up", "up-oneshot"),
    ("u-500", "up", "up-500"),
    ("u-400", "up", "up-400"),
    ("u-401", "up", "up-401"),
    ("u-403", "up", "up-403"),
    ("u-huge-400", "up", "up-huge-400"),
    ("u-huge", "up", "up-huge"),
    ("u-slow", "up", "up-slow-first"),
    ("u-idle", "up", "up-idle"),
    ("u-endless", "up", "up-endless"),
    ("u-refused", "dead", "up-echo"),
];

async fn start() -> (Gateway, FakeUpstream) {
    let fake = FakeUpstream::start().await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = fake.url.clone();
    let gw = Gateway::start_raw(Opts::default(), move |o, dir| {
        let mut s = config_text(o, dir);
        s.push_str(&format!(
            "\n[backends.up]\nkind = \"openai\"\nbase_url = \"{url}\"\napi_key_env = \"TURNSTILE_TEST_UPSTREAM_KEY\"\n\
             first_byte_timeout_ms = 1000\nidle_timeout_ms = 500\nmax_response_bytes = 1048576\n\
             \n[backends.dead]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{closed}/v1\"\n"
        ));
        for (id, backend, model) in MODELS {
            s.push_str(&format!("\n[[models]]\nid = \"{id}\"\nbackend = \"{backend}\"\nbackend_model = \"{model}\"\n"));
        }
        s
    })
    .await;
    (gw, fake)
}

fn tool_req(model: &str) -> Value {
    json!({"model": model, "messages": [user("read it")], "tools": [read_tool(), list_tool()], "temperature": 0.5, "x_custom": [1]})
}

#[tokio::test]
async fn plain_relay_non_streaming_and_streaming() {
    let (gw, fake) = start().await;
    let (s, v) = gw
        .chat(
            ALICE,
            &json!({"model": "u-echo", "messages": [user("hello")], "seed": 7}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(content(&v), "echo: hello");
    assert_eq!(v["model"], "u-echo");
    assert_eq!(v["x_upstream_extra"]["kept"], true);
    assert_eq!(v["usage"]["total_tokens"], 10);
    // Fields the gateway does not interpret pass through; the model is renamed.
    let sent = &fake.bodies()[0];
    assert_eq!(sent["model"], "up-echo");
    assert_eq!(sent["seed"], 7);
    assert_eq!(
        fake.seen.auth.lock().unwrap()[0],
        format!("Bearer {UPSTREAM_KEY}")
    );

    let (s, _, body) = gw
        .chat_stream(ALICE, &json!({"model": "u-echo", "messages": [user("streamed")], "stream_options": {"include_usage": true}}))
        .await;
    assert_eq!(s, 200);
    let (events, done) = sse_events(&body);
    assert_eq!(done, 1);
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "echo: streamed");
    assert!(events.iter().all(|e| e["model"] == "u-echo"));
    assert!(events
        .iter()
        .filter(|e| e["choices"][0].is_object())
        .all(|e| e["system_fingerprint"] == "fp_up"));
    let finishes: Vec<_> = events
        .iter()
        .filter(|e| e["choices"][0]["finish_reason"].is_string())
        .collect();
    assert_eq!(finishes.len(), 1);
    assert_eq!(events.last().unwrap()["usage"]["total_tokens"], 10);
}

#[tokio::test]
async fn tool_round_trip_non_streaming_with_the_rejection_matrix() {
    let (gw, fake) = start().await;
    let req = tool_req("u-tool");
    let (s, resp) = gw.chat(ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    let c = calls(&resp);
    assert_eq!(c.len(), 1);
    let token = c[0]["id"].as_str().unwrap().to_string();
    assert!(token.starts_with("srct-") && token.len() == 37);
    assert!(!resp.to_string().contains("call_up_1"));
    let next = continuation(&req, &resp, |_, _| json!("FILE"));

    // Foreign and unknown: the same 404; drift: 400; malformed: 400. Nothing consumed.
    assert_eq!(gw.chat(BOB, &next).await.0, 404);
    let mut drift = next.clone();
    drift["messages"][0]["content"] = json!("read it!");
    assert_eq!(
        error_code(&gw.chat(ALICE, &drift).await.1),
        "continuation_mismatch"
    );
    let bad: Value = serde_json::from_str(&next.to_string().replace(&token, "srct-XYZ")).unwrap();
    assert_eq!(gw.chat(ALICE, &bad).await.0, 400);
    assert_eq!(
        fake.bodies().len(),
        1,
        "rejections never reach the upstream"
    );

    let (s, done) = gw.chat(ALICE, &next).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(content(&done), "Results: call_up_1=FILE");
    // The upstream saw its own ids restored, in the echo and in the tool message.
    let sent = &fake.bodies()[1];
    assert_eq!(sent["messages"][1]["tool_calls"][0]["id"], "call_up_1");
    assert_eq!(sent["messages"][2]["tool_call_id"], "call_up_1");
    assert_eq!(sent["temperature"], 0.5);
    assert_eq!(sent["x_custom"], json!([1]));
    // Replay: 409.
    let (s, v) = gw.chat(ALICE, &next).await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(fake.bodies().len(), 2);
}

#[tokio::test]
async fn concurrent_claims_on_an_upstream_continuation() {
    let (gw, fake) = start().await;
    let req = tool_req("u-tool");
    let (_, resp) = gw.chat(ALICE, &req).await;
    let next = continuation(&req, &resp, |_, _| json!("R"));
    let racers = (0..4).map(|_| gw.post(ALICE, &next).send());
    let mut statuses: Vec<u16> = futures::future::join_all(racers)
        .await
        .iter()
        .map(|r| r.as_ref().unwrap().status().as_u16())
        .collect();
    statuses.sort();
    assert_eq!(statuses, [200, 409, 409, 409]);
    assert_eq!(fake.bodies().len(), 2);
}

#[tokio::test]
async fn streaming_tool_calls_are_normalised() {
    let (gw, fake) = start().await;
    for model in ["u-tool", "u-parallel", "u-oneshot"] {
        let req = tool_req(model);
        let (s, _, body) = gw.chat_stream(ALICE, &req).await;
        assert_eq!(s, 200, "{model}: {body}");
        assert!(
            !body.contains("call_up_"),
            "{model}: upstream ids leaked: {body}"
        );
        let (events, done) = sse_events(&body);
        assert_eq!(done, 1);
        let deltas: Vec<&Value> = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].get(0))
            .collect();
        let want = if model == "u-tool" { 1 } else { 2 };
        let mut echo = Vec::new();
        for i in 0..want {
            let mine: Vec<&&Value> = deltas.iter().filter(|d| d["index"] == i).collect();
            assert_eq!(mine.len(), 2, "{model}: {body}");
            assert!(mine[0]["id"].as_str().unwrap().starts_with("srct-"));
            assert_eq!(mine[0]["type"], "function");
            assert!(mine[1].get("id").is_none() && mine[1]["function"].get("name").is_none());
            let args = mine[1]["function"]["arguments"].as_str().unwrap();
            assert!(
                serde_json::from_str::<Value>(args).is_ok(),
                "{model}: {args}"
            );
            echo.push(json!({"id": mine[0]["id"], "type": "function",
                             "function": {"name": mine[0]["function"]["name"], "arguments": args}}));
        }
        let finishes: Vec<_> = events
            .iter()
            .filter(|e| e["choices"][0]["finish_reason"].is_string())
            .collect();
        assert_eq!(finishes.len(), 1);
        assert_eq!(finishes[0]["choices"][0]["finish_reason"], "tool_calls");

        let mut next = req.clone();
        let msgs = next["messages"].as_array_mut().unwrap();
        msgs.push(json!({"role": "assistant", "content": null, "tool_calls": echo}));
        for (i, c) in echo.iter().enumerate() {
            msgs.push(json!({"role": "tool", "tool_call_id": c["id"], "content": format!("r{i}")}));
        }
        let (s, _, body) = gw.chat_stream(ALICE, &next).await;
        assert_eq!(s, 200, "{body}");
        let text: String = sse_events(&body)
            .0
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        let expected = if want == 1 {
            "Results: call_up_1=r0".to_string()
        } else {
            "Results: call_up_1=r0, call_up_2=r1".to_string()
        };
        assert_eq!(text, expected, "{model}");
    }
    assert_eq!(fake.bodies().len(), 6);
}

#[tokio::test]
async fn continuation_survives_a_restart_and_replay_after_restart_is_409() {
    let (mut gw, fake) = start().await;
    let req = tool_req("u-tool");
    let (_, resp) = gw.chat(ALICE, &req).await;
    let next = continuation(&req, &resp, |_, _| json!("AFTER-RESTART"));
    assert_eq!(gw.stop().await, Some(0));
    gw.spawn().await;
    assert_eq!(gw.chat(BOB, &next).await.0, 404);
    let (s, v) = gw.chat(ALICE, &next).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(content(&v), "Results: call_up_1=AFTER-RESTART");
    assert_eq!(gw.stop().await, Some(0));
    gw.spawn().await;
    assert_eq!(gw.chat(ALICE, &next).await.0, 409);
    assert_eq!(fake.bodies().len(), 2);
}

/// Security review finding 4: the write that spends a stateless record fails (another
/// connection holds SQLite's write lock) after the upstream answered; the answer is 200, and
/// the replay is refused in the same process and after a restart (never a second resume).
#[tokio::test]
async fn a_spend_the_store_refused_is_not_resumed_again_after_a_restart() {
    let opts = Opts {
        sqlite: true,
        ..Opts::default()
    };
    let (mut gw, fake) = gateway_on_fake(opts, &[("u-tool", "up-tool")]).await;
    let req = tool_req("u-tool");
    let (s, resp) = gw.chat(ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    let next = continuation(&req, &resp, |_, _| json!("ONCE"));
    fake.seen
        .hold_next
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let answer = {
        let (http, url, next) = (gw.http.clone(), gw.url.clone(), next.clone());
        tokio::spawn(async move {
            let r = http
                .post(format!("{url}/v1/chat/completions"))
                .bearer_auth(ALICE)
                .json(&next)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        })
    };
    // The upstream has the forward; the store's write lock is taken before it answers.
    wait_until("the forward at the upstream", || fake.bodies().len() == 2).await;
    let lock = SqliteLock::take(&gw.dir.path().join("turnstile.db"));
    fake.seen.release.notify_one();
    let (s, v) = tokio::time::timeout(Duration::from_secs(20), answer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s, 200, "{v}");
    assert_eq!(content(&v), "Results: call_up_1=ONCE");
    // The tombstones are written behind the answer: their failure is logged soon after.
    wait_until("the failed tombstone write logged", || {
        gw.log().contains("could not persist tombstones")
    })
    .await;
    drop(lock);
    assert_eq!(gw.chat(ALICE, &next).await.0, 409);
    assert_eq!(gw.stop().await, Some(0));
    gw.spawn().await;
    let (s, v) = gw.chat(ALICE, &next).await;
    assert!(s == 409 || s == 410, "replay after restart: {s} {v}");
    assert_eq!(fake.bodies().len(), 2, "the upstream saw one resume");
}

/// Security review finding 6: the provider's refusal of the gateway's own key is a gateway
/// failure, not the client's 401, and its text (which names the key) reaches no one.
#[tokio::test]
async fn an_upstream_refusing_the_gateways_key_is_502_without_its_text() {
    let (gw, _fake) = start().await;
    for model in ["u-401", "u-403"] {
        let (s, v) = gw
            .chat(ALICE, &json!({"model": model, "messages": [user("x")]}))
            .await;
        assert_eq!(
            (s.as_u16(), error_code(&v).as_str()),
            (502, "upstream_error"),
            "{model}: {v}"
        );
        assert!(!v.to_string().contains("wXyZ"), "{v}");
    }
    assert!(!gw.log().contains("wXyZ"));
}

/// Security review finding 11: an upstream's whole bodies (an answer, an error's text) are
/// read under `max_response_bytes` (1 MiB here; the fake sends 2 MiB).
#[tokio::test]
async fn upstream_bodies_over_max_response_bytes_are_502() {
    let (gw, _fake) = start().await;
    for model in ["u-huge-400", "u-huge"] {
        let (s, v) = gw
            .chat(ALICE, &json!({"model": model, "messages": [user("x")]}))
            .await;
        assert_eq!(
            (s.as_u16(), error_code(&v).as_str()),
            (502, "upstream_error"),
            "{model}: {}",
            &v.to_string()[..200.min(v.to_string().len())]
        );
    }
}

#[tokio::test]
async fn upstream_failures_are_openai_shaped() {
    let (gw, _fake) = start().await;
    let body = |m: &str| json!({"model": m, "messages": [user("x")]});
    let (s, v) = gw.chat(ALICE, &body("u-500")).await;
    assert_eq!(
        (s.as_u16(), error_code(&v).as_str()),
        (502, "upstream_error")
    );
    assert!(!v.to_string().contains("secret-upstream"));
    let (s, v) = gw.chat(ALICE, &body("u-400")).await;
    assert_eq!(s, 400);
    assert_eq!(v["error"]["message"], "context too long");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let (s, v) = gw.chat(ALICE, &body("u-refused")).await;
    assert_eq!(
        (s.as_u16(), error_code(&v).as_str()),
        (502, "upstream_error")
    );
    assert!(!v.to_string().contains("127.0.0.1"));
    let (s, v) = gw.chat(ALICE, &body("u-slow")).await;
    assert_eq!(
        (s.as_u16(), error_code(&v).as_str()),
        (504, "upstream_timeout")
    );
    let (s, ct, stream) = gw.chat_stream(ALICE, &body("u-500")).await;
    assert_eq!(s, 502);
    assert!(ct.starts_with("application/json") && !stream.contains("data:"));
    // Idle mid-stream: an in-band error event, then [DONE].
    let (s, _, stream) = gw.chat_stream(ALICE, &body("u-idle")).await;
    assert_eq!(s, 200);
    let (events, done) = sse_events(&stream);
    assert_eq!(done, 1);
    assert_eq!(events.last().unwrap()["error"]["code"], "upstream_timeout");
    assert!(stream.contains("partial"));
    assert!(!gw.log().contains(UPSTREAM_KEY));
}

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_request() {
    let (gw, fake) = start().await;
    let mut resp = gw
        .post(
            ALICE,
            &json!({"model": "u-endless", "stream": true, "messages": [user("x")]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
        .await
        .unwrap()
        .unwrap();
    assert!(first.is_some());
    drop(resp);
    wait_until("the upstream sees the closed connection", || {
        fake.disconnects() == 1
    })
    .await;
}
