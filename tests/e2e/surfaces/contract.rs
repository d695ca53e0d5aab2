//! The surface contract: what every client API answers alike, written once and run for Chat
//! Completions, Responses, Messages and Gemini against the demo backend. A missing or wrong key is 401
//! and an unknown model answers exactly as one the caller may not use, both in the wire's own
//! shape and before a stream's first byte. A held turn's expiry and its
//! backend's death are 410 (a retry is never a fresh turn); a disconnect mid-stream
//! interrupts the turn while keep-alives flow; the rejection matrix every surface shares:
//! another principal's token and an unknown one are one 404 body, each drift is 400, a
//! malformed id 400, a token from another surface a mismatch, a replay 409, and no rejection
//! consumes anything. What only one wire has stays in its module (`core.rs` and
//! `operations/continuation.rs` for chat, `responses.rs`, `messages.rs`).

use std::time::Duration;

use serde_json::{json, Value};

use super::core::assert_error_shape;
use crate::support::{gemini, messages, responses, *};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Wire {
    Chat,
    Responses,
    Messages,
    Gemini,
}

impl Wire {
    /// A turn on `model` with the client's read tool.
    fn request(self, model: &str, prompt: &str) -> Value {
        match self {
            Wire::Chat => tool_request(model, prompt),
            Wire::Responses => responses::request(model, prompt),
            Wire::Messages => messages::request(model, prompt),
            Wire::Gemini => gemini::request(model, prompt),
        }
    }

    /// A turn with no tool.
    fn plain(self, model: &str, prompt: &str, stream: bool) -> Value {
        match self {
            Wire::Chat => json!({"model": model, "stream": stream, "messages": [user(prompt)]}),
            Wire::Responses => json!({"model": model, "stream": stream, "input": prompt}),
            Wire::Messages => json!({"model": model, "stream": stream, "max_tokens": 10,
                                     "messages": [{"role": "user", "content": prompt}]}),
            Wire::Gemini => gemini::plain(model, prompt, stream),
        }
    }

    async fn create_text(self, gw: &Gateway, key: &str, body: &Value) -> (u16, String) {
        match self {
            Wire::Chat => {
                let r = gw.post(key, body).send().await.unwrap();
                (r.status().as_u16(), r.text().await.unwrap())
            }
            Wire::Responses => responses::create_text(gw, key, body).await,
            Wire::Messages => messages::create_text(gw, key, body).await,
            Wire::Gemini => gemini::create_text(gw, key, body).await,
        }
    }

