//! The activity API behind the console: who the caller is (`GET /v1/whoami`), its suspended
//! executions (`GET /v1/activity/executions`), kept threads (`GET /v1/activity/threads`) and
//! the backends behind its models (`GET /v1/activity/backends`). Each list answers
//! `{"object":"list","data":[…]}` from one of the engine's read models; an approver sees
//! everyone's.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{get, MethodRouter};
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};

use super::{principal, Gateway};
use crate::auth::Principal;
use crate::error::ApiError;

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

/// A `GET` route answering the caller's view of one read model as a list.
pub fn listing<T: Serialize + 'static>(
    read: fn(&Gateway, &Principal) -> Vec<T>,
) -> MethodRouter<Gateway> {
    get(
        move |State(gw): State<Gateway>, headers: HeaderMap| async move {
            let who = principal(&gw, &headers)?;
            Ok::<_, ApiError>(Json(json!({"object": "list", "data": read(&gw, &who)})))
        },
    )
}
