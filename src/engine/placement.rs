//! Placement: where the gateway's work lives. A single gateway holds all of it; a replica is
//! one among several on a shared PostgreSQL store (`[cluster]`). This component owns the
//! replica's membership (its lease and key) and answers every question about other
//! replicas from the store; the engine acts on what it answers.
//!
//! - **Lease.** At start the replica takes its lease (a new epoch) with the address of its
//!   internal listener, and renews it every third of `lease_seconds`. A renewal that finds
//!   the epoch settled means the others gave this replica up: what it holds is already
//!   `lost` in the store, so it settles its held turns in memory too and takes a new lease.
//!   Without a renewal for a whole lease the replica stops claiming its held turns and
//!   admitting fresh ones (it cannot promise them) until the store answers again.
//! - **Lapsed replicas.** Each renewal also reads the others' leases; one that lapsed is
//!   settled (held turns `lost`, approvals `denied(orphaned)`) by whichever replica gets the
//!   conditional write first. A request that needs a lapsed owner settles it the same way.
//! - **A continuation not held here** ([`Placement::find`]): its tokens are looked up in
//!   the store. A held turn of another live replica is validated here up to the claim and
//!   then forwarded (the HTTP layer relays the owner's answer); a stateless upstream's record
//!   is taken into this replica's registry and claimed here with a conditional write.

use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use subtle::ConstantTimeEq;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::resume::check;
use super::{ContinuationError, StartError};
use crate::approvals::Approvals;
use crate::auth::Principal;
use crate::config::ClusterConfig;
use crate::continuation::{principal_eq, PendingView, Reason};
use crate::digest::sha256;
use crate::metrics::Metrics;
use crate::store::{now_unix_ms, ApprovalRecord, Lease, RemotePending, Store, StoredSuspension};
use crate::turn::{Continuation, TurnInput};

/// A replica's internal listener, by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub replica_id: String,
    pub url: String,
}

/// What became of an owner that could not be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerFate {
    /// It renewed its lease meanwhile: try again here.
    Alive(Owner),
    /// Its lease lapsed and its held work is settled.
    Gone,
}

/// Where an approval decision is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalRoute {
    /// Here: the parked backend request is in this process (or the approval is settled).
    Here,
    /// On its owner replica.
    Owner(Owner),
}

/// Where the gateway's work lives.
pub(super) enum Placement {
    Single,
    Replica(Cluster),
}

/// A replica: its membership, and what it needs to act on the others.
pub(super) struct Cluster {
    m: Membership,
    store: Arc<Store>,
    approvals: Arc<Approvals>,
    metrics: Arc<Metrics>,
}

/// This replica's membership.
pub(super) struct Membership {
    id: String,
    lease: Duration,
    key: String,
    key_digest: [u8; 32],
    state: Mutex<LeaseState>,
    /// The last store round trip of the lease loop succeeded.
    store_ok: AtomicBool,
}

#[derive(Debug, Clone, Default)]
struct LeaseState {
    epoch: i64,
    url: String,
    /// Until when the last renewal vouches for this replica.
    valid_until: Option<Instant>,
}

impl Membership {
    /// Reads the shared key from the environment variable the config names.
    pub fn new(c: &ClusterConfig) -> Result<Membership, StartError> {
        let key = std::env::var(&c.key_env).unwrap_or_default();
        if key.len() < 16 {
            return Err(StartError::Environment {
                key: "cluster.key_env",
                var: c.key_env.clone(),
                problem: "must hold the cluster's shared key (at least 16 bytes)",
            });
        }
        Ok(Membership::with_key(&c.replica_id, c.lease, key))
    }

    fn with_key(id: &str, lease: Duration, key: String) -> Membership {
        Membership {
            id: id.to_string(),
            lease,
            key_digest: sha256(key.as_bytes()),
            key,
            state: Mutex::new(LeaseState::default()),
            store_ok: AtomicBool::new(true),
        }
    }

    fn lease_valid(&self) -> bool {
        self.state
            .lock()
            .valid_until
            .is_some_and(|v| Instant::now() < v)
    }

    fn lease_ms(&self) -> u64 {
        self.lease.as_millis() as u64
    }
}

