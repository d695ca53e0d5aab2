//! Remote compaction over HTTP: a `compaction_trigger` runs one summary turn on a fresh thread
//! and answers exactly one `compaction` item whose handle a later request carries back in
//! place of the conversation; `POST /v1/responses/compact`; the handle is the caller's only,
//! survives a restart, and an unknown one reads as an unknown response.

use serde_json::{json, Value};

use crate::support::{responses, *};

fn conversation() -> Vec<Value> {
    vec![
        json!({"type": "message", "role": "developer", "content": "be useful",
               "internal_chat_message_metadata_passthrough": {"turn_id": "t1"}}),
        json!({"type": "message", "role": "user", "content": "first question"}),
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "You said: first question"}]}),
    ]
}

/// The backend saw `text` in a turn's input or a thread's instructions.
fn backend_saw(gw: &Gateway, text: &str) -> bool {
    gw.spy()
        .iter()
        .filter(|e| e["event"] == "turn_start" || e["event"] == "thread_start")
        .any(|e| e.to_string().contains(text))
}

#[tokio::test]
async fn a_compaction_trigger_answers_one_item_whose_handle_stands_for_the_conversation() {
    let mut gw = Gateway::start().await;
    let mut input = conversation();
    input.push(json!({"type": "compaction_trigger"}));
    let (s, r) = responses::create(&gw, ALICE, &json!({"model": "echo", "input": input})).await;
    assert_eq!(s, 200, "{r}");
    let output = r["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{r}");
    let item = &output[0];
    assert_eq!(item["type"], "compaction", "{r}");
    let handle = item["encrypted_content"].as_str().unwrap().to_string();
    assert!(handle.starts_with("cmp-") && handle.len() == 36, "{handle}");
    assert!(r["usage"]["total_tokens"].as_u64() > Some(0), "{r}");
    // The summary turn saw the conversation as a transcript and ran on a thread of its own.
    assert!(backend_saw(&gw, "You are compacting a conversation"));
    assert!(backend_saw(&gw, "first question"));

    // The streamed form: exactly one compaction item, then completed.
    let mut again = conversation();
    again.push(json!({"type": "compaction_trigger"}));
    let (_, events) =
        responses::stream(&gw, ALICE, &json!({"model": "echo", "input": again})).await;
    let done = responses::last_response(&events);
    assert_eq!(done["output"].as_array().map(Vec::len), Some(1), "{done}");
    assert_eq!(done["output"][0]["type"], "compaction");

    // The next turn carries the item in place of the earlier conversation, after a restart.
    assert_eq!(gw.stop().await, Some(0));
    gw.spawn().await;
    let next = json!({"model": "echo", "input": [
        {"type": "message", "role": "user", "content": "first question"},
        item,
        {"type": "message", "role": "user", "content": "second question"}]});
    let (s, r) = responses::create(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(responses::response_text(&r), "You said: second question");
    assert!(backend_saw(
        &gw,
        "Summary of the earlier conversation (compacted)"
    ));

    // Another client's request with the same item, and an unknown handle: the body of an
    // unknown response.
    let (s, foreign) = responses::create(&gw, BOB, &next).await;
    assert_eq!(s, 404, "{foreign}");
    assert_eq!(foreign["error"]["code"], "continuation_not_found");
    let mut forged = next.clone();
    forged["input"][1]["encrypted_content"] = json!("cmp-00000000000000000000000000000000");
    let (s, unknown) = responses::create(&gw, ALICE, &forged).await;
    assert_eq!((s, &unknown), (404, &foreign));
}

#[tokio::test]
async fn the_compact_endpoint_keeps_user_messages_and_adds_one_compaction_item() {
    let gw = Gateway::start().await;
    let r = gw
        .http
        .post(format!("{}/v1/responses/compact", gw.url))
        .bearer_auth(ALICE)
        .json(&json!({"model": "echo", "input": conversation()}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "response.compaction", "{v}");
    let output = v["output"].as_array().unwrap();
    let kinds: Vec<(&str, &str)> = output
        .iter()
        .map(|o| {
            (
                o["type"].as_str().unwrap_or("message"),
                o["role"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(kinds, [("message", "user"), ("compaction", "")], "{v}");
    assert!(v["usage"]["input_tokens"].as_u64() > Some(0), "{v}");
    // Without a credential: 401 before anything runs.
    let r = gw
        .http
        .post(format!("{}/v1/responses/compact", gw.url))
        .json(&json!({"model": "echo", "input": conversation()}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}
