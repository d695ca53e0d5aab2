//! The one ending path. Every way an execution ends goes through [`Engine::end`] with a
//! typed [`EndReason`]: its pending approvals are denied (cancelled), its turn is dropped
//! (which interrupts an unfinished backend turn and returns its session), the end is
//! journaled (if the execution has a journal row; queued, `journal.rs`) and counted. A settled batch also goes
//! through [`Engine::settled`], which makes its tombstones durable first.

use super::execution::{ExecutionMeta, Suspended};
use super::Engine;
use crate::continuation::{Reason, Settled};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    Completed,
    Failed,
    FailedToStart,
    Interrupted,
    Lost,
    Cancelled,
    Expired,
    Revoked,
    MaxRounds,
    Capacity,
    StoreUnavailable,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Completed => "completed",
            EndReason::Failed => "failed",
            EndReason::FailedToStart => "failed_to_start",
            EndReason::Interrupted => "interrupted",
            EndReason::Lost => "lost",
            EndReason::Cancelled => "cancelled",
            EndReason::Expired => "expired",
            EndReason::Revoked => "revoked",
            EndReason::MaxRounds => "max_rounds",
            EndReason::Capacity => "capacity",
            EndReason::StoreUnavailable => "store_unavailable",
        }
    }

    /// The ending that matches a batch's settlement (None: it was claimed and goes on).
    pub fn of_settlement(reason: Reason) -> Option<EndReason> {
        match reason {
            Reason::Resolved => None,
            Reason::Expired => Some(EndReason::Expired),
            Reason::Cancelled => Some(EndReason::Cancelled),
            Reason::Lost => Some(EndReason::Lost),
            Reason::Revoked => Some(EndReason::Revoked),
        }
    }
}

impl Engine {
    /// Ends an execution; `state` is whatever still holds its turn or record, dropped here.
    pub(super) fn end<T>(
        &self,
        meta: &ExecutionMeta,
        journaled: bool,
        reason: EndReason,
        state: T,
    ) {
        self.inner.approvals.cancel_execution(&meta.id);
        drop(state);
        // A stateless leg that simply answered is the request's own log line; every other
        // ending is worth a line of its own.
        if journaled || reason != EndReason::Completed {
            tracing::info!(execution = %meta.id, reason = reason.as_str(), "execution ended");
        } else {
            tracing::debug!(execution = %meta.id, reason = reason.as_str(), "execution ended");
        }
        self.inner.metrics.ended(reason.as_str());
        if journaled {
            self.inner.journal.ended(&meta.id, reason.as_str());
        }
    }

    /// Records tombstones (`execution id, principal, token digests`) in the store, and deletes
    /// the ones a principal's ring pushed out. Returns how many tokens the store still had
    /// pending, None when it could not be written.
    pub(super) fn persist_tombstones(
        &self,
        (execution_id, principal, tokens): (&str, &str, &[[u8; 32]]),
        reason: Reason,
        evicted: &[[u8; 32]],
    ) -> Option<usize> {
        let store = &self.inner.store;
        store
            .tokens_settled(execution_id, principal, tokens, reason.as_str(), evicted)
            .inspect_err(|e| {
                // The in-memory tombstones still answer replays; after a restart, recovery
                // turns the still-pending rows of a held turn and the still-claimed record of
                // a stateless one into `lost` tombstones, which never resume. (An expired or
                // revoked stateless record left pending is refused again after a restart.)
                tracing::error!(execution = %execution_id, error = %e, "could not persist tombstones");
            })
            .ok()
    }

    /// Persists a settled batch's tombstones and, unless it was claimed, ends its execution.
    /// Returns the suspension of a claimed batch.
    pub(super) fn settled(&self, s: Settled<Suspended>) -> Option<Suspended> {
        let tokens = (s.execution_id.as_str(), s.principal.as_str(), &s.tokens[..]);
        self.persist_tombstones(tokens, s.reason, &s.evicted);
        match EndReason::of_settlement(s.reason) {
            None => Some(s.parked),
            Some(end) => {
                let meta = s.parked.meta.clone();
                self.end(&meta, true, end, s.parked);
                None
            }
        }
    }
}
