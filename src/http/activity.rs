//! The activity API behind the console: who the caller is (`GET /v1/whoami`), its suspended
//! executions (`GET /v1/activity/executions`), kept threads (`GET /v1/activity/threads`) and
//! the backends behind its models (`GET /v1/activity/backends`). Each list answers
//! `{"object":"list","data":[…]}` from one of the engine's read models; an approver sees
//! everyone's.

use axum::extract::State;
use axum::routing::{get, MethodRouter};
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};

use super::{AppState, Caller};
use crate::auth::Principal;
use crate::engine::Engine;

pub async fn whoami(State(gw): State<Engine>, caller: Caller) -> Json<Value> {
    let who = caller.principal;
    // The configured groups its token named: the ones its grant comes from.
    let groups: Vec<String> = (gw.config().grant(&who.id, &who.groups).iter())
        .flat_map(|g| g.groups.iter().map(|g| g.name.clone()))
        .collect();
    Json(json!({
        "object": "principal",
        "id": who.id,
        "approver": who.approver,
        "groups": groups,
        "models": gw.models_for(&who),
    }))
}

/// A `GET` route answering the caller's view of one read model as a list.
pub fn listing<T: Serialize + 'static>(
    read: fn(&Engine, &Principal) -> Vec<T>,
) -> MethodRouter<AppState> {
    get(move |State(gw): State<Engine>, caller: Caller| async move {
        Json(json!({"object": "list", "data": read(&gw, &caller.principal)}))
    })
}
