//! The Responses surface (`POST /v1/responses`): input items as neutral messages (`items`),
//! client tools towards backends and back (`tools`), the response object and its event stream
//! (`framing`). Errors use the OpenAI shape of the chat surface.
//!
//! Continuations come in two styles with one validation path: the full `input` again, ending
//! with the outputs (stateless, as Codex CLI sends with `store:false`), or
//! `previous_response_id` plus only the outputs (stateful: the engine expands the reference
//! from what the suspension kept, bound to its principal and execution).
//!
//! Digests use the shared neutral message projection (`surface::canonical`) over this
//! surface's messages; a token is still answered only on the surface that issued it. The
//! `tool_choice` digest also covers `reasoning.effort`.

pub mod framing;
pub mod items;
pub mod object;
mod plan;
pub mod socket;
pub mod tools;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use self::object::Envelope;
pub use self::plan::{prepare, Prepared, Responses};
use self::tools::ToolMap;
use super::canonical::{echo_digest_of, exposed_echo, message_digest, tools_digest};
use super::turn::{Detected, Parts, Projection};
use crate::continuation::canonical::digest;
use crate::engine::CompactionAsk;
use crate::error::{ApiError, Param};
use crate::turn::{Effort, Sampling, SurfaceId, TurnInput};

/// A request body as read: its shape is checked, its compaction handles not yet resolved.
#[derive(Debug, Deserialize)]
pub struct Request {
    model: String,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    store: Option<bool>,
    #[serde(default)]
    reasoning: Option<Value>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    max_output_tokens: Option<Value>,
    #[serde(default)]
    temperature: Option<Value>,
    #[serde(default)]
    top_p: Option<Value>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    text: Option<Value>,
    #[serde(default)]
    user: Option<Value>,
    /// `false`: a response that runs nothing (Codex's prewarm), only naming its input.
    #[serde(default)]
    generate: Option<bool>,
    #[serde(default)]
    prompt_cache_key: Option<Value>,
    /// Echoed in the response object only (no backend here takes them).
    #[serde(default)]
    presence_penalty: Option<Value>,
    #[serde(default)]
    frequency_penalty: Option<Value>,
    #[serde(default)]
    top_logprobs: Option<Value>,
    #[serde(default)]
    max_tool_calls: Option<Value>,
    #[serde(default)]
    safety_identifier: Option<Value>,
    /// The body's size as it came (its compaction items not expanded).
    #[serde(skip)]
    body_bytes: usize,
}

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A turn of the model.
    Turn,
    /// `generate: false`: a response with no output, run by nothing.
    Prewarm,
    /// The input ends with a `compaction_trigger` item (or the request came to
    /// `/v1/responses/compact`): one summary turn, answered with one `compaction` item.
    Compact,
}

/// How a compaction's summary enters the conversation that carries its item.
pub const SUMMARY_PREFIX: &str = "Summary of the earlier conversation (compacted):\n\n";

impl Request {
    /// The client asked for the answer streamed.
    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// What resolving the request's compaction items asks of the engine (see
    /// [`crate::engine::Engine::compacted`]).
    pub fn compaction_ask<'a>(&'a self, handles: &'a [String]) -> CompactionAsk<'a> {
        let items = self.input.as_array().map(Vec::as_slice).unwrap_or_default();
        // Results for calls end a continuation's input: it is never limited.
        let answers = items.last().is_some_and(|i| {
            matches!(
                i["type"].as_str(),
                Some("function_call_output" | "custom_tool_call_output")
            )
        });
        CompactionAsk {
            model: &self.model,
            handles,
            fresh: !answers,
            body_bytes: self.body_bytes,
        }
    }

