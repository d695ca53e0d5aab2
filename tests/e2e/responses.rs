//! `POST /v1/responses` against the demo backend and the in-test fake upstream: plain answers
//! (strict event order), function, custom and namespaced tool round trips in both client
//! styles (the full `input` again, or `previous_response_id` and the outputs), parallel calls,
//! three rounds, the rejection matrix, and endings (expiry, crash, disconnect).

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::fake_upstream::FakeUpstream;
use crate::support::*;

async fn post(gw: &Gateway, key: &str, body: &Value) -> reqwest::Response {
    gw.http
        .post(format!("{}/v1/responses", gw.url))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("send")
}

/// Non-streaming: status and body.
async fn create(gw: &Gateway, key: &str, body: &Value) -> (u16, Value) {
    let (status, text) = create_text(gw, key, body).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON {text}")),
    )
}

async fn create_text(gw: &Gateway, key: &str, body: &Value) -> (u16, String) {
    let r = post(gw, key, body).await;
    (r.status().as_u16(), r.text().await.expect("body"))
}

/// Streaming: the status and the events, checked strictly: each has an `event:` line naming
/// its type and the next `sequence_number`, and the stream ends with exactly one terminal event.
async fn stream(gw: &Gateway, key: &str, body: &Value) -> (u16, Vec<Value>) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = post(gw, key, &body).await;
    let status = r.status().as_u16();
    if status != 200 {
        return (
            status,
            vec![serde_json::from_str(&r.text().await.unwrap()).unwrap()],
        );
    }
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        if block.lines().all(|l| l.starts_with(':')) {
            continue;
        }
        let name = block.lines().find_map(|l| l.strip_prefix("event: "));
        let data = block
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap();
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(name, v["type"].as_str(), "{block}");
        assert_eq!(v["sequence_number"], events.len() as u64, "{text}");
        assert!(v.get("error").is_none() || v["type"] == "error", "{v}");
        events.push(v);
    }
    let terminal = events
        .iter()
        .filter(|e| {
            matches!(
                e["type"].as_str(),
                Some("response.completed" | "response.failed" | "response.incomplete")
            )
        })
        .count();
    assert_eq!(terminal, 1, "{text}");
    (status, events)
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// The final response object of a stream.
fn last_response(events: &[Value]) -> Value {
    events.last().unwrap()["response"].clone()
}

fn read_tool() -> Value {
    json!({"type": "function", "name": "read_file", "description": "Read a file", "strict": false,
           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}})
}

fn patch_tool() -> Value {
    json!({"type": "custom", "name": "apply_patch", "description": "Apply a patch",
           "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}})
}

fn tools() -> Value {
    json!([read_tool(), patch_tool(),
           {"type": "namespace", "name": "fs", "description": "files", "tools": [
               {"type": "function", "name": "stat", "parameters": {"type": "object", "properties": {"p": {"type": "string"}}}}]},
           {"type": "web_search"}])
}

fn request(model: &str, prompt: &str) -> Value {
    json!({"model": model, "store": false, "tools": tools(), "tool_choice": "auto",
           "parallel_tool_calls": true, "reasoning": {"effort": "low", "summary": "auto"},
           "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
           "client_metadata": {"session_id": "s"},
           "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be useful"}]},
                     {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}]})
}

