//! What the registry keeps behind a suspension's tokens ([`Batch`]), what it needs to know of
//! the parked execution ([`Parked`]), and what a lookup answers ([`Lookup`], [`PendingView`]).

use std::sync::Arc;

use tokio::time::Instant;

use super::Digests;
use crate::turn::SurfaceId;

/// A pending batch: the calls exposed at one suspension of one execution. Its principal,
/// execution id, model, surface and deadline are the parked execution's own (read through
/// [`Parked`], not copied: thousands of batches may be pending).
pub struct Batch<P> {
    /// Token digests, in the order the calls were exposed.
    pub tokens: Vec<[u8; 32]>,
    pub digests: Digests,
    pub parked: P,
}

/// A batch taken apart from its parked execution: what spending its tokens, or putting the
/// execution back behind them, takes.
pub struct Head {
    pub principal: Arc<str>,
    pub execution_id: Arc<str>,
    pub tokens: Vec<[u8; 32]>,
    pub digests: Digests,
}

impl<P: Parked> Batch<P> {
    pub fn principal(&self) -> &Arc<str> {
        self.parked.principal()
    }

    pub fn execution_id(&self) -> &Arc<str> {
        self.parked.execution_id()
    }

    pub fn model(&self) -> &Arc<str> {
        self.parked.model()
    }

    pub fn surface(&self) -> SurfaceId {
        self.parked.surface()
    }

    pub fn deadline(&self) -> Instant {
        self.parked.deadline()
    }

    /// The batch's head, and its parked execution.
    pub fn split(self) -> (Head, P) {
        let head = Head {
            principal: self.principal().clone(),
            execution_id: self.execution_id().clone(),
            tokens: self.tokens,
            digests: self.digests,
        };
        (head, self.parked)
    }
}

impl Head {
    /// The batch with `parked` behind it again.
    pub fn join<P>(self, parked: P) -> Batch<P> {
        Batch {
            tokens: self.tokens,
            digests: self.digests,
            parked,
        }
    }
}

/// What a principal-scoped lookup of a set of tokens found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// At least one token is unknown or belongs to someone else.
    NotFound,
    /// The caller's own settled token (first one found).
    Settled(super::Reason),
    /// All tokens are the caller's and pending, in one batch.
    Pending(Box<PendingView>),
    /// All are the caller's and pending, but they span several batches or only part of one.
    Partial,
}

/// What the registry needs to know about a parked execution.
pub trait Parked {
    /// Whose execution it is.
    fn principal(&self) -> &Arc<str>;
    fn execution_id(&self) -> &Arc<str>;
    fn model(&self) -> &Arc<str>;
    fn surface(&self) -> SurfaceId;
    /// When its batch expires.
    fn deadline(&self) -> Instant;
    /// False when the backend turn behind the record is gone.
    fn is_alive(&self) -> bool;
    /// True for a record that survives a restart (a stateless upstream's), which holds no
    /// backend session or live-execution slot while suspended.
    fn is_durable(&self) -> bool;
    /// True when a continuation may name the record by reference (`previous_response_id`):
    /// what it needs of the conversation was kept.
    fn by_reference(&self) -> bool {
        false
    }
    /// Bytes of conversation the record keeps in memory (a stateless upstream's history on
    /// a surface that names records by reference); counted against the principal's budget.
    fn kept_bytes(&self) -> usize {
        0
    }
    /// What the execution has spent so far (nano-USD), for its per-execution cap.
    fn spent(&self) -> u64 {
        0
    }
    /// The execution's own spend cap besides its principal's (nano-USD).
    fn cap(&self) -> Option<u64> {
        None
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingView {
    /// False when the held turn is gone (its record reads as lost).
    pub alive: bool,
    pub batch: u64,
    pub execution_id: Arc<str>,
    pub model: Arc<str>,
    pub surface: SurfaceId,
    pub deadline: Instant,
    pub digests: Digests,
    /// Token digests of the batch in exposure order.
    pub tokens: Vec<[u8; 32]>,
    /// See [`Parked::by_reference`].
    pub by_reference: bool,
    /// See [`Parked::is_durable`].
    pub durable: bool,
    /// See [`Parked::spent`].
    pub spent: u64,
    /// See [`Parked::cap`].
    pub cap: Option<u64>,
}
