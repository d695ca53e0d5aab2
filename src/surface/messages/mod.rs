//! The Anthropic Messages surface (`POST /v1/messages`, Claude Code's API): messages and
//! content blocks as neutral messages (`blocks`), the message object and its event stream
//! (`framing`), its error body (`{"type":"error","error":{type,message}}`, Turnstile's code in
//! front of the message) and the token estimate of `count_tokens`.
//!
//! Tools without a `type` (or `"custom"`) are the client's; every typed tool (`web_search_*`,
//! `bash_*`, `code_execution_*`, ...) runs at Anthropic or is schema-less, so it is not
//! declared to a backend, and a `tool_choice` that forces one is 400 `unsupported_tool_choice`.
//!
//! Digests use the neutral message projection of the chat surface over this surface's
//! messages (with `is_error` when a result sets it). The tool set is digested with
//! `cache_control` removed (clients move their cache breakpoints between requests); the
//! `tool_choice` digest is that of `{"effort": output_config.effort, "tool_choice": {type,
//! name, disable_parallel_tool_use}}`. A `tool_use` block's `input` is compared as canonical
//! JSON.

pub mod blocks;
pub mod echo;
pub mod framing;
mod headers;
mod routes;
mod tools;
mod wire;

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use self::echo::{client_echo, exposed_echo};
use self::tools::{without_cache_control, Choice};
use super::canonical::{message_digest, tools_digest};
use super::turn::{Parts, Projection};
use super::{openai_field, sse, under, Answer, Host, Incoming, Plan, Route, Surface};
use crate::engine::{Leg, Standing};
use crate::error::{ApiError, Param};
use crate::turn::{Effort, Sampling, SurfaceId, ToolChoice, TurnInput};
use http::HeaderMap;

#[derive(Debug, Deserialize)]
struct Request {
    model: String,
    #[serde(default)]
    messages: Vec<Value>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    max_tokens: Option<Value>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    output_config: Option<Value>,
    #[serde(default)]
    stop_sequences: Option<Value>,
    #[serde(default)]
    temperature: Option<Value>,
    #[serde(default)]
    top_p: Option<Value>,
    #[serde(default)]
    thinking: Option<Value>,
    /// Auto mode's request for a provider-side safety check (refused: none here runs it).
    #[serde(default)]
    safeguards: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    metadata: Option<Value>,
}

/// How to frame the answer.
#[derive(Debug, Clone)]
pub struct Framing {
    pub stream: bool,
    /// The model as the client named it.
    pub model: String,
    /// How the backend's reasoning is shown: not at all (the request did not enable
    /// thinking), as `thinking` blocks with their text, or as blocks with the text omitted.
    pub thinking: Thinking,
}

/// What `thinking` asked to be shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thinking {
    Hidden,
    Shown,
    Omitted,
}

/// `thinking`: whether and how reasoning is shown, and the effort it stands for when no
/// `output_config.effort` is given (`docs/src/apis/messages.md`): `disabled` is
/// `minimal` (the least every reasoning backend takes), `adaptive` leaves the backend its own
/// default, `enabled` maps `budget_tokens` below 4,096 to `low`, below 16,384 to `medium`,
/// below 32,768 to `high` (Claude Code's 31,999), and beyond to `xhigh`.
fn thinking(v: Option<&Value>) -> Result<(Thinking, Option<Effort>), ApiError> {
    let Some(t) = v.filter(|v| !v.is_null()) else {
        return Ok((Thinking::Hidden, None));
    };
    let shown = match t["display"].as_str() {
        Some("omitted") => Thinking::Omitted,
        _ => Thinking::Shown,
    };
    let budget = &t["budget_tokens"];
    if !budget.is_null() && !budget.is_u64() {
        return Err(
            ApiError::invalid("`thinking.budget_tokens` must be a positive integer")
                .with_param("thinking.budget_tokens"),
        );
    }
    Ok(match t["type"].as_str() {
        Some("disabled") => (Thinking::Hidden, Some(Effort::Minimal)),
        Some("adaptive") => (shown, None),
        Some("enabled") => {
            let effort = match budget.as_u64() {
                Some(b) if b < 4_096 => Effort::Low,
                Some(b) if b < 16_384 => Effort::Medium,
                Some(b) if b < 32_768 => Effort::High,
                Some(_) => Effort::XHigh,
                None => Effort::Medium,
            };
            (shown, Some(effort))
        }
        _ => {
            return Err(ApiError::invalid(
                "`thinking.type` must be \"enabled\", \"adaptive\" or \"disabled\"",
            )
            .with_param("thinking.type"))
        }
    })
}

