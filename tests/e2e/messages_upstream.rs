//! `POST /v1/messages` on a stateless Chat Completions upstream (the in-test fake): the exact
//! translation both ways (system, mid-conversation system, options, tool ids restored, inputs
//! and names exact), round trips streamed and not, parallel blocks, `max_tokens`, client-owned
//! history and the rejection of replays and foreign tokens.

use serde_json::json;

use crate::support::fake_upstream::FakeUpstream;
use crate::support::messages::*;
use crate::support::*;

const UPSTREAM_MODELS: &[(&str, &str)] = &[
    ("u-echo", "up-echo"),
    ("u-tool", "up-tool"),
    ("u-parallel", "up-parallel"),
    ("u-truncated", "up-truncated"),
];

async fn upstream() -> (Gateway, FakeUpstream) {
    let fake = FakeUpstream::start().await;
    let url = fake.url.clone();
    let gw = Gateway::start_raw(Opts::default(), move |o, dir| {
        let mut s = config_text(o, dir);
        s.push_str(&format!(
            "\n[backends.up]\nkind = \"openai\"\nbase_url = \"{url}\"\napi_key_env = \"TURNSTILE_TEST_UPSTREAM_KEY\"\n"
        ));
        for (id, model) in UPSTREAM_MODELS {
            s.push_str(&format!(
                "\n[[models]]\nid = \"{id}\"\nbackend = \"up\"\nbackend_model = \"{model}\"\n"
            ));
        }
        s
    })
    .await;
    (gw, fake)
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