impl Placement {
    /// A replica over `store` with `membership`, else a single gateway.
    pub fn new(
        membership: Option<Membership>,
        store: Arc<Store>,
        approvals: Arc<Approvals>,
        metrics: Arc<Metrics>,
    ) -> Placement {
        match membership {
            None => Placement::Single,
            Some(m) => Placement::Replica(Cluster {
                m,
                store,
                approvals,
                metrics,
            }),
        }
    }

    fn cluster(&self) -> Option<&Cluster> {
        match self {
            Placement::Single => None,
            Placement::Replica(c) => Some(c),
        }
    }

    /// This replica's id, when it is one of several.
    pub fn replica_id(&self) -> Option<&str> {
        self.cluster().map(|c| c.m.id.as_str())
    }

    /// The shared key another replica presents on the internal listener, compared in
    /// constant time (over digests, so the length does not show either).
    pub fn key_matches(&self, presented: &[u8]) -> bool {
        self.cluster()
            .is_some_and(|c| bool::from(sha256(presented).ct_eq(&c.m.key_digest)))
    }

    /// The shared key, for requests this replica forwards.
    pub fn key(&self) -> Option<&str> {
        self.cluster().map(|c| c.m.key.as_str())
    }

    /// Whether this replica may take fresh work: a single gateway always; a replica while its
    /// lease is renewed and the store answers.
    pub fn admits_fresh(&self) -> bool {
        self.cluster()
            .is_none_or(|c| c.m.store_ok.load(Ordering::Relaxed) && c.m.lease_valid())
    }

    /// The lease part of readiness: None for a single gateway.
    pub fn lease_ready(&self) -> Option<bool> {
        self.cluster().map(|c| c.m.lease_valid())
    }

    /// Whether this replica may still claim the held turns it has (its lease vouches for
    /// them).
    pub fn may_claim_held(&self) -> bool {
        self.cluster().is_none_or(|c| c.m.lease_valid())
    }

    /// `replica`, if its lease is live (a lapsed one is settled); None on a single gateway.
    pub async fn live_replica(&self, replica: &str) -> Option<Owner> {
        self.cluster()?.live_owner(replica).await
    }

    /// Where a decision on this approval is taken.
    pub async fn approval_route(&self, record: &ApprovalRecord) -> ApprovalRoute {
        let Some(c) = self.cluster() else {
            return ApprovalRoute::Here;
        };
        if record.state != "pending" || record.owner == c.m.id {
            return ApprovalRoute::Here;
        }
        match c.live_owner(&record.owner).await {
            Some(owner) => ApprovalRoute::Owner(owner),
            None => ApprovalRoute::Here,
        }
    }

    /// After an owner could not be reached: waits (at most one lease) until its lease has
    /// either been renewed or lapsed, and settles it if it lapsed.
    pub async fn await_owner(&self, replica: &str) -> OwnerFate {
        match self.cluster() {
            Some(c) => c.await_owner(replica).await,
            None => OwnerFate::Gone,
        }
    }

    /// A continuation none of whose tokens this process holds: what the store knows of it.
    /// Only a replica looks; a single gateway's registry is the whole truth. `Ok` is a
    /// stateless record for this replica to take in and claim.
    pub async fn find(
        &self,
        principal: &Principal,
        input: &TurnInput,
        c: &Continuation,
        forwarded: bool,
        max_result_bytes: usize,
    ) -> Result<StoredSuspension, ContinuationError> {
        match self.cluster() {
            Some(cluster) => {
                cluster
                    .find(principal, input, c, forwarded, max_result_bytes)
                    .await
            }
            None => Err(ContinuationError::NotFound),
        }
    }
}

impl Cluster {
    /// Takes the lease with the internal listener's address (`url`), starts following the
    /// others' approval writes, and settles lapsed replicas. Called once the internal
    /// listener is bound, before anything is served.
    pub async fn join(
        &self,
        url: String,
        tracker: &TaskTracker,
        stop: &CancellationToken,
    ) -> Result<(), StartError> {
        let m = &self.m;
        let started = Instant::now();
        let epoch = self
            .store
            .lease_acquire(&url, now_unix_ms() + m.lease_ms())
            .await
            .map_err(StartError::Lease)?;
        *m.state.lock() = LeaseState {
            epoch,
            url: url.clone(),
            valid_until: Some(started + m.lease),
        };
        tracing::info!(replica = %m.id, epoch, %url, "replica lease taken");
        super::follow::follow_approvals(&self.store, &self.approvals, &m.id, tracker, stop).await;
        self.survey().await;
        Ok(())
    }

