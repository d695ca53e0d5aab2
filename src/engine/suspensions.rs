//! The suspensions: every suspended execution in memory (the registry, behind its tokens),
//! their durable side (the store's records and tombstones) and the journal that writes
//! lifecycle rows and tombstones behind the request path. This component owns the three and
//! is the only part of the engine that touches them; the engine decides when a batch is
//! registered, claimed, spent, put back or settled, and this part does it consistently in
//! memory and in the store.

use std::sync::Arc;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::execution::{ExecutionMeta, Suspended};
use super::journal::Journal;
use super::ContinuationError;
use crate::auth::Principal;
use crate::backend::{Hold, Holds};
use crate::continuation::{Batch, Head, Lookup, Parked, Reason, Registry, Settled};
use crate::store::{now_unix, now_unix_ms, Store, StoreError, StoredSuspension, SuspensionRecord};

use super::activity::{sees, unix_at, SuspendedView};

pub(super) struct Suspensions {
    registry: Registry<Suspended>,
    journal: Journal,
    store: Arc<Store>,
}

/// Why a batch could not be suspended; the batch comes back to be ended.
pub(super) enum Refusal {
    /// Over the registry's bounds.
    Capacity(Box<Batch<Suspended>>),
    /// The store did not record it (no token was exposed).
    Store(Option<Box<Batch<Suspended>>>),
}

impl Suspensions {
    /// Over the store, putting back the durable suspensions a previous process left pending.
    pub async fn open(
        store: Arc<Store>,
        registry: Registry<Suspended>,
        journal: Journal,
    ) -> Result<Suspensions, StoreError> {
        for s in store.durable_suspensions().await? {
            registry.restore(durable_batch(s));
        }
        Ok(Suspensions {
            registry,
            journal,
            store,
        })
    }

    /// Notified when a batch is registered (the earliest deadline may be earlier).
    pub fn changed(&self) -> &Notify {
        self.registry.changed()
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.registry.next_deadline()
    }

    /// Suspended batches, pending tokens and tombstones in memory.
    pub fn counts(&self) -> (usize, usize, usize) {
        (
            self.registry.batch_count(),
            self.registry.pending_count(),
            self.registry.tombstone_count(),
        )
    }

    /// The principal's suspended executions: all, and those with a durable record.
    pub fn suspended_of(&self, principal: &str) -> (usize, usize) {
        self.registry.suspended_of(principal)
    }

    /// What a principal keeps beside its suspensions, under their bound (see
    /// [`Registry::rekeep`]).
    pub fn rekeep(&self, principal: &str, was: usize, now: usize) -> bool {
        self.registry.rekeep(principal, was, now)
    }

    /// An agent execution's start, before it runs (queued while the journal is behind).
    pub async fn started(&self, m: &ExecutionMeta) -> Result<(), StoreError> {
        self.journal.started(&m.id, &m.principal, &m.model).await
    }

    /// A stateless execution's start, written at once when it first suspends.
    pub async fn started_now(&self, m: &ExecutionMeta) -> Result<(), StoreError> {
        self.store
            .execution_started(&m.id, &m.principal, &m.model)
            .await
    }

    pub async fn ended(&self, execution_id: &str, reason: &'static str) {
        self.journal.ended(execution_id, reason).await;
    }

    /// Registers a batch within the bounds, then records it durably: only then may its
    /// tokens be exposed.
    pub async fn suspend(&self, batch: Batch<Suspended>) -> Result<(), Refusal> {
        let ids = match &batch.parked.hold {
            Hold::Ids(ids) => Some(ids.clone()),
            Hold::Live { .. } => None,
        };
        let left = batch.deadline().saturating_duration_since(Instant::now());
        let (execution_id, principal, model, surface) = (
            batch.execution_id().clone(),
            batch.principal().clone(),
            batch.model().clone(),
            batch.surface(),
        );
        let (digests, tokens) = (batch.digests, batch.tokens.clone());
        let (rounds, created_at) = (batch.parked.rounds, batch.parked.meta.created);
        let spend = batch.parked.spent();
        let id = self.registry.register(batch).map_err(Refusal::Capacity)?;
        let record = SuspensionRecord {
            execution_id: &execution_id,
            principal: &principal,
            model: &model,
            surface,
            deadline_ms: now_unix_ms() + left.as_millis() as u64,
            digests: &digests,
            tokens: &tokens,
            ids: ids.as_deref(),
            rounds,
            created_at,
            spend,
        };
        if let Err(e) = self.store.suspension_recorded(&record).await {
            tracing::error!(execution = %execution_id, error = %e, "could not record the suspension; no token exposed");
            // Nobody can have claimed the batch: its tokens were never exposed.
            return Err(Refusal::Store(self.registry.withdraw(id).map(Box::new)));
        }
        Ok(())
    }

