//! The continuation contract (spec section 3) against the demo backend, with its spy
//! proving what reached the held turn.

use serde_json::{json, Value};

use crate::support::*;

/// Fresh `tool` turn: returns the request and the suspended response.
async fn suspend(gw: &Gateway, key: &str, model: &str) -> (Value, Value) {
    let req = tool_request(model, "please read /tmp/secret.txt");
    let (status, resp) = gw.chat(key, &req).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["choices"][0]["finish_reason"], "tool_calls", "{resp}");
    (req, resp)
}

fn is_token(id: &str) -> bool {
    id.len() == 37
        && id.starts_with("srct-")
        && id[5..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[tokio::test]
async fn one_round_trip_non_streaming() {
    let gw = Gateway::start().await;
    let (req, resp) = suspend(&gw, ALICE, "tool").await;
    let c = calls(&resp);
    assert_eq!(c.len(), 1);
    assert!(is_token(c[0]["id"].as_str().unwrap()), "{c:?}");
    assert_eq!(c[0]["type"], "function");
    assert_eq!(c[0]["function"]["name"], "read_file");
    let args: Value =
        serde_json::from_str(c[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"path": "/tmp/secret.txt"}));
    assert!(resp["choices"][0]["message"]["content"].is_null());
    // The backend's own call id never leaves the gateway.
    let started = gw.wait_spy("turn_start", 1).await;
    assert!(!resp
        .to_string()
        .contains(started[0]["thread"].as_str().unwrap()));

    let next = continuation(&req, &resp, |_, _| json!("SECRET-42 \"quoted\"\nline2"));
    let (status, done) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(content(&done), "Tool result: SECRET-42 \"quoted\"\nline2");
    assert_eq!(done["choices"][0]["finish_reason"], "stop");
    assert_eq!(done["id"], resp["id"], "one execution across legs");
    // Usage of the model request arrives on the second leg only.
    assert_eq!(resp["usage"]["total_tokens"], 0);
    assert_eq!(done["usage"]["total_tokens"], 15);
    let results = gw.spy_events("tool_result");
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["text"], "SECRET-42 \"quoted\"\nline2");
    assert_eq!(results[0]["success"], true);
    // One thread, one turn: nothing was steered or started again.
    assert_eq!(gw.spy_events("turn_start").len(), 1);
    assert!(gw.spy_events("steer").is_empty());
}

#[tokio::test]
async fn one_round_trip_streaming_with_strict_deltas() {
    let gw = Gateway::start().await;
    let req = tool_request("text_then_tool", "look at /a/b");
    let (status, _, body) = gw.chat_stream(ALICE, &req).await;
    assert_eq!(status, 200);
    let (events, done) = sse_events(&body);
    assert_eq!(done, 1);
    assert_eq!(
        events[0]["choices"][0]["delta"],
        json!({"role": "assistant"})
    );
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Let me check.");
    let tc: Vec<&Value> = events
        .iter()
        .filter(|e| e["choices"][0]["delta"].get("tool_calls").is_some())
        .collect();
    assert_eq!(tc.len(), 2);
    let first = &tc[0]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(first["index"], 0);
    assert!(is_token(first["id"].as_str().unwrap()));
    assert_eq!(first["type"], "function");
    assert_eq!(first["function"]["name"], "read_file");
    let second = &tc[1]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(second["index"], 0);
    assert!(
        second.get("id").is_none()
            && second.get("type").is_none()
            && second["function"].get("name").is_none()
    );
    let finish: Vec<&Value> = events
        .iter()
        .filter(|e| !e["choices"][0]["finish_reason"].is_null())
        .collect();
    assert_eq!(finish.len(), 1);
    assert_eq!(finish[0]["choices"][0]["finish_reason"], "tool_calls");

    // The client echoes the text it saw as content.
    let mut next = req.clone();
    let id = first["id"].clone();
    next["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "read_file", "arguments": second["function"]["arguments"]}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": [{"type": "text", "text": "part1 "}, {"type": "text", "text": "part2"}]}),
    ]);
    let (status, _, body) = gw.chat_stream(ALICE, &next).await;
    assert_eq!(status, 200, "{body}");
    let (events, done) = sse_events(&body);
    assert_eq!(done, 1);
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Tool result: part1 part2");
    assert_eq!(gw.spy_events("tool_result")[0]["text"], "part1 part2");

    // Streaming replay: a real 409 before any SSE byte.
    let (status, ct, body) = gw.chat_stream(ALICE, &next).await;
    assert_eq!(status, 409);
    assert!(ct.starts_with("application/json"), "{ct}");
    assert!(!body.contains("data:"));
    assert_eq!(gw.spy_events("tool_result").len(), 1);
}

