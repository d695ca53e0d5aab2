//! The Anthropic Messages routes: `POST /v1/messages` (the `?beta=true` query Claude Code sends
//! is accepted and ignored), `POST /v1/messages/count_tokens` (an estimate, see
//! `surface::messages::estimate_tokens`) and the Anthropic form of `GET /v1/models` (chosen by
//! the `anthropic-version` header). Every error here has the Anthropic shape ([`Anthropic`]).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde_json::{json, Value};

use super::error::Anthropic;
use super::{
    admitted, answered, cluster, holding, keep_raw, principal, run, sse, stream_place, Gateway, Ran,
};
use crate::error::{ApiError, ErrorCode};
use crate::surface::messages;

/// `POST /v1/messages`.
pub(super) async fn create(
    State(gw): State<Gateway>,
    hop: Option<Extension<cluster::Hop>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Anthropic> {
    let mut a = admitted(&gw, &headers, body).await?;
    let raw = keep_raw(&gw, &a);
    let bytes = std::mem::take(&mut a.bytes);
    let (input, framing) = messages::parse(&bytes, a.arrived)?;
    drop(bytes);
    let slot = stream_place(&gw, &a, framing.stream)?;
    let leg = match run(&gw, &a.principal, input, hop, (&uri, &headers, raw))
        .await
        .map_err(ApiError::from)?
    {
        Ran::Here(leg) => leg,
        Ran::Relayed(resp) => return Ok(holding(resp, slot)),
    };
    let execution = leg.execution_id.clone();
    let resp = if framing.stream {
        sse(messages::framing::stream(leg, framing, a.cfg.server.keepalive).await?)
    } else {
        Json(messages::framing::collect(leg, framing).await?).into_response()
    };
    Ok(answered(&gw, &a, execution, holding(resp, slot)))
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": n}` for a model the principal may use.
pub(super) async fn count_tokens(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Anthropic> {
    let a = admitted(&gw, &headers, body).await?;
    let (input, _) = messages::parse(&a.bytes, a.arrived)?;
    if !gw.models_for(&a.principal).contains(&input.model) {
        return Err(ApiError::model_not_found(&input.model).into());
    }
    let n = messages::estimate_tokens(&input);
    Ok(Json(json!({"input_tokens": n})).into_response())
}

/// A model in Anthropic's list shape.
fn model(id: &str) -> Value {
    json!({"type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z"})
}

/// `GET /v1/models` for an Anthropic client: one page holding every model.
pub(super) fn models(gw: &Gateway, headers: &HeaderMap) -> Result<Response, Anthropic> {
    let principal = principal(gw, headers)?;
    let ids = gw.models_for(&principal);
    let data: Vec<Value> = ids.iter().map(|id| model(id)).collect();
    Ok(Json(json!({"data": data, "has_more": false,
                   "first_id": ids.first(), "last_id": ids.last()}))
    .into_response())
}

/// `GET /v1/models/{id}` for an Anthropic client.
pub(super) fn model_of(gw: &Gateway, headers: &HeaderMap, id: &str) -> Result<Response, Anthropic> {
    let principal = principal(gw, headers)?;
    if !gw.models_for(&principal).iter().any(|m| m == id) {
        return Err(ApiError::model_not_found(id).into());
    }
    Ok(Json(model(id)).into_response())
}

/// Another method on a Messages route.
pub(super) async fn method_not_allowed() -> Anthropic {
    Anthropic(ApiError::new(
        ErrorCode::MethodNotAllowed,
        "Method not allowed on this route.",
    ))
}
