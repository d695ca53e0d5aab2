//! The published contracts on every surface (`docs/src/conformance.md`): a forced tool choice
//! is honoured by an OpenAI-compatible upstream (and the calls that come back are held like
//! any other) and refused with its reason by an agent backend; a JSON schema for the answer
//! reaches the scripted app-server as `outputSchema`, the real Codex binary's model as its
//! `text.format`, and an upstream as `response_format`, and is refused by name where no
//! backend can honour it. Every answer here is checked against its published schema by the
//! request helpers (`support::schema`).

use serde_json::{json, Value};

use crate::backends::codex::{codex_bin, Rig, Setup};
use crate::support::fake_responses::{FakeResponses, Reply};
use crate::support::fake_upstream::gateway_on_fake;
use crate::support::{messages, responses, *};

/// The schema every structured-output test asks for.
fn schema() -> Value {
    json!({"type": "object", "properties": {"answer": {"type": "string"}, "count": {"type": "integer"}},
           "required": ["answer", "count"], "additionalProperties": false})
}

/// The Chat Completions form of a forced choice of `read_file` or of any tool.
fn chat_choices() -> [(Value, Value); 2] {
    [
        (json!("required"), json!("required")),
        (
            json!({"type": "function", "function": {"name": "read_file"}}),
            json!({"type": "function", "function": {"name": "read_file"}}),
        ),
    ]
}

fn chat_forced(model: &str, choice: &Value) -> Value {
    json!({"model": model, "messages": [user("read /x")], "tools": [read_tool()], "tool_choice": choice})
}

fn responses_forced(model: &str, choice: &Value) -> Value {
    json!({"model": model, "input": "read /x", "tools": [responses::read_file_tool()],
           "tool_choice": choice})
}

