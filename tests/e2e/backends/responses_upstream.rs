//! `POST /v1/responses` on a stateless Chat Completions upstream (the in-test fake): the exact
//! translation both ways, and function and custom tool round trips in both client styles.

use serde_json::json;

use crate::support::fake_upstream::{gateway_on_fake, FakeUpstream};
use crate::support::responses::*;
use crate::support::*;

const UPSTREAM_MODELS: &[(&str, &str)] = &[
    ("u-echo", "up-echo"),
    ("u-tool", "up-tool"),
    ("u-parallel", "up-parallel"),
    ("u-custom", "up-custom"),
];

async fn upstream() -> (Gateway, FakeUpstream) {
    gateway_on_fake(Opts::default(), UPSTREAM_MODELS).await
}

#[tokio::test]
async fn upstream_translation_of_plain_and_streamed_answers() {
    let (gw, fake) = upstream().await;
    let mut req = json!({"model": "u-echo", "input": "hello", "instructions": "be brief",
        "max_output_tokens": 50, "temperature": 0.2});
    let (s, v) = create(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(response_text(&v), "echo: hello");
    assert_eq!(v["usage"]["total_tokens"], 10);
    let sent = &fake.bodies()[0];
    assert_eq!(sent["model"], "up-echo");
    assert_eq!(
        sent["messages"],
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}])
    );
    assert_eq!(
        (sent["max_tokens"].as_u64(), sent["temperature"].as_f64()),
        (Some(50), Some(0.2))
    );
    req["stream"] = json!(true);
    let (s, ev) = stream(&gw, ALICE, &req).await;
    assert_eq!(s, 200);
    assert_eq!(response_text(&last_response(&ev)), "echo: hello");
    assert_eq!(last_response(&ev)["usage"]["total_tokens"], 10);
}

#[tokio::test]
async fn upstream_function_and_custom_round_trips_in_both_styles() {
    let (gw, fake) = upstream().await;
    for (model, style) in [
        ("u-tool", "stateless"),
        ("u-tool", "stateful"),
        ("u-custom", "stateless"),
        ("u-custom", "stateful"),
    ] {
        let mut req = request(model, "read it");
        req["tools"] = json!([
            read_file_tool(),
            patch_tool(),
            {"type": "function", "name": "list_dir", "parameters": {"type": "object"}}
        ]);
        let (s, ev) = stream(&gw, ALICE, &req).await;
        assert_eq!(s, 200, "{ev:?}");
        let resp = last_response(&ev);
        let c = response_calls(&resp);
        assert_eq!(c.len(), 1, "{resp}");
        assert!(is_token(&c[0]["call_id"]));
        assert!(!resp.to_string().contains("call_up"), "{resp}");
        if model == "u-custom" {
            assert_eq!(c[0]["type"], "custom_tool_call");
            assert_eq!(c[0]["input"], "*** Begin Patch");
        } else {
            assert_eq!(c[0]["arguments"], r#"{"path":"/x"}"#);
        }
        let next = match style {
            "stateless" => stateless(&req, &resp, |_, _| "FILE".into()),
            _ => stateful(&req, &resp, |_, _| "FILE".into()),
        };
        let (s, ev) = stream(&gw, ALICE, &next).await;
        assert_eq!(s, 200, "{model} {style}: {ev:?}");
        let done = last_response(&ev);
        assert_eq!(
            response_text(&done),
            "Results: call_up_1=FILE",
            "{model} {style}"
        );
        // The upstream got the whole conversation in Chat form with its own id restored.
        let sent = fake.bodies().last().unwrap().clone();
        let m = sent["messages"].as_array().unwrap();
        assert_eq!(m[0]["role"], "developer");
        assert_eq!(m[2]["tool_calls"][0]["id"], "call_up_1", "{sent}");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "call_up_1", "content": "FILE"})
        );
        let tools = sent["tools"].as_array().unwrap();
        assert!(tools.iter().all(|t| t["type"] == "function"), "{sent}");
        assert_eq!(
            tools[1]["function"]["parameters"]["required"],
            json!(["input"])
        );
        assert_eq!(sent["reasoning_effort"], "low");
        // Replay: 409.
        assert_eq!(create(&gw, ALICE, &next).await.0, 409);
    }
}

#[tokio::test]
async fn upstream_parallel_calls_and_foreign_references() {
    let (gw, _fake) = upstream().await;
    let mut req = request("u-parallel", "two");
    req["tools"] = json!([read_file_tool(), {"type": "function", "name": "list_dir", "parameters": {"type": "object"}}]);
    let (s, resp) = create(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    assert_eq!(response_calls(&resp).len(), 2);
    let by_ref = stateful(&req, &resp, |i, _| format!("R{i}"));
    let (s, v) = create(&gw, BOB, &by_ref).await;
    assert_eq!((s, error_code(&v)), (404, "continuation_not_found".into()));
    let (s, done) = create(&gw, ALICE, &by_ref).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(response_text(&done), "Results: call_up_1=R0, call_up_2=R1");
}

#[tokio::test]
async fn kept_conversations_are_bounded_per_client_in_bytes() {
    // Each suspension keeps a 40 KB conversation (a stateless upstream holds none of its
    // own); each client may keep 100 KB.
    let (gw, _fake) = gateway_on_fake(
        Opts {
            continuations: "max_kept_bytes_per_client = 100000",
            ..Opts::default()
        },
        UPSTREAM_MODELS,
    )
    .await;
    let req = request("u-tool", &"x".repeat(40_000));
    let mut held = Vec::new();
    for _ in 0..2 {
        let (s, v) = create(&gw, ALICE, &req).await;
        assert_eq!(s, 200, "{v}");
        assert!(is_token(&response_calls(&v)[0]["call_id"]));
        held.push(v);
    }
    // The third would keep 120 KB: refused before any token is exposed.
    let (s, text) = create_text(&gw, ALICE, &req).await;
    assert_eq!(s, 429, "{text}");
    assert!(text.contains("capacity_exhausted"), "{text}");
    assert!(!text.contains("srct-"), "{text}");
    // Another client has a budget of its own.
    let (s, v) = create(&gw, BOB, &req).await;
    assert_eq!(s, 200, "{v}");
    // A resumed suspension gives its bytes back.
    let next = stateful(&req, &held[0], |_, _| "FILE".into());
    let (s, v) = create(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = create(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{v}");
}
