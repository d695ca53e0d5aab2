//! The Chat Completions surface (`POST /v1/chat/completions`): its wire types (`wire`),
//! continuation detection (`detect`), response and stream framing (`framing`) and its error
//! body shape (OpenAI's `{"error":{message,type,code,param}}`, also used by every non-surface
//! route).
//!
//! [`parse`] turns a request body into a neutral [`TurnInput`]. Messages map one to one, so
//! message indices in the input are indices in the client's `messages`.

pub mod detect;
pub mod framing;
mod routes;
pub mod wire;

use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::time::Instant;

use self::detect::detect;
use self::wire::ChatRequest;
use super::canonical::{
    echo_digest_of, exposed_echo, message_digest, tool_choice_digest, tools_digest,
};
use super::turn::{Parts, Projection};
use super::{openai_field, sse, Answer, Host, Incoming, Plan, Route, Surface};
use crate::engine::Leg;
use crate::error::{ApiError, Param};
use crate::turn::{
    Call, Effort, Message, Passthrough, Role, Sampling, SurfaceId, ToolChoice, ToolDef, TurnInput,
    Wire,
};

/// What the HTTP layer needs besides the turn: how to frame the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    pub stream: bool,
    pub include_usage: bool,
}

/// The Chat Completions API.
pub struct Chat;

impl Surface for Chat {
    const ID: SurfaceId = SurfaceId::Chat;
    const PATH: &'static str = "/v1/chat/completions";
    type Request = (TurnInput, Framing);
    type Framing = Framing;

    fn read(req: Incoming<'_>) -> Result<Self::Request, ApiError> {
        let (body, arrived) = (req.body, req.arrived);
        parse(body, arrived)
    }

    fn streams(req: &Self::Request) -> bool {
        req.1.stream
    }

    async fn plan<H: Host>(req: Self::Request, _: &H) -> Result<(Plan, Framing), ApiError> {
        Ok((Plan::Turn(req.0), req.1))
    }

    async fn stream(leg: Leg, f: Framing, keepalive: Duration) -> Result<sse::Body, ApiError> {
        framing::stream(leg, f.include_usage, keepalive).await
    }

    async fn collect(leg: Leg, _: Framing) -> Result<Answer, ApiError> {
        framing::collect(leg).await
    }

    fn field(p: Param) -> &'static str {
        openai_field(p)
    }

    fn error_body(e: &ApiError) -> Value {
        error_body(e)
    }

    fn routes() -> Vec<Route> {
        routes::routes()
    }
}

/// Parses and translates one request body. Shapes are checked here (400), before any lookup.
pub fn parse(body: Bytes, arrived: Instant) -> Result<(TurnInput, Framing), ApiError> {
    let req: ChatRequest = super::read_json(&body)?;
    if req.messages.is_empty() {
        return Err(
            ApiError::invalid("`messages` must not be empty").with_param(Param::Conversation)
        );
    }
    let framing = Framing {
        stream: req.stream,
        include_usage: req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    };
    let effort = Effort::read(req.reasoning_effort.as_ref(), "reasoning_effort")?;
    let cache_hints = req.prompt_cache_key.is_some() || req.user.is_some();
    let messages: Vec<Message> = req.messages.iter().map(neutral_message).collect();
    let detected = detect(&messages)?;
    let tool_choice = tool_choice(req.tool_choice.as_ref());
    let parts = Parts {
        surface: SurfaceId::Chat,
        projection: Projection {
            digest: message_digest,
            exposed: exposed_echo,
            returned: echo_digest_of,
            response_id: framing::completion_id,
        },
        model: req.model,
        messages,
        detected,
        reference: None,
        tools: tools(req.tools.as_deref(), &tool_choice),
        tools_digest: tools_digest(req.tools.as_deref()),
        tool_choice_digest: tool_choice_digest(req.tool_choice.as_ref(), effort),
        tool_choice,
        effort,
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        stream: req.stream,
        passthrough: Some(Passthrough {
            wire: Wire::ChatCompletions,
            body,
            cache_hints,
        }),
        // The rest of the sampling options reach an upstream in the body as sent; an agent
        // backend honours a JSON schema or refuses it (`backend::agent::validate`).
        sampling: Sampling {
            response_format: structured(req.response_format),
            ..Sampling::default()
        },
        arrived,
    };
    Ok((parts.build(), framing))
}

/// The neutral form of one wire message (the text of its content, its calls' arguments as
/// text).
pub fn neutral_message(m: &wire::Message) -> Message {
    Message {
        role: Role::parse(&m.role),
        text: m.text(),
        images: Vec::new(),
        name: m.name.clone(),
        tool_calls: m
            .tool_calls
            .iter()
            .flatten()
            .map(|c| Call {
                id: c.id.clone(),
                name: c.function.name.clone(),
                arguments: c.function.arguments_text(),
            })
            .collect(),
        tool_call_id: m.tool_call_id.clone(),
        is_error: false,
    }
}