fn messages_forced(model: &str, choice: &Value) -> Value {
    json!({"model": model, "max_tokens": 100, "tool_choice": choice,
           "messages": [{"role": "user", "content": "read /x"}],
           "tools": [{"name": "read_file", "description": "Read a file",
                      "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]})
}

#[tokio::test]
async fn a_forced_tool_choice_is_honoured_by_an_upstream_on_every_surface() {
    let (gw, fake) = gateway_on_fake(Opts::default(), &[("u-tool", "up-tool")]).await;
    // The choice as the upstream received it with the fresh turn just sent.
    let upstream_saw = |want: &Value| {
        let bodies = fake.bodies();
        let last = bodies.last().expect("a request upstream");
        assert_eq!(&last["tool_choice"], want, "{last}");
    };

    for (choice, upstream) in chat_choices() {
        let req = chat_forced("u-tool", &choice);
        let (s, v) = gw.chat(ALICE, &req).await;
        assert_eq!(s, 200, "{v}");
        upstream_saw(&upstream);
        let call = &calls(&v)[0];
        assert!(call["id"].as_str().unwrap().starts_with("srct-"), "{v}");
        // The held call resumes once; a second answer is refused.
        let next = continuation(&req, &v, |_, _| json!("file body"));
        let (s, done) = gw.chat(ALICE, &next).await;
        assert_eq!(s, 200, "{done}");
        let (s, again) = gw.chat(ALICE, &next).await;
        assert_eq!(
            (s.as_u16(), error_code(&again)),
            (409, "continuation_already_resolved".into())
        );
    }

    for (choice, upstream) in [
        (json!("required"), json!("required")),
        (
            json!({"type": "function", "name": "read_file"}),
            json!({"type": "function", "function": {"name": "read_file"}}),
        ),
    ] {
        let req = responses_forced("u-tool", &choice);
        let (s, v) = responses::create(&gw, ALICE, &req).await;
        assert_eq!(s, 200, "{v}");
        upstream_saw(&upstream);
        assert!(
            responses::is_token(&responses::response_calls(&v)[0]["call_id"]),
            "{v}"
        );
        assert_eq!(
            v["tool_choice"], choice,
            "the response echoes the request's choice"
        );
        let next = responses::stateful(&req, &v, |_, _| "file body".into());
        let (s, done) = responses::create(&gw, ALICE, &next).await;
        assert_eq!(s, 200, "{done}");
    }

    for (choice, upstream) in [
        (json!({"type": "any"}), json!("required")),
        (
            json!({"type": "tool", "name": "read_file"}),
            json!({"type": "function", "function": {"name": "read_file"}}),
        ),
    ] {
        let req = messages_forced("u-tool", &choice);
        let (s, _, streamed) = messages::stream(&gw, ALICE, &req).await;
        assert_eq!(s, 200, "{streamed}");
        assert!(
            messages::is_token(&messages::tool_uses(&streamed)[0]["id"]),
            "{streamed}"
        );
        upstream_saw(&upstream);
        let m = messages::create(&gw, ALICE, &req).await.1;
        upstream_saw(&upstream);
        let uses = messages::tool_uses(&m);
        assert!(messages::is_token(&uses[0]["id"]), "{m}");
        let next = messages::answer(&req, &m, |_, _| json!("file body"), &[]);
        let (s, done) = messages::create(&gw, ALICE, &next).await;
        assert_eq!(s, 200, "{done}");
    }
}

#[tokio::test]
async fn a_forced_tool_choice_is_refused_with_its_reason_by_an_agent_on_every_surface() {
    let gw = Gateway::start().await;
    let why = |v: &Value, message: &str| {
        assert!(
            message.contains("agent backend (`app-server`)") && message.contains("\"auto\""),
            "{v}"
        );
    };
    for (choice, _) in chat_choices() {
        let (s, v) = gw.chat(ALICE, &chat_forced("tool", &choice)).await;
        assert_eq!(
            (s.as_u16(), error_code(&v)),
            (400, "unsupported_tool_choice".into())
        );
        assert_eq!(v["error"]["param"], "tool_choice");
        why(&v, v["error"]["message"].as_str().unwrap());
    }
    for choice in [
        json!("required"),
        json!({"type": "function", "name": "read_file"}),
    ] {
        let (s, v) = responses::create(&gw, ALICE, &responses_forced("tool", &choice)).await;
        assert_eq!((s, error_code(&v)), (400, "unsupported_tool_choice".into()));
        assert_eq!(v["error"]["param"], "tool_choice");
        why(&v, v["error"]["message"].as_str().unwrap());
    }
    for choice in [
        json!({"type": "any"}),
        json!({"type": "tool", "name": "read_file"}),
    ] {
        let (s, v) = messages::create(&gw, ALICE, &messages_forced("tool", &choice)).await;
        assert_eq!(
            (s, messages::code(&v)),
            (400, "unsupported_tool_choice".into())
        );
        assert_eq!(v["error"]["type"], "invalid_request_error");
        why(&v, v["error"]["message"].as_str().unwrap());
    }
    // Nothing ran: no backend turn was started for any of them.
    assert!(gw.spy_events("turn_start").is_empty());
}

/// The structured-output request of each surface, and where its answer's JSON is.
fn structured(surface: &str, model: &str) -> Value {
    let format = json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema(), "strict": true}});
    match surface {
        "chat" => json!({"model": model, "messages": [user("count")], "response_format": format}),
        "responses" => json!({"model": model, "input": "count", "text": {"format":
            {"type": "json_schema", "name": "answer", "schema": schema(), "strict": true}}}),
        _ => {
            json!({"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": "count"}],
                    "output_config": {"format": {"type": "json_schema", "schema": schema()}}})
        }
    }
}

/// The answer text of a surface's whole answer.
async fn answer_text(gw: &Gateway, surface: &str, req: &Value) -> String {
    match surface {
        "chat" => {
            let (s, v) = gw.chat(ALICE, req).await;
            assert_eq!(s, 200, "{v}");
            content(&v)
        }
        "responses" => {
            let (s, v) = responses::create(gw, ALICE, req).await;
            assert_eq!(s, 200, "{v}");
            responses::response_text(&v)
        }
        _ => {
            let (s, v) = messages::create(gw, ALICE, req).await;
            assert_eq!(s, 200, "{v}");
            messages::text(&v)
        }
    }
}

const SURFACES: [&str; 3] = ["chat", "responses", "messages"];