    /// The batch of a principal's tokens in memory.
    pub fn lookup(&self, principal: &str, tokens: &[[u8; 32]]) -> Lookup {
        self.registry.lookup(principal, tokens)
    }

    /// A durable record found in the store (another replica's), unless one is here already.
    pub fn take_in(&self, s: StoredSuspension) {
        self.registry.restore_absent(durable_batch(s));
    }

    pub fn settle(&self, batch: u64, reason: Reason) -> Option<Settled<Suspended>> {
        self.registry.settle(batch, reason)
    }

    /// Every held (agent) batch settled with `reason`.
    pub fn settle_held(&self, reason: Reason) -> Vec<Settled<Suspended>> {
        let held = self.registry.held_batches();
        held.into_iter()
            .filter_map(|id| self.registry.settle(id, reason))
            .collect()
    }

    pub fn take_expired(&self, now: Instant) -> Vec<Settled<Suspended>> {
        self.registry.take_expired(now)
    }

    pub fn take_dead(&self) -> Vec<Settled<Suspended>> {
        self.registry.take_dead()
    }

    /// The claim: exactly one caller takes the batch. A stateless record is also claimed in
    /// the store (replicas race for it); a held turn's tokens are spent at once.
    pub async fn take(&self, batch: u64) -> Result<Taken, ContinuationError> {
        let batch = self
            .registry
            .take(batch)
            .ok_or(ContinuationError::Settled(Reason::Resolved))?;
        let (head, parked) = batch.split();
        if parked.hold.is_durable() {
            if let Err(e) = self.claim_durable(&head.execution_id, &head.tokens).await {
                if e == ContinuationError::StoreUnavailable {
                    self.registry.reinstate(head.join(parked));
                }
                return Err(e);
            }
        } else if self.spend_held(&head).await == Some(false) {
            // Another replica settled this held turn (this one's lease had lapsed).
            return Ok(Taken::Gone(parked));
        }
        Ok(Taken::Claimed(head, parked))
    }

