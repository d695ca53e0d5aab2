//! Approvals of the backend's own side effects: durable, single-use, time-bounded and
//! principal-scoped.
//!
//! An `ask` approval is written to the store as `pending` **before** anyone can see it (the
//! `created` event and the API read the store), and its backend responder is parked here.
//! Every settlement (human decision, expiry, cancellation) takes the responder out of the map
//! under one lock, writes the new state durably, and only then answers the backend, so the
//! backend gets exactly one answer and the stored decision equals what it received. If the
//! store cannot record an approval, the backend is answered deny. This module never imports
//! axum.

use crate::telemetry::{Parent, Wait};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{broadcast, Notify};
use tokio::time::Instant;

use crate::auth::Principal;
use crate::backend::{ApprovalAsk, ApprovalResponder};
use crate::ids::new_id;
use crate::store::{now_unix, ApprovalRecord, Store, StoreError};

/// The longest reason a decision may carry (it is stored with the record).
pub const MAX_REASON_CHARS: usize = 1000;

/// The state of an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalState {
    Pending,
    Approved,
    Denied,
}

impl ApprovalState {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Denied => "denied",
        }
    }

    pub fn parse(s: &str) -> Option<ApprovalState> {
        match s {
            "pending" => Some(ApprovalState::Pending),
            "approved" => Some(ApprovalState::Approved),
            "denied" => Some(ApprovalState::Denied),
            _ => None,
        }
    }
}

/// Why an approval was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleReason {
    /// A human decided (approve or deny).
    Human,
    Expired,
    Cancelled,
    /// Left pending by a previous process, settled at startup.
    Orphaned,
    /// The store could not record the decision: the backend was denied.
    StoreUnavailable,
}

impl SettleReason {
    pub fn parse(s: &str) -> Option<SettleReason> {
        [
            SettleReason::Human,
            SettleReason::Expired,
            SettleReason::Cancelled,
            SettleReason::Orphaned,
            SettleReason::StoreUnavailable,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SettleReason::Human => "human",
            SettleReason::Expired => "expired",
            SettleReason::Cancelled => "cancelled",
            SettleReason::Orphaned => "orphaned",
            SettleReason::StoreUnavailable => "store_unavailable",
        }
    }
}

/// What happened to an approval, as `GET /v1/approvals/events` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Created,
    Decided,
    Expired,
    Cancelled,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Created => "created",
            EventKind::Decided => "decided",
            EventKind::Expired => "expired",
            EventKind::Cancelled => "cancelled",
        }
    }
}

/// A lifecycle event as published on `GET /v1/approvals/events`.
#[derive(Debug, Clone)]
pub struct ApprovalEvent {
    pub kind: EventKind,
    pub record: ApprovalRecord,
}

struct Waiter {
    responder: ApprovalResponder,
    execution_id: String,
    deadline: Instant,
    /// Its wait, in the execution's trace.
    span: Wait,
}

pub struct Approvals {
    store: Arc<Store>,
    /// The parked requests; held only for a map operation, never across a store call.
    waiters: Mutex<HashMap<String, Waiter>>,
    /// Taken for each change of an approval: its store write, its waiter and its event go
    /// together, so a racing decision reads the winner's result.
    settling: tokio::sync::Mutex<()>,
    events: broadcast::Sender<ApprovalEvent>,
    /// Notified when an approval is parked (the earliest expiry may be earlier).
    changed: Notify,
}

#[derive(Debug)]
pub enum DecideError {
    /// Unknown, or not visible to the caller.
    NotFound,
    /// Already settled; carries the settled record.
    AlreadyDecided(Box<ApprovalRecord>),
    Store(StoreError),
}

/// The API view of a record.
pub fn to_json(r: &ApprovalRecord) -> Value {
    json!({
        "id": r.id,
        "object": "approval",
        "state": r.state,
        "reason": r.reason,
        "kind": r.kind,
        "execution_id": r.execution_id,
        "model": r.model,
        "client": r.principal,
        "summary": r.summary,
        "created_at": r.created_at,
        "expires_at": r.expires_at,
        "decided_at": r.decided_at,
        "decided_by": r.decided_by,
        "decision_reason": r.decision_reason,
    })
}

/// The owning client and approvers see an approval; nobody else learns it exists.
pub fn visible(r: &ApprovalRecord, who: &Principal) -> bool {
    who.approver || *r.principal == *who.id
}

impl Approvals {
    /// Settles approvals a previous process left pending as `denied(orphaned)`.
    pub async fn new(store: Arc<Store>) -> Result<Approvals, StoreError> {
        let orphaned = store.approvals_orphan().await?;
        if orphaned > 0 {
            tracing::warn!(
                orphaned,
                "pending approvals of a previous process settled as orphaned"
            );
        }
        let (events, _) = broadcast::channel(256);
        Ok(Approvals {
            store,
            waiters: Mutex::new(HashMap::new()),
            settling: tokio::sync::Mutex::new(()),
            events,
            changed: Notify::new(),
        })
    }

