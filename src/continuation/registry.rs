//! Pending continuation records and tombstones, in memory, and the atomic claim.
//!
//! A record holds digests only (principal, execution id, model, surface, deadline and the
//! SHA-256 of tools, tool_choice, conversation prefix and assistant echo) plus the parked
//! execution (`P`, opaque here). Tokens are keyed by their SHA-256; the token text is never
//! stored. Every state change happens under one lock that is never held across an `.await`
//! and never returns a guard. Deadlines are kept in an ordered index, so expiry costs
//! O(expired), and [`Registry::changed`] wakes the engine's timer when the earliest deadline
//! may have moved. Durability is the caller's: the store is written by the engine (before
//! exposure, and after each settlement), never from here.

use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use subtle::ConstantTimeEq;
use tokio::sync::Notify;
use tokio::time::Instant;

pub use super::digests::Digests;
pub use batch::{Batch, Head, Lookup, Parked, PendingView};

/// Why a token stopped being pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Resolved,
    Expired,
    Cancelled,
    Lost,
    Revoked,
    /// The execution reached its principal's per-execution spend cap.
    BudgetExceeded,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Resolved => "resolved",
            Reason::Expired => "expired",
            Reason::Cancelled => "cancelled",
            Reason::Lost => "lost",
            Reason::Revoked => "revoked",
            Reason::BudgetExceeded => "budget_exceeded",
        }
    }

    pub fn parse(s: &str) -> Reason {
        match s {
            "resolved" => Reason::Resolved,
            "expired" => Reason::Expired,
            "cancelled" => Reason::Cancelled,
            "revoked" => Reason::Revoked,
            "budget_exceeded" => Reason::BudgetExceeded,
            _ => Reason::Lost,
        }
    }
}

struct Tomb {
    /// Shared with the principal's ring.
    principal: Arc<str>,
    reason: Reason,
}

struct Inner<P> {
    next_batch: u64,
    token_batch: HashMap<[u8; 32], u64>,
    /// Boxed: the map's table stays small while thousands of executions are parked.
    batches: HashMap<u64, Box<Batch<P>>>,
    per_principal: HashMap<Arc<str>, usize>,
    /// [`Parked::kept_bytes`] of the pending batches, by principal (only those keeping any).
    kept: HashMap<Arc<str>, usize>,
    pending: usize,
    tombs: HashMap<[u8; 32], Tomb>,
    rings: HashMap<Arc<str>, VecDeque<[u8; 32]>>,
    /// Tokens of batches taken for a forward that may still fail (their principal): they
    /// read as resolved until committed or reinstated.
    in_flight: HashMap<[u8; 32], Arc<str>>,
    /// Every batch by deadline.
    deadlines: BTreeSet<(Instant, u64)>,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_pending: usize,
    pub max_pending_per_client: usize,
    pub max_kept_bytes_per_client: usize,
    pub tombstones_per_client: usize,
}

/// A settled batch handed back to the caller (to resume or to clean up, and to persist).
pub struct Settled<P> {
    pub execution_id: Arc<str>,
    pub principal: Arc<str>,
    pub tokens: Vec<[u8; 32]>,
    pub reason: Reason,
    /// Tombstones the principal's ring pushed out (the store deletes them too).
    pub evicted: Vec<[u8; 32]>,
    pub parked: P,
}

pub struct Registry<P> {
    inner: Mutex<Inner<P>>,
    limits: Limits,
    changed: Notify,
}

