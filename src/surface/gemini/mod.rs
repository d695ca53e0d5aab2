//! The Gemini API surface (`generativelanguage` v1beta, what Gemini CLI, `@google/genai` and
//! `google-genai` speak): `POST /v1beta/models/{model}:generateContent`,
//! `:streamGenerateContent` (`alt=sse` events, else one JSON array written as it grows) and
//! `:countTokens`, and the model list and lookup (`routes`). The model and the method are the
//! path's (`{model}:{method}` is one path segment); the key comes as `x-goog-api-key` or the
//! `key` query parameter ([`Surface::CREDENTIAL`]). Errors are Google's envelope (`errors`).
//!
//! `contents` become neutral messages (`contents`), the tools and options theirs (`options`),
//! and the answer is a `GenerateContentResponse` (`framing`). A held call's `functionCall.id`
//! is its `srct-` token; a `functionResponse` answers the call its `id` names, or, without an
//! id, the next unanswered call of the same name in the model turn before it.
//!
//! Digests use the neutral message projection over these messages (a model turn's text is
//! its text parts joined as sent, thought parts left out). A model turn sent back is compared
//! as Messages compares one: `args` with every number as a JavaScript client holds it, text of
//! whitespace only as none. The tool set is digested as sent; the tool-choice digest is that
//! of `{"thinking": generationConfig.thinkingConfig, "tool_config": toolConfig}` without
//! `includeThoughts` (showing thoughts changes no answer).

mod contents;
mod errors;
mod framing;
mod options;
mod routes;

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::canonical::{message_digest, tools_digest};
use super::messages::echo::{client_echo, exposed_echo};
use super::turn::{Parts, Projection};
use super::{sse, under, Answer, Credential, Host, Incoming, Plan, Reply, Route, Surface};
use crate::continuation::canonical::digest;
use crate::engine::Leg;
use crate::error::{ApiError, ErrorCode, Param};
use crate::turn::{SurfaceId, ToolChoice, TurnInput};

/// The root of every route of this surface.
const ROOT: &str = "/v1beta";

/// A `GenerateContentRequest` (fields in either JSON spelling: Google's parsers take both).
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Request {
    #[serde(default)]
    contents: Option<Value>,
    #[serde(default, alias = "system_instruction")]
    system_instruction: Option<Value>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default, alias = "tool_config")]
    tool_config: Option<Value>,
    #[serde(default, alias = "generation_config")]
    generation_config: Option<Value>,
    #[serde(default, alias = "cached_content")]
    cached_content: Option<Value>,
    /// `countTokens` may wrap the whole request.
    #[serde(default, alias = "generate_content_request")]
    generate_content_request: Option<Box<Request>>,
}

/// The method a request's path names after the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Generate,
    Stream,
    Count,
}

/// A request read from its path and body.
pub enum Read {
    Turn(TurnInput, Framing),
    Count(TurnInput),
}

/// How to frame the answer.
#[derive(Debug, Clone)]
pub struct Framing {
    pub stream: bool,
    /// Streamed as one JSON array (no `alt=sse`), not as events.
    pub array: bool,
    /// The model as the client named it (`modelVersion`).
    pub model: String,
    /// `thinkingConfig.includeThoughts`: reasoning is shown as thought parts.
    pub thoughts: bool,
}

/// The `responseId` of one leg: the execution id's hex, and `_N` for the leg after the N-th
/// tool round.
pub fn response_id(execution_id: &str, round: u32) -> String {
    let hex = execution_id.strip_prefix("exe-").unwrap_or(execution_id);
    match round {
        0 => hex.to_string(),
        n => format!("{hex}_{n}"),
    }
}

/// Gemini's API.
pub struct Gemini;

impl Surface for Gemini {
    const ID: SurfaceId = SurfaceId::Gemini;
    const PATH: &'static str = "/v1beta/models/{call}";
    type Request = Read;
    type Framing = Framing;
    const CREDENTIAL: Option<Credential> = Some(credential);

    fn read(req: Incoming<'_>) -> Result<Read, ApiError> {
        let call = req.param("call").unwrap_or_default();
        let (model, method) = method(call)?;
        let alt = query(req.uri, "alt");
        let array = match alt {
            None | Some("json") => true,
            Some("sse") => false,
            Some(_) => {
                return Err(ApiError::invalid("`alt` must be \"sse\" or \"json\"").with_param("alt"))
            }
        };
        let stream = method == Method::Stream;
        let (input, thoughts) = parse(&req.body, model, stream, method, req.arrived)?;
        Ok(match method {
            Method::Count => Read::Count(input),
            _ => Read::Turn(
                input,
                Framing {
                    stream,
                    array: stream && array,
                    model: model.to_string(),
                    thoughts,
                },
            ),
        })
    }

    fn streams(req: &Read) -> bool {
        matches!(req, Read::Turn(_, f) if f.stream)
    }

