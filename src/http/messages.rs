//! The Anthropic Messages routes: `POST /v1/messages` (the `?beta=true` query Claude Code sends
//! is accepted and ignored), `POST /v1/messages/count_tokens` (an estimate, see
//! `surface::messages::estimate_tokens`) and the Anthropic form of `GET /v1/models` (chosen by
//! the `anthropic-version` header); `POST /v1/messages` itself is the generic turn handler.
//! Every error here has the Anthropic shape ([`Anthropic`]).

use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::turn::SurfaceError;
use super::{Admitted, AppState};
use crate::engine::Engine;
use crate::error::{ApiError, ErrorCode};
use crate::surface::{messages, Messages};

/// An error on a Messages route, in the Anthropic shape.
type Anthropic = SurfaceError<Messages>;

/// `POST /v1/messages/count_tokens`: `{"input_tokens": n}` for a model the principal may use.
pub(super) async fn count_tokens(
    State(gw): State<Engine>,
    a: Result<Admitted, ApiError>,
) -> Result<Response, Anthropic> {
    let a = a?;
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

/// The paging parameters of Anthropic's model list.
#[derive(serde::Deserialize)]
struct Page {
    limit: Option<usize>,
    after_id: Option<String>,
    before_id: Option<String>,
}

/// `GET /v1/models` for an Anthropic client (Claude Code's gateway model discovery asks
/// `?limit=1000`): the caller's models in config order, a page of `limit` (default 20, 1 to
/// 1000) after `after_id` or before `before_id`. A cursor the caller cannot see gives an
/// empty page.
pub(super) fn models(
    app: &AppState,
    headers: &HeaderMap,
    uri: &Uri,
) -> Result<Response, Anthropic> {
    let principal = app.authenticate(headers)?;
    let gw = &app.engine;
    let page = axum::extract::Query::<Page>::try_from_uri(uri)
        .map_err(|_| {
            ApiError::invalid("`limit` must be a number; `after_id` and `before_id` are model ids")
        })?
        .0;
    let limit = page.limit.unwrap_or(20);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("`limit` must be between 1 and 1000")
            .with_param("limit")
            .into());
    }
    let ids = gw.models_for(&principal);
    let at = |id: &str| ids.iter().position(|m| m == id);
    let (slice, has_more) = match (&page.after_id, &page.before_id) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid("give `after_id` or `before_id`, not both").into())
        }
        (Some(after), None) => match at(after) {
            Some(i) => {
                let rest = &ids[i + 1..];
                (&rest[..limit.min(rest.len())], rest.len() > limit)
            }
            None => (&ids[..0], false),
        },
        (None, Some(before)) => match at(before) {
            Some(i) => (&ids[i.saturating_sub(limit)..i], i > limit),
            None => (&ids[..0], false),
        },
        (None, None) => (&ids[..limit.min(ids.len())], ids.len() > limit),
    };
    let data: Vec<Value> = slice.iter().map(|id| model(id)).collect();
    Ok(Json(json!({"data": data, "has_more": has_more,
                   "first_id": slice.first(), "last_id": slice.last()}))
    .into_response())
}

/// `GET /v1/models/{id}` for an Anthropic client.
pub(super) fn model_of(
    app: &AppState,
    headers: &HeaderMap,
    id: &str,
) -> Result<Response, Anthropic> {
    let principal = app.authenticate(headers)?;
    if !app.engine.models_for(&principal).iter().any(|m| m == id) {
        return Err(ApiError::model_not_found(id).into());
    }
    Ok(Json(model(id)).into_response())
}

/// Another method on a Messages route.
pub(super) async fn method_not_allowed() -> Anthropic {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "Method not allowed on this route.",
    )
    .into()
}