    /// How often the lease is renewed: every third of it.
    pub fn renew_every(&self) -> Duration {
        self.m.lease / 3
    }

    /// Renews the lease. A renewal that finds the epoch settled means the others gave this
    /// replica up: `fenced` settles what it holds, and a new lease is taken. Then the others'
    /// leases are surveyed.
    pub async fn renew(&self, fenced: impl AsyncFnOnce()) {
        let (m, store) = (&self.m, &self.store);
        let metrics = &self.metrics.cluster;
        let started = Instant::now();
        let epoch = m.state.lock().epoch;
        match store.lease_renew(epoch, now_unix_ms() + m.lease_ms()).await {
            Ok(true) => {
                m.state.lock().valid_until = Some(started + m.lease);
                if !m.store_ok.swap(true, Ordering::Relaxed) {
                    tracing::info!("store reachable again; admitting fresh turns");
                }
                metrics.renewal("ok");
            }
            Ok(false) => {
                metrics.renewal("fenced");
                tracing::error!(replica = %m.id, epoch, "this replica's lease was settled by another replica; its held turns are lost");
                fenced().await;
                let url = m.state.lock().url.clone();
                match store
                    .lease_acquire(&url, now_unix_ms() + m.lease_ms())
                    .await
                {
                    Ok(epoch) => {
                        let mut s = m.state.lock();
                        s.epoch = epoch;
                        s.valid_until = Some(started + m.lease);
                    }
                    Err(e) => tracing::error!(error = %e, "could not take a new lease"),
                }
            }
            Err(e) => {
                metrics.renewal("error");
                if m.store_ok.swap(false, Ordering::Relaxed) {
                    tracing::error!(error = %e, "store unreachable; no fresh turns until it answers, held turns finish within the lease");
                }
                return;
            }
        }
        self.survey().await;
    }

    /// Gives the lease up (shutdown).
    pub async fn release(&self) {
        let epoch = self.m.state.lock().epoch;
        if let Err(e) = self.store.lease_release(epoch).await {
            tracing::warn!(error = %e, "could not release the replica's lease; it lapses by itself");
        }
    }

    /// Reads every lease: counts the live ones and settles the others' lapsed ones.
    async fn survey(&self) {
        let metrics = &self.metrics.cluster;
        let Ok(leases) = self.store.leases().await else {
            return;
        };
        let now = now_unix_ms();
        let live = leases.iter().filter(|l| l.live_at(now)).count();
        metrics.replicas_seen.store(live as u64, Ordering::Relaxed);
        for l in &leases {
            if l.replica_id != self.m.id && !l.settled && l.expires_at_ms <= now {
                self.settle_lapsed(l).await;
            }
        }
    }

    /// Settles a replica whose lease lapsed, unless another replica did first.
    async fn settle_lapsed(&self, l: &Lease) {
        match self
            .store
            .settle_replica(&l.replica_id, l.epoch, now_unix_ms())
            .await
        {
            Ok(Some(s)) => {
                self.metrics
                    .cluster
                    .replicas_settled
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    replica = %l.replica_id,
                    epoch = l.epoch,
                    tokens = s.tokens_lost,
                    executions = s.executions_lost,
                    approvals = s.approvals_orphaned.len(),
                    "settled a replica whose lease lapsed: its held turns are lost, its approvals orphaned"
                );
                // The others hear of it from the feed; this replica tells its own consoles.
                for id in &s.approvals_orphaned {
                    self.approvals.republish(id).await;
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(replica = %l.replica_id, error = %e, "could not settle a lapsed replica")
            }
        }
    }

    /// The owner replica of a held record, if its lease is live; a lapsed one is settled.
    async fn live_owner(&self, replica: &str) -> Option<Owner> {
        let lease = self.store.lease_of(replica).await.ok().flatten()?;
        self.live(lease).await
    }

    /// The replica of `lease`, if it is live; a lapsed one is settled.
    async fn live(&self, lease: Lease) -> Option<Owner> {
        if lease.live_at(now_unix_ms()) {
            return Some(Owner {
                replica_id: lease.replica_id,
                url: lease.url,
            });
        }
        if !lease.settled {
            self.settle_lapsed(&lease).await;
        }
        None
    }

