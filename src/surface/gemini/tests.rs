use serde_json::json;

use super::*;
use crate::engine::LegEvent;
use crate::surface::sse::Frame;
use crate::turn::{Effort, ExposedCall, Role, Usage};

const T1: &str = "srct-0123456789abcdef0123456789abcdef";
const T2: &str = "srct-ffffffffffffffffffffffffffffffff";

fn parsed(v: Value) -> (TurnInput, bool) {
    parse(
        v.to_string().as_bytes(),
        "m",
        true,
        Method::Stream,
        Instant::now(),
    )
    .unwrap()
}

fn refused(v: Value) -> ApiError {
    parse(
        v.to_string().as_bytes(),
        "m",
        false,
        Method::Generate,
        Instant::now(),
    )
    .expect_err("refused")
}

/// A Gemini CLI-shaped first request.
fn first() -> Value {
    json!({
        "contents": [{"role": "user", "parts": [{"text": "<session_context>x</session_context>"},
                                                {"text": "read a.txt"}]}],
        "systemInstruction": {"role": "user", "parts": [{"text": "You are a CLI."}]},
        "tools": [{"functionDeclarations": [
            {"name": "read_file", "description": "Reads", "parametersJsonSchema":
                {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
            {"name": "run_shell_command", "parameters":
                {"type": "OBJECT", "properties": {"command": {"type": "STRING", "nullable": true}},
                 "propertyOrdering": ["command"]}}]},
            {"googleSearch": {}}],
        "generationConfig": {"temperature": 0, "topP": 1, "maxOutputTokens": 100,
            "thinkingConfig": {"includeThoughts": true, "thinkingBudget": 8192}}
    })
}

/// [`first`] answered: the model turn with two calls, and their responses.
fn continued(first_id: Option<&str>, second_id: Option<&str>) -> Value {
    let mut body = first();
    let fr = |id: Option<&str>, name: &str, response: Value| {
        let mut f = json!({"name": name, "response": response});
        if let Some(id) = id {
            f["id"] = json!(id);
        }
        json!({"functionResponse": f})
    };
    let contents = body["contents"].as_array_mut().unwrap();
    contents.push(json!({"role": "model", "parts": [
        {"text": "Let me ", "thought": true},
        {"text": "look"}, {"text": "."},
        {"functionCall": {"id": T1, "name": "read_file", "args": {"path": "a.txt"}},
         "thoughtSignature": "c2ln"},
        {"functionCall": {"id": T2, "name": "read_file", "args": {"path": "b.txt", "n": 60.0}}}]}));
    contents.push(json!({"role": "user", "parts": [
        fr(first_id, "read_file", json!({"output": "one"})),
        fr(second_id, "read_file", json!({"error": "no such file"}))]}));
    body
}

#[test]
fn a_gemini_cli_request_parses() {
    let (t, thoughts) = parsed(first());
    assert!(thoughts && t.stream);
    assert_eq!(t.surface, SurfaceId::Gemini);
    assert_eq!(t.effort, Some(Effort::Medium));
    let roles: Vec<_> = t.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user"]);
    assert_eq!(
        t.messages[1].text,
        "<session_context>x</session_context>\n\nread a.txt"
    );
    let tools = t.tools.as_ref().unwrap();
    assert_eq!(tools.len(), 2);
    assert_eq!(tools[0].parameters["required"], json!(["path"]));
    assert_eq!(
        tools[1].parameters,
        json!({"type": "object", "properties": {"command": {"type": ["string", "null"]}}})
    );
    assert_eq!(t.sampling.max_tokens, Some(json!(100)));
    assert!(t.continuation.is_none());
}

#[test]
fn responses_answer_by_id_or_by_name_and_position() {
    let by_id = parsed(continued(Some(T1), Some(T2))).0;
    let by_place = parsed(continued(None, None)).0;
    for t in [&by_id, &by_place] {
        let c = t.continuation.as_ref().unwrap();
        assert_eq!((c.assistant, c.tokens.len()), (2, 2));
        assert_eq!(t.messages[3].tool_call_id.as_deref(), Some(T1));
        assert_eq!(t.messages[4].tool_call_id.as_deref(), Some(T2));
        assert_eq!(
            (t.messages[3].text.as_str(), t.messages[3].is_error),
            ("one", false)
        );
        assert_eq!(
            (t.messages[4].text.as_str(), t.messages[4].is_error),
            ("no such file", true)
        );
    }
    assert_eq!(by_id.continuation, by_place.continuation);
    // The model turn as exposed: thoughts apart, text joined as streamed, numbers as sent.
    let exposed = [
        ExposedCall {
            id: T1.into(),
            name: "read_file".into(),
            arguments: r#"{"path":"a.txt"}"#.into(),
        },
        ExposedCall {
            id: T2.into(),
            name: "read_file".into(),
            arguments: r#"{"n":60,"path":"b.txt"}"#.into(),
        },
    ];
    let c = by_id.continuation.unwrap();
    assert_eq!(c.echo, exposed_echo("look.", &exposed));
    // The prefix is the fresh request's conversation.
    let mut fresh = parsed(first()).0;
    fresh.digest_messages();
    assert_eq!(c.prefix, fresh.fingerprint.prefix);
}

#[test]
fn one_id_named_twice_and_a_missing_response() {
    // Both responses name the first call: drift for the engine to refuse (two results for
    // one token), not a silent match.
    let t = parsed(continued(Some(T1), Some(T1))).0;
    let c = t.continuation.unwrap();
    assert_eq!(c.results[0].0, c.results[1].0);
    // The calls followed by a user turn with no responses.
    let mut body = continued(None, None);
    body["contents"][2] = json!({"role": "user", "parts": [{"text": "never mind"}]});
    let e = refused(body);
    assert_eq!(e.code, ErrorCode::ContinuationMismatch);
    assert_eq!(Gemini::field(e.param.unwrap()), "contents");
}

#[test]
fn tool_config_modes() {
    let with = |config: Value| {
        let mut b = first();
        b["toolConfig"] = json!({"functionCallingConfig": config});
        b
    };
    let (t, _) = parsed(with(
        json!({"mode": "ANY", "allowedFunctionNames": ["read_file"]}),
    ));
    assert_eq!(t.tool_choice, ToolChoice::Named("read_file".into()));
    let (t, _) = parsed(with(json!({"mode": "ANY"})));
    assert_eq!(t.tool_choice, ToolChoice::Required);
    assert_eq!(t.tools.as_ref().unwrap().len(), 2);
    let (t, _) = parsed(with(
        json!({"mode": "ANY", "allowedFunctionNames": ["read_file", "nope"]}),
    ));
    assert_eq!(t.tools.as_ref().unwrap().len(), 1);
    let (t, _) = parsed(with(json!({"mode": "NONE"})));
    assert_eq!((t.tool_choice, t.tools), (ToolChoice::None, Ok(Vec::new())));
    let (t, _) = parsed(with(json!({"mode": "VALIDATED"})));
    assert_eq!(t.tool_choice, ToolChoice::Auto);
    let e = refused(with(json!({"mode": "SOMETIMES"})));
    assert_eq!(e.code, ErrorCode::InvalidRequest);
    // The tool config is bound in the fingerprint; showing thoughts is not.
    let a = parsed(with(json!({"mode": "AUTO"}))).0.fingerprint;
    let b = parsed(first()).0.fingerprint;
    assert_ne!(a.tool_choice, b.tool_choice);
    let mut hidden = first();
    hidden["generationConfig"]["thinkingConfig"]["includeThoughts"] = json!(false);
    assert_eq!(parsed(hidden).0.fingerprint, b);
}

#[test]
fn generation_config_maps_to_options() {
    let with = |g: Value| {
        let mut b = first();
        b["generationConfig"] = g;
        parsed(b).0
    };
    for (thinking, effort) in [
        (json!({"thinkingBudget": 0}), Some(Effort::Minimal)),
        (json!({"thinkingBudget": -1}), None),
        (json!({"thinkingBudget": 1024}), Some(Effort::Low)),
        (json!({"thinkingBudget": 24576}), Some(Effort::High)),
        (json!({"thinkingBudget": 65536}), Some(Effort::XHigh)),
        (json!({"thinkingLevel": "LOW"}), Some(Effort::Low)),
        (json!({"thinking_level": "HIGH"}), Some(Effort::High)),
    ] {
        assert_eq!(
            with(json!({"thinkingConfig": thinking})).effort,
            effort,
            "{thinking}"
        );
    }
    let t = with(json!({"responseMimeType": "application/json",
        "responseSchema": {"type": "OBJECT", "properties": {"a": {"type": "INTEGER"}}},
        "stopSequences": ["x"], "max_output_tokens": 5}));
    let format = t.sampling.response_format.unwrap();
    assert_eq!(
        format["json_schema"]["schema"],
        json!({"type": "object", "properties": {"a": {"type": "integer"}}})
    );
    assert_eq!(t.sampling.stop, Some(json!(["x"])));
    assert_eq!(t.sampling.max_tokens, Some(json!(5)));
    let t = with(json!({"responseMimeType": "application/json"}));
    assert_eq!(
        t.sampling.response_format,
        Some(json!({"type": "json_object"}))
    );
    let mut b = first();
    b["generationConfig"] = json!({"candidateCount": 2});
    assert_eq!(refused(b).code, ErrorCode::InvalidRequest);
    let mut b = first();
    b["generationConfig"] = json!({"thinkingConfig": {"thinkingLevel": "EXTREME"}});
    assert_eq!(
        Gemini::field(refused(b).param.unwrap()),
        "generationConfig.thinkingConfig"
    );
}

#[test]
fn bad_shapes_are_400() {
    for body in [
        json!({}),
        json!({"contents": []}),
        json!({"contents": {"role": "user"}}),
        json!({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}),
        json!({"contents": [{"role": "user", "parts": "x"}]}),
        json!({"contents": [{"role": "user", "parts": [{"text": "x"}]}], "tools": {}}),
        json!({"contents": [{"role": "user", "parts": [{"text": "x"}]}], "cachedContent": "c/1"}),
    ] {
        assert_eq!(
            refused(body.clone()).code,
            ErrorCode::InvalidRequest,
            "{body}"
        );
    }
    let e = parse(b"{bad", "m", false, Method::Generate, Instant::now()).err();
    assert_eq!(e.unwrap().code, ErrorCode::InvalidRequest);
    let ok = json!({"contents": [{"parts": [{"text": "hi"}]}],
                    "system_instruction": "Be brief."});
    let (t, _) = parsed(ok);
    assert_eq!(t.messages[0].role, Role::System);
    assert_eq!(t.messages[1].role, Role::User);
}

#[test]
fn paths_name_the_model_and_method() {
    assert_eq!(
        method("m:generateContent").unwrap(),
        ("m", Method::Generate)
    );
    assert_eq!(
        method("models/gemini-2.5-pro:streamGenerateContent").unwrap(),
        ("gemini-2.5-pro", Method::Stream)
    );
    assert_eq!(method("a:b:countTokens").unwrap(), ("a:b", Method::Count));
    for bad in ["m", "m:embedContent", ":generateContent"] {
        assert_eq!(method(bad).unwrap_err().code, ErrorCode::NotFound, "{bad}");
    }
    let uri: http::Uri = "/v1beta/models/m:generateContent?alt=sse&key=sk-a"
        .parse()
        .unwrap();
    let mut headers = http::HeaderMap::new();
    assert_eq!(credential(&uri, &headers), Some("sk-a"));
    headers.insert("x-goog-api-key", "sk-b".parse().unwrap());
    assert_eq!(credential(&uri, &headers), Some("sk-b"));
    assert_eq!(query(&uri, "alt"), Some("sse"));
}

#[test]
fn errors_are_googles_envelope() {
    let e = ApiError::new(ErrorCode::ContinuationAlreadyResolved, "Already answered.");
    let body = Gemini::error_body(&e);
    assert_eq!(body["error"]["code"], 409);
    assert_eq!(body["error"]["status"], "ABORTED");
    assert_eq!(
        body["error"]["message"],
        "continuation_already_resolved: Already answered."
    );
    assert_eq!(
        body["error"]["details"][0]["reason"],
        "CONTINUATION_ALREADY_RESOLVED"
    );
    let mut e = ApiError::new(ErrorCode::RateLimited, "Slow down.");
    e.retry_after = Some(7);
    let body = Gemini::error_body(&e);
    assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED");
    assert_eq!(body["error"]["details"][1]["retryDelay"], "7s");
    let e = ApiError::invalid("bad").with_param(Param::Conversation);
    let body = Gemini::error_body(&e);
    assert_eq!(
        body["error"]["details"][1]["fieldViolations"][0]["field"],
        "contents"
    );
}

fn framer(array: bool, thoughts: bool) -> impl Frame {
    framing::framer(
        "exe-1",
        0,
        Framing {
            stream: true,
            array,
            model: "m".into(),
            thoughts,
        },
    )
}

/// The `data:` payloads of an SSE text.
fn events(text: &str) -> Vec<Value> {
    text.split("\r\n\r\n")
        .filter_map(|e| e.trim().strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn a_stream_is_text_then_calls_with_the_finish() {
    let mut f = framer(false, true);
    let mut text = f.opening();
    for ev in [
        LegEvent::Reasoning("hm".into()),
        LegEvent::Delta("Let me".into()),
    ] {
        text.push_str(&f.frame(ev).0);
    }
    text.push_str(&f.keepalive());
    let usage = Usage {
        prompt_tokens: 10,
        completion_tokens: 7,
        reasoning_tokens: 2,
        cached_tokens: 4,
        ..Usage::default()
    };
    let calls = vec![ExposedCall {
        id: T1.into(),
        name: "read_file".into(),
        arguments: r#"{"path":"a.txt"}"#.into(),
    }];
    let (end, done) = f.frame(LegEvent::End { calls, usage });
    assert!(done);
    text.push_str(&end);
    let ev = events(&text);
    assert_eq!(ev.len(), 3);
    assert_eq!(
        ev[0]["candidates"][0]["content"]["parts"][0]["thought"],
        true
    );
    assert_eq!(
        ev[1]["candidates"][0]["content"]["parts"][0]["text"],
        "Let me"
    );
    let last = &ev[2];
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    assert_eq!(
        last["candidates"][0]["content"]["parts"][0]["functionCall"],
        json!({"id": T1, "name": "read_file", "args": {"path": "a.txt"}})
    );
    assert_eq!(
        last["usageMetadata"],
        json!({"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 17,
               "cachedContentTokenCount": 4, "thoughtsTokenCount": 2})
    );
    assert_eq!(last["responseId"], "1");
}

#[test]
fn the_array_form_is_one_json_array_and_an_error_ends_it() {
    let mut f = framer(true, false);
    let mut text = f.opening();
    text.push_str(&f.frame(LegEvent::Reasoning("hidden".into())).0);
    text.push_str(&f.frame(LegEvent::Delta("a".into())).0);
    text.push_str(&f.keepalive());
    let (end, done) = f.frame(LegEvent::Error(crate::engine::EngineError::TurnFailed));
    assert!(done);
    text.push_str(&end);
    let v: Value = serde_json::from_str(&text).unwrap();
    let items = v.as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[1]["error"]["status"], "UNAVAILABLE");
}