    /// The handles of the `compaction` items in `input` (their `encrypted_content`), to be
    /// resolved before [`translate`].
    pub fn compactions(&self) -> Vec<String> {
        let items = self.input.as_array().map(Vec::as_slice).unwrap_or_default();
        items
            .iter()
            .filter(|i| is_compaction(i))
            .map(|i| {
                i["encrypted_content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    }

    /// The `input` items with type `message` and role `user`, as sent (what a
    /// `/v1/responses/compact` answer keeps).
    pub fn user_messages(&self) -> Vec<Value> {
        let items = self.input.as_array().map(Vec::as_slice).unwrap_or_default();
        items
            .iter()
            .filter(|i| i["role"] == "user" && i.get("type").is_none_or(|t| t == "message"))
            .cloned()
            .collect()
    }
}

fn is_compaction(item: &Value) -> bool {
    matches!(
        item["type"].as_str(),
        Some("compaction" | "compaction_summary")
    )
}

/// Reads one request body (400 on a malformed one).
pub fn read(body: &[u8]) -> Result<Request, ApiError> {
    let mut req: Request = super::read_json(body)?;
    req.body_bytes = body.len();
    Ok(req)
}

/// `input` with each compaction item as the user message of its summary, and a final
/// `compaction_trigger` taken off (`true`: it was there). A handle with no summary in
/// `summaries` reads as an unknown response.
fn resolve(input: &mut Value, summaries: &[(String, String)]) -> Result<bool, ApiError> {
    let Value::Array(items) = input else {
        return Ok(false);
    };
    let trigger = items
        .last()
        .is_some_and(|i| i["type"] == "compaction_trigger");
    items.retain(|i| i["type"] != "compaction_trigger");
    for item in items.iter_mut().filter(|i| is_compaction(i)) {
        let handle = item["encrypted_content"].as_str().unwrap_or_default();
        let Some((_, summary)) = summaries.iter().find(|(h, _)| h == handle) else {
            return Err(crate::engine::EngineError::from(
                crate::engine::ContinuationError::ResponseNotFound,
            )
            .into());
        };
        *item = json!({"type": "message", "role": "user",
                       "content": format!("{SUMMARY_PREFIX}{summary}")});
    }
    Ok(trigger)
}

/// How to frame the answer: the request fields a response object echoes, and the client's
/// view of its tools.
#[derive(Debug, Clone)]
pub struct Framing {
    pub stream: bool,
    /// `model`, `tools`, `tool_choice`, `instructions`, ... as the response object shows them.
    pub envelope: Box<Envelope>,
    pub map: ToolMap,
}

/// The execution a response id names (`resp_<hex>` is execution `exe-<hex>`).
pub fn execution_of(response_id: &str) -> String {
    match response_id.strip_prefix("resp_") {
        Some(hex) => format!("exe-{hex}"),
        None => String::new(),
    }
}

/// The response id of an execution.
pub fn response_id(execution_id: &str) -> String {
    format!(
        "resp_{}",
        execution_id.strip_prefix("exe-").unwrap_or(execution_id)
    )
}

/// Parses and translates one request body without compaction items. Shapes are checked here
/// (400), before any lookup.
pub fn parse(body: &[u8], arrived: Instant) -> Result<(TurnInput, Framing), ApiError> {
    let (input, framing, _) = translate(read(body)?, &[], arrived)?;
    Ok((input, framing))
}

/// Translates a request read by [`read`], its compaction handles resolved to `summaries`.
pub fn translate(
    mut req: Request,
    summaries: &[(String, String)],
    arrived: Instant,
) -> Result<(TurnInput, Framing, Kind), ApiError> {
    let kind = match (resolve(&mut req.input, summaries)?, req.generate) {
        (true, _) => Kind::Compact,
        (false, Some(false)) => Kind::Prewarm,
        (false, _) => Kind::Turn,
    };
    let all = all_tools(&req);
    let tool_values = Some(&*all);
    let effort = Effort::read(
        req.reasoning.as_ref().and_then(|r| r.get("effort")),
        "reasoning.effort",
    )?;
    let choice_none = req.tool_choice.as_ref().is_some_and(|c| c == "none");
    let tools = tools::read(tool_values, choice_none);
    let tool_choice = tools::choice(req.tool_choice.as_ref(), &tools.map)?;
    let stateful = req.previous_response_id.is_some();
    // A reference carries the held turn's instructions; the request's do not re-enter it.
    let instructions = req.instructions.as_deref().filter(|_| !stateful);
    let messages = items::messages(&req.input, instructions, &tools.map);
    if messages.is_empty() {
        return Err(ApiError::invalid("`input` must not be empty").with_param(Param::Conversation));
    }
    let detected = match kind {
        // A summary turn of the conversation as it stands: nothing in it is answered.
        Kind::Compact => Detected::Fresh,
        _ => items::detect(&messages, stateful)?,
    };
    let stream = req.stream.unwrap_or(false);
    let parallel = req.parallel_tool_calls.unwrap_or(true);
    let parts = Parts {
        surface: SurfaceId::Responses,
        projection: Projection {
            digest: message_digest,
            exposed: exposed_echo,
            returned: echo_digest_of,
            response_id: |execution_id, _| response_id(execution_id),
        },
        model: req.model.clone(),
        messages,
        detected,
        reference: req.previous_response_id.as_deref().map(execution_of),
        tools: tools.defs,
        tools_digest: tools_digest(tool_values),
        tool_choice_digest: tool_choice_digest(req.tool_choice.as_ref(), effort),
        tool_choice,
        effort,
        parallel_tool_calls: parallel,
        stream,
        passthrough: None,
        sampling: sampling(&req),
        arrived,
    };
    let framing = Framing {
        stream,
        envelope: Box::new(Envelope::of(req, parallel)),
        map: tools.map,
    };
    let input = parts.build();
    Ok((input, framing, kind))
}

/// The digest of the tool choice with the effort (a plain request's computed once).
fn tool_choice_digest(choice: Option<&Value>, effort: Option<Effort>) -> [u8; 32] {
    fn of(choice: Value, effort: Option<Effort>) -> [u8; 32] {
        digest(&json!({"effort": effort.map(Effort::as_str), "tool_choice": choice}))
    }
    match (choice, effort) {
        (None, None) => {
            static AUTO: std::sync::LazyLock<[u8; 32]> =
                std::sync::LazyLock::new(|| of(json!("auto"), None));
            *AUTO
        }
        (choice, effort) => of(choice.cloned().unwrap_or_else(|| json!("auto")), effort),
    }
}

/// The request's tools: `tools`, and those an `additional_tools` input item offers (Codex
/// sends its tools that way to model families that run in code mode).
fn all_tools(req: &Request) -> std::borrow::Cow<'_, [Value]> {
    let extra: Vec<&Value> = match &req.input {
        Value::Array(items) => items
            .iter()
            .filter(|i| i["type"] == "additional_tools")
            .flat_map(|i| i["tools"].as_array().into_iter().flatten())
            .collect(),
        _ => Vec::new(),
    };
    let top = req.tools.as_deref().unwrap_or_default();
    if extra.is_empty() {
        return std::borrow::Cow::Borrowed(top);
    }
    let mut all = top.to_vec();
    all.extend(extra.into_iter().cloned());
    std::borrow::Cow::Owned(all)
}

/// The request's sampling options (`docs/src/apis/responses.md`).
fn sampling(req: &Request) -> Sampling {
    let set = |v: &Option<Value>| v.as_ref().filter(|v| !v.is_null()).cloned();
    let format = req.text.as_ref().map(|t| &t["format"]);
    let response_format = match format.and_then(|f| f["type"].as_str()) {
        Some("json_object") => Some(json!({"type": "json_object"})),
        Some("json_schema") => {
            let f = format.cloned().unwrap_or_default();
            Some(json!({"type": "json_schema", "json_schema": {
                "name": f["name"], "schema": f["schema"], "strict": f["strict"]}}))
        }
        // A format the gateway does not know is still a request for structure.
        Some("text") | None => None,
        Some(_) => format.cloned(),
    };
    Sampling {
        max_tokens: set(&req.max_output_tokens),
        temperature: set(&req.temperature),
        top_p: set(&req.top_p),
        stop: None,
        cache_key: req.prompt_cache_key.clone().filter(Value::is_string),
        response_format,
    }
}

/// This surface's names for the neutral parameters: the conversation is `input`.
pub fn field(p: Param) -> &'static str {
    match p {
        Param::Conversation => "input",
        Param::Effort => "reasoning.effort",
        Param::ResponseFormat => "text.format",
        p => super::openai_field(p),
    }
}

/// The OpenAI error body of this surface (also the `error` of a failed response).
pub fn error_body(e: &ApiError) -> Value {
    super::chat::openai_error_body(e, field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::turn::{Role, ToolChoice};

    const T: &str = "srct-0123456789abcdef0123456789abcdef";

    fn parsed(v: Value) -> (TurnInput, Framing) {
        parse(v.to_string().as_bytes(), Instant::now()).unwrap()
    }

    #[test]
    fn tolerant_parse_of_a_codex_request() {
        let (t, f) = parsed(json!({
            "model": "m", "stream": true, "store": false, "include": ["reasoning.encrypted_content"],
            "reasoning": {"summary": "auto", "effort": "high"}, "prompt_cache_key": "k",
            "client_metadata": {"a": "b"}, "instructions": "be brief",
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
                      {"type": "web_search"}],
            "tool_choice": "auto", "parallel_tool_calls": true
        }));
        assert_eq!(t.surface, SurfaceId::Responses);
        assert_eq!(t.messages[0].role, Role::System);
        assert_eq!(t.messages[1].text, "hi");
        assert_eq!(t.tools.as_ref().unwrap().len(), 1);
        assert_eq!(t.tool_choice, ToolChoice::Auto);
        assert!(t.stream && t.continuation.is_none());
        assert_eq!(
            crate::backend::upstream::translate::options(&t)["reasoning_effort"],
            "high"
        );
        assert!(!f.envelope.store);
        assert_eq!(f.envelope.tools.len(), 2);
    }

    #[test]
    fn unknown_members_of_items_are_ignored_and_kept_out_of_the_fingerprint() {
        let item = |extra: Option<Value>| {
            let mut m = json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]});
            if let Some(x) = extra {
                m["internal_chat_message_metadata_passthrough"] = x;
            }
            json!({"model": "m", "input": [m]})
        };
        let plain = parsed(item(None)).0;
        let codex = parsed(item(Some(
            json!({"turn_id": "t", "content_item_kinds": ["user.text"]}),
        )))
        .0;
        assert_eq!(plain.fingerprint, codex.fingerprint);
        assert_eq!(plain.messages, codex.messages);
    }

    #[test]
    fn a_trigger_compacts_a_prewarm_generates_nothing_and_a_handle_reads_as_its_summary() {
        let body = json!({"model": "m", "generate": false, "input": [
            {"role": "user", "content": "a"},
            {"type": "compaction", "encrypted_content": "cmp-1"},
            {"role": "user", "content": "b"},
            {"type": "compaction_trigger"}]});
        let req = read(body.to_string().as_bytes()).unwrap();
        assert_eq!(req.compactions(), ["cmp-1"]);
        assert_eq!(req.user_messages().len(), 2);
        let summaries = [("cmp-1".to_string(), "it went well".to_string())];
        let (t, _, kind) = translate(req, &summaries, Instant::now()).unwrap();
        assert_eq!(kind, Kind::Compact);
        assert_eq!(t.messages.len(), 3);
        assert_eq!(t.messages[1].text, format!("{SUMMARY_PREFIX}it went well"));
        let mut prewarm = body.clone();
        prewarm["input"].as_array_mut().unwrap().pop();
        let req = read(prewarm.to_string().as_bytes()).unwrap();
        let (_, _, kind) = translate(req, &summaries, Instant::now()).unwrap();
        assert_eq!(kind, Kind::Prewarm);
        let req = read(prewarm.to_string().as_bytes()).unwrap();
        let e = translate(req, &[], Instant::now()).unwrap_err();
        assert_eq!(e.code, ErrorCode::ContinuationNotFound);
    }

    #[test]
    fn tools_of_an_additional_tools_item_are_the_clients_too() {
        let (t, _) = parsed(json!({"model": "m", "input": [
            {"type": "additional_tools", "role": "developer", "tools": [
                {"type": "custom", "name": "exec", "description": "run JavaScript"}]},
            {"role": "user", "content": "go"}]}));
        let tools = t.tools.unwrap();
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].name, "exec");
        assert_eq!(t.messages.len(), 1);
    }

    #[test]
    fn effort_is_part_of_the_fingerprint() {
        let body =
            |effort: &str| json!({"model": "m", "input": "x", "reasoning": {"effort": effort}});
        let low = parsed(body("low")).0.fingerprint;
        let high = parsed(body("high")).0.fingerprint;
        assert_eq!(low.tools, high.tools);
        assert_ne!(low.tool_choice, high.tool_choice);
        let bad = parse(body("turbo").to_string().as_bytes(), Instant::now()).unwrap_err();
        assert_eq!(bad.param, Some("reasoning.effort".into()));
    }

    #[test]
    fn a_stateless_continuation_has_the_fresh_prefix() {
        let history = json!([{"role": "user", "content": "a"}]);
        let mut fresh = parsed(json!({"model": "m", "input": history})).0;
        fresh.digest_messages();
        let cont = parsed(json!({"model": "m", "input": [
            {"role": "user", "content": "a"},
            {"type": "function_call", "call_id": T, "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": T, "output": "r"}]}))
        .0;
        let c = cont.continuation.unwrap();
        assert_eq!(c.prefix, fresh.fingerprint.prefix);
        assert!(c.bound.is_none());
    }

    #[test]
    fn a_stateful_continuation_is_bound_to_its_response() {
        let (t, _) = parsed(json!({"model": "m", "previous_response_id": "resp_abc",
            "input": [{"type": "function_call_output", "call_id": T, "output": "r"}]}));
        let c = t.continuation.unwrap();
        assert_eq!(c.bound.as_deref(), Some("exe-abc"));
        assert_eq!(c.results[0].1, 0);
        let (t, _) =
            parsed(json!({"model": "m", "previous_response_id": "resp_abc", "input": "more"}));
        assert!(t.continuation.is_none());
        assert_eq!(t.follows.as_deref(), Some("exe-abc"));
    }

    #[test]
    fn bad_bodies_are_invalid_and_continuation_params_point_at_input() {
        for body in ["{bad", r#"{"model":"m","input":[]}"#, r#"{"input":"x"}"#] {
            let e = parse(body.as_bytes(), Instant::now()).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidRequest, "{body}");
        }
        let e = ApiError::new(ErrorCode::ContinuationNotFound, "x").with_param(Param::Conversation);
        assert_eq!(error_body(&e)["error"]["param"], "input");
    }
}
