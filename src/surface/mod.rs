//! Client surfaces: one module per client API, each an implementation of [`Surface`]. A surface
//! owns its wire types, its tolerant parsing into a neutral [`TurnInput`] (through the shared
//! steps in `turn.rs`), its response and stream framing, its error body shape and its own names
//! for the neutral error parameters. `canonical.rs` holds the projections every surface digests
//! with, and each surface's routes beside its turn POST ([`Route`]: model lists, token counts,
//! compaction, a WebSocket mode). Nothing else knows a client wire format; the HTTP layer
//! serves every turn route with one generic handler over this trait, and every other route a
//! surface declares through [`Surface::routes`].

pub mod canonical;
pub mod chat;
pub mod gemini;
pub mod messages;
pub mod responses;
pub mod sse;
pub mod turn;

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::time::Instant;

pub use self::chat::Chat;
pub use self::messages::Messages;
pub use self::responses::Responses;
use crate::engine::{Leg, Standing};
use crate::error::{ApiError, Param};
use crate::turn::{SurfaceId, TurnInput, Usage};
use http::HeaderMap;

/// A request as it arrived on a surface's route: its path and query (where a client API may
/// name the model), its headers (its version, its credential's form) and its body, read
/// under the body limit.
pub struct Incoming<'a> {
    pub uri: &'a http::Uri,
    /// The route's path parameters (`{id}`), percent-decoded, as the route names them.
    pub params: &'a [(&'a str, &'a str)],
    pub headers: &'a HeaderMap,
    pub body: Bytes,
    pub arrived: Instant,
}

impl Incoming<'_> {
    /// The path parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
    }
}

/// A route of a client API beside its turn POST, served by the HTTP layer for an
/// authenticated caller, with errors in the surface's shape.
pub struct Route {
    pub path: &'static str,
    pub serve: Serve,
}

/// How a [`Route`] is served.
pub enum Serve {
    /// `GET`, answered from the request's path, query and headers.
    Get(Handler),
    /// `POST`, its body admitted and read as a turn's is (the same limits).
    Post(Handler),
    /// `GET` upgraded to the Responses WebSocket mode ([`responses::socket`]: the wire is the
    /// surface's; the upgrade, pings, idle close and credential re-checks are the transport's).
    Socket,
}

/// A surface's own form of credential (a header or query parameter its clients send instead
/// of `Authorization`): the key or token it carries, if the request has one.
pub type Credential = for<'a> fn(&'a http::Uri, &'a HeaderMap) -> Option<&'a str>;

/// The handler of a [`Route`]: the request and, for its principal, the gateway.
pub type Handler =
    for<'a> fn(Incoming<'a>, &'a dyn Host) -> BoxFuture<'a, Result<Answer, ApiError>>;

/// One client API.
pub trait Surface: Send + Sync + 'static {
    const ID: SurfaceId;
    /// The path of its turn route (`POST`).
    const PATH: &'static str;
    /// Whether a successful answer reports the caller's standing against its budget caps
    /// ([`Surface::standing_headers`]).
    const REPORTS_STANDING: bool = false;
    /// A request read from its body: shapes checked, nothing looked up yet.
    type Request: Send;
    /// What framing the answer needs besides the leg.
    type Framing: Send + 'static;
    /// Where its clients put the credential when they send no `Authorization` (read on its
    /// routes only, as a bearer token).
    const CREDENTIAL: Option<Credential> = None;

    /// Reads a request as it arrived, its path and headers as well as its body (400 on a bad
    /// shape).
    fn read(req: Incoming<'_>) -> Result<Self::Request, ApiError>;

    /// Whether the answer is streamed (its place among the principal's streams is taken
    /// before anything runs).
    fn streams(req: &Self::Request) -> bool;

    /// What the request comes to: a turn to run, or an answer that needs none.
    fn plan<H: Host>(
        req: Self::Request,
        host: &H,
    ) -> impl Future<Output = Result<(Plan, Self::Framing), ApiError>> + Send;

    /// The streamed answer of a leg.
    fn stream(
        leg: Leg,
        framing: Self::Framing,
        keepalive: Duration,
    ) -> impl Future<Output = Result<sse::Body, ApiError>> + Send;

    /// The whole answer of a leg, once it ends.
    fn collect(
        leg: Leg,
        framing: Self::Framing,
    ) -> impl Future<Output = Result<Answer, ApiError>> + Send;

    /// This surface's name for a neutral error parameter.
    fn field(p: Param) -> &'static str;

    /// The error body in this surface's shape.
    fn error_body(e: &ApiError) -> Value;

    /// The status of an error on this surface, where its clients' contract differs from the
    /// neutral one ([`ApiError::status`]).
    fn error_status(e: &ApiError) -> u16 {
        e.status()
    }

    /// Headers this surface's clients read on an error, beyond `Retry-After`.
    fn error_headers(_e: &ApiError, _headers: &mut HeaderMap) {}

    /// Headers of a successful answer that tell the caller where it stands against its
    /// fullest budget cap.
    fn standing_headers(_standing: &Standing, _headers: &mut HeaderMap) {}

    /// Its routes beside the turn route.
    fn routes() -> Vec<Route> {
        Vec::new()
    }

    /// Whether a request speaks this surface's dialect: it picks the surface of a path
    /// several surfaces serve (the model list) and the shape of an unknown route's 404. By
    /// default, a path at or under [`Surface::PATH`].
    fn claims(uri: &http::Uri, _headers: &HeaderMap) -> bool {
        under(uri.path(), Self::PATH)
    }
}

/// Whether `path` is `prefix` or a path below it.
pub fn under(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// What a request comes to.
// Built once per request and taken apart at once: boxing the turn would cost every request an
// allocation to save a few hundred bytes of stack.
#[allow(clippy::large_enum_variant)]
pub enum Plan {
    Turn(TurnInput),
    /// An answer that runs no leg (a Responses prewarm or compaction).
    Done(Reply),
}

/// An answer, streamed or whole.
pub enum Reply {
    Stream(sse::Body),
    Whole(Answer),
}

/// A whole answer: built here, or an upstream's own JSON body relayed as it came.
pub enum Answer {
    Json(Value),
    Raw(Bytes),
}

/// What a surface may ask of the gateway while planning, for the request's principal.
pub trait Host: Sync {
    /// The summaries a request's compaction handles stand for, by handle (see
    /// [`crate::engine::Engine::compacted`]: bounded, and admitted first).
    fn compacted<'a>(
        &'a self,
        ask: crate::engine::CompactionAsk<'a>,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, ApiError>>;
    /// Runs a summary turn: the handle of the compacted conversation and the turn's usage.
    fn compact(&self, input: TurnInput) -> BoxFuture<'_, Result<(String, Usage), ApiError>>;
    /// The models the principal may use, in config order.
    fn models(&self) -> Vec<String>;
}

/// Chat's (and every OpenAI surface's) names for the neutral parameters.
pub fn openai_field(p: Param) -> &'static str {
    match p {
        Param::Conversation => "messages",
        Param::Tools => "tools",
        Param::ToolChoice => "tool_choice",
        Param::ResponseFormat => "response_format",
        Param::Model => "model",
        Param::Effort => "reasoning_effort",
        Param::Field(name) => name,
    }
}

/// A request body as `T`: UTF-8 (as JSON must be; serde would skip invalid bytes inside
/// members it ignores, and the body may be relayed as is) and then JSON.
pub fn read_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::invalid(format!("Invalid request body: not UTF-8 ({e})")))?;
    serde_json::from_str(text).map_err(|e| ApiError::invalid(format!("Invalid request body: {e}")))
}
