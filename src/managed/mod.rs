//! Anthropic's Managed Agents API, self-hosted: agents (`agents.rs`), environments and
//! sessions (`sessions.rs`), a session's event log (`log.rs`) and the events a client sends
//! (`send.rs`), and the driver that runs a session's turns through the engine (`runner.rs`).
//! Every object is its principal's: another principal's id reads exactly as an unknown one.
//!
//! A session is a conversation the gateway keeps for the client: each `user.message` is a
//! fresh turn of the engine over the session's transcript (so an agent's kept thread carries
//! on, and a released one resumes from the transcript), each `agent.custom_tool_use` is a
//! held call of the engine's one suspension path, and the results the client sends are its
//! continuation, answered exactly once. The event log is durable before anything is streamed.
//! Wire shapes follow the pinned `anthropic` SDK's `beta_managed_agents_*` types.

pub mod agents;
mod budget;
mod confirm;
pub mod environments;
pub mod events;
mod log;
mod runner;
mod send;
pub mod sessions;
mod spec;
pub mod wire;

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Value};

use self::agents::{paged, parse_row};
use self::wire::Paging;

use crate::auth::Principal;
use crate::engine::{Engine, Owner};
use crate::error::{ApiError, ErrorCode};
use crate::store::{ListRows, ManagedRow, StoreError};

pub use self::log::{Live, Published};
pub use self::send::send;

/// The API's state on this gateway: the sessions loaded here, over the engine.
#[derive(Clone)]
pub struct Managed {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    /// Sessions loaded since start, by id (their log's live end and their turn's state).
    live: parking_lot::Mutex<HashMap<String, Arc<Live>>>,
}

impl Managed {
    pub fn new(engine: Engine) -> Managed {
        Managed {
            inner: Arc::new(Inner {
                engine,
                live: parking_lot::Mutex::default(),
            }),
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The principal's session, loaded (its log read back once after a start). Another
    /// principal's is the same 404 as an unknown id; one another replica runs is 503 (the
    /// routes send it there first: see [`Managed::place`]).
    pub async fn session(&self, who: &Principal, id: &str) -> Result<Arc<Live>, ApiError> {
        let row = sessions::load(self, who, id).await?;
        if !self.runs_here(&row) {
            self.forget(id);
            return Err(elsewhere());
        }
        if let Some(live) = self.inner.live.lock().get(id) {
            return Ok(live.clone());
        }
        let live = Arc::new(Live::load(self, who, row).await?);
        let mut map = self.inner.live.lock();
        Ok(map.entry(id.to_string()).or_insert(live).clone())
    }

    /// Where the principal's session `id` is acted on: the replica its row names (this one on
    /// a single gateway). A replica whose lease lapsed has it taken over here, one taker
    /// winning, and its turn is then settled as lost (see [`Live::load`]). A request
    /// `forwarded` by another replica is not sent on again (503).
    pub async fn place(
        &self,
        who: &Principal,
        id: &str,
        forwarded: bool,
    ) -> Result<Place, ApiError> {
        let store = self.engine().store();
        for _ in 0..3 {
            let row = sessions::load(self, who, id).await?;
            if self.runs_here(&row) {
                return Ok(Place::Here);
            }
            // Another replica runs it now: what this process remembers of it is stale.
            self.forget(id);
            if forwarded {
                break;
            }
            match self.engine().live_replica(&row.owner).await {
                Some(owner) => return Ok(Place::Owner(owner)),
                None => {
                    (store.managed_claim(sessions::KIND, id, &who.id, &row.owner))
                        .await
                        .map_err(store_failed)?;
                }
            }
        }
        Err(elsewhere())
    }

    /// Whether this replica runs the session of `row` (every session, on a single gateway).
    fn runs_here(&self, row: &ManagedRow) -> bool {
        row.owner.is_empty() || row.owner == self.engine().store().owner()
    }

    /// The principal's sessions whose turn runs or is held here.
    fn running(&self, principal: &str) -> usize {
        let map = self.inner.live.lock();
        map.values()
            .filter(|l| l.principal == principal && l.busy())
            .count()
    }

    /// Forgets a deleted session: its streams end.
    fn forget(&self, id: &str) -> Option<Arc<Live>> {
        self.inner.live.lock().remove(id)
    }
}

/// Where a session is acted on.
pub enum Place {
    Here,
    /// The live replica that runs it.
    Owner(Owner),
}

/// A session another replica runs, reached where it cannot be sent on.
fn elsewhere() -> ApiError {
    ApiError::new(
        ErrorCode::ReplicaUnavailable,
        "The session runs on another replica that cannot be reached now; retry.",
    )
}

/// The store failed: 503, logged without content.
pub(crate) fn store_failed(e: StoreError) -> ApiError {
    tracing::error!(error = %e, "managed agents store call failed");
    ApiError::new(ErrorCode::StoreUnavailable, "The store is unavailable.")
}

/// The 404 of an unknown (or another principal's) object.
pub(crate) fn not_found(what: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("No {what} with this id."))
}

/// A 400 naming the field at fault.
pub(crate) fn refused(field: impl Into<String>, why: impl std::fmt::Display) -> ApiError {
    let field = field.into();
    ApiError::invalid(format!("`{field}`: {why}"))
}

/// Refuses a feature this gateway does not have, given as a non-empty list field.
pub(crate) fn unsupported_lists(body: &Value, fields: &[&str]) -> Result<(), ApiError> {
    let given = |f: &&&str| {
        body.get(**f)
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    };
    match fields.iter().find(given) {
        Some(field) => Err(refused(*field, "is not supported by this gateway")),
        None => Ok(()),
    }
}

/// A string field of a request body, if present and not null.
pub(crate) fn opt_str<'a>(body: &'a Value, field: &str) -> Result<Option<&'a str>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(refused(field, "must be a string")),
    }
}

