//! Agents: create, retrieve (a version or the latest), versioned update, list, versions,
//! archive. `model` names a Turnstile model the caller may use, so an agent runs on whatever
//! backend kind that model uses. Custom tools are the client's own (held when the agent calls
//! them); the agent toolset is the backend's own tools under the model's approval policy,
//! narrowed by its permission policies (`always_allow`, `always_ask`; a disabled `bash`,
//! `edit` or `write` denies; `auto` and other disabled tools are refused). What Turnstile does
//! not have (skills, MCP servers, multiagent, other execution identities) is refused with 400
//! naming the field.

use serde_json::{json, Map, Value};

use super::wire::{self, only, page, Paging};
use super::{not_found, opt_str, refused, store_failed, unsupported_lists, Managed};
use crate::auth::Principal;
use crate::config::Decision;
use crate::error::{ApiError, ErrorCode};
use crate::store::ManagedRow;
use crate::turn::Effort;

const KIND: &str = "agent";
const FIELDS: &[&str] = &[
    "model",
    "name",
    "description",
    "execution_identity",
    "mcp_servers",
    "metadata",
    "multiagent",
    "skills",
    "system",
    "tools",
    "version",
];
/// The agent toolset's tools (`agent_toolset_20260401`).
const TOOLSET: &[&str] = &[
    "bash",
    "edit",
    "read",
    "write",
    "glob",
    "grep",
    "web_fetch",
    "web_search",
];
/// The toolset's tools that Turnstile sees only as `permissions` side effects (where a backend
/// asks at all), so it cannot disable them.
pub(super) const UNGATED: &[&str] = &["read", "glob", "grep", "web_fetch", "web_search"];
const POLICIES: &[&str] = &["always_allow", "always_ask", "auto"];

/// `POST /v1/agents`.
pub async fn create(m: &Managed, who: &Principal, body: &Value) -> Result<Value, ApiError> {
    only(body, FIELDS)?;
    if body.get("version").is_some() {
        return Err(refused("version", "is not a field of this request"));
    }
    let (at, ms) = wire::now();
    let mut agent = json!({
        "type": "agent",
        "id": wire::new_id("agent_"),
        "version": 1,
        "name": Value::Null,
        "description": Value::Null,
        "system": Value::Null,
        "model": Value::Null,
        "tools": [],
        "mcp_servers": [],
        "skills": [],
        "metadata": wire::metadata(body.get("metadata"))?,
        "execution_identity": {"type": "service_account"},
        "multiagent": Value::Null,
        "created_at": at,
        "updated_at": at,
        "archived_at": Value::Null,
    });
    if body.get("name").is_none() || body.get("model").is_none() {
        return Err(ApiError::invalid("`name` and `model` are required"));
    }
    apply(m, who, &mut agent, body)?;
    let row = ManagedRow {
        id: agent["id"].as_str().unwrap_or_default().to_string(),
        version: 1,
        body: agent.to_string(),
        archived: false,
        created_at_ms: ms,
        owner: String::new(),
    };
    let max = m.engine().config().managed_agents.max_agents_per_client;
    let stored = (m.engine().store())
        .managed_insert(KIND, &who.id, &row, max)
        .await
        .map_err(store_failed)?;
    if !stored {
        return Err(over_bound("agents", max));
    }
    Ok(agent)
}

pub(super) fn over_bound(what: &str, max: usize) -> ApiError {
    ApiError::new(
        ErrorCode::CapacityExhausted,
        format!("You have {max} {what}, the most this gateway keeps for one client; delete or archive some first."),
    )
}

