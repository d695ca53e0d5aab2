//! `POST /v1/messages` against the demo backend: plain answers (strict event grammar), a
//! `tool_use` round trip, text beside the results, `is_error`, parallel blocks, three rounds,
//! what this wire adds to the surface contract's rejection matrix (`contract.rs`, with the
//! endings), both credentials, Anthropic error shapes, `count_tokens` and the Anthropic model
//! list. `messages_upstream.rs` runs the same
//! surface on a stateless upstream.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::messages::*;
use crate::support::*;

#[tokio::test]
async fn plain_answer_non_streaming_and_streaming() {
    let gw = Gateway::start().await;
    let (s, v) = create(&gw, ALICE, &request("echo", "hello")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "echo");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    assert_eq!(v["content"][0]["type"], "text");
    assert!(text(&v).starts_with("You said: "), "{v}");
    assert!(text(&v).ends_with("hello"), "{v}");
    assert_eq!(v["stop_reason"], "end_turn");
    assert!(v["stop_sequence"].is_null());
    for k in [
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ] {
        assert!(v["usage"][k].is_u64(), "{v}");
    }

    let (s, ev, m) = stream(&gw, ALICE, &request("echo", "hi there")).await;
    assert_eq!(s, 200);
    let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[..2], ["message_start", "content_block_start"]);
    assert_eq!(
        kinds[kinds.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(text(&m).ends_with("hi there"), "{m}");
    assert_eq!(m["stop_reason"], "end_turn");
    assert_eq!(m["usage"]["output_tokens"], 5);
    // The backend got the system blocks and the mid-conversation system message as
    // instructions, the reminder and the prompt as the turn's input, and the effort.
    let start = &gw.thread_starts()[1];
    let instructions = start["developer_instructions"].to_string();
    assert!(
        instructions.contains("You are an agent.") && instructions.contains("cwd: /tmp"),
        "{start}"
    );
    let turn = &gw.spy_events("turn_start")[1];
    assert!(turn["input"].to_string().contains("be careful"), "{turn}");
    assert_eq!(turn["effort"], "high");
}

#[tokio::test]
async fn tool_use_round_trip_with_text_beside_and_failed_results() {
    let gw = Gateway::start().await;
    let req = request("text_then_tool", "please read /etc/hostname");
    let (s, ev, resp) = stream(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{ev:?}");
    assert_eq!(resp["stop_reason"], "tool_use");
    assert_eq!(text(&resp), "Let me check.");
    let calls = tool_uses(&resp);
    assert_eq!(calls.len(), 1, "{resp}");
    assert!(is_token(&calls[0]["id"]), "{resp}");
    assert_eq!(calls[0]["name"], "Read");
    assert_eq!(calls[0]["input"], json!({"file_path": "/etc/hostname"}));
    // Only the client's own tools reach the backend.
    let declared = gw.thread_starts()[0]["dynamic_tools"].to_string();
    assert!(
        declared.contains("Read") && declared.contains("Bash"),
        "{declared}"
    );
    assert!(!declared.contains("web_search"), "{declared}");

    let next = answer(
        &req,
        &resp,
        |_, _| json!({"content": [{"type": "text", "text": "HOST"}], "is_error": true}),
        &["<system-reminder>file read</system-reminder>"],
    );
    let (s, ev, done) = stream(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{ev:?}");
    assert_eq!(text(&done), "Tool result: HOST");
    // One execution, but every leg its own message (Claude Code merges equal ids).
    let first = resp["id"].as_str().unwrap();
    assert_eq!(done["id"], format!("{first}_1"));
    assert_eq!(done["stop_reason"], "end_turn");
    let result = &gw.spy_events("tool_result")[0];
    assert_eq!(
        (result["text"].as_str(), result["success"].as_bool()),
        (Some("HOST"), Some(false))
    );
    // The text beside the results reached the held turn.
    let steer = &gw.spy_events("steer")[0];
    assert_eq!(
        steer["input"],
        json!(["<system-reminder>file read</system-reminder>"])
    );
    // Replay: 409, with no retry invited.
    let r = post(&gw, ALICE, &next).await;
    assert_eq!(r.status(), 409);
    assert_eq!(r.headers()["x-should-retry"], "false");
    assert_eq!(
        r.headers()["x-turnstile-error-code"],
        "continuation_already_resolved"
    );
}

#[tokio::test]
async fn parallel_blocks_and_three_rounds() {
    let gw = Gateway::start().await;
    let req = request("parallel", "read /a");
    let (s, resp) = create(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    let calls = tool_uses(&resp);
    assert_eq!(calls.len(), 2, "{resp}");
    assert_ne!(calls[0]["id"], calls[1]["id"]);
    // Results in the other order are fine.
    let mut next = answer(&req, &resp, |i, _| json!(format!("r{i}")), &[]);
    let last = next["messages"].as_array_mut().unwrap().last_mut().unwrap();
    last["content"].as_array_mut().unwrap().swap(0, 1);
    let (s, done) = create(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(text(&done), "Results: r0 | r1");

    // One block at a time when parallel tool use is disabled.
    let mut req = request("parallel", "read /b");
    req["tool_choice"] = json!({"type": "auto", "disable_parallel_tool_use": true});
    let (_, one) = create(&gw, ALICE, &req).await;
    assert_eq!(tool_uses(&one).len(), 1, "{one}");
    let (s, two) = create(&gw, ALICE, &answer(&req, &one, |_, _| json!("p0"), &[])).await;
    assert_eq!((s, tool_uses(&two).len()), (200, 1), "{two}");

    let req = request("rounds3", "read /r");
    let (_, _, r1) = stream(&gw, ALICE, &req).await;
    let n1 = answer(&req, &r1, |_, _| json!("one"), &[]);
    let (_, _, r2) = stream(&gw, ALICE, &n1).await;
    assert!(is_token(&tool_uses(&r2)[0]["id"]), "{r2}");
    let n2 = answer(&n1, &r2, |_, _| json!("two"), &[]);
    let (_, r3) = create(&gw, ALICE, &n2).await;
    let n3 = answer(&n2, &r3, |_, _| json!("three"), &[]);
    let (s, done) = create(&gw, ALICE, &n3).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(text(&done), "Done after 3 rounds: one, two, three");
    assert_eq!(done["id"], format!("{}_3", r1["id"].as_str().unwrap()));
}

/// Beside the surface contract's matrix (`contract.rs`): moving cache breakpoints is not
/// drift, and every held call needs exactly its own result.
#[tokio::test]
async fn cache_breakpoints_may_move_and_every_call_needs_its_result() {
    let gw = Gateway::start().await;
    let req = request("tool", "read /m");
    let (_, resp) = create(&gw, ALICE, &req).await;
    let next = answer(&req, &resp, |_, _| json!("R"), &[]);
    let mut moved = next.clone();
    moved["tools"][1]
        .as_object_mut()
        .unwrap()
        .remove("cache_control");
    moved["tools"][0]["cache_control"] = json!({"type": "ephemeral"});
    moved["messages"][0]["content"][1]["cache_control"] = json!({"type": "ephemeral"});
    // A mix of tokens and other ids, and no results at all: 400, nothing consumed.
    let mut extra = next.clone();
    extra["messages"][3]["content"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "tool_result", "tool_use_id": "toolu_01", "content": "x"}));
    let (s, v) = create(&gw, ALICE, &extra).await;
    assert_eq!((s, code(&v)), (400, "continuation_mismatch".into()), "{v}");
    let mut missing = next.clone();
    missing["messages"][3]["content"] = json!([{"type": "text", "text": "no results"}]);
    let (s, v) = create(&gw, ALICE, &missing).await;
    assert_eq!((s, code(&v)), (400, "continuation_mismatch".into()), "{v}");
    let (s, done) = create(&gw, ALICE, &moved).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(text(&done), "Tool result: R");
    let (s, v) = create(&gw, ALICE, &next).await;
    assert_eq!((s, code(&v)), (409, "continuation_already_resolved".into()));
}

#[tokio::test]
async fn a_conversation_continues_on_its_thread_and_approvals_hold_the_stream() {
    let gw = Gateway::start().await;
    let first = request("echo", "one");
    let (_, _, a1) = stream(&gw, ALICE, &first).await;
    let mut second = first.clone();
    let messages = second["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": a1["content"]}));
    messages.push(json!({"role": "user", "content": [{"type": "text", "text": "two"}]}));
    let (s, a2) = create(&gw, ALICE, &second).await;
    assert_eq!(s, 200, "{a2}");
    assert_eq!(text(&a2), "You said: two");
    // One thread: the second turn got only its new message.
    assert_eq!(gw.thread_starts().len(), 1, "{:?}", gw.spy());
    let starts = gw.spy_events("turn_start");
    assert_eq!(starts[1]["thread"], starts[0]["thread"]);
    assert_eq!(starts[1]["input"], json!(["two"]));

    // A side effect the policy asks about: the stream waits, a comment names the approval.
    let req = gw
        .http
        .post(format!("{}/v1/messages", gw.url))
        .header("x-api-key", ALICE)
        .json(
            &json!({"model": "cmd-ask", "stream": true, "max_tokens": 10,
                      "messages": [{"role": "user", "content": "go"}]}),
        );
    let chat = tokio::spawn(async move { req.send().await.unwrap().text().await.unwrap() });
    let a = pending(&gw, ALICE).await;
    let id = a["id"].as_str().unwrap();
    let r = gw
        .http
        .post(format!("{}/v1/approvals/{id}/decision", gw.url))
        .header("x-api-key", ALICE)
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(15), chat)
        .await
        .unwrap()
        .unwrap();
    assert!(body.contains(&format!(": approval pending {id}")), "{body}");
    let said: String = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|e| e["delta"]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(said, "Command ran.", "{body}");
    assert!(
        body.trim_end()
            .ends_with("data: {\"type\":\"message_stop\"}"),
        "{body}"
    );
}

