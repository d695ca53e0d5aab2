//! Read models of the activity view (`GET /v1/activity/*`, the console): the suspended
//! executions with their held calls, the idle threads kept for a conversation's next turn,
//! and the backends' health. Nothing is stored for them: each is a short scan of the
//! registry, the continuity set or the backends, scoped to the principal (an approver sees
//! everyone's). Tokens, backend ids and conversation text never appear.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::auth::Principal;
use crate::backend::{Backend, Holds};
use crate::config::Config;
use crate::continuation::registry::principal_eq;
use tokio::time::Instant;

/// A suspended execution: the calls it exposed wait for the client's results.
#[derive(Debug, Clone, Serialize)]
pub struct SuspendedView {
    pub execution_id: String,
    pub client: String,
    pub model: String,
    pub surface: &'static str,
    /// `held`: a live agent turn holds the calls open (lost if its process dies);
    /// `durable`: a stateless upstream's record (survives a restart).
    pub hold: &'static str,
    /// Held calls of this suspension, and their tool names when known (a record read back
    /// from the store has only the count).
    pub calls: usize,
    pub tools: Vec<String>,
    /// The suspension's round (1 for the first).
    pub round: u32,
    pub created_at: u64,
    pub suspended_at: Option<u64>,
    /// When the execution ends `expired` unless continued (Unix seconds).
    pub deadline_at: u64,
}

/// An idle backend thread kept for its conversation's next turn.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadView {
    /// The execution whose completed turn the thread holds (`previous_response_id` names it).
    pub execution_id: String,
    pub client: String,
    pub model: String,
    pub surface: &'static str,
    /// Messages of the conversation so far.
    pub messages: usize,
    pub kept_at: u64,
    pub expires_at: u64,
    /// False once its backend process died or is being recycled (the next turn starts fresh).
    pub usable: bool,
}

/// A configured backend and how it is doing.
#[derive(Debug, Clone, Serialize)]
pub struct BackendView {
    pub name: String,
    /// `app-server` or `openai`.
    pub kind: &'static str,
    /// `ok`; `down` (an app-server with no live process); `failing` (an upstream whose last
    /// request failed); `unused` (an upstream not asked yet).
    pub status: &'static str,
    /// The models it serves that the principal may use.
    pub models: Vec<String>,
    pub busy: usize,
    pub capacity: usize,
    pub processes_alive: usize,
    pub last_answer: Option<u64>,
    pub last_failure: Option<u64>,
}

/// Unix seconds of a monotonic deadline.
pub(super) fn unix_at(deadline: Instant, now: Instant, unix: u64) -> u64 {
    unix + deadline.saturating_duration_since(now).as_secs()
}

/// Whether `who` sees what `owner` holds: its own, or everyone's for an approver.
pub(super) fn sees(who: &Principal, owner: &str) -> bool {
    who.approver || principal_eq(owner, &who.id)
}

/// The backends behind the principal's models (every backend for an approver).
pub(super) fn backend_views(
    cfg: &Config,
    backends: &BTreeMap<String, Arc<dyn Backend>>,
    who: &Principal,
) -> Vec<BackendView> {
    let grant = cfg.grant(&who.id, &who.groups);
    let may_use = |model: &str| who.approver || grant.as_ref().is_some_and(|g| g.may_use(model));
    backends
        .iter()
        .filter_map(|(name, b)| {
            let models: Vec<String> = cfg
                .models
                .iter()
                .filter(|m| m.backend == *name && may_use(&m.id))
                .map(|m| m.id.to_string())
                .collect();
            if models.is_empty() && !who.approver {
                return None;
            }
            let s = b.stats();
            let info = b.describe();
            let status = match info.holds {
                Holds::Turn if b.ready() => "ok",
                Holds::Turn => "down",
                Holds::Nothing => match (s.last_answer, s.last_failure) {
                    (None, None) => "unused",
                    (a, Some(f)) if a.is_none_or(|a| f > a) => "failing",
                    _ => "ok",
                },
            };
            Some(BackendView {
                name: name.clone(),
                kind: info.kind,
                status,
                models,
                busy: s.busy,
                capacity: s.capacity,
                processes_alive: s.processes_alive,
                last_answer: s.last_answer,
                last_failure: s.last_failure,
            })
        })
        .collect()
}
