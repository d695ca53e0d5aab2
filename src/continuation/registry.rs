//! Pending continuation records and tombstones, and the atomic claim.
//!
//! A record holds digests only (principal, execution id, model, deadline and the SHA-256 of
//! tools, tool_choice, conversation prefix and assistant echo) plus the parked execution
//! (`P`), which owns the backend's held turn. Tokens are keyed by their SHA-256; the token
//! text is never stored. Every state change happens under one lock that is never held across
//! an `.await` and never returns a guard; the durable store is written after the in-memory
//! change (claims) or before the record becomes visible to anyone (registration).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use subtle::ConstantTimeEq;

use crate::store::Store;

/// Why a token stopped being pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Resolved,
    Expired,
    Cancelled,
    Lost,
    Revoked,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Resolved => "resolved",
            Reason::Expired => "expired",
            Reason::Cancelled => "cancelled",
            Reason::Lost => "lost",
            Reason::Revoked => "revoked",
        }
    }

    pub fn parse(s: &str) -> Reason {
        match s {
            "resolved" => Reason::Resolved,
            "expired" => Reason::Expired,
            "cancelled" => Reason::Cancelled,
            "revoked" => Reason::Revoked,
            _ => Reason::Lost,
        }
    }
}

/// The four digests of a suspension point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digests {
    pub tools: [u8; 32],
    pub tool_choice: [u8; 32],
    pub prefix: [u8; 32],
    pub echo: [u8; 32],
}

impl Digests {
    /// Which digest differs, compared in constant time on fixed 32-byte arrays.
    pub fn first_mismatch(&self, other: &Digests) -> Option<&'static str> {
        let pairs = [
            ("tools", &self.tools, &other.tools),
            ("tool_choice", &self.tool_choice, &other.tool_choice),
            ("conversation prefix", &self.prefix, &other.prefix),
            ("assistant message", &self.echo, &other.echo),
        ];
        let mut first = None;
        for (name, a, b) in pairs {
            if !bool::from(a.ct_eq(b)) && first.is_none() {
                first = Some(name);
            }
        }
        first
    }
}

/// A batch about to be registered.
pub struct NewBatch<P> {
    pub principal: String,
    pub execution_id: String,
    pub model: String,
    pub deadline: Instant,
    /// Token digests, in the order the calls were exposed.
    pub tokens: Vec<[u8; 32]>,
    pub digests: Digests,
    pub parked: P,
}

/// What a principal-scoped lookup of a set of tokens found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// At least one token is unknown or belongs to someone else.
    NotFound,
    /// The caller's own settled token (first one found).
    Settled(Reason),
    /// All tokens are the caller's and pending, in one batch.
    Pending(Box<PendingView>),
    /// All are the caller's and pending, but they span several batches or only part of one.
    Partial,
}

/// What the registry needs to know about a parked execution.
pub trait Parked {
    /// False when the backend turn behind the record is gone.
    fn is_alive(&self) -> bool;
    /// For a stateless upstream: the upstream's call ids (in token order), the round count and
    /// the creation time, stored with the record so it survives a restart. None for a held
    /// turn, whose record is journaled as a plain pending token.
    fn upstream(&self) -> Option<(&[String], u32, u64)> {
        None
    }
}