#[tokio::test]
async fn credentials_and_anthropic_error_shapes() {
    let gw = Gateway::start().await;
    let body =
        json!({"model": "echo", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]});
    // Bearer works as well as x-api-key.
    let r = gw
        .http
        .post(format!("{}/v1/messages", gw.url))
        .bearer_auth(ALICE)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A bad key and a refused model are the surface contract's (`contract.rs`).
    let (s, v) = create(&gw, ALICE, &json!({"model": "echo", "messages": []})).await;
    assert_eq!((s, code(&v)), (400, "invalid_request".into()), "{v}");
    let (s, v) = create_text(&gw, ALICE, &json!("not an object")).await;
    assert_eq!(s, 400, "{v}");
    // The agent cannot force a tool, nor may a server tool be forced.
    let mut forced = request("tool", "x");
    forced["tool_choice"] = json!({"type": "any"});
    let (s, v) = create(&gw, ALICE, &forced).await;
    assert_eq!(
        (s, code(&v)),
        (400, "unsupported_tool_choice".into()),
        "{v}"
    );
    forced["tool_choice"] = json!({"type": "tool", "name": "web_search"});
    let (s, v) = create(&gw, ALICE, &forced).await;
    assert_eq!(
        (s, code(&v)),
        (400, "unsupported_tool_choice".into()),
        "{v}"
    );
    forced["tool_choice"] = json!({"type": "none"});
    let (s, _) = create(&gw, ALICE, &forced).await;
    assert_eq!(s, 200);
    let mut effort = request("echo", "x");
    effort["output_config"]["effort"] = json!("turbo");
    let (s, v) = create(&gw, ALICE, &effort).await;
    assert_eq!((s, code(&v)), (400, "invalid_request".into()), "{v}");
    // Client-owned tool history cannot enter an agent's turn.
    let own = json!({"model": "echo", "max_tokens": 8, "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"}]}]});
    let (s, v) = create(&gw, ALICE, &own).await;
    assert_eq!((s, code(&v)), (400, "invalid_request".into()), "{v}");
    // An unknown Messages route (the Batches API) and another method on the route.
    let r = gw
        .http
        .post(format!("{}/v1/messages/batches", gw.url))
        .header("x-api-key", ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (code(&v), v["error"]["type"].as_str()),
        ("not_found".into(), Some("not_found_error"))
    );
    let r = gw
        .http
        .get(format!("{}/v1/messages", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error", "{v}");
    // A model failure after the stream started is an `error` event.
    let (s, _, last) = stream(&gw, ALICE, &request("fail", "x")).await;
    if s == 200 {
        assert_eq!(last["type"], "error", "{last}");
        assert_eq!(last["error"]["type"], "api_error");
    } else {
        assert_eq!((s, code(&last)), (502, "upstream_error".into()));
    }
}

#[tokio::test]
async fn count_tokens_and_the_anthropic_model_list() {
    let gw = Gateway::start().await;
    let count = |key: &'static str, body: Value| {
        let gw = &gw;
        async move {
            let r = gw
                .http
                .post(format!("{}/v1/messages/count_tokens?beta=true", gw.url))
                .header("x-api-key", key)
                .header("anthropic-version", "2023-06-01")
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (s, small) = count(
        ALICE,
        json!({"model": "echo", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(s, 200, "{small}");
    let (_, big) = count(ALICE, request("echo", &"word ".repeat(400))).await;
    let (small, big) = (
        small["input_tokens"].as_u64().unwrap(),
        big["input_tokens"].as_u64().unwrap(),
    );
    assert!(small > 0 && big > small + 400, "{small} {big}");
    let (s, v) = count(
        CAROL,
        json!({"model": "tool", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!((s, code(&v)), (400, "model_not_found".into()));
    let (s, v) = count("sk-nobody", json!({})).await;
    assert_eq!((s, code(&v)), (401, "invalid_api_key".into()));
    // No turn was started by counting.
    assert!(gw.spy_events("turn_start").is_empty());

    let list = |anthropic: bool| {
        let mut r = gw
            .http
            .get(format!("{}/v1/models", gw.url))
            .header("x-api-key", ALICE);
        if anthropic {
            r = r.header("anthropic-version", "2023-06-01");
        }
        async move { r.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let a = list(true).await;
    assert_eq!(a["has_more"], false, "{a}");
    assert_eq!(a["data"][0]["type"], "model");
    assert!(a["data"][0]["display_name"].is_string());
    assert!(a["data"][0]["created_at"].is_string());
    assert_eq!(a["first_id"], a["data"][0]["id"]);
    let o = list(false).await;
    assert_eq!(o["object"], "list", "{o}");
    assert_eq!(
        a["data"].as_array().unwrap().len(),
        o["data"].as_array().unwrap().len()
    );
    let r = gw
        .http
        .get(format!("{}/v1/models/echo", gw.url))
        .header("x-api-key", ALICE)
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["id"], "echo");
}