/// `POST /v1/agents/{id}`: a new version with the fields given (omitted ones kept), unless
/// `version` is given and is not the current one (409).
pub async fn update(
    m: &Managed,
    who: &Principal,
    id: &str,
    body: &Value,
) -> Result<Value, ApiError> {
    only(body, FIELDS)?;
    let current = get_row(m, who, id, None).await?;
    let mut agent: Value = parse_row(&current)?;
    if !agent["archived_at"].is_null() {
        return Err(ApiError::invalid("An archived agent cannot be updated."));
    }
    if let Some(v) = body.get("version") {
        if v.as_i64() != Some(current.version) {
            return Err(ApiError::new(
                ErrorCode::ContinuationAlreadyResolved,
                format!(
                    "`version` is not the agent's current version ({})",
                    current.version
                ),
            ));
        }
    }
    if body
        .get("name")
        .is_some_and(|n| n.as_str().is_none_or(|s| s.is_empty()))
    {
        return Err(refused("name", "must be a non-empty string"));
    }
    if body.get("model").is_some_and(Value::is_null) {
        return Err(refused("model", "cannot be cleared"));
    }
    let before = agent.clone();
    apply(m, who, &mut agent, body)?;
    if let Some(meta) = agent["metadata"].as_object_mut() {
        wire::patch_metadata(meta, body.get("metadata"), true)?;
    }
    if agent == before {
        return Ok(agent);
    }
    let (at, _) = wire::now();
    let version = current.version + 1;
    agent["version"] = json!(version);
    agent["updated_at"] = json!(at);
    let row = ManagedRow {
        version,
        body: agent.to_string(),
        ..current
    };
    let stored = (m.engine().store())
        .managed_insert(KIND, &who.id, &row, usize::MAX)
        .await;
    match stored {
        Ok(true) => Ok(agent),
        // Another update took this version first.
        Ok(false) | Err(_) => Err(ApiError::new(
            ErrorCode::ContinuationAlreadyResolved,
            "The agent was updated concurrently; retrieve it and try again.",
        )),
    }
}

/// Sets the fields `body` gives (the metadata patch aside), checked.
fn apply(m: &Managed, who: &Principal, agent: &mut Value, body: &Value) -> Result<(), ApiError> {
    unsupported_lists(body, &["mcp_servers", "skills"])?;
    if body.get("multiagent").is_some_and(|v| !v.is_null()) {
        return Err(refused("multiagent", "is not supported by this gateway"));
    }
    match body.get("execution_identity") {
        None | Some(Value::Null) => {}
        Some(v) if v["type"] == "service_account" => {}
        Some(_) => {
            return Err(refused(
                "execution_identity",
                "only `service_account` is supported",
            ))
        }
    }
    if let Some(name) = body.get("name") {
        match name.as_str() {
            Some(s) if !s.is_empty() => agent["name"] = name.clone(),
            _ => return Err(refused("name", "must be a non-empty string")),
        }
    }
    for field in ["description", "system"] {
        if body.get(field).is_some() {
            let v = opt_str(body, field)?.filter(|s| !s.is_empty());
            agent[field] = json!(v);
        }
    }
    if let Some(model) = body.get("model") {
        agent["model"] = self::model(m, who, model)?;
    }
    if let Some(tools) = body.get("tools") {
        agent["tools"] = self::tools(tools)?;
    }
    enforceable(m, agent)
}

/// A toolset that asks or denies needs a backend that asks: a Codex model under
/// `approval_policy = "never"` runs every command and patch unasked (its sandbox is the
/// guard), so a confirmation could never be enforced there (refused, never silently widened).
fn enforceable(m: &Managed, agent: &Value) -> Result<(), ApiError> {
    let spec = super::spec::AgentSpec::of(agent);
    let Some(own) = spec.approvals else {
        return Ok(());
    };
    let cfg = m.engine().config();
    let Some(model) = cfg.model(&spec.model) else {
        return Ok(());
    };
    let never = model.codex.approval_policy.as_deref() == Some("never");
    if never && (own.command != Decision::Allow || own.file_change != Decision::Allow) {
        return Err(refused(
            "tools",
            format!("`always_ask` or a disabled tool cannot be enforced on `{}`: its backend never asks before a command or a file change (approval_policy = \"never\")", spec.model),
        ));
    }
    Ok(())
}

