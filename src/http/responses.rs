//! The Responses routes over HTTP (`POST /v1/responses`, `POST /v1/responses/compact`) and
//! what they share with the WebSocket transport (`responses_ws.rs`): a request's compaction
//! handles resolved for its principal, then a turn, a compaction or a prewarm.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::{admitted, answered, cluster, holding, keep_raw, run, sse, stream_place, Gateway, Ran};
use crate::auth::Principal;
use crate::engine::{ContinuationError, EngineError};
use crate::error::ApiError;
use crate::surface::responses::{self, framing, Framing, Kind};
use crate::turn::{TurnInput, Usage};

/// What a Responses request comes to once read: a turn to run, or a response that needs no
/// leg (a prewarm: no output; a compaction: one item, its summary turn already run).
// Built once per request and taken apart at once: boxing the turn would cost every request an
// allocation to save a few hundred bytes of stack.
#[allow(clippy::large_enum_variant)]
pub(super) enum Plan {
    Turn(TurnInput),
    Finished {
        id: String,
        output: Vec<Value>,
        usage: Usage,
    },
}

/// Resolves a request's compaction handles for `principal` and decides what it comes to.
/// `compact`: the request came to `/v1/responses/compact` (a compaction whatever its input
/// ends with). The turn itself is run by the caller: this future stays small, so the request
/// path does not copy a turn's state through one more frame.
pub(super) async fn plan(
    gw: &Gateway,
    principal: &Principal,
    req: responses::Request,
    arrived: tokio::time::Instant,
    compact: bool,
) -> Result<(Plan, Framing), ApiError> {
    let mut summaries = Vec::new();
    for handle in req.compactions() {
        match gw.compacted(principal, &handle) {
            Ok(Some(summary)) => summaries.push((handle, summary)),
            Ok(None) => return Err(EngineError::from(ContinuationError::ResponseNotFound).into()),
            Err(e) => return Err(e.into()),
        }
    }
    let (input, framing, kind) = responses::translate(req, &summaries, arrived)?;
    let id = || responses::response_id(&crate::ids::new_id("exe-"));
    let plan = match (kind, compact) {
        (Kind::Compact, _) | (_, true) => {
            // Boxed: a rare path whose future would otherwise size every request's.
            let (handle, usage) = Box::pin(gw.compact(principal, input)).await?;
            let item = json!({"id": crate::ids::new_id("cmp_"), "type": "compaction",
                              "encrypted_content": handle});
            Plan::Finished {
                id: id(),
                output: vec![item],
                usage,
            }
        }
        (Kind::Prewarm, false) => Plan::Finished {
            id: id(),
            output: Vec::new(),
            usage: Usage::default(),
        },
        (Kind::Turn, false) => Plan::Turn(input),
    };
    Ok((plan, framing))
}

/// `POST /v1/responses`.
pub(super) async fn create(
    State(gw): State<Gateway>,
    hop: Option<Extension<cluster::Hop>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut a = admitted(&gw, &headers, body).await?;
    let raw = keep_raw(&gw, &a);
    let req = responses::read(&std::mem::take(&mut a.bytes))?;
    let slot = stream_place(&gw, &a, req.streams())?;
    let (plan, framing) = plan(&gw, &a.principal, req, a.arrived, false)
        .await
        .map_err(responses::on_input)?;
    let input = match plan {
        Plan::Turn(input) => input,
        Plan::Finished { id, output, usage } => {
            let resp = finished(framing, &id, output, usage);
            return Ok(answered(&gw, &a, String::new(), holding(resp, slot)));
        }
    };
    let ran = run(&gw, &a.principal, input, hop, (&uri, &headers, raw)).await;
    let leg = match ran.map_err(|e| responses::on_input(e.into()))? {
        Ran::Here(leg) => leg,
        Ran::Relayed(resp) => return Ok(holding(resp, slot)),
    };
    let execution = leg.execution_id.clone();
    let resp = if framing.stream {
        sse(framing::stream(leg, framing, a.cfg.server.keepalive).await?)
    } else {
        Json(framing::collect(leg, framing).await?).into_response()
    };
    Ok(answered(&gw, &a, execution, holding(resp, slot)))
}

/// A response that ran no leg, streamed or whole.
fn finished(framing: Framing, id: &str, output: Vec<Value>, usage: Usage) -> Response {
    let stream = framing.stream;
    let events = framing::finished(framing, id, output, usage);
    if stream {
        let text = framing::sse_text(events);
        let body = futures::stream::once(async move { Ok(Bytes::from(text)) });
        return sse(Box::pin(body));
    }
    let last = events.into_iter().last().unwrap_or_default();
    Json(last["response"].clone()).into_response()
}

/// `POST /v1/responses/compact`: the conversation in `input` compacted by one summary turn;
/// the answer keeps its user messages and adds one `compaction` item.
pub(super) async fn compact(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let a = admitted(&gw, &headers, body).await?;
    let req = responses::read(&a.bytes)?;
    let kept = req.user_messages();
    let (plan, _) = plan(&gw, &a.principal, req, a.arrived, true)
        .await
        .map_err(responses::on_input)?;
    let Plan::Finished { id, output, usage } = plan else {
        return Err(ApiError::upstream());
    };
    let mut all = kept;
    all.extend(output);
    let body = json!({
        "id": id,
        "object": "response.compaction",
        "created_at": crate::store::now_unix(),
        "output": all,
        "usage": framing::usage_json(usage),
    });
    Ok(answered(&gw, &a, String::new(), Json(body).into_response()))
}
