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
use crate::turn::Usage;

/// What a Responses request came to.
pub(super) enum Answer {
    Ran(Ran),
    /// A response that ran no leg: a prewarm (no output) or a compaction (one item).
    Finished {
        id: String,
        output: Vec<Value>,
        usage: Usage,
    },
}

/// Reads, resolves and runs one Responses request for `principal`. `compact`: the request
/// came to `/v1/responses/compact` (a compaction whatever its input ends with).
pub(super) async fn answer(
    gw: &Gateway,
    principal: &Principal,
    req: responses::Request,
    arrived: tokio::time::Instant,
    compact: bool,
    hop: Option<Extension<cluster::Hop>>,
    replay: (&Uri, &HeaderMap, Option<Bytes>),
) -> Result<(Answer, Framing), ApiError> {
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
    let answer = match (kind, compact) {
        (Kind::Compact, _) | (_, true) => {
            let (handle, usage) = gw.compact(principal, input).await?;
            let item = json!({"id": crate::ids::new_id("cmp_"), "type": "compaction",
                              "encrypted_content": handle});
            Answer::Finished {
                id: id(),
                output: vec![item],
                usage,
            }
        }
        (Kind::Prewarm, false) => Answer::Finished {
            id: id(),
            output: Vec::new(),
            usage: Usage::default(),
        },
        (Kind::Turn, false) => {
            let ran = run(gw, principal, input, hop, replay).await;
            Answer::Ran(ran.map_err(|e| responses::on_input(e.into()))?)
        }
    };
    Ok((answer, framing))
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
    let replay = (&uri, &headers, raw);
    let (answer, framing) = answer(&gw, &a.principal, req, a.arrived, false, hop, replay)
        .await
        .map_err(responses::on_input)?;
    let leg = match answer {
        Answer::Ran(Ran::Here(leg)) => leg,
        Answer::Ran(Ran::Relayed(resp)) => return Ok(holding(resp, slot)),
        Answer::Finished { id, output, usage } => {
            let resp = finished(framing, &id, output, usage);
            return Ok(answered(&gw, &a, String::new(), holding(resp, slot)));
        }
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
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let a = admitted(&gw, &headers, body).await?;
    let req = responses::read(&a.bytes)?;
    let kept = req.user_messages();
    let replay = (&uri, &headers, None);
    let (answer, _) = answer(&gw, &a.principal, req, a.arrived, true, None, replay)
        .await
        .map_err(responses::on_input)?;
    let Answer::Finished { id, output, usage } = answer else {
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