/// `model`: an id or `{id, effort, speed}`; the id must be a model the caller may use.
fn model(m: &Managed, who: &Principal, v: &Value) -> Result<Value, ApiError> {
    let (id, config) = match v {
        Value::String(id) => (id.as_str(), None),
        Value::Object(o) => match o.get("id").and_then(Value::as_str) {
            Some(id) => (id, Some(o)),
            None => return Err(refused("model.id", "is required")),
        },
        _ => return Err(refused("model", "must be a model id or a model config")),
    };
    if !m.engine().models_for(who).iter().any(|m| m == id) {
        return Err(ApiError::model_not_found(id));
    }
    let mut out = json!({"id": id, "speed": "standard"});
    let Some(config) = config else { return Ok(out) };
    for (k, v) in config {
        match k.as_str() {
            "id" => {}
            "effort" if v.is_null() => {}
            "effort" => {
                let level = v
                    .as_str()
                    .or_else(|| v["type"].as_str())
                    .unwrap_or_default();
                if effort(level).is_none() {
                    return Err(refused(
                        "model.effort",
                        "must be low, medium, high, xhigh or max",
                    ));
                }
                out["effort"] = json!({"type": level});
            }
            "speed" if v.is_null() || v == "standard" => {}
            "speed" => return Err(refused("model.speed", "only `standard` is supported")),
            "inference_geo" if v.is_null() => {}
            other => {
                return Err(refused(
                    format!("model.{other}"),
                    "is not supported by this gateway",
                ))
            }
        }
    }
    Ok(out)
}

/// The engine's effort for the API's level (`max` is the most there is: `xhigh`).
pub(super) fn effort(level: &str) -> Option<Effort> {
    Some(match level {
        "low" => Effort::Low,
        "medium" => Effort::Medium,
        "high" => Effort::High,
        "xhigh" | "max" => Effort::XHigh,
        _ => return None,
    })
}

/// `tools`: custom tools and at most one agent toolset, resolved to the response's shape.
fn tools(v: &Value) -> Result<Value, ApiError> {
    if v.is_null() {
        return Ok(json!([]));
    }
    let Some(list) = v.as_array() else {
        return Err(refused("tools", "must be an array"));
    };
    if list.len() > 256 {
        return Err(refused("tools", "at most 256 tools"));
    }
    let mut out = Vec::with_capacity(list.len());
    let mut names = std::collections::HashSet::new();
    let mut toolsets = 0;
    for (i, t) in list.iter().enumerate() {
        let at = |f: &str| format!("tools[{i}].{f}");
        match t["type"].as_str() {
            Some("custom") => {
                let name = t["name"].as_str().unwrap_or_default();
                let good = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
                if name.is_empty() || name.len() > 128 || !name.chars().all(good) {
                    return Err(refused(
                        at("name"),
                        "must be 1 to 128 letters, digits, `_` or `-`",
                    ));
                }
                if !names.insert(name.to_string()) {
                    return Err(refused(at("name"), "is the name of another tool"));
                }
                let Some(description) = t["description"].as_str() else {
                    return Err(refused(at("description"), "is required"));
                };
                let schema = &t["input_schema"];
                if schema["type"] != "object" {
                    return Err(refused(
                        at("input_schema"),
                        "must be a JSON schema of type object",
                    ));
                }
                out.push(json!({"type": "custom", "name": name, "description": description, "input_schema": schema}));
            }
            Some("agent_toolset_20260401") => {
                toolsets += 1;
                if toolsets > 1 {
                    return Err(refused(at("type"), "at most one agent toolset"));
                }
                out.push(toolset(t, &at)?);
            }
            Some("mcp_toolset") => {
                return Err(refused(
                    at("type"),
                    "MCP toolsets are not supported by this gateway",
                ))
            }
            _ => {
                return Err(refused(
                    at("type"),
                    "must be `custom` or `agent_toolset_20260401`",
                ))
            }
        }
    }
    Ok(Value::Array(out))
}

/// The agent toolset with its defaults resolved: enabled, `always_allow` (the model's own
/// policy decides). Only the tools whose side effects go through the approval policy (`bash`
/// a command, `edit` and `write` a file change) can be disabled: the others run wherever the
/// backend has them.
fn toolset(t: &Value, at: &dyn Fn(&str) -> String) -> Result<Value, ApiError> {
    let default = &t["default_config"];
    let enabled = default["enabled"].as_bool().unwrap_or(true);
    let configs = t["configs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let disabled = |name: &str| {
        let own = configs.iter().find(|c| c["name"] == name);
        !own.and_then(|c| c["enabled"].as_bool()).unwrap_or(enabled)
    };
    if let Some(tool) = UNGATED.iter().find(|t| disabled(t)) {
        return Err(refused(
            at("configs"),
            format!(
                "disabling `{tool}` is not supported by this gateway (only bash, edit and write)"
            ),
        ));
    }
    let policy = policy(
        &default["permission_policy"],
        &at("default_config.permission_policy"),
    )?;
    let mut configs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (j, c) in t["configs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let field = |f: &str| at(&format!("configs[{j}].{f}"));
        let name = c["name"].as_str().unwrap_or_default();
        if !TOOLSET.contains(&name) || !seen.insert(name) {
            return Err(refused(
                field("name"),
                "must name a tool of the toolset, once",
            ));
        }
        if let Some(extra) = c.as_object().and_then(|o| {
            o.keys()
                .find(|k| !["type", "name", "enabled", "permission_policy"].contains(&k.as_str()))
        }) {
            return Err(refused(field(extra), "is not supported by this gateway"));
        }
        let own = &c["permission_policy"];
        configs.push(json!({
            "type": name,
            "name": name,
            "enabled": c["enabled"].as_bool().unwrap_or(enabled),
            "permission_policy": if own.is_null() { policy.clone() } else { self::policy(own, &field("permission_policy"))? },
        }));
    }
    Ok(json!({
        "type": "agent_toolset_20260401",
        "configs": configs,
        "default_config": {"enabled": enabled, "permission_policy": policy},
    }))
}