    pub fn subscribe(&self) -> broadcast::Receiver<ApprovalEvent> {
        self.events.subscribe()
    }

    pub fn pending_count(&self) -> usize {
        self.waiters.lock().len()
    }

    pub fn changed(&self) -> &Notify {
        &self.changed
    }

    /// The earliest expiry of a pending approval (a scan: pending approvals are few).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.waiters.lock().values().map(|w| w.deadline).min()
    }

    fn publish(&self, kind: EventKind, record: ApprovalRecord) {
        // No subscribers is fine.
        let _ = self.events.send(ApprovalEvent { kind, record });
    }

    /// Publishes what another replica (or a settlement of one) wrote to approval `id`, as
    /// its record now reads: `created` while pending, else the event of its settle reason.
    pub async fn republish(&self, id: &str) {
        let Ok(Some(record)) = self.store.approval_get(id).await else {
            return;
        };
        let kind = match (record.state.as_str(), record.reason.as_deref()) {
            ("pending", _) => EventKind::Created,
            (_, Some("human")) => EventKind::Decided,
            (_, Some("expired")) => EventKind::Expired,
            _ => EventKind::Cancelled,
        };
        self.publish(kind, record);
    }

    /// Records a pending approval and parks the backend's request. On a store failure the
    /// backend is answered deny and the error is returned.
    pub async fn create(
        &self,
        principal: &str,
        execution_id: &str,
        model: &str,
        ask: ApprovalAsk,
        ttl: Duration,
        at: &Parent,
    ) -> Result<ApprovalRecord, StoreError> {
        let now = now_unix();
        let record = ApprovalRecord {
            id: new_id("apr-"),
            principal: principal.to_string(),
            execution_id: execution_id.to_string(),
            invocation_id: new_id("inv-"),
            kind: ask.kind.as_str().to_string(),
            model: model.to_string(),
            action_digest: hex::encode(ask.action_digest),
            summary: ask.summary,
            state: ApprovalState::Pending.as_str().into(),
            reason: None,
            created_at: now,
            expires_at: now + ttl.as_secs(),
            decided_at: None,
            decided_by: None,
            owner: self.store.owner().to_string(),
            decision_reason: None,
        };
        // Store, park and publish in one settling turn: no decision can slip in between, and
        // `created` always precedes any other event of the approval.
        let settling = self.settling.lock().await;
        if let Err(e) = self.store.approval_insert(&record).await {
            drop(settling);
            tracing::error!(execution = %execution_id, error = %e, "approval not recorded; backend denied (store_unavailable)");
            ask.responder.answer(false);
            return Err(e);
        }
        self.waiters.lock().insert(
            record.id.clone(),
            Waiter {
                responder: ask.responder,
                execution_id: execution_id.to_string(),
                deadline: Instant::now() + ttl,
                span: Wait::start(at, &record.kind, &record.id),
            },
        );
        self.publish(EventKind::Created, record.clone());
        drop(settling);
        self.changed.notify_one();
        tracing::info!(execution = %execution_id, approval = %record.id, kind = %record.kind, "approval pending");
        Ok(record)
    }

    pub async fn get(&self, id: &str, who: &Principal) -> Option<ApprovalRecord> {
        self.store
            .approval_get(id)
            .await
            .ok()
            .flatten()
            .filter(|r| visible(r, who))
    }

    pub async fn list(
        &self,
        state: Option<ApprovalState>,
        reason: Option<SettleReason>,
        who: &Principal,
    ) -> Result<Vec<ApprovalRecord>, StoreError> {
        let principal = (!who.approver).then_some(&*who.id);
        let state = state.map(ApprovalState::as_str);
        self.store
            .approvals_list(principal, state, reason.map(SettleReason::as_str))
            .await
    }

    /// A human decision, with the reason they gave (recorded, not sent to the backend).
    /// Exactly one concurrent decision wins; the rest see the settled record.
    pub async fn decide(
        &self,
        id: &str,
        approve: bool,
        reason: Option<&str>,
        who: &Principal,
    ) -> Result<ApprovalRecord, DecideError> {
        self.decide_telling(id, approve, reason, who, false).await
    }

    /// [`Self::decide`]; with `tell`, a denial's reason also reaches the backend's model (a
    /// Managed Agents `deny_message`, written for the model by the session's owner).
    pub async fn decide_telling(
        &self,
        id: &str,
        approve: bool,
        reason: Option<&str>,
        who: &Principal,
        tell: bool,
    ) -> Result<ApprovalRecord, DecideError> {
        let record = self.get(id, who).await.ok_or(DecideError::NotFound)?;
        let settling = self.settling.lock().await;
        let Some(waiter) = self.waiters.lock().remove(id) else {
            drop(settling);
            let settled = self.settled(id, record).await;
            return Err(DecideError::AlreadyDecided(Box::new(settled)));
        };
        let state = if approve {
            ApprovalState::Approved
        } else {
            ApprovalState::Denied
        };
        let (state, human) = (state.as_str(), SettleReason::Human.as_str());
        // The durable write happens in the settling turn so a losing racer reads the result.
        let written = self
            .store
            .approvals_settle(&[id.to_string()], state, human, Some((&who.id, reason)))
            .await;
        drop(settling);
        match written {
            Ok(ids) if ids.len() == 1 => {
                let reason = reason.filter(|_| tell && !approve).map(str::to_string);
                waiter.responder.answer_with(approve, reason);
                waiter.span.decided(state, human);
                let settled = self.settled(id, record).await;
                tracing::info!(approval = %id, state, decided_by = %who.id, "approval decided");
                self.publish(EventKind::Decided, settled.clone());
                Ok(settled)
            }
            Ok(_) => {
                waiter.responder.answer(false);
                let settled = self.settled(id, record).await;
                Err(DecideError::AlreadyDecided(Box::new(settled)))
            }
            Err(e) => {
                // Never approve what could not be recorded.
                tracing::error!(approval = %id, error = %e, "decision not recorded; backend denied");
                waiter.responder.answer(false);
                let _ = self
                    .store
                    .approvals_settle(
                        &[id.to_string()],
                        ApprovalState::Denied.as_str(),
                        SettleReason::StoreUnavailable.as_str(),
                        None,
                    )
                    .await;
                Err(DecideError::Store(e))
            }
        }
    }

    /// Settles every waiter matching `pick` as `denied(reason)` in one durable step, then
    /// answers the backend deny for each.
    async fn settle_where(
        &self,
        reason: SettleReason,
        event: EventKind,
        pick: impl Fn(&Waiter) -> bool,
    ) -> usize {
        // Most executions end with no approval pending: they never wait for the settling turn.
        if !self.waiters.lock().values().any(&pick) {
            return 0;
        }
        let settling = self.settling.lock().await;
        let taken: Vec<(String, Waiter)> = {
            let mut waiters = self.waiters.lock();
            let ids: Vec<String> = waiters
                .iter()
                .filter(|(_, w)| pick(w))
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter()
                .filter_map(|id| waiters.remove_entry(id))
                .collect()
        };
        if taken.is_empty() {
            return 0;
        }
        let ids: Vec<String> = taken.iter().map(|(id, _)| id.clone()).collect();
        let denied = ApprovalState::Denied.as_str();
        if let Err(e) = self
            .store
            .approvals_settle(&ids, denied, reason.as_str(), None)
            .await
        {
            tracing::error!(error = %e, reason = reason.as_str(), "could not record approval settlement; backend denied anyway");
        }
        drop(settling);
        for (id, w) in taken {
            w.responder.answer(false);
            w.span.decided(denied, reason.as_str());
            if let Some(r) = self.store.approval_get(&id).await.ok().flatten() {
                self.publish(event, r);
            }
        }
        ids.len()
    }

    /// The record as settled (or as it was read before, if it cannot be read now).
    async fn settled(&self, id: &str, before: ApprovalRecord) -> ApprovalRecord {
        self.store
            .approval_get(id)
            .await
            .ok()
            .flatten()
            .unwrap_or(before)
    }

    /// Denies approvals past their TTL (`denied(expired)`).
    pub async fn expire_due(&self, now: Instant) -> usize {
        self.settle_where(SettleReason::Expired, EventKind::Expired, |w| {
            w.deadline <= now
        })
        .await
    }

    /// Whether an approval of the execution is pending (most executions end with none).
    pub fn pending_for(&self, execution_id: &str) -> bool {
        (self.waiters.lock().values()).any(|w| w.execution_id == execution_id)
    }

    /// Denies every pending approval of an execution that ended (`denied(cancelled)`).
    pub async fn cancel_execution(&self, execution_id: &str) -> usize {
        self.settle_where(SettleReason::Cancelled, EventKind::Cancelled, |w| {
            w.execution_id == execution_id
        })
        .await
    }

    /// Shutdown: every pending approval is cancelled.
    pub async fn cancel_all(&self) -> usize {
        self.settle_where(SettleReason::Cancelled, EventKind::Cancelled, |_| true)
            .await
    }
}

#[cfg(test)]
mod tests;