/// The message id of one leg: `msg_` + the execution id's hex, and `_N` for the leg after
/// the N-th tool round. Every leg is its own message: Claude Code merges assistant messages
/// that share an id (with their results) into one.
pub fn message_id(execution_id: &str, round: u32) -> String {
    let hex = execution_id.strip_prefix("exe-").unwrap_or(execution_id);
    match round {
        0 => format!("msg_{hex}"),
        n => format!("msg_{hex}_{n}"),
    }
}

/// The Anthropic Messages API.
pub struct Messages;

impl Surface for Messages {
    const ID: SurfaceId = SurfaceId::Messages;
    const PATH: &'static str = "/v1/messages";
    const REPORTS_STANDING: bool = true;
    type Request = (TurnInput, Framing);
    type Framing = Framing;

    fn read(req: Incoming<'_>) -> Result<Self::Request, ApiError> {
        let (body, arrived) = (req.body, req.arrived);
        let (input, framing) = parse(&body, arrived)?;
        // Anthropic's own answer to a body without it (`count_tokens` takes none).
        if input.sampling.max_tokens.is_none() {
            return Err(ApiError::invalid("max_tokens: Field required").with_param("max_tokens"));
        }
        Ok((input, framing))
    }

    fn streams(req: &Self::Request) -> bool {
        req.1.stream
    }

    async fn plan<H: Host>(req: Self::Request, _: &H) -> Result<(Plan, Framing), ApiError> {
        Ok((Plan::Turn(req.0), req.1))
    }

    async fn stream(leg: Leg, f: Framing, keepalive: Duration) -> Result<sse::Body, ApiError> {
        framing::stream(leg, f, keepalive).await
    }

    async fn collect(leg: Leg, f: Framing) -> Result<Answer, ApiError> {
        framing::collect(leg, f).await.map(Answer::Raw)
    }

    fn field(p: Param) -> &'static str {
        match p {
            Param::Effort => "output_config.effort",
            Param::ResponseFormat => "output_config.format",
            p => openai_field(p),
        }
    }

    fn error_body(e: &ApiError) -> Value {
        framing::error_body(e)
    }

    fn error_status(e: &ApiError) -> u16 {
        headers::status(e)
    }

    fn error_headers(e: &ApiError, h: &mut HeaderMap) {
        headers::on_error(e, h)
    }

    fn routes() -> Vec<Route> {
        routes::routes()
    }

    /// A path under `/v1/messages`, or any request naming the API version (an Anthropic
    /// client's `GET /v1/models` is this surface's).
    fn claims(uri: &http::Uri, headers: &HeaderMap) -> bool {
        under(uri.path(), Self::PATH) || headers.contains_key("anthropic-version")
    }

    fn standing_headers(s: &Standing, h: &mut HeaderMap) {
        headers::on_answer(s, h)
    }
}

