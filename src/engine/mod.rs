//! The execution engine: executions and their legs, whatever the surface and the backend kind.
//!
//! An execution is one client-visible assistant turn. It starts on a fresh request
//! (`execute.rs`), runs a backend leg, and ends with the answer, an error, or a suspension:
//! the calls the backend wants from the client's tools are exposed behind fresh tokens,
//! registered before any token is written (`leg.rs`). A continuation is validated in a fixed
//! order and, after the atomic claim, handed back to its backend, which answers the held calls
//! (an agent) or sends the conversation with its ids restored (a stateless upstream); the next
//! leg of the same execution follows (`resume.rs`). Every ending goes through one function
//! (`Engine::end`); deadlines sleep until due (the timer, here).
//!
//! State has owners: [`suspensions`] (registry, journal, durable records), [`placement`]
//! (single gateway or replica), [`threads`] (idle threads and conversations), `budget` (the
//! usage ledger and the spend caps), admission limits and approvals. `impl Engine` lives in
//! four files: this one
//! (start, operations, the timer, shutdown), `execute.rs`, `leg.rs` and `resume.rs`; it
//! orchestrates the owners and never reaches into their state.
//!
//! The engine works on the neutral [`TurnInput`] and never imports axum or a wire type;
//! surfaces translate to and from it.

mod activity;
mod admission;
mod approval_policy;
mod budget;
mod compaction;
mod continuity;
mod ending;
mod error;
mod execute;
mod execution;
mod follow;
mod journal;
mod ledger;
mod leg;
mod placement;
mod resume;
mod suspensions;
#[cfg(test)]
mod tests;
mod threads;
mod timer;

pub use activity::{BackendView, SuspendedView, ThreadView};
pub use admission::Slot;
pub use approval_policy::ApprovalNotice;
pub use budget::{CapView, Standing};
pub use ending::EndReason;
pub use error::{ContinuationError, EngineError, StartError};
pub use execute::{CompactionAsk, Outcome};
pub use ledger::Spent;
pub use leg::{Leg, LegEvent};
pub use placement::{ApprovalRoute, Owner, OwnerFate};

use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::placement::Placement;
use self::suspensions::Suspensions;
use self::threads::Threads;
use crate::approvals::Approvals;
use crate::auth::Principal;
use crate::backend::{self, Backend, Holds};
use crate::config::{self, Config, ConfigError};
use crate::continuation::{Limits, Reason, Registry};
use crate::metrics::{Gauges, Metrics};
use crate::notify::Notifier;
use crate::store::{ApprovalRecord, Store, StoreError};

struct Inner {
    config: RwLock<Arc<Config>>,
    config_path: Option<PathBuf>,
    /// Every backend by name, whatever its kind, started once (a reload does not restart them).
    backends: BTreeMap<String, Arc<dyn Backend>>,
    /// Suspended executions, in memory and in the store.
    suspensions: Suspensions,
    /// A single gateway, or this replica's lease among others.
    placement: Placement,
    /// Idle backend threads kept for their conversation's next turn.
    threads: Threads,
    approvals: Arc<Approvals>,
    metrics: Arc<Metrics>,
    /// Usage accounting (metrics and daily totals in the store) and the budget caps.
    budgets: budget::Budgets,
    store: Arc<Store>,
    /// `[[webhooks]]` delivery (None: no endpoint).
    notifier: Option<Arc<Notifier>>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    /// Per-principal admission limits of fresh turns.
    limiter: admission::Limiter,
}