fn policy(v: &Value, field: &str) -> Result<Value, ApiError> {
    match v["type"].as_str() {
        None if v.is_null() => Ok(json!({"type": "always_allow"})),
        Some(p @ ("always_allow" | "always_ask")) => Ok(json!({ "type": p })),
        // The model's own judgement per invocation: not something Turnstile has.
        Some(p) if POLICIES.contains(&p) => Err(refused(
            field,
            format!("`{p}` is not supported by this gateway"),
        )),
        _ => Err(refused(field, "must be always_allow, always_ask or auto")),
    }
}

/// `GET /v1/agents/{id}` (`?version=N`).
pub async fn retrieve(
    m: &Managed,
    who: &Principal,
    id: &str,
    version: Option<i64>,
) -> Result<Value, ApiError> {
    parse_row(&get_row(m, who, id, version).await?)
}

async fn get_row(
    m: &Managed,
    who: &Principal,
    id: &str,
    version: Option<i64>,
) -> Result<ManagedRow, ApiError> {
    super::object_row(m, who, (KIND, "agent"), id, version).await
}

pub(super) fn parse_row(r: &ManagedRow) -> Result<Value, ApiError> {
    serde_json::from_str(&r.body)
        .map_err(|_| store_failed(crate::store::StoreError::Missing("agent body")))
}

/// `POST /v1/agents/{id}/archive`: it stays readable; no new session may use it.
pub async fn archive(m: &Managed, who: &Principal, id: &str) -> Result<Value, ApiError> {
    super::archive_row(m, who, KIND, get_row(m, who, id, None).await?).await
}

/// `GET /v1/agents`.
pub async fn list(m: &Managed, who: &Principal, q: &Paging) -> Result<Value, ApiError> {
    super::list_objects(m, who, KIND, q, false).await
}

/// `GET /v1/agents/{id}/versions`: newest first.
pub async fn versions(
    m: &Managed,
    who: &Principal,
    id: &str,
    q: &Paging,
) -> Result<Value, ApiError> {
    let before = match q.page.as_deref() {
        Some(p) => p
            .parse()
            .map_err(|_| refused("page", "is not a cursor this API issued"))?,
        None => 0,
    };
    let store = m.engine().store();
    let found = store
        .managed_versions(KIND, id, &who.id, before, q.limit() + 1)
        .await
        .map_err(store_failed)?;
    if found.is_empty() && before == 0 {
        return Err(not_found("agent"));
    }
    paged(found, q.limit(), |r| r.version.to_string())
}

/// A page of `limit` rows out of `limit + 1` read, its cursor that of its last row.
pub(super) fn paged(
    mut rows: Vec<ManagedRow>,
    limit: usize,
    cursor: impl Fn(&ManagedRow) -> String,
) -> Result<Value, ApiError> {
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next = more.then(|| rows.last().map(&cursor)).flatten();
    let data = rows.iter().map(parse_row).collect::<Result<_, _>>()?;
    Ok(page(data, next))
}

/// The agent as a session snapshots it (no timestamps, no metadata).
pub fn snapshot(agent: &Value) -> Value {
    let mut snap: Map<String, Value> = agent.as_object().cloned().unwrap_or_default();
    for k in ["created_at", "updated_at", "archived_at", "metadata"] {
        snap.remove(k);
    }
    Value::Object(snap)
}
