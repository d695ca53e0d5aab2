//! How an execution ends. Every way goes through `Engine::end` (`leg.rs`) with a typed
//! [`EndReason`] and the [`Leftover`] that still holds its turn or record: its pending
//! approvals are denied (cancelled), then the leftover is dropped (which interrupts an
//! unfinished backend turn and returns its session), the end is journaled (if the execution
//! has a journal row; queued, `journal.rs`) and counted. A settled batch also goes through
//! `Engine::settled`, which makes its tombstones durable first.

use super::admission::Slot;
use super::execution::{Execution, Suspended};
use crate::continuation::{Batch, Reason};

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
    /// Stopped at its principal's per-execution spend cap.
    BudgetExceeded,
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
            EndReason::BudgetExceeded => "budget_exceeded",
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
            Reason::BudgetExceeded => Some(EndReason::BudgetExceeded),
        }
    }
}

/// What still holds an ended execution's turn or record; dropped after its approvals are
/// cancelled.
// Each variant is held only to be dropped at that point.
#[allow(dead_code)]
pub(super) enum Leftover {
    Nothing,
    /// A running execution: dropping its turn interrupts it and frees its session.
    Running(Execution),
    /// A suspended execution and its hold.
    Parked(Suspended),
    /// A batch the registry refused or gave back.
    Batch(Box<Batch<Suspended>>),
    /// The principal's place of an execution that completed.
    Slot(Option<Slot>),
}
