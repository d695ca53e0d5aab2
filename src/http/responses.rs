//! `POST /v1/responses/compact`: the conversation in `input` compacted by one summary turn
//! (`POST /v1/responses` is the generic turn handler, its WebSocket form `responses_ws.rs`).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::turn::{answered, Planner, SurfaceError};
use super::Admitted;
use crate::engine::Engine;
use crate::error::ApiError;
use crate::surface::responses::{self, framing, Prepared};
use crate::surface::Responses;

/// `POST /v1/responses/compact`: the conversation in `input` compacted by one summary turn;
/// the answer keeps its user messages and adds one `compaction` item.
pub(super) async fn compact(
    State(gw): State<Engine>,
    a: Result<Admitted, ApiError>,
) -> Result<Response, SurfaceError<Responses>> {
    let a = a?;
    let req = responses::read(&a.bytes)?;
    let kept = req.user_messages();
    let host = Planner::new(&gw, &a.principal);
    let (prepared, _) = responses::prepare(req, a.arrived, &host, true).await?;
    let Prepared::Finished { id, output, usage } = prepared else {
        return Err(ApiError::upstream().into());
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
