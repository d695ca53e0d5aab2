//! Environments: where a session's agent works. Each is a folder under
//! `[managed_agents] workspace_root`, and each session of it a folder inside, made when the
//! session is created and removed when it is deleted. Only what Turnstile does honours a
//! config: a cloud config with unrestricted networking and no packages, or `self_hosted`.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::agents::{over_bound, parse_row};
use super::wire::{self, only, Paging};
use super::{not_found, opt_str, refused, store_failed, Managed};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::store::ManagedRow;

const KIND: &str = "environment";
const FIELDS: &[&str] = &["name", "config", "description", "metadata", "scope"];

/// `POST /v1/environments`.
pub async fn create(m: &Managed, who: &Principal, body: &Value) -> Result<Value, ApiError> {
    only(body, FIELDS)?;
    let Some(name) = opt_str(body, "name")?.filter(|n| !n.is_empty()) else {
        return Err(refused("name", "is required"));
    };
    let (at, ms) = wire::now();
    let id = wire::new_id("env_");
    let env = json!({
        "type": "environment",
        "id": id,
        "name": name,
        "description": opt_str(body, "description")?,
        "config": config(body.get("config"))?,
        "metadata": wire::metadata(body.get("metadata"))?,
        "scope": scope(body.get("scope"))?,
        "created_at": at,
        "updated_at": at,
        "archived_at": Value::Null,
    });
    let row = ManagedRow {
        id: id.clone(),
        version: 1,
        body: env.to_string(),
        archived: false,
        created_at_ms: ms,
        owner: String::new(),
    };
    let max = m
        .engine()
        .config()
        .managed_agents
        .max_environments_per_client;
    let store = m.engine().store();
    if !store
        .managed_insert(KIND, &who.id, &row, max)
        .await
        .map_err(store_failed)?
    {
        return Err(over_bound("environments", max));
    }
    Ok(env)
}

fn scope(v: Option<&Value>) -> Result<Value, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(Value::Null),
        Some(s) if s == "organization" || s == "account" => Ok(s.clone()),
        Some(_) => Err(refused("scope", "must be organization or account")),
    }
}

/// The config with its defaults resolved.
fn config(v: Option<&Value>) -> Result<Value, ApiError> {
    let empty = json!({"type": "cloud"});
    let v = v.filter(|v| !v.is_null()).unwrap_or(&empty);
    match v["type"].as_str() {
        Some("self_hosted") => Ok(json!({"type": "self_hosted"})),
        Some("cloud") => {
            let net = &v["networking"];
            if !net.is_null() && net["type"] != "unrestricted" {
                return Err(refused("config.networking", "only `unrestricted` is supported: this gateway does not restrict an agent's network"));
            }
            let managers = ["apt", "cargo", "gem", "go", "npm", "pip"];
            let packages = &v["packages"];
            if managers
                .iter()
                .any(|k| packages[k].as_array().is_some_and(|a| !a.is_empty()))
            {
                return Err(refused(
                    "config.packages",
                    "is not supported: this gateway installs no packages",
                ));
            }
            let lists: serde_json::Map<String, Value> = managers
                .iter()
                .map(|k| (k.to_string(), json!([])))
                .collect();
            let mut packages = Value::Object(lists);
            packages["type"] = json!("packages");
            Ok(
                json!({"type": "cloud", "networking": {"type": "unrestricted"}, "packages": packages}),
            )
        }
        _ => Err(refused("config.type", "must be cloud or self_hosted")),
    }
}

/// `POST /v1/environments/{id}`.
pub async fn update(
    m: &Managed,
    who: &Principal,
    id: &str,
    body: &Value,
) -> Result<Value, ApiError> {
    only(body, FIELDS)?;
    let mut row = get_row(m, who, id).await?;
    let mut env = parse_row(&row)?;
    if let Some(name) = body.get("name").filter(|v| !v.is_null()) {
        match name.as_str() {
            Some(s) if !s.is_empty() => env["name"] = name.clone(),
            _ => return Err(refused("name", "must be a non-empty string")),
        }
    }
    if body.get("description").is_some() {
        env["description"] = json!(opt_str(body, "description")?);
    }
    if body.get("config").is_some() {
        env["config"] = config(body.get("config"))?;
    }
    if body.get("scope").is_some() {
        env["scope"] = scope(body.get("scope"))?;
    }
    if let Some(meta) = env["metadata"].as_object_mut() {
        wire::patch_metadata(meta, body.get("metadata"), true)?;
    }
    env["updated_at"] = json!(wire::now().0);
    row.body = env.to_string();
    let store = m.engine().store();
    store
        .managed_update(KIND, &who.id, &row, false)
        .await
        .map_err(store_failed)?;
    Ok(env)
}

pub async fn retrieve(m: &Managed, who: &Principal, id: &str) -> Result<Value, ApiError> {
    parse_row(&get_row(m, who, id).await?)
}

pub(super) async fn get_row(
    m: &Managed,
    who: &Principal,
    id: &str,
) -> Result<ManagedRow, ApiError> {
    super::object_row(m, who, (KIND, "environment"), id, None).await
}

/// `POST /v1/environments/{id}/archive`: no new session may use it.
pub async fn archive(m: &Managed, who: &Principal, id: &str) -> Result<Value, ApiError> {
    super::archive_row(m, who, KIND, get_row(m, who, id).await?).await
}

/// `DELETE /v1/environments/{id}`: its folder goes too (each session's went with it).
pub async fn delete(m: &Managed, who: &Principal, id: &str) -> Result<Value, ApiError> {
    let store = m.engine().store();
    if !store
        .managed_delete(KIND, id, &who.id)
        .await
        .map_err(store_failed)?
    {
        return Err(not_found("environment"));
    }
    let _ = std::fs::remove_dir_all(folder(m, id));
    Ok(json!({"id": id, "type": "environment_deleted"}))
}

/// `GET /v1/environments`.
pub async fn list(m: &Managed, who: &Principal, q: &Paging) -> Result<Value, ApiError> {
    super::list_objects(m, who, KIND, q, false).await
}

/// An environment's folder. Ids are the gateway's own (`env_` and hex), never a path.
pub(super) fn folder(m: &Managed, id: &str) -> PathBuf {
    m.engine().config().managed_agents.workspace_root.join(id)
}