/// Cheap-clone handle to the engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// Starts every backend the config names, then the engine.
    pub async fn start(cfg: Config, config_path: Option<PathBuf>) -> Result<Engine, StartError> {
        backend::agent::scratch::sweep_scratch();
        let mut backends: BTreeMap<String, Arc<dyn Backend>> = BTreeMap::new();
        for (name, spec) in &cfg.backends {
            let backend =
                backend::build(name, spec)
                    .await
                    .map_err(|error| StartError::Backend {
                        name: name.clone(),
                        error,
                    })?;
            if let Some(version) = backend.version() {
                tracing::info!(backend = %name, kind = spec.kind(), version = %version, "backend ready");
            }
            backends.insert(name.clone(), backend);
        }
        Self::with_backends(cfg, config_path, backends).await
    }

    /// Opens the store (settling whatever a previous process left live), restores durable
    /// suspensions and starts the timer, over backends that are already running (the seam
    /// where tests inject a scripted backend).
    pub async fn with_backends(
        cfg: Config,
        config_path: Option<PathBuf>,
        backends: BTreeMap<String, Arc<dyn Backend>>,
    ) -> Result<Engine, StartError> {
        let membership = cfg
            .cluster
            .as_ref()
            .map(placement::Membership::new)
            .transpose()?;
        let store = Arc::new(open_store(&cfg).await?);
        let recovered = store.recover().await?;
        if recovered.executions_lost > 0 {
            tracing::warn!(
                executions = recovered.executions_lost,
                tokens = recovered.tokens_lost,
                "settled executions left live by a previous process as lost"
            );
        }
        let limits = Limits {
            max_pending: cfg.continuations.max_pending,
            max_pending_per_client: cfg.continuations.max_pending_per_client,
            max_kept_bytes_per_client: cfg.continuations.max_kept_bytes_per_client,
            tombstones_per_client: cfg.continuations.tombstones_per_client,
        };
        let tombstones = store.tombstones().await?;
        let registry = Registry::new(
            limits,
            tombstones
                .into_iter()
                .map(|t| (t.digest, t.principal, Reason::parse(&t.reason))),
        );
        let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
        crate::auth::oidc::keep_fresh(&cfg.jwt, &[], &tracker, &shutdown);
        let notifier = Notifier::start(&cfg.webhooks, store.clone(), &tracker, shutdown.clone())
            .await
            .map_err(StartError::Notify)?;
        let approvals = Arc::new(Approvals::new(store.clone()).await?);
        let deaths = backends.values().filter_map(|b| b.deaths()).collect();
        let metrics = Arc::new(Metrics::default());
        let placement = Placement::new(
            membership,
            store.clone(),
            approvals.clone(),
            metrics.clone(),
        );
        let single = placement.replica_id().is_none();
        let journal = journal::Journal::start(store.clone(), single);
        let suspensions = Suspensions::open(store.clone(), registry, journal).await?;
        let engine = Engine {
            inner: Arc::new(Inner {
                config: RwLock::new(Arc::new(cfg)),
                config_path,
                backends,
                suspensions,
                placement,
                threads: Threads::new(metrics.clone()),
                approvals,
                budgets: budget::Budgets::new(store.clone(), metrics.clone()),
                metrics,
                store,
                notifier,
                shutdown,
                tracker,
                limiter: admission::Limiter::default(),
            }),
        };
        let timer = engine.clone();
        engine
            .inner
            .tracker
            .spawn(async move { timer.run_timer(deaths).await });
        Ok(engine)
    }

    pub fn config(&self) -> Arc<Config> {
        self.inner.config.read().clone()
    }

    /// Re-reads the config file. Clients, keys, allowlists, limits and models take effect at
    /// once; backends keep running as started. A file that fails validation
    /// changes nothing.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let Some(path) = &self.inner.config_path else {
            return Ok(());
        };
        let new = config::load(path)?;
        for w in new.warnings() {
            tracing::warn!("{w}");
        }
        let old = self.config();
        crate::auth::oidc::keep_fresh(
            &new.jwt,
            &old.jwt,
            &self.inner.tracker,
            &self.inner.shutdown,
        );
        if new.backends != old.backends {
            tracing::warn!(
                "backend settings changed in the config file; they apply after a restart"
            );
        }
        *self.inner.config.write() = Arc::new(new);
        Ok(())
    }

    /// Model ids the principal may use, in config order.
    pub fn models_for(&self, principal: &Principal) -> Vec<String> {
        let cfg = self.config();
        let Some(client) = cfg.grant(&principal.id, &principal.groups) else {
            return Vec::new();
        };
        cfg.models
            .iter()
            .filter(|m| client.may_use(&m.id))
            .map(|m| m.id.to_string())
            .collect()
    }

    /// Store writable, the replica's lease (if it is one) renewed, and every agent backend
    /// has a live process.
    pub async fn ready(&self) -> bool {
        self.store_ready().await && self.lease_ready().unwrap_or(true) && self.backends_ready()
    }

    /// The store answers a write.
    pub async fn store_ready(&self) -> bool {
        self.inner.store.writable().await
    }

    /// `sqlite` or `postgres`.
    pub fn store_engine(&self) -> &'static str {
        self.inner.store.engine_name()
    }

    /// Every backend can take a turn (an agent's processes are up).
    pub fn backends_ready(&self) -> bool {
        self.inner.backends.values().all(|b| b.ready())
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Webhook delivery, when an endpoint is configured.
    pub fn notifier(&self) -> Option<&Notifier> {
        self.inner.notifier.as_deref()
    }

    /// Live values for the gauges of `/metrics`.
    pub fn gauges(&self) -> Gauges {
        let (suspended_executions, pending_continuations, tombstones) =
            self.inner.suspensions.counts();
        Gauges {
            suspended_executions,
            pending_continuations,
            tombstones,
            pending_approvals: self.inner.approvals.pending_count(),
            sessions: self
                .inner
                .backends
                .iter()
                .filter(|(_, b)| b.describe().holds == Holds::Turn)
                .map(|(n, b)| {
                    let s = b.stats();
                    (n.clone(), s.busy, s.capacity)
                })
                .collect(),
            idle_threads: self.inner.threads.len(),
            store_round_trips: self.inner.store.round_trips(),
        }
    }

    /// Where `principal` stands against its fullest cap that gates fresh turns, for the
    /// surfaces that report it on every answer (see [`budget::Budgets::standing`]).
    pub async fn standing(&self, principal: &str) -> Option<Standing> {
        let budget = self.config().budget_of(principal);
        self.inner.budgets.standing(principal, &budget).await
    }

    /// The caps of `principal` and what is left of each; empty when it has none.
    pub async fn budget_view(&self, principal: &str) -> Result<Vec<CapView>, StoreError> {
        let budget = self.config().budget_of(principal);
        self.inner.budgets.view(principal, &budget).await
    }

    /// Daily usage totals: the caller's own, or, for an approver, everyone's (optionally one
    /// principal's). Reported usage not yet written is written first.
    pub async fn usage(
        &self,
        principal: &Principal,
        mut q: crate::store::UsageQuery,
    ) -> Result<Vec<crate::store::UsageRow>, crate::store::StoreError> {
        if !principal.approver {
            q.principal = Some(principal.id.to_string());
        }
        self.inner
            .budgets
            .flush(&|p| self.config().budget_of(p))
            .await?;
        self.inner.store.usage(&q).await
    }

    /// Writes the usage deltas to the store (the timer does this about once a second).
    async fn flush_usage(&self) {
        if let Err(e) = self
            .inner
            .budgets
            .flush(&|p| self.config().budget_of(p))
            .await
        {
            tracing::error!(error = %e, "could not write usage totals; kept for the next try");
        }
    }

    /// A principal's bytes kept beside its suspensions (a Responses socket's last
    /// response), none yet: counted in its `max_kept_bytes_per_client` until dropped.
    pub fn kept(&self, principal: &str) -> Kept {
        Kept {
            gw: self.clone(),
            principal: principal.to_string(),
            bytes: 0,
        }
    }

    /// Cancelled when shutdown begins (long-lived streams end on it).
    pub fn stopping(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    pub fn approvals(&self) -> &Approvals {
        &self.inner.approvals
    }

    /// The durable store (the Managed Agents API keeps its objects and event logs there).
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Settles the principal's held batch that `tokens` name as cancelled, its turn
    /// interrupted (a client withdrawing the calls it was asked: a Managed Agents interrupt
    /// or deletion). False when they name no pending batch of the principal's.
    pub async fn withdraw(&self, principal: &str, tokens: &[String]) -> bool {
        let digests: Vec<[u8; 32]> = tokens
            .iter()
            .filter_map(|t| crate::continuation::token::token_digest(t))
            .collect();
        let found = self.inner.suspensions.lookup(principal, &digests);
        let crate::continuation::Lookup::Pending(view) = found else {
            return false;
        };
        match self.inner.suspensions.settle(view.batch, Reason::Cancelled) {
            Some(s) => {
                self.settled(s).await;
                true
            }
            None => false,
        }
    }

    /// Releases the backend thread kept idle after the principal's `execution` completed (its
    /// owner is gone: a deleted or archived Managed Agents session).
    pub fn release_thread(&self, principal: &str, execution: &str) {
        self.inner.threads.release_execution(principal, execution);
    }

    /// Runs `task` as one of the engine's, drained at shutdown.
    pub fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.inner.tracker.spawn(task);
    }

    pub(super) fn backend(&self, name: &str) -> Option<Arc<dyn Backend>> {
        self.inner.backends.get(name).cloned()
    }

    /// Every held turn settled `lost` (shutdown; a replica the others gave up).
    async fn settle_held(&self) {
        for s in self.inner.suspensions.settle_held(Reason::Lost) {
            self.settled(s).await;
        }
    }

    /// The principal's suspended executions (everyone's for an approver), earliest deadline
    /// first.
    pub fn suspended_for(&self, who: &Principal) -> Vec<SuspendedView> {
        self.inner.suspensions.views(who)
    }

    /// The principal's idle threads (everyone's for an approver), most recently kept first.
    pub fn threads_for(&self, who: &Principal) -> Vec<ThreadView> {
        self.inner.threads.views(who)
    }

    /// The backends behind the principal's models (every backend for an approver).
    pub fn backends_for(&self, who: &Principal) -> Vec<BackendView> {
        activity::backend_views(&self.config(), &self.inner.backends, who)
    }

    /// This replica's id, when it is one of several.
    pub fn replica_id(&self) -> Option<&str> {
        self.inner.placement.replica_id()
    }

    /// The shared key another replica presents on the internal listener, compared in
    /// constant time.
    pub fn cluster_key_matches(&self, presented: &[u8]) -> bool {
        self.inner.placement.key_matches(presented)
    }

    /// The shared key, for requests this replica forwards.
    pub fn cluster_key(&self) -> Option<&str> {
        self.inner.placement.key()
    }

    /// The lease part of readiness: None for a single gateway.
    pub fn lease_ready(&self) -> Option<bool> {
        self.inner.placement.lease_ready()
    }

    /// The replica `replica`, if its lease is live (a lapsed one's held turns are settled
    /// first); None on a single gateway.
    pub async fn live_replica(&self, replica: &str) -> Option<Owner> {
        self.inner.placement.live_replica(replica).await
    }

    /// Where a decision on this approval is taken.
    pub async fn approval_route(&self, record: &ApprovalRecord) -> ApprovalRoute {
        self.inner.placement.approval_route(record).await
    }

    /// After an owner could not be reached: waits (at most one lease) until its lease has
    /// either been renewed or lapsed.
    pub async fn await_owner(&self, replica: &str) -> OwnerFate {
        self.inner.placement.await_owner(replica).await
    }

    /// Takes the lease with the internal listener's address and starts renewing it every
    /// third of it until shutdown, then gives it up. Called once the internal listener is
    /// bound, before anything is served.
    pub async fn join_cluster(&self, bound: SocketAddr) -> Result<(), StartError> {
        let Placement::Replica(cluster) = &self.inner.placement else {
            return Ok(());
        };
        let url = placement::advertised(self.config().cluster.as_ref(), bound);
        let (tracker, stop) = (&self.inner.tracker, &self.inner.shutdown);
        cluster.join(url, tracker, stop).await?;
        let engine = self.clone();
        tracker.spawn(async move {
            let Placement::Replica(cluster) = &engine.inner.placement else {
                return;
            };
            loop {
                tokio::select! {
                    _ = engine.inner.shutdown.cancelled() => break,
                    _ = tokio::time::sleep(cluster.renew_every()) => {
                        cluster.renew(async || engine.settle_held().await).await;
                    }
                }
            }
            cluster.release().await;
        });
        Ok(())
    }

    async fn run_timer(&self, mut deaths: Vec<watch::Receiver<u64>>) {
        let mut forget = tokio::time::interval(timer::FORGET_IDLE_EVERY);
        forget.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut flush = tokio::time::interval(timer::FLUSH_USAGE_EVERY);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (suspensions, threads) = (&self.inner.suspensions, &self.inner.threads);
        let approvals = &self.inner.approvals;
        loop {
            let next = timer::earliest(suspensions.next_deadline(), approvals.next_deadline());
            let next = timer::earliest(next, threads.next_expiry());
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.inner.shutdown.cancelled() => return,
                _ = sleep => self.expire_due(Instant::now()).await,
                _ = suspensions.changed().notified() => {}
                _ = approvals.changed().notified() => {}
                _ = threads.changed().notified() => {}
                _ = timer::any_death(&mut deaths) => {
                    for s in suspensions.take_dead() {
                        tracing::warn!(execution = %s.execution_id, "backend of a suspended execution died");
                        self.settled(s).await;
                    }
                }
                _ = forget.tick() => self.inner.limiter.forget_idle(),
                _ = flush.tick() => self.flush_usage().await,
            }
        }
    }

    /// Settles every suspension and approval whose deadline is at or before `now`, and
    /// releases the idle threads past their TTL.
    async fn expire_due(&self, now: Instant) {
        for s in self.inner.suspensions.take_expired(now) {
            tracing::info!(execution = %s.execution_id, "suspended execution expired; turn interrupted");
            self.settled(s).await;
        }
        self.inner.approvals.expire_due(now).await;
        self.inner.threads.release_idle(now);
    }

    /// Stops new work: running legs end with an error and every held turn is settled `lost`
    /// (interrupted). Durable records stay in the store for the next start. Idempotent.
    pub async fn begin_shutdown(&self) {
        self.inner.shutdown.cancel();
        self.settle_held().await;
        self.inner.approvals.cancel_all().await;
        self.inner.threads.clear();
    }

    /// Stops legs, settles every held turn as `lost` (so replays after a restart answer 410),
    /// waits for owned tasks and reaps every backend child.
    pub async fn shutdown(&self) {
        self.begin_shutdown().await;
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        self.flush_usage().await;
        self.inner.suspensions.close().await;
        for b in self.inner.backends.values() {
            b.shutdown().await;
        }
    }
}