    async fn create(self, gw: &Gateway, key: &str, body: &Value) -> (u16, Value) {
        if self == Wire::Gemini {
            return gemini::create(gw, key, body).await;
        }
        let (s, text) = self.create_text(gw, key, body).await;
        (s, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// A streamed request, as sent.
    async fn send(self, gw: &Gateway, key: &str, body: &Value) -> reqwest::Response {
        match self {
            Wire::Chat => gw.post(key, body).send().await.unwrap(),
            Wire::Responses => responses::post(gw, key, body).await,
            Wire::Messages => messages::post(gw, key, body).await,
            Wire::Gemini => gemini::post(gw, key, body).await,
        }
    }

    /// The token of the answer's first held call.
    fn token(self, resp: &Value) -> String {
        let id = match self {
            Wire::Chat => calls(resp)[0]["id"].clone(),
            Wire::Responses => responses::response_calls(resp)[0]["call_id"].clone(),
            Wire::Messages => messages::tool_uses(resp)[0]["id"].clone(),
            Wire::Gemini => gemini::calls(resp)[0]["id"].clone(),
        };
        id.as_str().unwrap().to_string()
    }

    /// The continuation that answers every held call with `result`, the whole conversation
    /// sent again.
    fn answer(self, req: &Value, resp: &Value, result: &str) -> Value {
        match self {
            Wire::Chat => continuation(req, resp, |_, _| json!(result)),
            Wire::Responses => responses::stateless(req, resp, |_, _| result.into()),
            Wire::Messages => messages::answer(req, resp, |_, _| json!(result), &[]),
            Wire::Gemini => gemini::answer(req, resp, |_, _| json!(result)),
        }
    }

    fn text(self, resp: &Value) -> String {
        match self {
            Wire::Chat => content(resp),
            Wire::Responses => responses::response_text(resp),
            Wire::Messages => messages::text(resp),
            Wire::Gemini => gemini::text(resp),
        }
    }

    fn code(self, v: &Value) -> String {
        match self {
            Wire::Messages => messages::code(v),
            Wire::Gemini => gemini::code(v),
            _ => error_code(v),
        }
    }

    /// A continuation that drifted from what the turn was held with, each way this wire can.
    fn drifts(self, next: &Value) -> Vec<Value> {
        let edit = |f: &dyn Fn(&mut Value)| {
            let mut d = next.clone();
            f(&mut d);
            d
        };
        match self {
            Wire::Chat => vec![
                edit(&|d| d["messages"][0]["content"] = json!("read /m!")),
                edit(&|d| d["tools"] = json!([read_tool()])),
                edit(&|d| d["model"] = json!("echo")),
            ],
            Wire::Responses => vec![
                edit(&|d| d["input"][1]["content"][0]["text"] = json!("read /m!")),
                edit(&|d| d["reasoning"]["effort"] = json!("high")),
                edit(&|d| {
                    let echoed = d["input"].as_array().unwrap().len() - 2;
                    d["input"][echoed]["arguments"] = json!(r#"{"path":"/elsewhere"}"#);
                }),
            ],
            Wire::Messages => vec![
                edit(&|d| d["messages"][0]["content"][1]["text"] = json!("read /m!")),
                edit(&|d| d["output_config"]["effort"] = json!("low")),
                edit(&|d| d["tools"] = json!([messages::claude_read_tool()])),
                edit(&|d| {
                    d["messages"][2]["content"][0]["input"] = json!({"file_path": "/elsewhere"})
                }),
                edit(&|d| d["model"] = json!("echo")),
            ],
            Wire::Gemini => vec![
                edit(&|d| d["contents"][0]["parts"][1]["text"] = json!("read /m!")),
                edit(&|d| d["generationConfig"]["thinkingConfig"]["thinkingBudget"] = json!(0)),
                edit(&|d| d["tools"][0]["functionDeclarations"][1]["description"] = json!("x")),
                edit(&|d| {
                    d["contents"][1]["parts"][0]["functionCall"]["args"] =
                        json!({"absolute_path": "/elsewhere"})
                }),
                edit(&|d| d["model"] = json!("echo")),
            ],
        }
    }

    /// How a stream starts, and the keep-alive it sends while the turn is silent.
    fn stream_marks(self) -> (&'static str, &'static str) {
        match self {
            Wire::Chat => ("data: ", ": keep-alive"),
            Wire::Responses => ("event: response.created\n", ": keep-alive"),
            Wire::Messages => (
                "event: message_start\n",
                "event: ping\ndata: {\"type\":\"ping\"}",
            ),
            // Neither Google SDK's reader takes an SSE comment: an empty line.
            Wire::Gemini => ("", "\r\n"),
        }
    }

    /// Its route.
    fn path(self) -> &'static str {
        match self {
            Wire::Chat => "/v1/chat/completions",
            Wire::Responses => "/v1/responses",
            Wire::Messages => "/v1/messages",
            Wire::Gemini => "/v1beta/models/echo:generateContent",
        }
    }

    /// Its status for a model the caller may not use (Claude Code's gateway protocol: 400).
    fn model_refused(self) -> u16 {
        match self {
            Wire::Messages => 400,
            _ => 404,
        }
    }

    /// Checks an error body has exactly this wire's error shape.
    fn assert_shape(self, v: &Value, code: &str) {
        match self {
            Wire::Messages => {
                assert_eq!(v["type"], "error", "{v}");
                let mut keys: Vec<_> = v.as_object().unwrap().keys().collect();
                keys.sort();
                assert_eq!(keys, ["error", "type"]);
                let mut keys: Vec<_> = v["error"].as_object().unwrap().keys().collect();
                keys.sort();
                assert_eq!(keys, ["message", "type"]);
                assert_eq!(messages::code(v), code);
            }
            Wire::Gemini => {
                gemini::check_error(v);
                assert_eq!(gemini::code(v), code);
            }
            _ => assert_error_shape(v, code),
        }
    }

    /// Another surface, for its tokens.
    fn other(self) -> Wire {
        match self {
            Wire::Chat => Wire::Responses,
            _ => Wire::Chat,
        }
    }
}

macro_rules! contract {
    ($($surface:ident: $wire:ident),* $(,)?) => {
        $(mod $surface {
            #[tokio::test]
            async fn a_bad_key_is_401_and_a_refused_model_looks_unknown() {
                super::credentials_and_models(super::Wire::$wire).await
            }
            #[tokio::test]
            async fn a_held_turn_expires_and_a_dead_backend_loses_it_both_410() {
                super::expiry_and_death(super::Wire::$wire).await
            }
            #[tokio::test]
            async fn a_disconnect_mid_stream_interrupts_the_turn_and_keepalives_flow() {
                super::disconnect(super::Wire::$wire).await
            }
            #[tokio::test]
            async fn the_rejection_matrix_consumes_nothing() {
                super::rejections(super::Wire::$wire).await
            }
        })*
    };
}

contract!(
    chat_completions: Chat,
    responses_api: Responses,
    messages_api: Messages,
    gemini_api: Gemini,
);

async fn credentials_and_models(wire: Wire) {
    let gw = Gateway::start().await;
    let body = wire.plain("echo", "hi", false);
    // Missing and wrong keys: 401 in the wire's shape, its code in a header too.
    let url = format!("{}{}", gw.url, wire.path());
    let r = gw.http.post(&url).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["x-turnstile-error-code"], "invalid_api_key");
    wire.assert_shape(&r.json().await.unwrap(), "invalid_api_key");
    let (s, v) = wire.create(&gw, "sk-nobody", &body).await;
    assert_eq!(s, 401, "{v}");
    wire.assert_shape(&v, "invalid_api_key");
    if wire == Wire::Messages {
        assert_eq!(v["error"]["type"], "authentication_error", "{v}");
    }

    // An unknown model and one the caller may not use: the same answer but for the name.
    let (s1, unknown) = wire
        .create(&gw, CAROL, &wire.plain("nope", "hi", false))
        .await;
    let (s2, forbidden) = wire
        .create(&gw, CAROL, &wire.plain("tool", "hi", false))
        .await;
    assert_eq!((s1, s2), (wire.model_refused(), wire.model_refused()));
    wire.assert_shape(&unknown, "model_not_found");
    let message =
        |v: &Value, name: &str| v["error"]["message"].as_str().unwrap().replace(name, "X");
    assert_eq!(message(&unknown, "nope"), message(&forbidden, "tool"));
    // Decided before a stream's first byte: a real status, a JSON body.
    let r = wire.send(&gw, CAROL, &wire.plain("tool", "hi", true)).await;
    assert_eq!(r.status().as_u16(), wire.model_refused());
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("application/json"), "{ct}");
}

