//! The Responses API as a [`Surface`], and what a request comes to once read: its compaction
//! handles resolved for its principal, then a turn, a compaction (one summary turn, answered
//! with one `compaction` item) or a prewarm (no output). `POST /v1/responses/compact` and the
//! WebSocket mode (`socket.rs`) plan their requests here too.

use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::{framing, translate, Framing, Kind, Request};
use crate::engine::Leg;
use crate::error::{ApiError, Param};
use crate::surface::{sse, Answer, Host, Incoming, Plan, Reply, Route, Serve, Surface};
use crate::turn::{SurfaceId, TurnInput, Usage};

/// The OpenAI Responses API.
pub struct Responses;

impl Surface for Responses {
    const ID: SurfaceId = SurfaceId::Responses;
    const PATH: &'static str = "/v1/responses";
    type Request = (Request, Instant);
    type Framing = Framing;

    fn read(req: Incoming<'_>) -> Result<Self::Request, ApiError> {
        let (body, arrived) = (req.body, req.arrived);
        Ok((super::read(&body)?, arrived))
    }

    fn streams(req: &Self::Request) -> bool {
        req.0.streams()
    }

    async fn plan<H: Host>(req: Self::Request, host: &H) -> Result<(Plan, Framing), ApiError> {
        let (prepared, framing) = prepare(req.0, req.1, host, false).await?;
        let plan = match prepared {
            Prepared::Turn(input) => Plan::Turn(input),
            Prepared::Finished { id, output, usage } => {
                Plan::Done(finished(framing.clone(), &id, output, usage))
            }
        };
        Ok((plan, framing))
    }

    async fn stream(leg: Leg, f: Framing, keepalive: Duration) -> Result<sse::Body, ApiError> {
        framing::stream(leg, f, keepalive).await
    }

    async fn collect(leg: Leg, f: Framing) -> Result<Answer, ApiError> {
        framing::collect(leg, f).await
    }

    fn field(p: Param) -> &'static str {
        super::field(p)
    }

    fn error_body(e: &ApiError) -> Value {
        super::error_body(e)
    }

    fn routes() -> Vec<Route> {
        vec![
            Route {
                path: "/v1/responses/compact",
                serve: Serve::Post(compact),
            },
            Route {
                path: Self::PATH,
                serve: Serve::Socket,
            },
        ]
    }
}

/// `POST /v1/responses/compact`: the conversation in `input` compacted by one summary turn;
/// the answer keeps its user messages and adds one `compaction` item.
fn compact<'a>(req: Incoming<'a>, host: &'a dyn Host) -> BoxFuture<'a, Result<Answer, ApiError>> {
    Box::pin(async move {
        let read = super::read(&req.body)?;
        let kept = read.user_messages();
        let (prepared, _) = prepare(read, req.arrived, host, true).await?;
        let Prepared::Finished { id, output, usage } = prepared else {
            return Err(ApiError::upstream());
        };
        let mut all = kept;
        all.extend(output);
        Ok(Answer::Json(json!({
            "id": id,
            "object": "response.compaction",
            "created_at": crate::store::now_unix(),
            "output": all,
            "usage": super::object::UsageOut::of(usage),
        })))
    })
}

/// What a request comes to.
// Built once per request and taken apart at once (as `Plan`).
#[allow(clippy::large_enum_variant)]
pub enum Prepared {
    Turn(TurnInput),
    /// A response that needs no leg: no output (a prewarm) or one `compaction` item, its
    /// summary turn already run.
    Finished {
        id: String,
        output: Vec<Value>,
        usage: Usage,
    },
}

/// Resolves a request's compaction handles through `host` and decides what it comes to.
/// `compact`: the request came to `/v1/responses/compact` (a compaction whatever its input
/// ends with). A turn is returned, not run: this future stays small, so the request path does
/// not copy a turn's state through one more frame.
pub async fn prepare<H: Host + ?Sized>(
    req: Request,
    arrived: Instant,
    host: &H,
    compact: bool,
) -> Result<(Prepared, Framing), ApiError> {
    let handles = req.compactions();
    let summaries = match handles.is_empty() {
        true => Vec::new(),
        false => host.compacted(req.compaction_ask(&handles)).await?,
    };
    let (input, framing, kind) = translate(req, &summaries, arrived)?;
    let id = || super::response_id(&crate::ids::new_id("exe-"));
    let prepared = match (kind, compact) {
        (Kind::Compact, _) | (_, true) => {
            // Boxed by the host: a rare path whose future would otherwise size every
            // request's.
            let (handle, usage) = host.compact(input).await?;
            let item = json!({"id": crate::ids::new_id("cmp_"), "type": "compaction",
                              "encrypted_content": handle});
            Prepared::Finished {
                id: id(),
                output: vec![item],
                usage,
            }
        }
        (Kind::Prewarm, false) => Prepared::Finished {
            id: id(),
            output: Vec::new(),
            usage: Usage::default(),
        },
        (Kind::Turn, false) => Prepared::Turn(input),
    };
    Ok((prepared, framing))
}

/// A response that ran no leg, streamed or whole.
fn finished(framing: Framing, id: &str, output: Vec<Value>, usage: Usage) -> Reply {
    let stream = framing.stream;
    let events = framing::finished(framing, id, output, usage);
    if stream {
        let text = framing::sse_text(events);
        let body = futures::stream::once(async move { Ok(Bytes::from(text)) });
        return Reply::Stream(Box::pin(body));
    }
    let last = events.into_iter().last().unwrap_or_default();
    Reply::Whole(Answer::Json(last["response"].clone()))
}