    async fn await_owner(&self, replica: &str) -> OwnerFate {
        let Some(first) = self.store.lease_of(replica).await.ok().flatten() else {
            return OwnerFate::Gone;
        };
        if first.live_at(now_unix_ms()) {
            let left = first.expires_at_ms.saturating_sub(now_unix_ms());
            let wait = Duration::from_millis(left + 50).min(self.m.lease + Duration::from_secs(1));
            tokio::time::sleep(wait).await;
        }
        let now = now_unix_ms();
        match self.store.lease_of(replica).await.ok().flatten() {
            Some(l) if l.live_at(now) && l.expires_at_ms > first.expires_at_ms => {
                OwnerFate::Alive(Owner {
                    replica_id: l.replica_id,
                    url: l.url,
                })
            }
            Some(l) => {
                if !l.settled {
                    self.settle_lapsed(&l).await;
                }
                OwnerFate::Gone
            }
            None => OwnerFate::Gone,
        }
    }

    async fn find(
        &self,
        principal: &Principal,
        input: &TurnInput,
        c: &Continuation,
        forwarded: bool,
        max_result_bytes: usize,
    ) -> Result<StoredSuspension, ContinuationError> {
        let store = &self.store;
        let unavailable = |e: crate::store::StoreError| {
            tracing::error!(error = %e, "store unavailable for a continuation lookup");
            ContinuationError::StoreUnavailable
        };
        // Pending first, then tombstones: a settlement deletes the pending rows and writes the
        // tombstones in one transaction, so a record settled in between is found as the
        // latter, never as neither.
        let first = c.tokens.first().ok_or(ContinuationError::NotFound)?;
        let found = store.pending_of(first).await.map_err(unavailable)?;
        let Some(found) = found else {
            for t in &c.tokens {
                if let Some((owner, reason)) = store.tombstone_of(t).await.map_err(unavailable)? {
                    if !principal_eq(&owner, &principal.id) {
                        return Err(ContinuationError::NotFound);
                    }
                    return Err(ContinuationError::Settled(Reason::parse(&reason)));
                }
            }
            return Err(ContinuationError::NotFound);
        };
        match found {
            RemotePending::Durable(s) => {
                if !principal_eq(&s.principal, &principal.id) {
                    return Err(ContinuationError::NotFound);
                }
                Ok(s)
            }
            RemotePending::Held {
                owner,
                execution_id,
                principal: holder,
                model,
                surface,
                deadline_ms,
                digests,
                tokens,
                lease,
            } => {
                if !principal_eq(&holder, &principal.id) {
                    return Err(ContinuationError::NotFound);
                }
                if c.tokens.iter().any(|t| !tokens.contains(t)) {
                    return Err(ContinuationError::Mismatch(
                        "the tool calls do not form one pending batch".into(),
                    ));
                }
                if owner == self.m.id || forwarded {
                    // Held here by the store's account but not in this process: gone.
                    return Err(ContinuationError::Settled(Reason::Lost));
                }
                if deadline_ms <= now_unix_ms() {
                    // Its owner's timer settles it.
                    return Err(ContinuationError::Settled(Reason::Expired));
                }
                let left = Duration::from_millis(deadline_ms.saturating_sub(now_unix_ms()));
                let view = PendingView {
                    alive: true,
                    batch: 0,
                    execution_id: execution_id.into(),
                    model: model.into(),
                    surface,
                    deadline: Instant::now() + left,
                    digests,
                    tokens,
                    by_reference: c.bound.is_some(),
                    durable: false,
                    // The owner checks the per-execution cap at its claim.
                    spent: 0,
                    cap: None,
                };
                // By reference, the owner holds the conversation: it checks the rest.
                if c.bound.is_none() {
                    check(&view, input, c, max_result_bytes)?;
                }
                let owner = match lease {
                    Some(l) => self.live(l).await,
                    None => None,
                };
                match owner {
                    Some(o) => Err(ContinuationError::Elsewhere(o)),
                    None => Err(ContinuationError::Settled(Reason::Lost)),
                }
            }
        }
    }
}

/// The listener address a replica advertises: the configured one, else the bound one.
pub(super) fn advertised(c: Option<&ClusterConfig>, bound: SocketAddr) -> String {
    c.and_then(|c| c.advertise_url.clone())
        .unwrap_or_else(|| format!("http://{bound}"))
}

#[cfg(test)]
mod tests;
