//! Helpers for the Gemini API tests: requests as the SDKs send them (the model and method in
//! the path, the key in `x-goog-api-key`), a strict stream reader that rebuilds the response,
//! and the continuation (the contents again, the model turn as received, one user turn with a
//! `functionResponse` per call). A test body names its model and streaming in `model` and
//! `stream`, which these helpers move into the path.

use serde_json::{json, Value};

use super::schema::{self, Wire};
use super::Gateway;

/// The path and the body as sent, for a test body.
pub fn route(body: &Value) -> (String, Value) {
    let mut body = body.clone();
    let o = body.as_object_mut().expect("a JSON object");
    let model = o
        .remove("model")
        .and_then(|m| m.as_str().map(str::to_string));
    let stream = o.remove("stream") == Some(json!(true));
    let method = match stream {
        true => "streamGenerateContent?alt=sse",
        false => "generateContent",
    };
    let path = format!("/v1beta/models/{}:{method}", model.unwrap_or_default());
    (path, body)
}

pub async fn post(gw: &Gateway, key: &str, body: &Value) -> reqwest::Response {
    let (path, body) = route(body);
    gw.http
        .post(format!("{}{path}", gw.url))
        .header("x-goog-api-key", key)
        .json(&body)
        .send()
        .await
        .expect("send")
}

/// Checks an error body is Google's envelope, exactly.
pub fn check_error(v: &Value) {
    schema::check(Wire::GoogleError, v);
}

/// Non-streaming: status and body (a streamed request's text is returned as is).
pub async fn create_text(gw: &Gateway, key: &str, body: &Value) -> (u16, String) {
    let r = post(gw, key, body).await;
    (r.status().as_u16(), r.text().await.expect("body"))
}

/// Non-streaming: status and body, each checked against Google's published schema.
pub async fn create(gw: &Gateway, key: &str, body: &Value) -> (u16, Value) {
    let (status, text) = create_text(gw, key, body).await;
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("non-JSON {text}"));
    match status {
        200 => schema::check(Wire::GenerateContentResponse, &v),
        _ => check_error(&v),
    }
    (status, v)
}

/// Streaming (`alt=sse`): the status, each response, and the one response they make (parts
/// in order, the last response's finish and usage). Every event is a `data:` line ending in
/// `\r\n\r\n`, checked against the schema; an `{"error": ...}` event ends the stream.
pub async fn stream(gw: &Gateway, key: &str, body: &Value) -> (u16, Vec<Value>, Value) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = post(gw, key, &body).await;
    let status = r.status().as_u16();
    if status != 200 {
        let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        check_error(&v);
        return (status, vec![v.clone()], v);
    }
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    assert!(text.ends_with("\r\n\r\n"), "{text}");
    let mut events = Vec::new();
    for block in text
        .split("\r\n\r\n")
        .map(str::trim)
        .filter(|b| !b.is_empty())
    {
        let data = block
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("{block}"));
        let v: Value = serde_json::from_str(data).unwrap();
        match v.get("error") {
            Some(_) => check_error(&v),
            None => schema::check(Wire::GenerateContentResponse, &v),
        }
        events.push(v);
    }
    let last = events.last().cloned().unwrap_or(Value::Null);
    if last.get("error").is_some() {
        return (status, events, last);
    }
    let parts: Vec<Value> = events
        .iter()
        .flat_map(|e| {
            e["candidates"][0]["content"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    for e in &events[..events.len() - 1] {
        assert!(e["candidates"][0].get("finishReason").is_none(), "{e}");
    }
    let mut whole = last;
    whole["candidates"][0]["content"]["parts"] = Value::Array(parts);
    (status, events, whole)
}

/// Gemini CLI's `read_file` declaration (JSON Schema parameters).
pub fn read_file() -> Value {
    json!({"name": "read_file", "description": "Reads a file.",
           "parametersJsonSchema": {"type": "object",
               "properties": {"absolute_path": {"type": "string"}}, "required": ["absolute_path"]}})
}

/// A request shaped like Gemini CLI's: a system instruction, the session context and the
/// prompt as two parts, its tools, thoughts asked for.
pub fn request(model: &str, prompt: &str) -> Value {
    json!({"model": model,
           "contents": [{"role": "user", "parts": [{"text": "<session_context>cwd: /tmp</session_context>"},
                                                   {"text": prompt}]}],
           "systemInstruction": {"role": "user", "parts": [{"text": "You are an interactive CLI agent."}]},
           "tools": [{"functionDeclarations": [read_file(),
               {"name": "run_shell_command", "description": "Runs a command.",
                "parameters": {"type": "OBJECT", "properties": {"command": {"type": "STRING"}},
                               "required": ["command"]}}]}],
           "generationConfig": {"temperature": 1, "topP": 0.95,
                                "thinkingConfig": {"includeThoughts": true, "thinkingBudget": 8192}}})
}

/// A plain request with no tools.
pub fn plain(model: &str, prompt: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream,
           "contents": [{"role": "user", "parts": [{"text": prompt}]}]})
}

/// The model turn of a response.
pub fn content(resp: &Value) -> Value {
    resp["candidates"][0]["content"].clone()
}

/// The `functionCall`s of a response.
pub fn calls(resp: &Value) -> Vec<Value> {
    (content(resp)["parts"].as_array().into_iter().flatten())
        .filter_map(|p| p.get("functionCall").cloned())
        .collect()
}

/// The text of a response (thought parts left out).
pub fn text(resp: &Value) -> String {
    (content(resp)["parts"].as_array().into_iter().flatten())
        .filter(|p| p["thought"] != true)
        .filter_map(|p| p["text"].as_str())
        .collect()
}

/// The continuation: the request's contents, the model turn as received and a user turn with
/// `result(i, call)` as each call's `response.output`.
pub fn answer(req: &Value, resp: &Value, result: impl Fn(usize, &Value) -> Value) -> Value {
    let mut next = req.clone();
    let contents = next["contents"].as_array_mut().unwrap();
    contents.push(content(resp));
    let parts: Vec<Value> = calls(resp)
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"functionResponse": {"id": c["id"], "name": c["name"],
                                        "response": {"output": result(i, c)}}})
        })
        .collect();
    contents.push(json!({"role": "user", "parts": parts}));
    next
}

/// Turnstile's code in a Google error (the message's first word, and the `ErrorInfo` reason).
pub fn code(v: &Value) -> String {
    let message = v["error"]["message"].as_str().unwrap_or_default();
    let code = message.split(':').next().unwrap_or_default().to_string();
    let reason = v["error"]["details"][0]["reason"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(reason, code.to_ascii_uppercase(), "{v}");
    code
}