impl Parked for &'static str {
    fn is_alive(&self) -> bool {
        true
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingView {
    /// False when the held turn is gone (its record reads as lost).
    pub alive: bool,
    pub batch: u64,
    pub execution_id: String,
    pub model: String,
    pub deadline: Instant,
    pub digests: Digests,
    /// Token digests of the batch in exposure order.
    pub tokens: Vec<[u8; 32]>,
}

struct Batch<P> {
    principal: String,
    execution_id: String,
    model: String,
    deadline: Instant,
    tokens: Vec<[u8; 32]>,
    digests: Digests,
    parked: P,
}

struct Tomb {
    principal: String,
    reason: Reason,
}

struct Inner<P> {
    next_batch: u64,
    token_batch: HashMap<[u8; 32], u64>,
    /// Boxed: the map's table stays small while thousands of executions are parked.
    batches: HashMap<u64, Box<Batch<P>>>,
    per_principal: HashMap<String, usize>,
    pending: usize,
    tombs: HashMap<[u8; 32], Tomb>,
    rings: HashMap<String, VecDeque<[u8; 32]>>,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_pending: usize,
    pub max_pending_per_client: usize,
    pub tombstones_per_client: usize,
}

/// A settled batch handed back to the caller (to resume or to clean up).
pub struct Settled<P> {
    pub execution_id: String,
    pub principal: String,
    pub tokens: Vec<[u8; 32]>,
    pub parked: P,
}

pub enum RegisterError<P> {
    /// A bound was hit; the parked execution comes back so its held calls can be cancelled.
    Capacity(P),
    /// The journal write failed; the batch was withdrawn.
    Store(Option<P>),
}

pub struct Registry<P> {
    inner: Mutex<Inner<P>>,
    store: Arc<Store>,
    limits: Limits,
}

fn principal_eq(a: &str, b: &str) -> bool {
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

impl<P: Parked> Registry<P> {
    /// Builds the registry, loading durable tombstones (oldest first) into the rings.
    pub fn new(store: Arc<Store>, limits: Limits) -> Result<Self, crate::store::StoreError> {
        let mut inner = Inner {
            next_batch: 1,
            token_batch: HashMap::new(),
            batches: HashMap::new(),
            per_principal: HashMap::new(),
            pending: 0,
            tombs: HashMap::new(),
            rings: HashMap::new(),
        };
        for t in store.tombstones()? {
            push_tomb(
                &mut inner,
                limits.tombstones_per_client,
                t.digest,
                &t.principal,
                Reason::parse(&t.reason),
                // Rows beyond the ring (a smaller ring than last time) just stay unloaded.
                &mut Vec::new(),
            );
        }
        Ok(Registry {
            inner: Mutex::new(inner),
            store,
            limits,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<P>> {
        // Poisoning means a panic elsewhere mid-update; the maps stay structurally valid.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn pending_count(&self) -> usize {
        self.lock().pending
    }

    pub fn batch_count(&self) -> usize {
        self.lock().batches.len()
    }

    /// Suspended batches (one per suspended execution) of one principal: all of them, and
    /// those of stateless upstreams. A scan, made only for admission limits.
    pub fn suspended_of(&self, principal: &str) -> (usize, usize) {
        let inner = self.lock();
        let mut all = 0;
        let mut upstream = 0;
        for b in inner.batches.values().filter(|b| b.principal == principal) {
            all += 1;
            if b.parked.upstream().is_some() {
                upstream += 1;
            }
        }
        (all, upstream)
    }

    pub fn tombstone_count(&self) -> usize {
        self.lock().tombs.len()
    }

    /// Registers a batch durably. On success the tokens may be exposed.
    pub fn register(&self, b: NewBatch<P>) -> Result<(), RegisterError<P>> {
        let n = b.tokens.len();
        let upstream_rows = b.parked.upstream().map(|(ids, rounds, created)| {
            let left = b.deadline.saturating_duration_since(Instant::now());
            let deadline_ms = crate::store::now_unix_ms() + left.as_millis() as u64;
            let mut digests = [0u8; 128];
            for (i, d) in [
                b.digests.tools,
                b.digests.tool_choice,
                b.digests.prefix,
                b.digests.echo,
            ]
            .iter()
            .enumerate()
            {
                digests[i * 32..(i + 1) * 32].copy_from_slice(d);
            }
            b.tokens
                .iter()
                .zip(ids)
                .enumerate()
                .map(|(i, (t, up))| crate::store::UpstreamPending {
                    digest: *t,
                    execution_id: b.execution_id.clone(),
                    principal: b.principal.clone(),
                    model: b.model.clone(),
                    deadline_ms,
                    digests,
                    upstream_id: up.clone(),
                    position: i as u32,
                    rounds,
                    created_at: created,
                })
                .collect::<Vec<_>>()
        });
        let id = {
            let mut g = self.lock();
            let mine = g.per_principal.get(&b.principal).copied().unwrap_or(0);
            if g.pending + n > self.limits.max_pending
                || mine + n > self.limits.max_pending_per_client
            {
                return Err(RegisterError::Capacity(b.parked));
            }
            Self::insert(
                &mut g,
                b.principal.clone(),
                b.execution_id.clone(),
                b.model,
                b.deadline,
                b.tokens.clone(),
                b.digests,
                b.parked,
            )
        };
        let written = match &upstream_rows {
            Some(rows) => self.store.upstream_registered(rows),
            None => {
                let detail = format!(
                    "count={n} tokens={} tools={} prefix={} echo={}",
                    b.tokens
                        .iter()
                        .map(super::token::short)
                        .collect::<Vec<_>>()
                        .join(","),
                    super::token::short(&b.digests.tools),
                    super::token::short(&b.digests.prefix),
                    super::token::short(&b.digests.echo)
                );
                self.store
                    .tokens_registered(&b.execution_id, &b.principal, &b.tokens, &detail)
            }
        };
        if let Err(e) = written {
            tracing::error!(execution = %b.execution_id, error = %e, "could not journal pending tokens");
            // Nobody can have claimed the batch: its tokens were never exposed.
            let batch = self.remove(&mut self.lock(), id);
            return Err(RegisterError::Store(batch.map(|b| b.parked)));
        }
        Ok(())
    }

    /// Puts back a batch recovered from the store at startup (no bounds, no new write).
    pub fn restore(&self, b: NewBatch<P>) {
        let mut g = self.lock();
        Self::insert(
            &mut g,
            b.principal,
            b.execution_id,
            b.model,
            b.deadline,
            b.tokens,
            b.digests,
            b.parked,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn insert(
        g: &mut Inner<P>,
        principal: String,
        execution_id: String,
        model: String,
        deadline: Instant,
        tokens: Vec<[u8; 32]>,
        digests: Digests,
        parked: P,
    ) -> u64 {
        let id = g.next_batch;
        g.next_batch += 1;
        for t in &tokens {
            g.token_batch.insert(*t, id);
        }
        g.pending += tokens.len();
        *g.per_principal.entry(principal.clone()).or_default() += tokens.len();
        g.batches.insert(
            id,
            Box::new(Batch {
                principal,
                execution_id,
                model,
                deadline,
                tokens,
                digests,
                parked,
            }),
        );
        id
    }

    fn remove(&self, g: &mut Inner<P>, id: u64) -> Option<Batch<P>> {
        let batch = *g.batches.remove(&id)?;
        for t in &batch.tokens {
            g.token_batch.remove(t);
        }
        g.pending -= batch.tokens.len();
        if let Some(c) = g.per_principal.get_mut(&batch.principal) {
            *c -= batch.tokens.len();
            if *c == 0 {
                g.per_principal.remove(&batch.principal);
            }
        }
        Some(batch)
    }

    /// Principal-scoped lookup of the tokens of one assistant message. Another principal's
    /// token, live or settled, reads exactly as an unknown one.
    pub fn lookup(&self, principal: &str, tokens: &[[u8; 32]]) -> Lookup {
        let g = self.lock();
        let mut batch = None;
        let mut settled = None;
        let mut partial = false;
        for t in tokens {
            if let Some(id) = g.token_batch.get(t) {
                let b = &g.batches[id];
                if !principal_eq(&b.principal, principal) {
                    return Lookup::NotFound;
                }
                match batch {
                    None => batch = Some(*id),
                    Some(other) if other != *id => partial = true,
                    _ => {}
                }
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
            batch: id,
            execution_id: b.execution_id.clone(),
            model: b.model.clone(),
            deadline: b.deadline,
            digests: b.digests,
            tokens: b.tokens.clone(),
        }))
    }

    /// Atomically takes a whole batch out of the pending set and tombstones its tokens with
    /// `reason`. Exactly one caller gets `Some` for a batch; everyone after sees the tombstones.
    pub fn settle(&self, batch: u64, reason: Reason) -> Option<Settled<P>> {
        let mut evicted = Vec::new();
        let b = {
            let mut g = self.lock();
            let b = self.remove(&mut g, batch)?;
            for t in &b.tokens {
                push_tomb(
                    &mut g,
                    self.limits.tombstones_per_client,
                    *t,
                    &b.principal,
                    reason,
                    &mut evicted,
                );
            }
            b
        };
        self.persist_settled(&b.execution_id, &b.principal, &b.tokens, reason, &evicted);
        Some(Settled {
            execution_id: b.execution_id,
            principal: b.principal,
            tokens: b.tokens,
            parked: b.parked,
        })
    }

    fn persist_settled(
        &self,
        execution_id: &str,
        principal: &str,
        tokens: &[[u8; 32]],
        reason: Reason,
        evicted: &[[u8; 32]],
    ) {
        if let Err(e) =
            self.store
                .tokens_settled(execution_id, principal, tokens, reason.as_str(), evicted)
        {
            // The in-memory tombstones still answer replays; after a restart, recovery turns
            // the still-pending rows into `lost` tombstones, which also never resume.
            tracing::error!(execution = %execution_id, error = %e, "could not persist tombstones");
        }
    }

    /// Settles every batch whose deadline has passed.
    pub fn take_expired(&self, now: Instant) -> Vec<Settled<P>> {
        let ids: Vec<u64> = {
            let g = self.lock();
            g.batches
                .iter()
                .filter(|(_, b)| b.deadline <= now)
                .map(|(id, _)| *id)
                .collect()
        };
        ids.into_iter()
            .filter_map(|id| self.settle(id, Reason::Expired))
            .collect()
    }

    /// Batches that hold a live backend turn (not stateless upstream records).
    pub fn held_batches(&self) -> Vec<u64> {
        self.lock()
            .batches
            .iter()
            .filter(|(_, b)| b.parked.upstream().is_none())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Settles every batch (shutdown).
    pub fn take_all(&self, reason: Reason) -> Vec<Settled<P>> {
        let ids: Vec<u64> = self.lock().batches.keys().copied().collect();
        ids.into_iter()
            .filter_map(|id| self.settle(id, reason))
            .collect()
    }

    /// Settles every batch whose held turn is gone (backend crash) as `lost`.
    pub fn take_dead(&self) -> Vec<Settled<P>> {
        let ids: Vec<u64> = {
            let g = self.lock();
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
    g.tombs.insert(
        digest,
        Tomb {
            principal: principal.to_string(),
            reason,
        },
    );
    let q = g.rings.entry(principal.to_string()).or_default();
    q.push_back(digest);
    while q.len() > ring {
        if let Some(old) = q.pop_front() {
            g.tombs.remove(&old);
            evicted.push(old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn reg(max: usize, per: usize, ring: usize) -> Registry<&'static str> {
        Registry::new(
            Arc::new(Store::open_in_memory().unwrap()),
            Limits {
                max_pending: max,
                max_pending_per_client: per,
                tombstones_per_client: ring,
            },
        )
        .unwrap()
    }

    fn digests() -> Digests {
        Digests {
            tools: [1; 32],
            tool_choice: [2; 32],
            prefix: [3; 32],
            echo: [4; 32],
        }
    }

    fn batch(principal: &str, tokens: Vec<[u8; 32]>, deadline: Instant) -> NewBatch<&'static str> {
        NewBatch {
            principal: principal.into(),
            execution_id: "exe-1".into(),
            model: "m".into(),
            deadline,
            tokens,
            digests: digests(),
            parked: "parked",
        }
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn lookup_is_principal_scoped() {
        let r = reg(10, 10, 10);
        assert!(r
            .register(batch("alice", vec![[7; 32], [8; 32]], later()))
            .is_ok());
        assert_eq!(r.pending_count(), 2);
        assert!(matches!(
            r.lookup("alice", &[[7; 32], [8; 32]]),
            Lookup::Pending(_)
        ));
        assert_eq!(r.lookup("bob", &[[7; 32], [8; 32]]), Lookup::NotFound);
        assert_eq!(r.lookup("alice", &[[9; 32]]), Lookup::NotFound);
        assert_eq!(r.lookup("alice", &[[7; 32]]), Lookup::Partial);
    }

    #[test]
    fn claim_is_once_and_tombstones_are_principal_bound() {
        let r = reg(10, 10, 10);
        assert!(r.register(batch("alice", vec![[7; 32]], later())).is_ok());
        let Lookup::Pending(v) = r.lookup("alice", &[[7; 32]]) else {
            panic!()
        };
        assert!(r.settle(v.batch, Reason::Resolved).is_some());
        assert!(r.settle(v.batch, Reason::Resolved).is_none());
        assert_eq!(r.pending_count(), 0);
        assert_eq!(
            r.lookup("alice", &[[7; 32]]),
            Lookup::Settled(Reason::Resolved)
        );
        assert_eq!(r.lookup("bob", &[[7; 32]]), Lookup::NotFound);
    }

    #[test]
    fn bounds_refuse_and_return_the_parked_value() {
        let r = reg(3, 2, 10);
        assert!(r
            .register(batch("alice", vec![[1; 32], [2; 32]], later()))
            .is_ok());
        assert!(matches!(
            r.register(batch("alice", vec![[3; 32]], later())),
            Err(RegisterError::Capacity("parked"))
        ));
        assert!(r.register(batch("bob", vec![[4; 32]], later())).is_ok());
        assert!(matches!(
            r.register(batch("carol", vec![[5; 32]], later())),
            Err(RegisterError::Capacity(_))
        ));
        assert_eq!(r.pending_count(), 3);
    }

    #[test]
    fn expiry_and_ring_eviction() {
        let r = reg(10, 10, 2);
        let now = Instant::now();
        assert!(r.register(batch("alice", vec![[1; 32]], now)).is_ok());
        assert!(r.register(batch("alice", vec![[2; 32]], later())).is_ok());
        let expired = r.take_expired(now);
        assert_eq!(expired.len(), 1);
        assert_eq!(
            r.lookup("alice", &[[1; 32]]),
            Lookup::Settled(Reason::Expired)
        );
        assert_eq!(r.take_all(Reason::Lost).len(), 1);
        assert_eq!(r.pending_count(), 0);
        // Ring of 2: the oldest tombstone is evicted and reads as unknown.
        assert!(r.register(batch("alice", vec![[3; 32]], later())).is_ok());
        assert_eq!(r.take_all(Reason::Resolved).len(), 1);
        assert_eq!(r.lookup("alice", &[[1; 32]]), Lookup::NotFound);
        assert_eq!(
            r.lookup("alice", &[[3; 32]]),
            Lookup::Settled(Reason::Resolved)
        );
        assert_eq!(r.tombstone_count(), 2);
    }

    #[test]
    fn digest_mismatch_names_the_first_difference() {
        let a = digests();
        let mut b = a;
        assert_eq!(a.first_mismatch(&b), None);
        b.echo[0] ^= 1;
        assert_eq!(a.first_mismatch(&b), Some("assistant message"));
        b.tools[31] ^= 1;
        assert_eq!(a.first_mismatch(&b), Some("tools"));
    }
}