/// Parses and translates one request body. Shapes are checked here (400), before any lookup.
pub fn parse(body: &[u8], arrived: Instant) -> Result<(TurnInput, Framing), ApiError> {
    let req: Request = super::read_json(body)?;
    if req.messages.is_empty() {
        return Err(
            ApiError::invalid("`messages` must not be empty").with_param(Param::Conversation)
        );
    }
    let known = |m: &Value| matches!(m["role"].as_str(), Some("user" | "assistant" | "system"));
    if req.messages.iter().any(|m| !known(m)) {
        return Err(ApiError::invalid(
            "each message must be an object with `role` \"user\", \"assistant\" or \"system\" and `content`",
        )
        .with_param(Param::Conversation));
    }
    if req.safeguards.is_some() {
        return Err(ApiError::invalid(
            "safeguards: this gateway has no provider that runs auto mode's safety check or answers `safeguard_results`; send the request without `safeguards`",
        )
        .with_param("safeguards"));
    }
    let raw_effort = req.output_config.as_ref().map(|o| &o["effort"]);
    let (shown, thought) = thinking(req.thinking.as_ref())?;
    let effort = effort(raw_effort)?.or(thought);
    let tools_in = req.tools.as_deref().unwrap_or_default();
    let choice = Choice::read(req.tool_choice.as_ref(), tools_in)?;
    let messages = blocks::messages(req.system.as_ref(), &req.messages);
    let detected = blocks::detect(&messages)?;
    let stripped: Vec<Value> = tools_in.iter().map(without_cache_control).collect();
    let stream = req.stream.unwrap_or(false);
    let tools = match choice.neutral {
        ToolChoice::None => Ok(Vec::new()),
        _ => tools::tools(tools_in),
    };
    let parts = Parts {
        surface: SurfaceId::Messages,
        projection: Projection {
            digest: message_digest,
            exposed: exposed_echo,
            returned: client_echo,
            response_id: message_id,
        },
        model: req.model.clone(),
        messages,
        detected,
        reference: None,
        tools,
        tools_digest: tools_digest(Some(&stripped)),
        tool_choice_digest: choice.digest(raw_effort),
        tool_choice: choice.neutral,
        effort,
        parallel_tool_calls: !choice.disable_parallel,
        stream,
        passthrough: None,
        sampling: sampling(&req),
        arrived,
    };
    let framing = Framing {
        stream,
        model: req.model,
        thinking: shown,
    };
    Ok((parts.build(), framing))
}

/// `output_config.effort` in the OpenAI vocabulary (`max` is the strongest there is,
/// `xhigh`); absent or null is none, anything else is a 400.
fn effort(v: Option<&Value>) -> Result<Option<Effort>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "`output_config.effort` must be one of \"low\", \"medium\", \"high\", \"xhigh\", \"max\"",
        )
        .with_param("output_config.effort")
    };
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(match s.as_str() {
            "low" => Effort::Low,
            "medium" => Effort::Medium,
            "high" => Effort::High,
            "xhigh" | "max" => Effort::XHigh,
            _ => return Err(bad()),
        })),
        Some(_) => Err(bad()),
    }
}

/// The request's sampling options (`docs/src/apis/messages.md`).
fn sampling(req: &Request) -> Sampling {
    let set = |v: &Option<Value>| v.as_ref().filter(|v| !v.is_null()).cloned();
    // The client's cache identity, as a key that names no one (`cache_control` never
    // reaches a Chat Completions upstream: the body is translated, not forwarded).
    let user = req.metadata.as_ref().and_then(|m| m["user_id"].as_str());
    let cache_key = user
        .filter(|u| !u.is_empty())
        .map(|u| json!(hex::encode(crate::digest::sha256(u.as_bytes()))));
    Sampling {
        max_tokens: set(&req.max_tokens),
        temperature: set(&req.temperature),
        top_p: set(&req.top_p),
        stop: set(&req.stop_sequences),
        cache_key,
        response_format: req
            .output_config
            .as_ref()
            .and_then(|o| output_format(&o["format"])),
    }
}

/// `output_config.format` in the Chat Completions shape of a structured-output request.
fn output_format(f: &Value) -> Option<Value> {
    match f["type"].as_str() {
        None if f.is_null() => None,
        Some("json_schema") => Some(json!({"type": "json_schema", "json_schema": {
            "name": "output", "schema": f["schema"], "strict": true}})),
        _ => Some(f.clone()),
    }
}