    /// Claims a stateless record in the store before its forward, on a single gateway as on
    /// a replica (where replicas race for it). The claim is what makes the answer exactly
    /// once when the store fails later: a spend that cannot be written leaves the record
    /// claimed, and a claimed record settles `lost` at recovery.
    async fn claim_durable(
        &self,
        execution_id: &str,
        tokens: &[[u8; 32]],
    ) -> Result<(), ContinuationError> {
        match self.store.upstream_claim(execution_id, tokens.len()).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                // Claimed or spent by another replica: this copy is stale.
                self.registry.forget(tokens);
                Err(ContinuationError::Settled(Reason::Resolved))
            }
            Err(e) => {
                tracing::error!(error = %e, "store unavailable for a claim");
                Err(ContinuationError::StoreUnavailable)
            }
        }
    }

    /// Puts a taken stateless batch back as it was (its forward failed before the upstream
    /// answered), releasing its claim in the store. If that cannot be written the record
    /// stays claimed: this process may take it again, and a restart settles it `lost` (fail
    /// closed).
    pub async fn reinstate(&self, b: Batch<Suspended>) {
        if let Err(e) = self.store.upstream_unclaim(b.execution_id()).await {
            tracing::error!(error = %e, "could not release a claim; the record settles lost at the next start");
        }
        self.registry.reinstate(b);
    }

    /// Tombstones a taken batch's tokens, in memory and durably. Returns whether the store
    /// still had them pending (false when another replica settled them first), None when the
    /// store could not be written.
    pub fn spend<'a>(
        &'a self,
        b: &'a Head,
        reason: Reason,
    ) -> impl std::future::Future<Output = Option<bool>> + Send + 'a {
        // Only the parts cross the write's await: a batch is not `Sync`.
        let (execution_id, principal) = (&*b.execution_id, &*b.principal);
        let tokens = &b.tokens[..];
        let evicted = self.registry.commit(principal, tokens, reason);
        async move {
            self.persist((execution_id, principal, tokens), reason, &evicted)
                .await
                .map(|n| n == tokens.len())
        }
    }

    /// Tombstones a claimed held batch's tokens: behind the request path where the journal
    /// writes behind (`journal.rs`), else at once. Never for a stateless batch, whose durable
    /// record must not be claimable again.
    async fn spend_held(&self, b: &Head) -> Option<bool> {
        if !self.journal.behind() {
            return self.spend(b, Reason::Resolved).await;
        }
        let evicted = self
            .registry
            .commit(&b.principal, &b.tokens, Reason::Resolved);
        self.journal
            .tombstones(crate::store::Settlement {
                execution_id: b.execution_id.clone(),
                principal: b.principal.clone(),
                tokens: b.tokens.clone(),
                reason: Reason::Resolved.as_str(),
                evicted,
            })
            .await;
        Some(true)
    }

    /// Makes a settled batch's tombstones durable.
    pub fn persist_settled<'a>(
        &'a self,
        s: &'a Settled<Suspended>,
    ) -> impl std::future::Future<Output = ()> + Send + 'a {
        // Only the parts cross the write's await: a settled batch is not `Sync`.
        let tokens = (&*s.execution_id, &*s.principal, &s.tokens[..]);
        let (reason, evicted) = (s.reason, &s.evicted[..]);
        async move {
            self.persist(tokens, reason, evicted).await;
        }
    }

    /// Records tombstones (`execution id, principal, token digests`) in the store, and deletes
    /// the ones a principal's ring pushed out. Returns how many tokens the store still had
    /// pending, None when it could not be written.
    async fn persist(
        &self,
        (execution_id, principal, tokens): (&str, &str, &[[u8; 32]]),
        reason: Reason,
        evicted: &[[u8; 32]],
    ) -> Option<usize> {
        self.store
            .tokens_settled(execution_id, principal, tokens, reason.as_str(), evicted)
            .await
            .inspect_err(|e| {
                // The in-memory tombstones still answer replays; after a restart, recovery
                // turns the still-pending rows of a held turn and the still-claimed record of
                // a stateless one into `lost` tombstones, which never resume. (An expired or
                // revoked stateless record left pending is refused again after a restart.)
                tracing::error!(execution = %execution_id, error = %e, "could not persist tombstones");
            })
            .ok()
    }

    /// The principal's suspended executions (everyone's for an approver), earliest deadline
    /// first.
    pub fn views(&self, who: &Principal) -> Vec<SuspendedView> {
        let (now, unix) = (Instant::now(), now_unix());
        self.registry.snapshot(|b| {
            sees(who, b.principal()).then(|| SuspendedView {
                execution_id: b.execution_id().to_string(),
                client: b.principal().to_string(),
                model: b.model().to_string(),
                surface: b.surface().as_str(),
                hold: match b.parked.hold.is_durable() {
                    true => "durable",
                    false => "held",
                },
                calls: b.tokens.len(),
                tools: b.parked.tools.iter().map(|t| t.to_string()).collect(),
                round: b.parked.rounds,
                created_at: b.parked.meta.created,
                suspended_at: (b.parked.suspended_at != 0).then_some(b.parked.suspended_at),
                deadline_at: unix_at(b.deadline(), now, unix),
            })
        })
    }

    /// Writes what the journal queued and stops its writer.
    pub async fn close(&self) {
        self.journal.close().await;
    }

    #[cfg(test)]
    pub async fn flush(&self) {
        self.journal.flush().await;
    }

    #[cfg(test)]
    pub fn pending_count(&self) -> usize {
        self.registry.pending_count()
    }
}

/// What a claim took.
// Taken apart at once by the claim: boxing would cost every claim an allocation.
#[allow(clippy::large_enum_variant)]
pub(super) enum Taken {
    /// The batch (without its execution) and its suspended execution.
    Claimed(Head, Suspended),
    /// Another replica settled this held turn meanwhile: the execution is lost.
    Gone(Suspended),
}

/// A durable (stateless upstream) record from the store as a registry batch, its deadline
/// carried over from wall-clock time.
fn durable_batch(s: StoredSuspension) -> Batch<Suspended> {
    let left = std::time::Duration::from_millis(s.deadline_ms.saturating_sub(now_unix_ms()));
    let deadline = Instant::now() + left;
    let meta = ExecutionMeta {
        id: s.execution_id.as_str().into(),
        principal: s.principal.as_str().into(),
        // Not stored: a durable record resumed after a restart counts toward its principal's
        // own caps only.
        membership: None,
        model: s.model.as_str().into(),
        surface: s.surface,
        created: s.created_at,
        spent: (s.spend > 0).then(|| Arc::new(s.spend.into())),
        cap: None,
        approvals: None,
        trace: Default::default(),
    };
    Batch {
        tokens: s.tokens,
        digests: s.digests,
        parked: Suspended {
            meta,
            holds: Holds::Nothing,
            deadline,
            rounds: s.rounds,
            hold: Hold::Ids(s.ids),
            backlog: Vec::new(),
            slot: None,
            history: None,
            suspended_at: 0,
            tools: Box::default(),
            held: Default::default(),
        },
    }
}

#[cfg(test)]
mod tests;