#[tokio::test]
async fn replay_is_409_and_foreign_is_404_identical_to_unknown() {
    let gw = Gateway::start().await;
    let (req, resp) = suspend(&gw, ALICE, "tool").await;
    let next = continuation(&req, &resp, |_, _| json!("R"));

    // Foreign principal on a live token: 404, byte-identical to an unknown token.
    let unknown = next.to_string().replace(
        &calls(&resp)[0]["id"].as_str().unwrap()[5..],
        &"0".repeat(32),
    );
    let unknown: Value = serde_json::from_str(&unknown).unwrap();
    let foreign_live = gw.post(BOB, &next).send().await.unwrap();
    let unknown_resp = gw.post(ALICE, &unknown).send().await.unwrap();
    assert_eq!(foreign_live.status(), 404);
    assert_eq!(unknown_resp.status(), 404);
    let h1: Vec<String> = foreign_live
        .headers()
        .keys()
        .map(|k| k.to_string())
        .collect();
    let h2: Vec<String> = unknown_resp
        .headers()
        .keys()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(h1, h2);
    let b1 = foreign_live.bytes().await.unwrap();
    let b2 = unknown_resp.bytes().await.unwrap();
    assert_eq!(b1, b2);
    assert!(String::from_utf8_lossy(&b1).contains("continuation_not_found"));
    assert!(gw.spy_events("tool_result").is_empty());

    // The owner still resumes.
    let (status, _) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 200);
    // Owner replay: 409. Foreign replay of the consumed token: still the same 404.
    let (status, v) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 409);
    assert_eq!(error_code(&v), "continuation_already_resolved");
    assert!(!v.to_string().contains("Tool result"));
    let foreign_consumed = gw.post(BOB, &next).send().await.unwrap();
    assert_eq!(foreign_consumed.status(), 404);
    assert_eq!(foreign_consumed.bytes().await.unwrap(), b2);
    assert_eq!(gw.spy_events("tool_result").len(), 1);
}

