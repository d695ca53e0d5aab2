//! The activity API behind the console: who the caller is (`GET /v1/whoami`), its suspended
//! executions (`GET /v1/activity/executions`), kept threads (`GET /v1/activity/threads`) and
//! the backends behind its models (`GET /v1/activity/backends`). Each answers
//! `{"object":"list","data":[…]}` from the engine's read models; an approver sees everyone's.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};

use super::{principal, Gateway};
use crate::error::ApiError;

fn list<T: Serialize>(data: Vec<T>) -> Json<Value> {
    Json(json!({"object": "list", "data": data}))
}

pub async fn whoami(
    State(gw): State<Gateway>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let who = principal(&gw, &headers)?;
    Ok(Json(json!({
        "object": "principal",
        "id": who.id,
        "approver": who.approver,
        "models": gw.models_for(&who),
    })))
}

pub async fn executions(
    State(gw): State<Gateway>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let who = principal(&gw, &headers)?;
    Ok(list(gw.suspended_for(&who)))
}

pub async fn threads(
    State(gw): State<Gateway>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let who = principal(&gw, &headers)?;
    Ok(list(gw.threads_for(&who)))
}

pub async fn backends(
    State(gw): State<Gateway>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let who = principal(&gw, &headers)?;
    Ok(list(gw.backends_for(&who)))
}
