//! `POST /v1/messages` on a stateless Chat Completions upstream (the in-test fake): the exact
//! translation both ways (system, mid-conversation system, options, tool ids restored, inputs
//! and names exact), round trips streamed and not, parallel blocks, `max_tokens`, client-owned
//! history and the rejection of replays and foreign tokens.

use serde_json::json;

use crate::support::fake_upstream::{gateway_on_fake, FakeUpstream};
use crate::support::messages::*;
use crate::support::*;

const UPSTREAM_MODELS: &[(&str, &str)] = &[
    ("u-echo", "up-echo"),
    ("u-tool", "up-tool"),
    ("u-parallel", "up-parallel"),
    ("u-truncated", "up-truncated"),
    ("u-rounds2", "up-rounds2"),
];

async fn upstream() -> (Gateway, FakeUpstream) {
    upstream_with(Opts::default()).await
}

async fn upstream_with(opts: Opts) -> (Gateway, FakeUpstream) {
    gateway_on_fake(opts, UPSTREAM_MODELS).await
}

#[tokio::test]
async fn upstream_translation_of_plain_and_streamed_answers() {
    let (gw, fake) = upstream().await;
    let mut req = request("u-echo", "hello");
    req["temperature"] = json!(0.2);
    req["stop_sequences"] = json!(["END"]);
    let (s, v) = create(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        text(&v),
        "echo: <system-reminder>be careful</system-reminder>\n\nhello"
    );
    assert_eq!(v["model"], "u-echo");
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["usage"]["output_tokens"], 3, "{v}");
    let sent = &fake.bodies()[0];
    assert_eq!(sent["model"], "up-echo");
    assert_eq!(
        sent["messages"],
        json!([{"role": "system", "content": "x-billing: 1\n\nYou are an agent."},
               {"role": "user", "content": "<system-reminder>be careful</system-reminder>\n\nhello"},
               {"role": "system", "content": "# Environment\ncwd: /tmp"}])
    );
    assert_eq!(
        (
            sent["max_tokens"].as_u64(),
            sent["temperature"].as_f64(),
            sent["reasoning_effort"].as_str()
        ),
        (Some(32000), Some(0.2), Some("high"))
    );
    assert_eq!(sent["stop"], json!(["END"]));
    let names: Vec<_> = sent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].clone())
        .collect();
    assert_eq!(names, [json!("Read"), json!("Bash")], "{sent}");
    assert_eq!(
        sent["tools"][0]["function"]["parameters"],
        claude_read_tool()["input_schema"]
    );

    let (s, _, m) = stream(&gw, ALICE, &req).await;
    assert_eq!(s, 200);
    assert_eq!(text(&m), text(&v));
    assert_eq!(m["usage"]["output_tokens"], 3, "{m}");
    assert_eq!(fake.bodies()[1]["stream"], true);

    let (s, v) = create(&gw, ALICE, &request("u-truncated", "long")).await;
    assert_eq!(
        (s, v["stop_reason"].as_str()),
        (200, Some("max_tokens")),
        "{v}"
    );
    let (_, _, m) = stream(&gw, ALICE, &request("u-truncated", "long")).await;
    assert_eq!(m["stop_reason"], "max_tokens", "{m}");
}