/// Principal ids compared in constant time.
pub fn principal_eq(a: &str, b: &str) -> bool {
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

impl<P: Parked> Registry<P> {
    /// Builds the registry with the durable tombstones (oldest first) loaded into the rings.
    pub fn new(
        limits: Limits,
        tombstones: impl IntoIterator<Item = ([u8; 32], String, Reason)>,
    ) -> Self {
        let mut inner = Inner {
            next_batch: 1,
            token_batch: HashMap::new(),
            batches: HashMap::new(),
            per_principal: HashMap::new(),
            kept: HashMap::new(),
            pending: 0,
            tombs: HashMap::new(),
            rings: HashMap::new(),
            in_flight: HashMap::new(),
            deadlines: BTreeSet::new(),
        };
        for (digest, principal, reason) in tombstones {
            push_tomb(
                &mut inner,
                limits.tombstones_per_client,
                digest,
                &principal,
                reason,
                // Rows beyond the ring (a smaller ring than last time) just stay unloaded.
                &mut Vec::new(),
            );
        }
        Registry {
            inner: Mutex::new(inner),
            limits,
            changed: Notify::new(),
        }
    }

    /// Notified whenever a batch is added (the earliest deadline may be earlier).
    pub fn changed(&self) -> &Notify {
        &self.changed
    }

    /// The earliest deadline of any pending batch.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.inner.lock().deadlines.first().map(|(at, _)| *at)
    }

    pub fn pending_count(&self) -> usize {
        self.inner.lock().pending
    }

    pub fn batch_count(&self) -> usize {
        self.inner.lock().batches.len()
    }

    /// Suspended batches (one per suspended execution) of one principal: all of them, and
    /// the durable ones. A scan, made only for admission limits.
    pub fn suspended_of(&self, principal: &str) -> (usize, usize) {
        let inner = self.inner.lock();
        let mut all = 0;
        let mut durable = 0;
        for b in inner
            .batches
            .values()
            .filter(|b| **b.principal() == *principal)
        {
            all += 1;
            if b.parked.is_durable() {
                durable += 1;
            }
        }
        (all, durable)
    }

    pub fn tombstone_count(&self) -> usize {
        self.inner.lock().tombs.len()
    }

    /// What `view` makes of each pending batch it selects, earliest deadline first (the
    /// activity view: a scan under the lock, which `view` must keep short).
    pub fn snapshot<T>(&self, mut view: impl FnMut(&Batch<P>) -> Option<T>) -> Vec<T> {
        let inner = self.inner.lock();
        inner
            .deadlines
            .iter()
            .filter_map(|(_, id)| inner.batches.get(id))
            .filter_map(|b| view(b))
            .collect()
    }

    /// Adds a batch within the bounds; on success its id (the caller records it durably,
    /// and withdraws it if that fails). A refusal hands the batch back (boxed: rare).
    pub fn register(&self, b: Batch<P>) -> Result<u64, Box<Batch<P>>> {
        let n = b.tokens.len();
        let id = {
            let mut g = self.inner.lock();
            let mine = g.per_principal.get(b.principal()).copied().unwrap_or(0);
            let kept = g.kept.get(b.principal()).copied().unwrap_or(0);
            if g.pending + n > self.limits.max_pending
                || mine + n > self.limits.max_pending_per_client
                || kept.saturating_add(b.parked.kept_bytes())
                    > self.limits.max_kept_bytes_per_client
            {
                return Err(Box::new(b));
            }
            Self::insert(&mut g, b)
        };
        self.changed.notify_one();
        Ok(id)
    }

    /// Puts back a batch recovered from the store at startup (no bounds).
    pub fn restore(&self, b: Batch<P>) {
        Self::insert(&mut self.inner.lock(), b);
        self.changed.notify_one();
    }

    /// Puts in a durable batch another replica recorded, unless one of its tokens is known
    /// here already (a racing request put it in first). Returns whether it went in.
    pub fn restore_absent(&self, b: Batch<P>) -> bool {
        let mut g = self.inner.lock();
        let known = b.tokens.iter().any(|t| {
            g.token_batch.contains_key(t) || g.tombs.contains_key(t) || g.in_flight.contains_key(t)
        });
        if known {
            return false;
        }
        Self::insert(&mut g, b);
        drop(g);
        self.changed.notify_one();
        true
    }

    /// Drops the tokens of a taken batch without a tombstone: another replica claimed them,
    /// and the store answers for them from now on.
    pub fn forget(&self, tokens: &[[u8; 32]]) {
        let mut g = self.inner.lock();
        for t in tokens {
            g.in_flight.remove(t);
        }
    }

    /// Takes back a batch whose tokens were never exposed (its durable record failed).
    pub fn withdraw(&self, id: u64) -> Option<Batch<P>> {
        Self::remove(&mut self.inner.lock(), id)
    }

    fn insert(g: &mut Inner<P>, b: Batch<P>) -> u64 {
        let id = g.next_batch;
        g.next_batch += 1;
        for t in &b.tokens {
            g.token_batch.insert(*t, id);
        }
        g.pending += b.tokens.len();
        *g.per_principal.entry(b.principal().clone()).or_default() += b.tokens.len();
        let kept = b.parked.kept_bytes();
        if kept > 0 {
            *g.kept.entry(b.principal().clone()).or_default() += kept;
        }
        g.deadlines.insert((b.deadline(), id));
        g.batches.insert(id, Box::new(b));
        id
    }

    fn remove(g: &mut Inner<P>, id: u64) -> Option<Batch<P>> {
        let batch = *g.batches.remove(&id)?;
        g.deadlines.remove(&(batch.deadline(), id));
        for t in &batch.tokens {
            g.token_batch.remove(t);
        }
        g.pending -= batch.tokens.len();
        if let Some(c) = g.per_principal.get_mut(batch.principal()) {
            *c -= batch.tokens.len();
            if *c == 0 {
                g.per_principal.remove(batch.principal());
            }
        }
        let kept = batch.parked.kept_bytes();
        if let Some(c) = g.kept.get_mut(batch.principal()).filter(|_| kept > 0) {
            *c -= kept;
            if *c == 0 {
                g.kept.remove(batch.principal());
            }
        }
        Some(batch)
    }

    /// Principal-scoped lookup of the tokens of one assistant message. Another principal's
    /// token, live or settled, reads exactly as an unknown one.
    pub fn lookup(&self, principal: &str, tokens: &[[u8; 32]]) -> Lookup {
        let g = self.inner.lock();
        let mut batch = None;
        let mut settled = None;
        let mut partial = false;
        for t in tokens {
            if let Some(id) = g.token_batch.get(t) {
                let b = &g.batches[id];
                if !principal_eq(b.principal(), principal) {
                    return Lookup::NotFound;
                }
                match batch {
                    None => batch = Some(*id),
                    Some(other) if other != *id => partial = true,
                    _ => {}
                }
            } else if let Some(owner) = g.in_flight.get(t) {
                if !principal_eq(owner, principal) {
                    return Lookup::NotFound;
                }
                settled.get_or_insert(Reason::Resolved);
            } else if let Some(tomb) = g.tombs.get(t) {
                if !principal_eq(&tomb.principal, principal) {
                    return Lookup::NotFound;
                }
                settled.get_or_insert(tomb.reason);
            } else {
                return Lookup::NotFound;
            }
        }
        if let Some(r) = settled {
            return Lookup::Settled(r);
        }
        let Some(id) = batch else {
            return Lookup::NotFound;
        };
        let b = &g.batches[&id];
        if partial || b.tokens.len() != tokens.len() {
            return Lookup::Partial;
        }
        Lookup::Pending(Box::new(PendingView {
            alive: b.parked.is_alive(),
            durable: b.parked.is_durable(),
            batch: id,
            execution_id: b.execution_id().clone(),
            model: b.model().clone(),
            surface: b.surface(),
            deadline: b.deadline(),
            digests: b.digests,
            tokens: b.tokens.clone(),
            by_reference: b.parked.by_reference(),
            spent: b.parked.spent(),
            cap: b.parked.cap(),
        }))
    }

    /// Atomically takes a whole batch out of the pending set and tombstones its tokens with
    /// `reason`. Exactly one caller gets `Some` for a batch; everyone after sees the tombstones.
    pub fn settle(&self, batch: u64, reason: Reason) -> Option<Settled<P>> {
        let mut evicted = Vec::new();
        let mut g = self.inner.lock();
        let b = Self::remove(&mut g, batch)?;
        for t in &b.tokens {
            push_tomb(
                &mut g,
                self.limits.tombstones_per_client,
                *t,
                b.principal(),
                reason,
                &mut evicted,
            );
        }
        drop(g);
        Some(Settled {
            execution_id: b.execution_id().clone(),
            principal: b.principal().clone(),
            tokens: b.tokens,
            reason,
            evicted,
            parked: b.parked,
        })
    }

    /// Takes a whole batch out of the pending set without tombstoning it, for a forward that
    /// may still fail before anything reached the client. Until [`Registry::commit`] or
    /// [`Registry::reinstate`], its tokens read as resolved to their owner (a concurrent
    /// claim loses with 409). Exactly one caller gets `Some` for a batch.
    pub fn take(&self, batch: u64) -> Option<Batch<P>> {
        let mut g = self.inner.lock();
        let b = Self::remove(&mut g, batch)?;
        for t in &b.tokens {
            g.in_flight.insert(*t, b.principal().clone());
        }
        Some(b)
    }

    /// Tombstones the tokens of a taken batch with `reason`; returns the tombstones the
    /// principal's ring pushed out (the store deletes them too).
    pub fn commit(&self, principal: &str, tokens: &[[u8; 32]], reason: Reason) -> Vec<[u8; 32]> {
        let mut evicted = Vec::new();
        let mut g = self.inner.lock();
        for t in tokens {
            g.in_flight.remove(t);
            let ring = self.limits.tombstones_per_client;
            push_tomb(&mut g, ring, *t, principal, reason, &mut evicted);
        }
        evicted
    }

    /// Puts a taken batch back as it was (same tokens, same deadline), without bounds: its
    /// place was never given up.
    pub fn reinstate(&self, b: Batch<P>) {
        let mut g = self.inner.lock();
        for t in &b.tokens {
            g.in_flight.remove(t);
        }
        Self::insert(&mut g, b);
        drop(g);
        self.changed.notify_one();
    }

    /// Settles every batch whose deadline is at or before `now`, earliest first.
    pub fn take_expired(&self, now: Instant) -> Vec<Settled<P>> {
        let ids: Vec<u64> = {
            let g = self.inner.lock();
            g.deadlines
                .iter()
                .take_while(|(at, _)| *at <= now)
                .map(|(_, id)| *id)
                .collect()
        };
        ids.into_iter()
            .filter_map(|id| self.settle(id, Reason::Expired))
            .collect()
    }

    /// Batches that hold a live backend turn (not durable records).
    pub fn held_batches(&self) -> Vec<u64> {
        self.inner
            .lock()
            .batches
            .iter()
            .filter(|(_, b)| !b.parked.is_durable())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Settles every batch whose held turn is gone as `lost`. Called when a backend
    /// process died, not on a timer.
    pub fn take_dead(&self) -> Vec<Settled<P>> {
        let ids: Vec<u64> = {
            let g = self.inner.lock();
            g.batches
                .iter()
                .filter(|(_, b)| !b.parked.is_alive())
                .map(|(id, _)| *id)
                .collect()
        };
        ids.into_iter()
            .filter_map(|id| self.settle(id, Reason::Lost))
            .collect()
    }
}

/// Adds a tombstone to the principal's ring; the digests pushed out of the ring go to
/// `evicted` (the store deletes them too).
fn push_tomb<P>(
    g: &mut Inner<P>,
    ring: usize,
    digest: [u8; 32],
    principal: &str,
    reason: Reason,
    evicted: &mut Vec<[u8; 32]>,
) {
    let principal = match g.rings.get_key_value(principal) {
        Some((known, _)) => known.clone(),
        None => Arc::from(principal),
    };
    let Inner { rings, tombs, .. } = g;
    tombs.insert(
        digest,
        Tomb {
            principal: principal.clone(),
            reason,
        },
    );
    let q = rings.entry(principal).or_default();
    q.push_back(digest);
    while q.len() > ring {
        if let Some(old) = q.pop_front() {
            tombs.remove(&old);
            evicted.push(old);
        }
    }
}

mod batch;
mod kept;
#[cfg(test)]
mod tests;