fn calls(resp: &Value) -> Vec<Value> {
    resp["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] != "message")
        .cloned()
        .collect()
}

fn text(resp: &Value) -> String {
    resp["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|m| m["content"].as_array().unwrap().clone())
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect()
}

fn output_for(call: &Value, result: &str) -> Value {
    let kind = if call["type"] == "custom_tool_call" {
        "custom_tool_call_output"
    } else {
        "function_call_output"
    };
    json!({"type": kind, "call_id": call["call_id"], "output": result})
}

/// The stateless continuation: everything sent, the response's items echoed, the outputs.
fn stateless(req: &Value, resp: &Value, result: impl Fn(usize, &Value) -> String) -> Value {
    let mut next = req.clone();
    let input = next["input"].as_array_mut().unwrap();
    input.push(json!({"type": "reasoning", "id": "rs_1", "summary": []}));
    input.extend(resp["output"].as_array().unwrap().iter().cloned());
    for (i, c) in calls(resp).iter().enumerate() {
        input.push(output_for(c, &result(i, c)));
    }
    next
}

/// The stateful continuation: the response's id and only the outputs.
fn stateful(req: &Value, resp: &Value, result: impl Fn(usize, &Value) -> String) -> Value {
    let mut next = req.clone();
    next["previous_response_id"] = resp["id"].clone();
    next["input"] = calls(resp)
        .iter()
        .enumerate()
        .map(|(i, c)| output_for(c, &result(i, c)))
        .collect();
    next
}

fn is_token(id: &Value) -> bool {
    let id = id.as_str().unwrap_or_default();
    id.len() == 37 && id.starts_with("srct-")
}

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
    assert_eq!(text(&v), "You said: hello");
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
    assert_eq!(text(&done), deltas);
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
        let c = calls(&resp);
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
        assert_eq!(text(&done), format!("Tool result: HOST-{style}"), "{style}");
        assert_eq!(done["id"], resp["id"], "one execution across legs");
        assert!(calls(&done).is_empty());
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
        let c = calls(&resp);
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
        assert_eq!(text(&done), "Tool result: patched");
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
    let c = calls(&resp);
    assert_eq!(
        (c[0]["name"].as_str(), c[0]["namespace"].as_str()),
        (Some("stat"), Some("fs")),
        "{resp}"
    );
    let (s, done) = create(&gw, ALICE, &stateless(&req, &resp, |_, _| "dir".into())).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(text(&done), "Tool result: dir");
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
    let c = calls(&resp);
    assert_eq!(c[0]["name"], "request_user_input", "{resp}");
    let declared = gw.thread_starts()[0]["dynamic_tools"].clone();
    assert_eq!(declared, json!(["client_request_user_input"]));
    let (s, done) = create(&gw, ALICE, &stateless(&req, &resp, |_, _| "42".into())).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(text(&done), "Tool result: 42");
}

#[tokio::test]
async fn parallel_calls_and_three_rounds_mixing_styles() {
    let gw = Gateway::start().await;
    let req = request("parallel", "read /a");
    let (_, resp) = create(&gw, ALICE, &req).await;
    let c = calls(&resp);
    assert_eq!(c.len(), 2, "{resp}");
    assert_ne!(c[0]["call_id"], c[1]["call_id"]);
    // Outputs in the other order are fine.
    let mut next = stateless(&req, &resp, |i, _| format!("r{i}"));
    let input = next["input"].as_array_mut().unwrap();
    let n = input.len();
    input.swap(n - 1, n - 2);
    let (s, done) = create(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(text(&done), "Results: r0 | r1");

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
    assert_eq!(text(&done), "Done after 3 rounds: one, two, three");
    assert_eq!(done["id"], r1["id"]);
}

#[tokio::test]
async fn the_rejection_matrix_consumes_nothing() {
    let gw = Gateway::start().await;
    let req = request("tool", "read /m");
    let (_, resp) = create(&gw, ALICE, &req).await;
    let next = stateless(&req, &resp, |_, _| "R".into());
    let by_ref = stateful(&req, &resp, |_, _| "R".into());

    // Foreign token, foreign response id, unknown token: one 404 body.
    let (s, foreign) = create_text(&gw, BOB, &next).await;
    assert_eq!(s, 404, "{foreign}");
    let (s, foreign_ref) = create_text(&gw, BOB, &by_ref).await;
    assert_eq!(s, 404);
    assert_eq!(foreign, foreign_ref);
    let token = calls(&resp)[0]["call_id"].as_str().unwrap().to_string();
    let unknown: Value = serde_json::from_str(
        &next
            .to_string()
            .replace(&token, "srct-00000000000000000000000000000000"),
    )
    .unwrap();
    assert_eq!(
        create_text(&gw, ALICE, &unknown).await,
        (404, foreign.clone())
    );
    let mut wrong_ref = by_ref.clone();
    wrong_ref["previous_response_id"] = json!("resp_0123456789abcdef");
    assert_eq!(
        create_text(&gw, ALICE, &wrong_ref).await,
        (404, foreign.clone())
    );
    let v: Value = serde_json::from_str(&foreign).unwrap();
    assert_eq!(error_code(&v), "continuation_not_found");
    assert_eq!(v["error"]["param"], "input");

    // Drift of each kind: 400, nothing consumed.
    let mut drifts = Vec::new();
    let mut d = next.clone();
    d["input"][1]["content"][0]["text"] = json!("read /m!");
    drifts.push(d);
    let mut d = next.clone();
    d["reasoning"]["effort"] = json!("high");
    drifts.push(d);
    let mut d = by_ref.clone();
    d["tools"] = json!([read_tool()]);
    drifts.push(d);
    let mut d = next.clone();
    let echoed = d["input"].as_array().unwrap().len() - 2;
    d["input"][echoed]["arguments"] = json!(r#"{"path":"/elsewhere"}"#);
    drifts.push(d);
    for d in &drifts {
        let (s, v) = create(&gw, ALICE, d).await;
        assert_eq!(
            (s, error_code(&v)),
            (400, "continuation_mismatch".into()),
            "{d}"
        );
    }
    // A malformed id is 400 before any lookup.
    let bad: Value = serde_json::from_str(&next.to_string().replace(&token, "srct-xyz")).unwrap();
    assert_eq!(create(&gw, ALICE, &bad).await.0, 400);
    // A reference without outputs (a finished conversation's continuity) is refused.
    let mut more = by_ref.clone();
    more["input"] = json!("and then?");
    let (s, v) = create(&gw, ALICE, &more).await;
    assert_eq!((s, error_code(&v)), (400, "invalid_request".into()), "{v}");

    let (s, done) = create(&gw, ALICE, &by_ref).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(text(&done), "Tool result: R");
    // Replays, in either style: 409.
    for replay in [&next, &by_ref] {
        let (s, v) = create(&gw, ALICE, replay).await;
        assert_eq!(
            (s, error_code(&v)),
            (409, "continuation_already_resolved".into())
        );
    }
    // A token from the chat surface is a mismatch here.
    let chat_req = tool_request("tool", "read /c");
    let (_, chat_resp) = gw.chat(ALICE, &chat_req).await;
    let chat_token = crate::support::calls(&chat_resp)[0]["id"].clone();
    let mut cross = next.clone();
    let n = cross["input"].as_array().unwrap().len();
    cross["input"][n - 2]["call_id"] = chat_token.clone();
    cross["input"][n - 1]["call_id"] = chat_token;
    let (s, v) = create(&gw, ALICE, &cross).await;
    assert_eq!(
        (s, error_code(&v)),
        (400, "continuation_mismatch".into()),
        "{v}"
    );
}

#[tokio::test]
async fn expiry_and_crash_are_410() {
    let gw = Gateway::start_with(Opts {
        execution_ttl_seconds: 1,
        ..Opts::default()
    })
    .await;
    let req = request("tool", "read /e");
    let (_, resp) = create(&gw, ALICE, &req).await;
    gw.wait_spy("interrupt", 1).await;
    let (s, v) = create(&gw, ALICE, &stateful(&req, &resp, |_, _| "late".into())).await;
    assert_eq!(
        (s, error_code(&v)),
        (410, "continuation_expired".into()),
        "{v}"
    );

    let gw = Gateway::start().await;
    let (_, resp) = create(&gw, ALICE, &req).await;
    let pid = gw.spy_events("started")[0]["pid"].as_u64().unwrap();
    assert!(std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    wait_until("killed child reaped", || !pid_alive(pid)).await;
    let (s, v) = create(&gw, ALICE, &stateless(&req, &resp, |_, _| "R".into())).await;
    assert_eq!(
        (s, error_code(&v)),
        (410, "continuation_lost".into()),
        "{v}"
    );
}

#[tokio::test]
async fn client_disconnect_interrupts_the_held_turn_and_keepalives_flow() {
    let gw = Gateway::start().await;
    let mut r = post(
        &gw,
        ALICE,
        &json!({"model": "hang", "stream": true, "input": "x"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let mut seen = String::new();
    while !seen.contains(": keep-alive") {
        let c = tokio::time::timeout(Duration::from_secs(10), r.chunk())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(seen.starts_with("event: response.created\n"), "{seen}");
    drop(r);
    gw.wait_spy("interrupt", 1).await;
}

#[tokio::test]
async fn errors_are_openai_shaped_real_statuses() {
    let gw = Gateway::start().await;
    let (s, v) = create(&gw, "sk-nobody", &json!({"model": "echo", "input": "x"})).await;
    assert_eq!((s, error_code(&v)), (401, "invalid_api_key".into()));
    let (s, v) = create(&gw, ALICE, &json!({"model": "nope", "input": "x"})).await;
    assert_eq!((s, error_code(&v)), (404, "model_not_found".into()));
    let (s, v) = create(&gw, CAROL, &json!({"model": "tool", "input": "x"})).await;
    assert_eq!((s, error_code(&v)), (404, "model_not_found".into()));
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

// ---- the same surface on a stateless Chat Completions upstream ----

const UPSTREAM_MODELS: &[(&str, &str)] = &[
    ("u-echo", "up-echo"),
    ("u-tool", "up-tool"),
    ("u-parallel", "up-parallel"),
    ("u-custom", "up-custom"),
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
    let mut req = json!({"model": "u-echo", "input": "hello", "instructions": "be brief",
        "max_output_tokens": 50, "temperature": 0.2});
    let (s, v) = create(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(text(&v), "echo: hello");
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
    assert_eq!(text(&last_response(&ev)), "echo: hello");
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
            read_tool(),
            patch_tool(),
            {"type": "function", "name": "list_dir", "parameters": {"type": "object"}}
        ]);
        let (s, ev) = stream(&gw, ALICE, &req).await;
        assert_eq!(s, 200, "{ev:?}");
        let resp = last_response(&ev);
        let c = calls(&resp);
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
        assert_eq!(text(&done), "Results: call_up_1=FILE", "{model} {style}");
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
    req["tools"] = json!([read_tool(), {"type": "function", "name": "list_dir", "parameters": {"type": "object"}}]);
    let (s, resp) = create(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    assert_eq!(calls(&resp).len(), 2);
    let by_ref = stateful(&req, &resp, |i, _| format!("R{i}"));
    let (s, v) = create(&gw, BOB, &by_ref).await;
    assert_eq!((s, error_code(&v)), (404, "continuation_not_found".into()));
    let (s, done) = create(&gw, ALICE, &by_ref).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(text(&done), "Results: call_up_1=R0, call_up_2=R1");
}