/// Marks an object archived (once) and stores it; returns it.
pub(super) async fn archive_row(
    m: &Managed,
    who: &Principal,
    kind: &str,
    mut row: ManagedRow,
) -> Result<Value, ApiError> {
    let mut object = parse_row(&row)?;
    if object["archived_at"].is_null() {
        object["archived_at"] = json!(wire::now().0);
        row.body = object.to_string();
        row.archived = true;
        let store = m.engine().store();
        store
            .managed_update(kind, &who.id, &row, false)
            .await
            .map_err(store_failed)?;
    }
    Ok(object)
}

/// A page of one kind of the principal's objects, by creation (newest first unless
/// `ascending`), after the `page` cursor.
pub(super) async fn list_objects(
    m: &Managed,
    who: &Principal,
    kind: &str,
    q: &Paging,
    ascending: bool,
) -> Result<Value, ApiError> {
    let after = q
        .page
        .as_deref()
        .map(wire::read_object_cursor)
        .transpose()?;
    let rows = ListRows {
        include_archived: q.include_archived.unwrap_or(false),
        after,
        limit: q.limit() + 1,
        ascending,
    };
    let found = (m.engine().store())
        .managed_list(kind, &who.id, &rows)
        .await
        .map_err(store_failed)?;
    paged(found, q.limit(), |r| {
        wire::object_cursor(r.created_at_ms, &r.id)
    })
}

/// The principal's object of `kind` (a version, or the latest): 404 naming `what` for an
/// unknown id and for another principal's, alike.
pub(super) async fn object_row(
    m: &Managed,
    who: &Principal,
    (kind, what): (&str, &str),
    id: &str,
    version: Option<i64>,
) -> Result<ManagedRow, ApiError> {
    (m.engine().store())
        .managed_get(kind, id, &who.id, version)
        .await
        .map_err(store_failed)?
        .ok_or_else(|| not_found(what))
}