async fn expiry_and_death(wire: Wire) {
    let gw = Gateway::start_with(Opts {
        execution_ttl_seconds: 1,
        ..Opts::default()
    })
    .await;
    let req = wire.request("tool", "read /e");
    let (s, resp) = wire.create(&gw, ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    gw.wait_spy("interrupt", 1).await;
    let (s, v) = wire
        .create(&gw, ALICE, &wire.answer(&req, &resp, "late"))
        .await;
    assert_eq!(
        (s, wire.code(&v)),
        (410, "continuation_expired".into()),
        "{v}"
    );
    assert!(gw.spy_events("tool_result").is_empty());

    let gw = Gateway::start().await;
    let (_, resp) = wire.create(&gw, ALICE, &req).await;
    kill_demo_backend(&gw).await;
    let next = wire.answer(&req, &resp, "R");
    let (s, v) = wire.create(&gw, ALICE, &next).await;
    assert_eq!((s, wire.code(&v)), (410, "continuation_lost".into()), "{v}");
    // Never a fresh turn: a retry is still the tombstone's answer.
    let (s, _) = wire.create(&gw, ALICE, &next).await;
    assert!(s == 409 || s == 410, "{s}");
    // The backend serves the next turn.
    let (s, v) = wire
        .create(&gw, ALICE, &wire.plain("echo", "fine", false))
        .await;
    assert_eq!(s, 200, "{v}");
}

async fn disconnect(wire: Wire) {
    let gw = Gateway::start().await;
    let mut r = wire.send(&gw, ALICE, &wire.plain("hang", "x", true)).await;
    assert_eq!(r.status(), 200);
    let (opening, keepalive) = wire.stream_marks();
    let mut seen = String::new();
    while !seen.contains(keepalive) {
        let c = tokio::time::timeout(Duration::from_secs(10), r.chunk())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(seen.starts_with(opening), "{seen}");
    drop(r);
    let interrupts = gw.wait_spy("interrupt", 1).await;
    assert_eq!(interrupts.len(), 1);
}

async fn rejections(wire: Wire) {
    let gw = Gateway::start().await;
    let req = wire.request("tool", "read /m");
    let (_, resp) = wire.create(&gw, ALICE, &req).await;
    let next = wire.answer(&req, &resp, "R");
    let token = wire.token(&resp);
    let with_token =
        |t: &str| -> Value { serde_json::from_str(&next.to_string().replace(&token, t)).unwrap() };

    // Another principal's token and an unknown one: one 404 body.
    let (s, foreign) = wire.create_text(&gw, BOB, &next).await;
    assert_eq!(s, 404, "{foreign}");
    let unknown = with_token("srct-00000000000000000000000000000000");
    assert_eq!(
        wire.create_text(&gw, ALICE, &unknown).await,
        (404, foreign.clone())
    );
    let v: Value = serde_json::from_str(&foreign).unwrap();
    assert_eq!(wire.code(&v), "continuation_not_found");
    match wire {
        Wire::Messages => assert_eq!(v["error"]["type"], "not_found_error"),
        Wire::Responses => assert_eq!(v["error"]["param"], "input"),
        Wire::Gemini => assert_eq!(v["error"]["status"], "NOT_FOUND"),
        Wire::Chat => {}
    }
    // Drift of each kind: 400.
    for d in wire.drifts(&next) {
        let (s, v) = wire.create(&gw, ALICE, &d).await;
        assert_eq!(
            (s, wire.code(&v)),
            (400, "continuation_mismatch".into()),
            "{d}"
        );
        if wire == Wire::Messages {
            assert_eq!(v["error"]["type"], "invalid_request_error");
        }
    }
    // A malformed id: 400 before any lookup.
    let (s, v) = wire.create(&gw, ALICE, &with_token("srct-xyz")).await;
    assert_eq!(s, 400, "{v}");
    if wire == Wire::Messages {
        assert_eq!(wire.code(&v), "invalid_request");
    }
    // A token another surface issued is a mismatch here.
    let other = wire.other();
    let (_, theirs) = other
        .create(&gw, ALICE, &other.request("tool", "read /c"))
        .await;
    let (s, v) = wire
        .create(&gw, ALICE, &with_token(&other.token(&theirs)))
        .await;
    assert_eq!(
        (s, wire.code(&v)),
        (400, "continuation_mismatch".into()),
        "{v}"
    );

    // Nothing was consumed: the answer goes through, once.
    let (s, done) = wire.create(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(wire.text(&done), "Tool result: R");
    let (s, v) = wire.create(&gw, ALICE, &next).await;
    assert_eq!(
        (s, wire.code(&v)),
        (409, "continuation_already_resolved".into()),
        "{v}"
    );
    if wire == Wire::Gemini {
        assert_eq!(v["error"]["status"], "ABORTED", "{v}");
    }
}
