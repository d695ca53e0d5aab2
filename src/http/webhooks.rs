//! `GET /v1/webhooks` (the endpoints, their delivery counts and the newest deliveries) and
//! `POST /v1/webhooks/{id}/test` (queues a `webhook.test` event): an approver's. Anyone else,
//! and every gateway without an endpoint, gets the same 404.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::Caller;
use crate::engine::Engine;
use crate::error::{ApiError, ErrorCode};
use crate::notify::Notifier;

fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "No such webhook endpoint.")
}

fn store_unavailable(e: crate::store::StoreError) -> ApiError {
    tracing::error!(error = %e, "webhook deliveries unreadable");
    ApiError::new(ErrorCode::StoreUnavailable, "The store is unavailable.")
}

fn notifier<'a>(gw: &'a Engine, who: &crate::auth::Principal) -> Result<&'a Notifier, ApiError> {
    gw.notifier().filter(|_| who.approver).ok_or_else(not_found)
}

pub async fn list(
    State(gw): State<Engine>,
    Caller { principal: who, .. }: Caller,
) -> Result<Response, ApiError> {
    let view = notifier(&gw, &who)?
        .view()
        .await
        .map_err(store_unavailable)?;
    Ok(Json(view).into_response())
}

pub async fn test(
    State(gw): State<Engine>,
    Caller { principal: who, .. }: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let sent = notifier(&gw, &who)?.send_test(&id, &who.id).await;
    let msg = sent.ok_or_else(not_found)?.map_err(store_unavailable)?;
    tracing::info!(endpoint = %id, id = %msg, by = %who.id, "webhook test event queued");
    let body = json!({"object": "webhook_test", "endpoint": id, "id": msg});
    Ok((axum::http::StatusCode::ACCEPTED, Json(body)).into_response())
}