    async fn plan<H: Host>(req: Read, host: &H) -> Result<(Plan, Framing), ApiError> {
        match req {
            Read::Turn(input, framing) => Ok((Plan::Turn(input), framing)),
            Read::Count(input) => {
                if !host.models().contains(&input.model) {
                    return Err(ApiError::model_not_found(&input.model));
                }
                let n = super::messages::estimate_tokens(&input);
                let answer = json!({"totalTokens": n,
                    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n}]});
                let framing = Framing {
                    stream: false,
                    array: false,
                    model: input.model,
                    thoughts: false,
                };
                Ok((Plan::Done(Reply::Whole(Answer::Json(answer))), framing))
            }
        }
    }

    async fn stream(leg: Leg, f: Framing, keepalive: Duration) -> Result<sse::Body, ApiError> {
        framing::stream(leg, f, keepalive).await
    }

    async fn collect(leg: Leg, f: Framing) -> Result<Answer, ApiError> {
        framing::collect(leg, f).await
    }

    fn field(p: Param) -> &'static str {
        match p {
            Param::Conversation => "contents",
            Param::Tools => "tools",
            Param::ToolChoice => "toolConfig",
            Param::ResponseFormat => "generationConfig.responseSchema",
            Param::Model => "model",
            Param::Effort => "generationConfig.thinkingConfig",
            Param::Field(name) => name,
        }
    }

    fn error_body(e: &ApiError) -> Value {
        errors::body(e, Self::field)
    }

    fn routes() -> Vec<Route> {
        routes::routes()
    }

    /// Every path under `/v1beta`.
    fn claims(uri: &http::Uri, _: &http::HeaderMap) -> bool {
        under(uri.path(), ROOT)
    }
}

/// The key a Gemini client sends: `x-goog-api-key`, else the `key` query parameter (as sent:
/// keys and JWTs need no percent-encoding).
fn credential<'a>(uri: &'a http::Uri, headers: &'a http::HeaderMap) -> Option<&'a str> {
    match headers.get("x-goog-api-key").and_then(|v| v.to_str().ok()) {
        Some(k) => Some(k),
        None => query(uri, "key"),
    }
}

/// The raw value of query parameter `name`.
fn query<'a>(uri: &'a http::Uri, name: &str) -> Option<&'a str> {
    (uri.query()?.split('&'))
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The model and method of a `{model}:{method}` path segment.
fn method(call: &str) -> Result<(&str, Method), ApiError> {
    let unknown = || {
        ApiError::new(
            ErrorCode::NotFound,
            format!("Unknown method: the path must end in `{{model}}:generateContent`, `:streamGenerateContent` or `:countTokens`, not `{call}`."),
        )
    };
    let (model, name) = call.rsplit_once(':').ok_or_else(unknown)?;
    let model = model.strip_prefix("models/").unwrap_or(model);
    let method = match name {
        "generateContent" => Method::Generate,
        "streamGenerateContent" => Method::Stream,
        "countTokens" => Method::Count,
        _ => return Err(unknown()),
    };
    match model.is_empty() {
        true => Err(unknown()),
        false => Ok((model, method)),
    }
}

/// Parses and translates one request body; also whether thoughts are to be shown.
fn parse(
    body: &[u8],
    model: &str,
    stream: bool,
    method: Method,
    arrived: Instant,
) -> Result<(TurnInput, bool), ApiError> {
    let mut req: Request = super::read_json(body)?;
    if method == Method::Count {
        if let Some(inner) = req.generate_content_request.take() {
            req = *inner;
        }
    }
    if req.cached_content.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(ApiError::invalid(
            "cachedContent: this gateway keeps no cached contents; send the contents themselves",
        )
        .with_param("cachedContent"));
    }
    let wire = match &req.contents {
        Some(Value::Array(c)) if !c.is_empty() => c.as_slice(),
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            return Err(
                ApiError::invalid("contents is not specified").with_param(Param::Conversation)
            )
        }
        Some(_) => {
            return Err(
                ApiError::invalid("`contents` must be an array of Content objects")
                    .with_param(Param::Conversation),
            )
        }
    };
    let tools_in = options::declared_tools(req.tools.as_ref())?;
    let choice = options::Choice::read(req.tool_config.as_ref())?;
    let generation = options::Generation::read(req.generation_config.as_ref())?;
    let messages = contents::messages(req.system_instruction.as_ref(), wire)?;
    let detected = contents::detect(&messages)?;
    let tools = match &choice.neutral {
        ToolChoice::None => Ok(Vec::new()),
        _ => options::tools(&tools_in, &choice.allowed),
    };
    let parts = Parts {
        surface: SurfaceId::Gemini,
        projection: Projection {
            digest: message_digest,
            exposed: exposed_echo,
            returned: client_echo,
            response_id,
        },
        model: model.to_string(),
        messages,
        detected,
        reference: None,
        tools,
        tools_digest: tools_digest(
            req.tools
                .as_ref()
                .and_then(Value::as_array)
                .map(Vec::as_slice),
        ),
        tool_choice_digest: tool_choice_digest(generation.thinking_canonical, &req.tool_config),
        tool_choice: choice.neutral,
        effort: generation.effort,
        parallel_tool_calls: true,
        stream,
        passthrough: None,
        sampling: generation.sampling,
        arrived,
    };
    Ok((parts.build(), generation.thoughts))
}

/// The digest of the thinking configuration with `toolConfig` (a plain request's, with
/// neither, computed once).
fn tool_choice_digest(thinking: Value, tool_config: &Option<Value>) -> [u8; 32] {
    fn of(thinking: Value, tool_config: Value) -> [u8; 32] {
        digest(&json!({"thinking": thinking, "tool_config": tool_config}))
    }
    match (thinking, tool_config.as_ref().filter(|c| !c.is_null())) {
        (Value::Null, None) => {
            static PLAIN: std::sync::LazyLock<[u8; 32]> =
                std::sync::LazyLock::new(|| of(Value::Null, Value::Null));
            *PLAIN
        }
        (thinking, config) => of(thinking, config.cloned().unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests;