#[tokio::test]
async fn upstream_round_trips_restore_its_ids() {
    let (gw, fake) = upstream().await;
    for streamed in [false, true] {
        let mut req = request("u-tool", "read it");
        req["tools"] = json!([{"name": "read_file", "description": "r",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]);
        let resp = if streamed {
            stream(&gw, ALICE, &req).await.2
        } else {
            create(&gw, ALICE, &req).await.1
        };
        assert_eq!(resp["stop_reason"], "tool_use", "{resp}");
        let calls = tool_uses(&resp);
        assert_eq!(calls.len(), 1, "{resp}");
        assert!(is_token(&calls[0]["id"]));
        assert_eq!(calls[0]["name"], "read_file");
        assert_eq!(calls[0]["input"], json!({"path": "/x"}));
        assert!(!resp.to_string().contains("call_up"), "{resp}");
        let next = answer(&req, &resp, |_, _| json!("FILE"), &[]);
        let done = if streamed {
            stream(&gw, ALICE, &next).await.2
        } else {
            create(&gw, ALICE, &next).await.1
        };
        assert_eq!(text(&done), "Results: call_up_1=FILE", "{done}");
        assert_eq!(done["id"], format!("{}_1", resp["id"].as_str().unwrap()));
        let sent = fake.bodies().last().unwrap().clone();
        let m = sent["messages"].as_array().unwrap();
        assert_eq!(m[3]["tool_calls"][0]["id"], "call_up_1", "{sent}");
        assert_eq!(
            m[3]["tool_calls"][0]["function"],
            json!({"name": "read_file", "arguments": "{\"path\":\"/x\"}"})
        );
        assert_eq!(
            m[4],
            json!({"role": "tool", "tool_call_id": "call_up_1", "content": "FILE"})
        );
        assert!(!sent.to_string().contains("srct-"), "{sent}");
        let (s, v) = create(&gw, ALICE, &next).await;
        assert_eq!((s, code(&v)), (409, "continuation_already_resolved".into()));
    }
}

#[tokio::test]
async fn upstream_sequential_rounds_and_the_rejection_matrix() {
    let (mut gw, fake) = upstream().await;
    let req = request("u-rounds2", "two rounds");
    let (_, _, r1) = stream(&gw, ALICE, &req).await;
    assert_eq!(tool_uses(&r1)[0]["input"], json!({"path": "/r1"}), "{r1}");
    let n1 = answer(&req, &r1, |_, _| json!("one"), &[]);
    let token = tool_uses(&r1)[0]["id"].as_str().unwrap().to_string();

    // Drift, malformed and foreign: nothing consumed.
    let mut drifts = Vec::new();
    let mut d = n1.clone();
    d["messages"][0]["content"][1]["text"] = json!("two rounds!");
    drifts.push(d);
    let mut d = n1.clone();
    d["output_config"]["effort"] = json!("max");
    drifts.push(d);
    let mut d = n1.clone();
    d["messages"][2]["content"][0]["input"] = json!({"path": "/other"});
    drifts.push(d);
    for d in &drifts {
        let (s, v) = create(&gw, ALICE, d).await;
        assert_eq!((s, code(&v)), (400, "continuation_mismatch".into()), "{d}");
    }
    let bad: serde_json::Value =
        serde_json::from_str(&n1.to_string().replace(&token, "srct-nothex")).unwrap();
    assert_eq!(create(&gw, ALICE, &bad).await.0, 400);
    assert_eq!(create(&gw, BOB, &n1).await.0, 404);

    // A crash of the gateway loses nothing of a stateless suspension.
    gw.signal("KILL");
    gw.stop().await;
    gw.spawn().await;
    let (s, r2) = create(&gw, ALICE, &n1).await;
    assert_eq!(s, 200, "{r2}");
    assert_eq!(tool_uses(&r2)[0]["input"], json!({"path": "/r2"}), "{r2}");
    assert_eq!(create(&gw, ALICE, &n1).await.0, 409);
    let n2 = answer(&n1, &r2, |_, _| json!("two"), &[]);
    let (s, _, done) = stream(&gw, ALICE, &n2).await;
    assert_eq!(s, 200, "{done}");
    // The answered batch goes with the upstream's own id; an earlier round's calls are
    // history, with the (spent) ids the client holds.
    assert_eq!(text(&done), format!("Results: {token}=one, call_up_2=two"));
    let sent = fake.bodies().last().unwrap().clone();
    assert_eq!(
        sent["messages"][5]["tool_calls"][0]["id"], "call_up_2",
        "{sent}"
    );
    assert_eq!(sent["messages"][6]["tool_call_id"], "call_up_2", "{sent}");
    assert_eq!(fake.bodies().len(), 3);
}

#[tokio::test]
async fn upstream_suspension_expires() {
    let (gw, fake) = upstream_with(Opts {
        execution_ttl_seconds: 1,
        ..Opts::default()
    })
    .await;
    let req = request("u-tool", "late");
    let (_, resp) = create(&gw, ALICE, &req).await;
    wait_for("the deadline timer to settle the suspension", async || {
        let (_, m) = get_text(&gw, ALICE, "/metrics").await;
        m.contains("turnstile_executions_ended_total{reason=\"expired\"} 1")
            .then_some(())
    })
    .await;
    let (s, v) = create(&gw, ALICE, &answer(&req, &resp, |_, _| json!("R"), &[])).await;
    assert_eq!((s, code(&v)), (410, "continuation_expired".into()), "{v}");
    assert_eq!(fake.bodies().len(), 1);
}

#[tokio::test]
async fn upstream_parallel_blocks_text_beside_and_client_owned_history() {
    let (gw, fake) = upstream().await;
    let req = request("u-parallel", "two");
    let (s, resp) = create(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    let calls = tool_uses(&resp);
    assert_eq!(calls.len(), 2, "{resp}");
    assert_eq!(calls[1]["input"], json!({"dir": "/b"}));
    let next = answer(&req, &resp, |i, _| json!(format!("R{i}")), &[]);
    let (s, v) = create(&gw, BOB, &next).await;
    assert_eq!((s, code(&v)), (404, "continuation_not_found".into()));
    let (s, done) = create(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(text(&done), "Results: call_up_1=R0, call_up_2=R1");

    // Text beside the results follows them as a user message.
    let req = request("u-tool", "again");
    let (_, resp) = create(&gw, ALICE, &req).await;
    let next = answer(
        &req,
        &resp,
        |_, _| json!({"content": "E", "is_error": true}),
        &["note"],
    );
    let (s, _) = create(&gw, ALICE, &next).await;
    assert_eq!(s, 200);
    let sent = fake.bodies().last().unwrap().clone();
    let m = sent["messages"].as_array().unwrap();
    assert_eq!(m[m.len() - 2]["role"], "tool", "{sent}");
    assert_eq!(m[m.len() - 2]["content"], "E");
    assert_eq!(m[m.len() - 1], json!({"role": "user", "content": "note"}));

    // The client's own tool ids are ordinary history for a stateless upstream.
    let own = json!({"model": "u-echo", "max_tokens": 10, "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"}]}]});
    let (s, v) = create(&gw, ALICE, &own).await;
    assert_eq!(s, 200, "{v}");
    let sent = fake.bodies().last().unwrap().clone();
    assert_eq!(sent["messages"][1]["tool_calls"][0]["id"], "toolu_1");
    assert_eq!(sent["messages"][2]["tool_call_id"], "toolu_1");
}