#[tokio::test]
async fn a_json_schema_reaches_the_app_server_turn_and_shapes_its_answer_on_every_surface() {
    let gw = Gateway::start().await;
    for (i, surface) in SURFACES.iter().enumerate() {
        let text = answer_text(&gw, surface, &structured(surface, "echo")).await;
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{surface}: {text}"));
        assert_eq!(v["count"], 0, "{surface}: {v}");
        assert!(
            v["answer"].as_str().unwrap().starts_with("You said: "),
            "{v}"
        );
        let starts = gw.wait_spy("turn_start", i + 1).await;
        assert_eq!(starts[i]["outputSchema"], schema(), "{surface}");
    }
    // JSON mode without a schema cannot be asked of an agent: refused by name.
    let req = json!({"model": "echo", "messages": [user("x")], "response_format": {"type": "json_object"}});
    let (s, v) = gw.chat(ALICE, &req).await;
    assert_eq!(
        (s.as_u16(), error_code(&v)),
        (400, "unsupported_response_format".into())
    );
    assert_eq!(v["error"]["param"], "response_format");
    let mut req = structured("responses", "echo");
    req["text"]["format"] = json!({"type": "json_object"});
    let (s, v) = responses::create(&gw, ALICE, &req).await;
    assert_eq!(
        (s, v["error"]["param"].as_str()),
        (400, Some("text.format"))
    );
    // A plain text format is no request for structure.
    let req =
        json!({"model": "echo", "messages": [user("x")], "response_format": {"type": "text"}});
    assert_eq!(gw.chat(ALICE, &req).await.0, 200);
}

#[tokio::test]
async fn a_json_schema_reaches_an_upstream_as_its_response_format_on_every_surface() {
    let (gw, fake) = gateway_on_fake(Opts::default(), &[("u-echo", "up-echo")]).await;
    for (i, surface) in SURFACES.iter().enumerate() {
        answer_text(&gw, surface, &structured(surface, "u-echo")).await;
        let body = &fake.bodies()[i];
        let format = &body["response_format"];
        assert_eq!(format["type"], "json_schema", "{surface}: {body}");
        assert_eq!(
            format["json_schema"]["schema"],
            schema(),
            "{surface}: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_schema_reaches_the_real_codex_models_text_format_on_every_surface() {
    let Some(bin) = codex_bin() else { return };
    let answer = r#"{"answer":"forty-two","count":42}"#;
    let replies = SURFACES.iter().map(|_| Reply::text(answer, 2)).collect();
    let model = FakeResponses::queue(replies).await;
    let rig = Rig::start(&bin, &model, Setup::default()).await;
    for (i, surface) in SURFACES.iter().enumerate() {
        let text = answer_text(&rig.gw, surface, &structured(surface, "codex")).await;
        assert_eq!(text, answer, "{surface}\n{}", rig.log_tail());
        let seen = model.requests();
        let format = &seen[i]["text"]["format"];
        assert_eq!(format["type"], "json_schema", "{surface}: {}", seen[i]);
        assert_eq!(format["schema"], schema(), "{surface}: {}", seen[i]);
    }
}

/// Claude Code's gateway protocol on a running model: unknown body fields and betas never fail
/// a request, and an upstream's context-length refusal reaches the client worded as its
/// auto-compaction expects, with no code of Turnstile's in front.
#[tokio::test]
async fn messages_tolerate_the_unknown_and_relay_a_context_length_refusal() {
    let (gw, _fake) = gateway_on_fake(
        Opts::default(),
        &[("u-400", "up-400"), ("u-echo", "up-echo")],
    )
    .await;
    let mut req = messages::request("u-echo", "hi");
    req["a_field_from_2027"] = json!({"anything": [1, 2]});
    let r = gw
        .http
        .post(format!("{}/v1/messages", gw.url))
        .header("x-api-key", ALICE)
        .header("anthropic-beta", "a-beta-from-2027-01-01")
        .header("x-stainless-helper-method", "stream")
        .json(&req)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (s, v) = messages::create(&gw, ALICE, &messages::request("u-400", "hi")).await;
    assert_eq!(
        (s, v["error"]["type"].as_str()),
        (400, Some("invalid_request_error"))
    );
    assert_eq!(
        v["error"]["message"], "prompt is too long: context too long",
        "{v}"
    );
}
