//! Sessions: create (an agent version, an environment, `initial_events`), retrieve, update
//! (title, metadata), list, archive, delete. A session's object holds its agent snapshot,
//! status and usage; the gateway rewrites it as its turns run (`runner.rs`). Deleting a
//! session settles whatever its turn holds, removes its events and its working folder.

use serde_json::{json, Value};

use super::agents::{self, over_bound, parse_row};
use super::wire::{self, only, Paging};
use super::{budget, environments, send};
use super::{not_found, opt_str, refused, store_failed, unsupported_lists, Managed};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::store::ManagedRow;

pub(super) const KIND: &str = "session";
const FIELDS: &[&str] = &[
    "agent",
    "environment_id",
    "title",
    "metadata",
    "initial_events",
    "budget",
    "resources",
    "vault_ids",
];

/// `POST /v1/sessions`.
pub async fn create(m: &Managed, who: &Principal, body: &Value) -> Result<Value, ApiError> {
    only(body, FIELDS)?;
    unsupported_lists(body, &["resources", "vault_ids"])?;
    let ceiling = match body.get("budget") {
        None | Some(Value::Null) => None,
        Some(b) => Some(budget::parse("budget", b)?),
    };
    let (agent_id, version) = match body.get("agent") {
        Some(Value::String(id)) => (id.as_str(), None),
        Some(a) if a["type"] == "agent" => match a["id"].as_str() {
            Some(id) => (id, a["version"].as_i64()),
            None => return Err(refused("agent.id", "is required")),
        },
        Some(a) if a["type"] == "agent_with_overrides" => {
            return Err(refused(
                "agent.type",
                "`agent_with_overrides` is not supported by this gateway",
            ))
        }
        _ => {
            return Err(refused(
                "agent",
                "must be an agent id or {\"type\": \"agent\", \"id\", \"version\"}",
            ))
        }
    };
    let Some(env_id) = opt_str(body, "environment_id")? else {
        return Err(refused("environment_id", "is required"));
    };
    let initial = body.get("initial_events").filter(|v| !v.is_null());
    let initial = match initial {
        None => &[][..],
        Some(Value::Array(events)) => events.as_slice(),
        Some(_) => return Err(refused("initial_events", "must be an array")),
    };
    if initial.iter().any(|e| e["type"] != "user.message") {
        return Err(refused(
            "initial_events",
            "only `user.message` events are supported",
        ));
    }
    let agent = agents::retrieve(m, who, agent_id, version).await?;
    if !agent["archived_at"].is_null() {
        return Err(refused("agent", "the agent is archived"));
    }
    let model = agent["model"]["id"].as_str().unwrap_or_default();
    let priced = (m
        .engine()
        .config()
        .usable_model(&who.id, &who.groups, model))
    .is_some_and(|c| c.price.is_some());
    if ceiling.is_some() && !priced {
        return Err(refused(
            "budget",
            format_args!(
                "the agent's model `{model}` has no price to measure it by (model_not_budgetable)"
            ),
        ));
    }
    let env = environments::retrieve(m, who, env_id).await?;
    if !env["archived_at"].is_null() {
        return Err(refused("environment_id", "the environment is archived"));
    }
    let (at, ms) = wire::now();
    let id = wire::new_id("sesn_");
    let mut session = json!({
        "type": "session",
        "id": id,
        "status": "idle",
        "agent": agents::snapshot(&agent),
        "environment_id": env_id,
        "title": opt_str(body, "title")?,
        "metadata": wire::metadata(body.get("metadata"))?,
        "resources": [],
        "vault_ids": [],
        "outcome_evaluations": [],
        "stats": {"active_seconds": 0.0, "duration_seconds": 0.0},
        "usage": {
            "input_tokens": 0,
            "output_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        },
        "budget": ceiling.map(|c| json!({"type": "limit", "max_list_cost": budget::amount(c)})),
        "deployment_id": Value::Null,
        "created_at": at,
        "updated_at": at,
        "archived_at": Value::Null,
    });
    if priced {
        session["usage"]["list_cost"] = budget::amount(0);
    }
    let folder = environments::folder(m, env_id).join(&id);
    std::fs::create_dir_all(&folder).map_err(|e| {
        tracing::error!(error = %e, "a session's working folder could not be made");
        ApiError::new(
            crate::error::ErrorCode::Internal,
            "The session's working folder could not be made.",
        )
    })?;
    let row = ManagedRow {
        id: id.clone(),
        version: 1,
        body: session.to_string(),
        archived: false,
        created_at_ms: ms,
        owner: String::new(),
    };
    let max = m.engine().config().managed_agents.max_sessions_per_client;
    let stored = m
        .engine()
        .store()
        .managed_insert(KIND, &who.id, &row, max)
        .await;
    if !stored.map_err(store_failed)? {
        let _ = std::fs::remove_dir_all(&folder);
        return Err(over_bound("sessions", max));
    }
    if !initial.is_empty() {
        super::send(m, who, &id, &json!({"events": initial})).await?;
    }
    retrieve(m, who, &id).await
}

/// The principal's session row (404 for an unknown or another principal's id).
pub(super) async fn load(m: &Managed, who: &Principal, id: &str) -> Result<ManagedRow, ApiError> {
    super::object_row(m, who, (KIND, "session"), id, None).await
}

/// `GET /v1/sessions/{id}`.
pub async fn retrieve(m: &Managed, who: &Principal, id: &str) -> Result<Value, ApiError> {
    parse_row(&load(m, who, id).await?)
}

/// `POST /v1/sessions/{id}`: `title` and `metadata`.
pub async fn update(
    m: &Managed,
    who: &Principal,
    id: &str,
    body: &Value,
) -> Result<Value, ApiError> {
    only(body, &["title", "metadata", "budget", "vault_ids", "agent"])?;
    for field in ["vault_ids", "agent"] {
        if body.get(field).is_some_and(|v| !v.is_null()) {
            return Err(refused(field, "cannot be changed by this gateway"));
        }
    }
    let live = m.session(who, id).await?;
    let title = match body.get("title") {
        Some(_) => Some(json!(opt_str(body, "title")?)),
        None => None,
    };
    let meta = body.get("metadata").cloned();
    let ceiling = body.get("budget").cloned();
    live.rewrite(m, move |s| {
        if let Some(b) = &ceiling {
            budget::update(s, b)?;
        }
        if let Some(t) = title {
            s["title"] = t;
        }
        if let Some(meta_obj) = s["metadata"].as_object_mut() {
            wire::patch_metadata(meta_obj, meta.as_ref(), true)?;
        }
        Ok(())
    })
    .await
}

/// `POST /v1/sessions/{id}/archive`: readable, and takes no more events.
pub async fn archive(m: &Managed, who: &Principal, id: &str) -> Result<Value, ApiError> {
    let live = m.session(who, id).await?;
    let _gate = live.gate.lock().await;
    if live.busy() {
        return Err(ApiError::invalid(
            "A running session cannot be archived; interrupt it first.",
        ));
    }
    // A held turn waits for results the archived session no longer takes: it ends now.
    send::interrupt(m, &live).await;
    live.release_thread(m);
    live.rewrite(m, |s| {
        if s["archived_at"].is_null() {
            s["archived_at"] = json!(wire::now().0);
        }
        Ok(())
    })
    .await
}

/// `DELETE /v1/sessions/{id}`: the held turn (if any) is settled, the events, the object and
/// the working folder go, and open streams end.
pub async fn delete(m: &Managed, who: &Principal, id: &str) -> Result<Value, ApiError> {
    let row = load(m, who, id).await?;
    let session = parse_row(&row)?;
    if let Some(live) = m.forget(id) {
        live.end(m).await;
    }
    let store = m.engine().store();
    if !store
        .managed_delete(KIND, id, &who.id)
        .await
        .map_err(store_failed)?
    {
        return Err(not_found("session"));
    }
    if let Some(env) = session["environment_id"].as_str() {
        let _ = std::fs::remove_dir_all(environments::folder(m, env).join(&row.id));
    }
    Ok(json!({"id": id, "type": "session_deleted"}))
}

/// `GET /v1/sessions` (newest first, or `order=asc`).
pub async fn list(m: &Managed, who: &Principal, q: &Paging) -> Result<Value, ApiError> {
    let ascending = q.order.as_deref() == Some("asc");
    let mut page = super::list_objects(m, who, KIND, q, ascending).await?;
    page["prev_page"] = Value::Null;
    Ok(page)
}
