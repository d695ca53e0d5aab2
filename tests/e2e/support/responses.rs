//! Helpers for the Responses API tests: requests, strict stream reading, and the two
//! continuation styles.

use serde_json::{json, Value};

use super::schema::{self, Wire};
use super::Gateway;

pub async fn post(gw: &Gateway, key: &str, body: &Value) -> reqwest::Response {
    gw.http
        .post(format!("{}/v1/responses", gw.url))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("send")
}

/// Non-streaming: status and body (checked against the published schema).
pub async fn create(gw: &Gateway, key: &str, body: &Value) -> (u16, Value) {
    let (status, text) = create_text(gw, key, body).await;
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON {text}"));
    schema::check_openai(status, &v, Wire::Response);
    (status, v)
}

pub async fn create_text(gw: &Gateway, key: &str, body: &Value) -> (u16, String) {
    let r = post(gw, key, body).await;
    (r.status().as_u16(), r.text().await.expect("body"))
}

/// Streaming: the status and the events, checked strictly: each has an `event:` line naming
/// its type and the next `sequence_number`, and the stream ends with exactly one terminal event.
pub async fn stream(gw: &Gateway, key: &str, body: &Value) -> (u16, Vec<Value>) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = post(gw, key, &body).await;
    let status = r.status().as_u16();
    if status != 200 {
        let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        schema::check(Wire::OpenAiError, &v);
        return (status, vec![v]);
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
        schema::check(Wire::ResponseEvent, &v);
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

pub fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// The final response object of a stream.
pub fn last_response(events: &[Value]) -> Value {
    events.last().unwrap()["response"].clone()
}

pub fn read_file_tool() -> Value {
    json!({"type": "function", "name": "read_file", "description": "Read a file", "strict": false,
           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}})
}

pub fn patch_tool() -> Value {
    json!({"type": "custom", "name": "apply_patch", "description": "Apply a patch",
           "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}})
}

pub fn tools() -> Value {
    json!([read_file_tool(), patch_tool(),
           {"type": "namespace", "name": "fs", "description": "files", "tools": [
               {"type": "function", "name": "stat", "parameters": {"type": "object", "properties": {"p": {"type": "string"}}}}]},
           {"type": "web_search"}])
}

pub fn request(model: &str, prompt: &str) -> Value {
    json!({"model": model, "store": false, "tools": tools(), "tool_choice": "auto",
           "parallel_tool_calls": true, "reasoning": {"effort": "low", "summary": "auto"},
           "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
           "client_metadata": {"session_id": "s"},
           "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be useful"}]},
                     {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}]})
}

pub fn response_calls(resp: &Value) -> Vec<Value> {
    resp["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] != "message")
        .cloned()
        .collect()
}

pub fn response_text(resp: &Value) -> String {
    resp["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|m| m["content"].as_array().unwrap().clone())
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect()
}

pub fn output_for(call: &Value, result: &str) -> Value {
    let kind = if call["type"] == "custom_tool_call" {
        "custom_tool_call_output"
    } else {
        "function_call_output"
    };
    json!({"type": kind, "call_id": call["call_id"], "output": result})
}

/// The stateless continuation: everything sent, the response's items echoed, the outputs.
pub fn stateless(req: &Value, resp: &Value, result: impl Fn(usize, &Value) -> String) -> Value {
    let mut next = req.clone();
    let input = next["input"].as_array_mut().unwrap();
    input.push(json!({"type": "reasoning", "id": "rs_1", "summary": []}));
    input.extend(resp["output"].as_array().unwrap().iter().cloned());
    for (i, c) in response_calls(resp).iter().enumerate() {
        input.push(output_for(c, &result(i, c)));
    }
    next
}

/// The stateful continuation: the response's id and only the outputs.
pub fn stateful(req: &Value, resp: &Value, result: impl Fn(usize, &Value) -> String) -> Value {
    let mut next = req.clone();
    next["previous_response_id"] = resp["id"].clone();
    next["input"] = response_calls(resp)
        .iter()
        .enumerate()
        .map(|(i, c)| output_for(c, &result(i, c)))
        .collect();
    next
}

pub fn is_token(id: &Value) -> bool {
    let id = id.as_str().unwrap_or_default();
    id.len() == 37 && id.starts_with("srct-")
}