/// A structured-output request: `response_format` unless absent, null or plain `text`.
pub fn structured(format: Option<Value>) -> Option<Value> {
    format.filter(|f| !f.is_null() && f["type"] != "text")
}

fn tool_choice(v: Option<&Value>) -> ToolChoice {
    match v {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(Value::Object(o)) => ToolChoice::Named(
            o.get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        ),
        Some(_) => ToolChoice::Invalid,
    }
}

/// The client's tools (none when `tool_choice` is `none`), or why they cannot be read.
fn tools(tools: Option<&[Value]>, choice: &ToolChoice) -> Result<Vec<ToolDef>, String> {
    if *choice == ToolChoice::None {
        return Ok(Vec::new());
    }
    let mut out: Vec<ToolDef> = Vec::new();
    for t in tools.unwrap_or_default() {
        let def = tool_def(t).ok_or_else(|| {
            "each tool must be {\"type\":\"function\",\"function\":{\"name\":…}}".to_string()
        })?;
        if out.iter().any(|d| d.name == def.name) {
            return Err(format!("duplicate tool name `{}`", def.name));
        }
        out.push(def);
    }
    Ok(out)
}

/// Reads `{"type":"function","function":{name, description?, parameters?}}`, tolerating extra
/// keys (codex sends a top-level `name`). None for anything that has no function name.
fn tool_def(tool: &Value) -> Option<ToolDef> {
    let f = tool.get("function")?;
    let name = f.get("name")?.as_str()?.to_string();
    if name.is_empty() {
        return None;
    }
    let description = f
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let parameters = f
        .get("parameters")
        .cloned()
        .unwrap_or_else(|| json!({"type":"object","properties":{}}));
    Some(ToolDef {
        name,
        description,
        parameters,
    })
}

/// The OpenAI error body, also the payload of a mid-stream SSE error event.
pub fn error_body(e: &ApiError) -> Value {
    openai_error_body(e, openai_field)
}

/// The OpenAI error body with the parameter named by `field`.
pub fn openai_error_body(e: &ApiError, field: fn(Param) -> &'static str) -> Value {
    let mut body = match &e.upstream {
        Some(u) => json!({"error": {
            "message": e.message,
            "type": u.kind.as_deref().unwrap_or("invalid_request_error"),
            "code": u.code.as_deref().unwrap_or(e.code.as_str()),
            "param": u.param,
        }}),
        None => json!({"error": {
            "message": e.message,
            "type": e.code.kind(),
            "code": e.code.as_str(),
            "param": e.param.map(field),
        }}),
    };
    if let Some(extra) = &e.extra {
        body[extra.0] = extra.1.clone();
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    fn input(v: Value) -> TurnInput {
        parse(Bytes::from(v.to_string()), Instant::now()).unwrap().0
    }

    #[test]
    fn tolerant_parse_into_the_neutral_turn() {
        let t = input(json!({
            "model": "m", "stream": null, "max_tokens": 3,
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
            ],
            "tools": [{"type": "function", "name": "f", "function": {"name": "f"}}]
        }));
        assert_eq!(t.messages[0].role, Role::Developer);
        assert_eq!(t.messages[1].text, "ab");
        assert_eq!(t.tools.as_ref().unwrap()[0].name, "f");
        assert_eq!(t.tool_choice, ToolChoice::Auto);
        assert!(t.continuation.is_none() && t.parallel_tool_calls);
    }

    #[test]
    fn bad_tools_are_carried_not_refused() {
        let t = input(
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {}}], "tool_choice": 3}),
        );
        assert!(t.tools.is_err());
        assert_eq!(t.tool_choice, ToolChoice::Invalid);
        let none = input(
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {}}], "tool_choice": "none"}),
        );
        assert_eq!(none.tools, Ok(Vec::new()));
    }

    #[test]
    fn continuation_prefix_is_the_fresh_prefix_of_the_same_messages() {
        const T: &str = "srct-0123456789abcdef0123456789abcdef";
        let history = json!([{"role": "user", "content": "a"}]);
        let mut fresh = input(json!({"model": "m", "messages": history}));
        fresh.digest_messages();
        let cont = input(json!({"model": "m", "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "tool_calls": [{"id": T, "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": T, "content": "r"}]}));
        let c = cont.continuation.unwrap();
        assert_eq!(c.prefix, fresh.fingerprint.prefix);
        assert_eq!((c.assistant, c.results[0].1), (1, 2));
    }

    #[test]
    fn empty_messages_and_bad_json_are_invalid() {
        for body in ["{bad", r#"{"model":"m","messages":[]}"#] {
            let e = parse(Bytes::from(body), Instant::now()).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidRequest);
        }
    }
}
