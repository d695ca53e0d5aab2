//! What only the Gemini API has (the rest of its contract is `contract.rs`): the model and
//! method in the path, the key as `x-goog-api-key` or `?key=`, the caller's models paged with
//! `pageSize`/`pageToken`, `countTokens`, streaming as SSE events or as one JSON array, calls
//! answered by `id` or by name and position, and results answered in any order. Every answer
//! is checked against the schemas derived from Google's protos.

use serde_json::{json, Value};

use crate::support::gemini::{self, answer, calls, request, text};
use crate::support::schema::{self, Wire};
use crate::support::*;

async fn get_as(gw: &Gateway, key: Option<&str>, path: &str) -> (u16, Value) {
    let mut r = gw.http.get(format!("{}{path}", gw.url));
    if let Some(k) = key {
        r = r.header("x-goog-api-key", k);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    if status != 200 {
        gemini::check_error(&v);
    }
    (status, v)
}

#[tokio::test]
async fn models_are_the_callers_paged_and_the_key_may_be_a_query_parameter() {
    let gw = Gateway::start_with(Opts {
        alice_models: r#"["echo", "tool", "parallel", "hang"]"#,
        ..Opts::default()
    })
    .await;
    let mut seen = Vec::new();
    let mut path = "/v1beta/models?pageSize=3".to_string();
    let mut pages = 0;
    loop {
        let (s, v) = get_as(&gw, Some(ALICE), &path).await;
        assert_eq!(s, 200, "{v}");
        schema::check(Wire::ListModelsResponse, &v);
        pages += 1;
        for m in v["models"].as_array().unwrap() {
            seen.push(m["name"].as_str().unwrap().to_string());
        }
        match v["nextPageToken"].as_str() {
            Some(t) => path = format!("/v1beta/models?pageSize=3&pageToken={t}"),
            None => break,
        }
    }
    assert_eq!(pages, 2);
    assert_eq!(
        seen,
        [
            "models/echo",
            "models/tool",
            "models/parallel",
            "models/hang"
        ]
    );
    // Carol sees only hers; a page token naming a model she cannot see is an empty page.
    let (_, v) = get_as(&gw, Some(CAROL), "/v1beta/models").await;
    assert_eq!(v["models"].as_array().unwrap().len(), 1, "{v}");
    let token = &path["/v1beta/models?pageSize=3&pageToken=".len()..];
    let (s, v) = get_as(
        &gw,
        Some(CAROL),
        &format!("/v1beta/models?pageToken={token}"),
    )
    .await;
    assert_eq!((s, v["models"].as_array().map(Vec::len)), (200, Some(0)));
    let (s, v) = get_as(&gw, Some(ALICE), "/v1beta/models?pageSize=1001").await;
    assert_eq!(
        (s, v["error"]["status"].as_str()),
        (400, Some("INVALID_ARGUMENT"))
    );
    let (s, v) = get_as(&gw, Some(ALICE), "/v1beta/models?pageToken=%25").await;
    assert_eq!(s, 400, "{v}");

    // One model: hers, or Google's 404 (as for one that does not exist).
    let (s, v) = get_as(&gw, Some(ALICE), "/v1beta/models/tool").await;
    assert_eq!(s, 200, "{v}");
    schema::check(Wire::GoogleModel, &v);
    assert_eq!(v["name"], "models/tool");
    let (s, hidden) = get_as(&gw, Some(CAROL), "/v1beta/models/tool").await;
    let (s2, unknown) = get_as(&gw, Some(CAROL), "/v1beta/models/nope").await;
    assert_eq!((s, s2), (404, 404));
    assert_eq!(hidden["error"]["status"], "NOT_FOUND");
    let msg = |v: &Value, n: &str| v["error"]["message"].as_str().unwrap().replace(n, "X");
    assert_eq!(msg(&hidden, "tool"), msg(&unknown, "nope"));

    // The key as `?key=`; none, or a wrong one, is Google's 401.
    let (s, v) = get_as(&gw, None, &format!("/v1beta/models?key={ALICE}")).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = get_as(&gw, None, "/v1beta/models").await;
    assert_eq!(
        (s, v["error"]["status"].as_str()),
        (401, Some("UNAUTHENTICATED"))
    );
    let url = format!(
        "{}/v1beta/models/echo:generateContent?key=sk-nobody",
        gw.url
    );
    let r = gw
        .http
        .post(url)
        .json(&gemini::plain("echo", "hi", false))
        .send()
        .await;
    let v: Value = r.unwrap().json().await.unwrap();
    assert_eq!(gemini::code(&v), "invalid_api_key");
    // An unknown method or route under /v1beta: Google's 404.
    let (s, v) = gemini::create(
        &gw,
        ALICE,
        &json!({"model": "echo:embedContent",
        "contents": [{"parts": [{"text": "x"}]}]}),
    )
    .await;
    assert_eq!((s, v["error"]["status"].as_str()), (404, Some("NOT_FOUND")));
    let (s, _) = get_as(&gw, Some(ALICE), "/v1beta/files").await;
    assert_eq!(s, 404);
    // The key never reaches the log.
    assert!(!gw.log().contains(ALICE));
}

#[tokio::test]
async fn count_tokens_estimates_for_a_model_the_caller_may_use() {
    let gw = Gateway::start().await;
    let count = |key: &'static str, model: &'static str, body: Value| {
        let gw = &gw;
        async move {
            let url = format!("{}/v1beta/models/{model}:countTokens", gw.url);
            let r = gw.http.post(url).header("x-goog-api-key", key).json(&body);
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let contents = json!([{"role": "user", "parts": [{"text": "twelve bytes"}]}]);
    let (s, v) = count(ALICE, "echo", json!({"contents": contents})).await;
    assert_eq!(s, 200, "{v}");
    schema::check(Wire::CountTokensResponse, &v);
    assert_eq!(v["totalTokens"], 6);
    let wrapped = json!({"generateContentRequest": {"model": "models/echo", "contents": contents}});
    assert_eq!(count(ALICE, "echo", wrapped).await.1["totalTokens"], 6);
    let (s, v) = count(CAROL, "tool", json!({"contents": contents})).await;
    assert_eq!((s, v["error"]["status"].as_str()), (404, Some("NOT_FOUND")));
}

#[tokio::test]
async fn a_streamed_held_turn_resumes_by_id_or_by_name_and_position() {
    let gw = Gateway::start().await;
    let req = request("parallel", "read /a and /b");
    let (s, events, resp) = gemini::stream(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    assert!(!events.is_empty());
    let held = calls(&resp);
    assert_eq!(held.len(), 2, "{resp}");
    for c in &held {
        assert!(messages::is_token(&c["id"]), "{c}");
    }
    assert_eq!(resp["candidates"][0]["finishReason"], "STOP");
    assert!(resp["usageMetadata"]["totalTokenCount"].is_u64(), "{resp}");

    // The responses in the other order, by id.
    let mut next = answer(&req, &resp, |i, _| json!(format!("R{i}")));
    let parts = next["contents"][2]["parts"].as_array_mut().unwrap();
    parts.reverse();
    let (s, _, done) = gemini::stream(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{done}");
    assert!(
        text(&done).contains("R0") && text(&done).contains("R1"),
        "{done}"
    );

    // Without ids: each response answers the next call of its name.
    let req = request("parallel", "read /c and /d");
    let (_, resp) = gemini::create(&gw, ALICE, &req).await;
    let mut next = answer(&req, &resp, |i, _| json!(format!("S{i}")));
    for p in next["contents"][2]["parts"].as_array_mut().unwrap() {
        p["functionResponse"].as_object_mut().unwrap().remove("id");
    }
    let (s, done) = gemini::create(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{done}");
    let results = gw.spy_events("tool_result");
    let texts: Vec<&str> = results.iter().filter_map(|e| e["text"].as_str()).collect();
    assert!(texts.contains(&"S0") && texts.contains(&"S1"), "{texts:?}");
    // A replay is Google's 409, with the stable code.
    let (s, v) = gemini::create(&gw, ALICE, &next).await;
    assert_eq!((s, v["error"]["status"].as_str()), (409, Some("ABORTED")));
    assert_eq!(gemini::code(&v), "continuation_already_resolved");
}

#[tokio::test]
async fn a_stream_without_alt_sse_is_one_json_array() {
    let gw = Gateway::start().await;
    let url = format!("{}/v1beta/models/echo:streamGenerateContent", gw.url);
    let r = gw
        .http
        .post(url)
        .header("x-goog-api-key", ALICE)
        .json(&gemini::plain("echo", "hello there", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    let items: Vec<Value> = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    for item in &items {
        schema::check(Wire::GenerateContentResponse, item);
    }
    let said: String = items.iter().map(text).collect();
    assert_eq!(said, "You said: hello there");
    assert_eq!(
        items.last().unwrap()["candidates"][0]["finishReason"],
        "STOP"
    );
}

#[tokio::test]
async fn thoughts_are_shown_only_when_asked_for() {
    let gw = Gateway::start().await;
    let mut body = gemini::plain("reasoning", "ponder", false);
    let (s, v) = gemini::create(&gw, ALICE, &body).await;
    assert_eq!(s, 200, "{v}");
    let parts = v["candidates"][0]["content"]["parts"].as_array().unwrap();
    assert!(parts.iter().all(|p| p.get("thought").is_none()), "{v}");
    body["generationConfig"] = json!({"thinkingConfig": {"includeThoughts": true}});
    let (_, _, v) = gemini::stream(&gw, ALICE, &body).await;
    let parts = v["candidates"][0]["content"]["parts"].as_array().unwrap();
    let thought: String = (parts.iter())
        .filter(|p| p["thought"] == true)
        .filter_map(|p| p["text"].as_str())
        .collect();
    assert!(thought.starts_with("Thinking about: "), "{v}");
}