/// An honest estimate of a request's input tokens without the model's tokenizer: one token
/// per four bytes of text (system, messages, tool calls and results, the client tools' names,
/// descriptions and schemas), rounded up, plus three per message.
pub fn estimate_tokens(input: &TurnInput) -> u64 {
    let tools_bytes: usize = input
        .tools
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
        .sum();
    let text: usize = input
        .messages
        .iter()
        .map(|m| {
            m.text.len()
                + m.tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.arguments.len())
                    .sum::<usize>()
        })
        .sum();
    (text + tools_bytes).div_ceil(4) as u64 + 3 * input.messages.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    const T: &str = "srct-0123456789abcdef0123456789abcdef";

    fn parsed(v: Value) -> (TurnInput, Framing) {
        parse(v.to_string().as_bytes(), Instant::now()).unwrap()
    }

    /// What a Chat Completions upstream receives of the request's options.
    fn options(t: &TurnInput) -> serde_json::Map<String, Value> {
        crate::backend::upstream::translate::options(t)
    }

    fn fixture() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/claude-code-2.1.328-messages-request.json"
        );
        serde_json::from_str::<Value>(&std::fs::read_to_string(path).unwrap()).unwrap()["body"]
            .clone()
    }

    #[test]
    fn a_claude_code_request_parses() {
        let (t, f) = parsed(fixture());
        assert_eq!(t.surface, SurfaceId::Messages);
        assert!(t.stream && f.stream);
        assert_eq!(t.effort, Some(Effort::High));
        assert_eq!(t.tools.as_ref().unwrap().len(), 12);
        let roles: Vec<_> = t.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "system"]);
        assert!(t.continuation.is_none());
        assert_eq!(options(&t)["max_tokens"], 32000);
        assert_eq!(options(&t)["reasoning_effort"], "high");
    }

    #[test]
    fn a_2026_claude_code_body_maps_thinking_to_effort_and_names_no_one_upstream() {
        let mut body = fixture();
        body.as_object_mut().unwrap().remove("output_config");
        body["thinking"] = json!({"type": "enabled", "budget_tokens": 31999, "display": "updates"});
        body["context_management"] =
            json!({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]});
        body["system"][0]["cache_control"] = json!({"type": "ephemeral", "ttl": "1h"});
        body["metadata"] = json!({"user_id": "{\"device_id\":\"d\",\"session_id\":\"s\"}"});
        let (t, f) = parsed(body.clone());
        assert_eq!(t.effort, Some(Effort::High));
        assert_eq!(f.thinking, Thinking::Shown);
        let options = options(&t);
        let key = options["prompt_cache_key"].as_str().unwrap();
        assert_eq!(key.len(), 64);
        assert!(!options.values().any(|v| v.to_string().contains("ttl")));
        for (thinking, effort, shown) in [
            (
                json!({"type": "enabled", "budget_tokens": 2000}),
                Some(Effort::Low),
                Thinking::Shown,
            ),
            (
                json!({"type": "enabled", "budget_tokens": 8000}),
                Some(Effort::Medium),
                Thinking::Shown,
            ),
            (
                json!({"type": "enabled", "budget_tokens": 64000}),
                Some(Effort::XHigh),
                Thinking::Shown,
            ),
            (
                json!({"type": "adaptive", "display": "omitted"}),
                None,
                Thinking::Omitted,
            ),
            (
                json!({"type": "disabled"}),
                Some(Effort::Minimal),
                Thinking::Hidden,
            ),
        ] {
            body["thinking"] = thinking;
            let (t, f) = parsed(body.clone());
            assert_eq!(
                (t.effort, f.thinking),
                (effort, shown),
                "{}",
                body["thinking"]
            );
        }
        // An explicit effort wins over thinking.
        body["output_config"] = json!({"effort": "low"});
        body["thinking"] = json!({"type": "enabled", "budget_tokens": 64000});
        assert_eq!(parsed(body.clone()).0.effort, Some(Effort::Low));
        body["thinking"] = json!({"type": "sometimes"});
        let e = parse(body.to_string().as_bytes(), Instant::now()).unwrap_err();
        assert_eq!(e.param, Some("thinking.type".into()));
    }

    #[test]
    fn tool_choice_server_tools_and_parallel_use() {
        let body = |choice: Value| {
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "Read", "input_schema": {"type": "object"}},
                          {"type": "web_search_20250305", "name": "web_search"}],
                "tool_choice": choice})
        };
        let (t, _) = parsed(body(
            json!({"type": "any", "disable_parallel_tool_use": true}),
        ));
        assert_eq!(t.tool_choice, ToolChoice::Required);
        assert!(!t.parallel_tool_calls);
        assert_eq!(t.tools.as_ref().unwrap().len(), 1);
        let (t, _) = parsed(body(json!({"type": "tool", "name": "Read"})));
        assert_eq!(t.tool_choice, ToolChoice::Named("Read".into()));
        let (t, _) = parsed(body(json!({"type": "none"})));
        assert_eq!(t.tools, Ok(Vec::new()));
        let forced = body(json!({"type": "tool", "name": "web_search"}));
        let e = parse(forced.to_string().as_bytes(), Instant::now()).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnsupportedToolChoice);
        let (t, _) = parsed(body(json!({"type": "sometimes"})));
        assert_eq!(t.tool_choice, ToolChoice::Invalid);
    }

    #[test]
    fn fingerprint_binds_effort_and_ignores_cache_control() {
        let body = |effort: &str, cache: bool| {
            let mut tool = json!({"name": "Read", "input_schema": {"type": "object"}});
            if cache {
                tool["cache_control"] = json!({"type": "ephemeral"});
            }
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                   "tools": [tool], "output_config": {"effort": effort}})
        };
        let a = parsed(body("low", false)).0.fingerprint;
        let b = parsed(body("low", true)).0.fingerprint;
        let c = parsed(body("max", false)).0.fingerprint;
        assert_eq!(a, b);
        assert_ne!(a.tool_choice, c.tool_choice);
        assert_eq!(parsed(body("max", false)).0.effort, Some(Effort::XHigh));
        let bad = parse(body("turbo", false).to_string().as_bytes(), Instant::now());
        assert_eq!(bad.unwrap_err().param, Some("output_config.effort".into()));
    }

    #[test]
    fn a_continuation_prefix_is_the_fresh_prefix_and_the_echo_the_exposed_one() {
        let history = json!([{"role": "user", "content": "a"}]);
        let mut fresh = parsed(json!({"model": "m", "system": "s", "messages": history})).0;
        fresh.digest_messages();
        let cont = parsed(json!({"model": "m", "system": [{"type": "text", "text": "s"}], "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"},
                {"type": "tool_use", "id": T, "name": "f", "input": {"b": 1, "a": [1]}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": T, "content": "r"}]}]}))
        .0;
        let c = cont.continuation.unwrap();
        assert_eq!(c.prefix, fresh.fingerprint.prefix);
        let exposed = [crate::turn::ExposedCall {
            id: T.into(),
            name: "f".into(),
            arguments: r#"{"a":[1],"b":1}"#.into(),
        }];
        assert_eq!(c.echo, exposed_echo("ok", &exposed));
        assert_eq!((c.assistant, c.results[0].1), (2, 3));
    }

    #[test]
    fn errors_are_anthropic_shaped() {
        let e = ApiError::new(ErrorCode::ContinuationNotFound, "Unknown.");
        assert_eq!(
            framing::error_body(&e),
            json!({"type": "error", "error": {"type": "not_found_error",
                   "message": "continuation_not_found: Unknown."}})
        );
        for body in [
            "{bad",
            r#"{"model":"m","messages":[]}"#,
            r#"{"messages":[1]}"#,
            r#"{"model":"m","messages":[1]}"#,
            r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#,
        ] {
            let e = parse(body.as_bytes(), Instant::now()).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidRequest, "{body}");
        }
    }
}
