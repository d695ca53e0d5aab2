//! An execution's state: running ([`Execution`], which owns the backend turn of its current
//! leg) or suspended ([`Suspended`], parked in the registry behind its tokens).

use std::collections::VecDeque;

use tokio::time::Instant;

use super::admission::Slot;
use crate::backend::{BackendKind, HeldCall, Hold, Turn};
use crate::continuation::Parked;
use crate::turn::{EchoFn, Fingerprint, Surface, TurnInput};

/// The identity of an execution, shared by every state it goes through.
#[derive(Debug, Clone)]
pub struct ExecutionMeta {
    pub id: String,
    pub principal: String,
    pub model: String,
    pub surface: Surface,
    pub created: u64,
}

/// A running execution. Owns the backend turn: dropping it interrupts the turn (if still
/// running) and frees the backend session and the principal's slot.
pub struct Execution {
    pub meta: ExecutionMeta,
    pub kind: BackendKind,
    pub deadline: Instant,
    pub rounds: u32,
    /// The execution has a journal row (an agent's from the start; a stateless upstream's
    /// only once it suspends, since a leg that just answers leaves nothing to recover).
    pub journaled: bool,
    pub turn: Turn,
    /// Calls the backend issued that were not exposed yet (late arrivals, one-per-leg mode).
    pub backlog: VecDeque<HeldCall>,
    pub slot: Option<Slot>,
}

/// A suspended execution: what the registry keeps behind a batch of tokens.
pub struct Suspended {
    pub meta: ExecutionMeta,
    pub kind: BackendKind,
    pub deadline: Instant,
    pub rounds: u32,
    pub hold: Hold,
    pub backlog: VecDeque<HeldCall>,
    /// A held turn keeps its slot; a durable record holds none.
    pub slot: Option<Slot>,
}

impl Parked for Suspended {
    fn is_alive(&self) -> bool {
        self.hold.is_alive()
    }

    fn is_durable(&self) -> bool {
        self.hold.is_durable()
    }
}

/// What a leg's suspension needs from the request that drives it.
#[derive(Clone, Copy)]
pub struct LegContext {
    pub fingerprint: Fingerprint,
    pub parallel: bool,
    pub echo: EchoFn,
}

impl LegContext {
    pub fn of(input: &TurnInput) -> LegContext {
        LegContext {
            fingerprint: input.fingerprint,
            parallel: input.parallel_tool_calls,
            echo: input.echo,
        }
    }
}