/// Opens the store the config names, as this replica's (reading the database password from
/// the environment variable the config names).
async fn open_store(cfg: &Config) -> Result<Store, StartError> {
    use crate::store::StoreLocation;
    let owner = cfg.cluster.as_ref().map_or("", |c| c.replica_id.as_str());
    let store = match &cfg.store {
        config::StoreConfig::Sqlite { path } => {
            Store::connect(&StoreLocation::Sqlite(path), owner).await
        }
        config::StoreConfig::Postgres {
            url,
            password_env,
            pool_size,
        } => {
            let password = match password_env {
                Some(var) => Some(std::env::var(var).map_err(|_| StartError::Environment {
                    key: "store.password_env",
                    var: var.clone(),
                    problem: "is not set",
                })?),
                None => None,
            };
            Store::connect(
                &StoreLocation::Postgres {
                    url,
                    password: password.as_deref(),
                    pool_size: *pool_size,
                },
                owner,
            )
            .await
        }
    };
    Ok(store?)
}

/// Bytes a principal keeps outside the suspensions, under the bound they share
/// ([`Engine::kept`]); released when dropped.
pub struct Kept {
    gw: Engine,
    principal: String,
    bytes: usize,
}

impl Kept {
    /// Keeps `bytes` instead; false, keeping what it kept, when that is over the bound.
    pub fn resize(&mut self, bytes: usize) -> bool {
        let ok = (self.gw.inner.suspensions).rekeep(&self.principal, self.bytes, bytes);
        if ok {
            self.bytes = bytes;
        }
        ok
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.resize(0);
    }
}