#[tokio::test]
async fn concurrent_claims_give_exactly_one_winner() {
    let gw = Gateway::start().await;
    let (req, resp) = suspend(&gw, ALICE, "tool").await;
    let next = continuation(&req, &resp, |_, _| json!("RACE"));
    let racers: Vec<_> = (0..4)
        .map(|i| {
            let mut body = next.clone();
            body["stream"] = json!(i % 2 == 0);
            gw.post(ALICE, &body).send()
        })
        .collect();
    let results = futures::future::join_all(racers).await;
    let mut statuses: Vec<u16> = results
        .iter()
        .map(|r| r.as_ref().unwrap().status().as_u16())
        .collect();
    statuses.sort();
    assert_eq!(statuses, [200, 409, 409, 409]);
    for r in results {
        let r = r.unwrap();
        if r.status() == 409 {
            assert!(r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/json"));
        }
        let _ = r.bytes().await;
    }
    assert_eq!(gw.spy_events("tool_result").len(), 1);
}

#[tokio::test]
async fn each_drift_is_400_and_consumes_nothing() {
    let gw = Gateway::start().await;
    let (req, resp) = suspend(&gw, ALICE, "tool").await;
    let good = continuation(&req, &resp, |_, _| json!("OK"));
    let id = calls(&resp)[0]["id"].as_str().unwrap().to_string();

    let mut drifts: Vec<(&str, Value)> = Vec::new();
    let mut d = good.clone();
    d["model"] = json!("echo");
    drifts.push(("model", d));
    let mut d = good.clone();
    d["tools"].as_array_mut().unwrap().pop();
    drifts.push(("tool removed", d));
    let mut d = good.clone();
    d["tools"][0]["function"]["description"] = json!("Read a file!");
    drifts.push(("tool description", d));
    let mut d = good.clone();
    d["tool_choice"] = json!("none");
    drifts.push(("tool_choice", d));
    let mut d = good.clone();
    d["messages"][0]["content"] = json!("please read /tmp/secret.txT");
    drifts.push(("prefix", d));
    let mut d = good.clone();
    d["messages"][1]["tool_calls"][0]["function"]["arguments"] =
        json!("{\"path\":\"/etc/shadow\"}");
    drifts.push(("echo arguments", d));
    let mut d = good.clone();
    d["messages"][1]["tool_calls"][0]["function"]["name"] = json!("list_dir");
    drifts.push(("echo name", d));
    let mut d = good.clone();
    d["messages"][1]["content"] = json!("I did it");
    drifts.push(("echo content", d));
    let mut d = good.clone();
    d["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "tool", "tool_call_id": id, "content": "again"}));
    drifts.push(("duplicate result", d));
    let mut d = good.clone();
    let stranger = format!("srct-{}", "a".repeat(32));
    d["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "tool", "tool_call_id": stranger, "content": "x"}));
    drifts.push(("extra result", d));
    let mut d = good.clone();
    d["messages"][2]["content"] = json!("x".repeat(5000));
    drifts.push(("result too large", d));

    for (what, body) in drifts {
        let (status, v) = gw.chat(ALICE, &body).await;
        assert_eq!(status, 400, "{what}: {v}");
        assert_eq!(error_code(&v), "continuation_mismatch", "{what}");
    }
    assert!(gw.spy_events("tool_result").is_empty());

    // Reordering the tool set and re-serialising the echo are not drift.
    let mut ok = good.clone();
    ok["tools"].as_array_mut().unwrap().reverse();
    ok["messages"][1]["tool_calls"][0]["function"]["arguments"] =
        json!("{ \"path\" : \"/tmp/secret.txt\" }");
    ok["messages"][1].as_object_mut().unwrap().remove("content");
    let (status, v) = gw.chat(ALICE, &ok).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(content(&v), "Tool result: OK");
    assert_eq!(gw.spy_events("tool_result").len(), 1);
}

#[tokio::test]
async fn malformed_ids_are_400_before_lookup() {
    let gw = Gateway::start().await;
    let (req, resp) = suspend(&gw, ALICE, "tool").await;
    let good = continuation(&req, &resp, |_, _| json!("OK"));
    let id = calls(&resp)[0]["id"].as_str().unwrap().to_string();
    for bad in [
        id[..36].to_string(),
        format!("{id}0"),
        id.to_uppercase().replacen("SRCT", "srct", 1),
        format!(" {id}"),
        id.replacen("srct-", "call_", 1),
        "call_abc".to_string(),
    ] {
        let body: Value = serde_json::from_str(&good.to_string().replace(&id, &bad)).unwrap();
        let (status, v) = gw.chat(ALICE, &body).await;
        assert_eq!(status, 400, "{bad}: {v}");
        assert_eq!(error_code(&v), "invalid_request", "{bad}");
    }
    let (status, _) = gw.chat(ALICE, &good).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn parallel_batch_partial_then_whole() {
    let gw = Gateway::start().await;
    let req = tool_request("parallel", "read a");
    let (status, resp) = gw.chat(ALICE, &req).await;
    assert_eq!(status, 200, "{resp}");
    let c = calls(&resp);
    assert_eq!(c.len(), 2, "{resp}");
    assert_ne!(c[0]["id"], c[1]["id"]);
    // Only one of two answered: mismatch, nothing consumed.
    let mut partial = continuation(&req, &resp, |i, _| json!(format!("out{i}")));
    partial["messages"].as_array_mut().unwrap().pop();
    let (status, v) = gw.chat(ALICE, &partial).await;
    assert_eq!(status, 400);
    assert_eq!(error_code(&v), "continuation_mismatch");
    assert!(gw.spy_events("tool_result").is_empty());
    // Answered in reverse order: fine.
    let mut whole = continuation(&req, &resp, |i, _| json!(format!("out{i}")));
    whole["messages"].as_array_mut().unwrap()[2..].reverse();
    let (status, v) = gw.chat(ALICE, &whole).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(content(&v), "Results: out0 | out1");
    assert_eq!(gw.spy_events("tool_result").len(), 2);
}

#[tokio::test]
async fn one_call_per_leg_when_parallel_tool_calls_is_false() {
    let gw = Gateway::start().await;
    let mut req = tool_request("parallel", "read a");
    req["parallel_tool_calls"] = json!(false);
    let (_, first) = gw.chat(ALICE, &req).await;
    assert_eq!(calls(&first).len(), 1, "{first}");
    let next = continuation(&req, &first, |_, _| json!("A"));
    let (status, second) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(calls(&second).len(), 1, "{second}");
    assert_ne!(calls(&second)[0]["id"], calls(&first)[0]["id"]);
    let last = continuation(&next, &second, |_, _| json!("B"));
    let (status, done) = gw.chat(ALICE, &last).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(content(&done), "Results: A | B");
}

#[tokio::test]
async fn three_rounds_then_a_follow_up_turn_with_consumed_ids_in_history() {
    let gw = Gateway::start().await;
    let mut req = tool_request("rounds3", "go");
    for round in 1..=3 {
        let (status, resp) = gw.chat(ALICE, &req).await;
        assert_eq!(status, 200, "{resp}");
        assert_eq!(calls(&resp).len(), 1, "round {round}: {resp}");
        req = continuation(&req, &resp, move |_, _| json!(format!("r{round}")));
    }
    let (status, done) = gw.chat(ALICE, &req).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(content(&done), "Done after 3 rounds: r1, r2, r3");
    assert_eq!(gw.spy_events("turn_start").len(), 1);

    // A new user turn whose history holds the consumed ids: a fresh turn, not a replay.
    let mut follow = req.clone();
    follow["model"] = json!("echo");
    follow["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": content(&done)}),
        user("thanks"),
    ]);
    let (status, v) = gw.chat(ALICE, &follow).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(content(&v), "You said: thanks");
    assert_eq!(gw.spy_events("turn_start").len(), 2);
    assert_eq!(gw.spy_events("tool_result").len(), 3);
}

#[tokio::test]
async fn tool_choice_none_declares_no_tools() {
    let gw = Gateway::start().await;
    let mut req = tool_request("tool", "x");
    req["tool_choice"] = json!("none");
    let (status, v) = gw.chat(ALICE, &req).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(content(&v), "No tools available.");
    assert_eq!(gw.thread_starts()[0]["dynamic_tools"], json!([]));
}

#[tokio::test]
async fn round_limit_stops_the_turn_without_exposing_a_token() {
    let gw = Gateway::start_with(Opts {
        max_rounds: 1,
        ..Opts::default()
    })
    .await;
    let req = tool_request("rounds3", "go");
    let (_, resp) = gw.chat(ALICE, &req).await;
    let next = continuation(&req, &resp, |_, _| json!("r1"));
    let (status, v) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(error_code(&v), "capacity_exhausted");
    gw.wait_spy("interrupt", 1).await;
}

#[tokio::test]
async fn per_client_pending_bound_is_429() {
    let gw = Gateway::start_with(Opts {
        max_pending_per_client: 1,
        ..Opts::default()
    })
    .await;
    let _held = suspend(&gw, ALICE, "tool").await;
    let (status, v) = gw.chat(ALICE, &tool_request("tool", "again")).await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(error_code(&v), "capacity_exhausted");
    assert!(v.to_string().find("srct-").is_none());
    // Another client is unaffected.
    let (status, _) = gw.chat(BOB, &tool_request("tool", "bob")).await;
    assert_eq!(status, 200);
}
