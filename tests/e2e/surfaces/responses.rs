//! `POST /v1/responses` against the demo backend: plain answers (strict event order),
//! function, custom and namespaced tool round trips in both client styles (the full `input`
//! again, or `previous_response_id` and the outputs), parallel calls, three rounds, and what a
//! reference adds to the surface contract's rejection matrix (`contract.rs`, with the
//! endings). `responses_upstream.rs` runs the
//! same surface on a stateless upstream.

use serde_json::{json, Value};

use crate::support::responses::*;
use crate::support::*;

#[tokio::test]
async fn plain_answer_non_streaming_and_streaming_in_strict_order() {
    let gw = Gateway::start().await;
    let (s, v) = create(&gw, ALICE, &json!({"model": "echo", "input": "hello"})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["model"], "echo");
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    assert!(v["created_at"].is_u64());
    assert_eq!(response_text(&v), "You said: hello");
    assert_eq!(v["output"][0]["role"], "assistant");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    for k in ["input_tokens", "output_tokens", "total_tokens"] {
        assert!(v["usage"][k].is_u64(), "{v}");
    }
    assert!(v["usage"]["input_tokens_details"]["cached_tokens"].is_u64());
    assert_eq!(v["parallel_tool_calls"], true);
    assert_eq!(v["tool_choice"], "auto");
    assert_eq!(v["tools"], json!([]));

    let (s, ev) = stream(&gw, ALICE, &request("echo", "hi there")).await;
    assert_eq!(s, 200);
    let k = kinds(&ev);
    assert_eq!(
        k[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        k[k.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    assert!(k[4..k.len() - 4]
        .iter()
        .all(|k| *k == "response.output_text.delta"));
    assert_eq!(ev[0]["response"]["status"], "in_progress");
    assert_eq!(ev[0]["response"]["output"], json!([]));
    let ids: Vec<&Value> = ev
        .iter()
        .map(|e| &e["response"]["id"])
        .filter(|i| !i.is_null())
        .collect();
    assert!(ids.iter().all(|i| *i == ids[0]));
    let deltas: String = ev.iter().filter_map(|e| e["delta"].as_str()).collect();
    assert_eq!(deltas, "You said: hi there");
    let done = last_response(&ev);
    assert_eq!(response_text(&done), deltas);
    assert_eq!(done["status"], "completed");
    // The request's own fields are echoed.
    assert_eq!(done["store"], false);
    assert_eq!(done["reasoning"]["effort"], "low");
    assert_eq!(done["tools"], tools());
}

#[tokio::test]
async fn function_round_trip_in_both_styles() {
    let gw = Gateway::start().await;
    for style in ["stateless", "stateful"] {
        let req = request("tool", "please read /etc/hostname");
        let (s, ev) = stream(&gw, ALICE, &req).await;
        assert_eq!(s, 200);
        let resp = last_response(&ev);
        let c = response_calls(&resp);
        assert_eq!(c.len(), 1, "{resp}");
        assert_eq!(c[0]["type"], "function_call");
        assert_eq!(c[0]["name"], "read_file");
        assert!(is_token(&c[0]["call_id"]), "{c:?}");
        assert_eq!(c[0]["arguments"], r#"{"path":"/etc/hostname"}"#);
        // The call arrives complete in output_item.done, after its argument events.
        let k = kinds(&ev);
        let done_at = k
            .iter()
            .rposition(|k| *k == "response.output_item.done")
            .unwrap();
        assert_eq!(ev[done_at]["item"], c[0]);
        assert_eq!(k[done_at - 1], "response.function_call_arguments.done");
        assert_eq!(k[done_at - 2], "response.function_call_arguments.delta");
        let next = match style {
            "stateless" => stateless(&req, &resp, |_, _| format!("HOST-{style}")),
            _ => stateful(&req, &resp, |_, _| format!("HOST-{style}")),
        };
        let (s, ev) = stream(&gw, ALICE, &next).await;
        assert_eq!(s, 200, "{style}: {ev:?}");
        let done = last_response(&ev);
        assert_eq!(
            response_text(&done),
            format!("Tool result: HOST-{style}"),
            "{style}"
        );
        assert_eq!(done["id"], resp["id"], "one execution across legs");
        assert!(response_calls(&done).is_empty());
    }
    let results = gw.spy_events("tool_result");
    assert_eq!(results.len(), 2);
    assert_eq!(results[1]["text"], "HOST-stateful");
}

#[tokio::test]
async fn custom_and_namespaced_tools_keep_their_identity() {
    let gw = Gateway::start().await;
    for style in ["stateless", "stateful"] {
        let req = request("tool", "tool=apply_patch arg=***PATCH**");
        let (s, resp) = create(&gw, ALICE, &req).await;
        assert_eq!(s, 200, "{resp}");
        let c = response_calls(&resp);
        assert_eq!(c[0]["type"], "custom_tool_call", "{resp}");
        assert_eq!(c[0]["name"], "apply_patch");
        assert_eq!(c[0]["input"], "***PATCH**");
        assert!(c[0].get("arguments").is_none());
        let next = match style {
            "stateless" => stateless(&req, &resp, |_, _| "patched".into()),
            _ => stateful(&req, &resp, |_, _| "patched".into()),
        };
        let (s, done) = create(&gw, ALICE, &next).await;
        assert_eq!(s, 200, "{style}: {done}");
        assert_eq!(response_text(&done), "Tool result: patched");
    }
    // The backend saw the custom tool as a function with one string, the namespace flattened.
    let start = &gw.thread_starts()[0];
    let declared = start["dynamic_tools"].to_string();
    assert!(
        declared.contains("apply_patch") && declared.contains("fs__stat"),
        "{start}"
    );
    assert!(!declared.contains("web_search"), "{start}");

    let req = request("tool", "tool=fs__stat arg=/tmp");
    let (_, resp) = create(&gw, ALICE, &req).await;
    let c = response_calls(&resp);
    assert_eq!(
        (c[0]["name"].as_str(), c[0]["namespace"].as_str()),
        (Some("stat"), Some("fs")),
        "{resp}"
    );
    let (s, done) = create(&gw, ALICE, &stateless(&req, &resp, |_, _| "dir".into())).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(response_text(&done), "Tool result: dir");
}

#[tokio::test]
async fn a_tool_named_like_a_backend_built_in_is_mapped_not_refused() {
    let gw = Gateway::start().await;
    // The demo backend calls the tool under the name it was declared with.
    let mut req = request("tool", "tool=client_request_user_input arg=why");
    req["tools"] = json!([{"type": "function", "name": "request_user_input",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}]);
    let (s, resp) = create(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    let c = response_calls(&resp);
    assert_eq!(c[0]["name"], "request_user_input", "{resp}");
    let declared = gw.thread_starts()[0]["dynamic_tools"].clone();
    assert_eq!(declared, json!(["client_request_user_input"]));
    let (s, done) = create(&gw, ALICE, &stateless(&req, &resp, |_, _| "42".into())).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(response_text(&done), "Tool result: 42");
}

#[tokio::test]
async fn parallel_calls_and_three_rounds_mixing_styles() {
    let gw = Gateway::start().await;
    let req = request("parallel", "read /a");
    let (_, resp) = create(&gw, ALICE, &req).await;
    let c = response_calls(&resp);
    assert_eq!(c.len(), 2, "{resp}");
    assert_ne!(c[0]["call_id"], c[1]["call_id"]);
    // Outputs in the other order are fine.
    let mut next = stateless(&req, &resp, |i, _| format!("r{i}"));
    let input = next["input"].as_array_mut().unwrap();
    let n = input.len();
    input.swap(n - 1, n - 2);
    let (s, done) = create(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(response_text(&done), "Results: r0 | r1");

    // Round 1 by reference, round 2 in full, round 3 by reference again.
    let req = request("rounds3", "read /r");
    let (_, r1) = create(&gw, ALICE, &req).await;
    let n1 = stateful(&req, &r1, |_, _| "one".into());
    let (s, r2) = create(&gw, ALICE, &n1).await;
    assert_eq!(s, 200, "{r2}");
    // The full conversation after a round by reference: what the client saw, in order.
    let mut full = stateless(&req, &r1, |_, _| "one".into());
    full = stateless(&full, &r2, |_, _| "two".into());
    let (s, r3) = create(&gw, ALICE, &full).await;
    assert_eq!(s, 200, "{r3}");
    let (s, done) = create(&gw, ALICE, &stateful(&req, &r3, |_, _| "three".into())).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(response_text(&done), "Done after 3 rounds: one, two, three");
    assert_eq!(done["id"], r1["id"]);
}

/// Beside the surface contract's matrix (`contract.rs`), for a continuation by reference
/// (`previous_response_id` and the outputs): another principal's response id and an unknown
/// one are the same 404 body as a foreign token; its tools drift is 400; a reference without
/// outputs to a response that has not completed is 404; a replay in either style is 409.
#[tokio::test]
async fn a_reference_is_checked_like_a_token() {
    let gw = Gateway::start().await;
    let req = request("tool", "read /m");
    let (_, resp) = create(&gw, ALICE, &req).await;
    let next = stateless(&req, &resp, |_, _| "R".into());
    let by_ref = stateful(&req, &resp, |_, _| "R".into());
    let (s, foreign) = create_text(&gw, BOB, &next).await;
    assert_eq!(s, 404, "{foreign}");
    let (s, foreign_ref) = create_text(&gw, BOB, &by_ref).await;
    assert_eq!(s, 404);
    assert_eq!(foreign, foreign_ref);
    let mut wrong_ref = by_ref.clone();
    wrong_ref["previous_response_id"] = json!("resp_0123456789abcdef");
    assert_eq!(
        create_text(&gw, ALICE, &wrong_ref).await,
        (404, foreign.clone())
    );
    let mut d = by_ref.clone();
    d["tools"] = json!([read_file_tool()]);
    let (s, v) = create(&gw, ALICE, &d).await;
    assert_eq!(
        (s, error_code(&v)),
        (400, "continuation_mismatch".into()),
        "{v}"
    );
    let mut more = by_ref.clone();
    more["input"] = json!("and then?");
    let (s, v) = create(&gw, ALICE, &more).await;
    assert_eq!(
        (s, error_code(&v)),
        (404, "continuation_not_found".into()),
        "{v}"
    );
    assert_eq!(v["error"]["param"], "previous_response_id");
    let (s, done) = create(&gw, ALICE, &by_ref).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(response_text(&done), "Tool result: R");
    for replay in [&next, &by_ref] {
        let (s, v) = create(&gw, ALICE, replay).await;
        assert_eq!(
            (s, error_code(&v)),
            (409, "continuation_already_resolved".into())
        );
    }
}

#[tokio::test]
async fn errors_are_openai_shaped_real_statuses() {
    let gw = Gateway::start().await;
    // Keys and models are the surface contract's (`contract.rs`).
    let (s, v) = create(&gw, ALICE, &json!({"model": "echo", "input": []})).await;
    assert_eq!((s, error_code(&v)), (400, "invalid_request".into()), "{v}");
    let mut forced = request("tool", "x");
    forced["tool_choice"] = json!({"type": "web_search"});
    let (s, v) = create(&gw, ALICE, &forced).await;
    assert_eq!(
        (s, error_code(&v)),
        (400, "unsupported_tool_choice".into()),
        "{v}"
    );
    let (s, ev) = stream(&gw, ALICE, &json!({"model": "fail", "input": "x"})).await;
    // A model failure after the stream started fails the response.
    if s == 200 {
        let last = ev.last().unwrap();
        assert_eq!(last["type"], "response.failed", "{ev:?}");
        assert_eq!(last["response"]["status"], "failed");
    } else {
        assert_eq!(s, 502);
    }
}
