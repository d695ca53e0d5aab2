//! The execution engine: executions and their legs, whatever the surface and the backend kind.
//!
//! An execution is one client-visible assistant turn. It starts on a fresh request, runs a
//! backend leg, and ends with the answer, an error, or a suspension: the calls the backend
//! wants from the client's tools are exposed behind fresh tokens, registered before any token
//! is written (`suspension.rs`). A continuation is validated in a fixed order and, after the
//! atomic claim, handed back to its backend, which answers the held calls (an agent) or sends
//! the conversation with its ids restored (a stateless upstream); the next leg of the same
//! execution follows (`resume.rs`). Every ending goes through one function (`ending.rs`);
//! deadlines sleep until due (`timer.rs`).
//!
//! The engine works on the neutral [`TurnInput`] and never imports axum or a wire type;
//! surfaces translate to and from it.

mod activity;
mod admission;
mod approval_policy;
mod cluster;
mod compaction;
mod continuity;
mod conversation;
mod ending;
mod error;
mod execution;
mod follow;
mod journal;
mod ledger;
mod leg;
mod resume;
mod suspension;
#[cfg(test)]
mod tests;
mod timer;

pub use activity::{BackendView, SuspendedView, ThreadView};
pub use admission::Slot;
pub use cluster::{ApprovalRoute, Owner, OwnerFate};
pub use ending::EndReason;
pub use error::{ContinuationError, EngineError, StartError};
pub use leg::{Leg, LegEvent};

use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::execution::{Execution, ExecutionMeta, LegContext, Suspended};
use crate::approvals::Approvals;
use crate::auth::{self, Principal};
use crate::backend::{self, Backend, Holds, LegRequest};
use crate::config::{self, Config, ConfigError};
use crate::continuation::{Limits, Reason, Registry};
use crate::error::ApiError;
use crate::ids::new_id;
use crate::metrics::{Gauges, Metrics};
use crate::store::{now_unix, Store};
use crate::turn::TurnInput;

struct Inner {
    config: RwLock<Arc<Config>>,
    config_path: Option<PathBuf>,
    /// Every backend by name, whatever its kind, started once (a reload does not restart them).
    backends: BTreeMap<String, Arc<dyn Backend>>,
    registry: Registry<Suspended>,
    approvals: Approvals,
    metrics: Arc<Metrics>,
    /// Usage accounting (metrics and daily totals in the store).
    ledger: Arc<ledger::Ledger>,
    /// Idle backend threads kept for their conversation's next turn.
    continuity: continuity::Continuity,
    store: Arc<Store>,
    /// Agent executions' starts and ends, written behind the request path.
    journal: journal::Journal,
    /// `[cluster]`: this replica's lease and key; None for a single gateway.
    cluster: Option<cluster::Membership>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    /// Per-principal admission limits of fresh turns.
    limiter: admission::Limiter,
    /// Verified JWTs by digest (each entry bound to the config generation that verified it).
    jwt_cache: auth::jwt::Cache,
}

/// Cheap-clone handle to the engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// Starts every backend the config names, then the engine.
    pub async fn start(cfg: Config, config_path: Option<PathBuf>) -> Result<Engine, StartError> {
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
        Self::with_backends(cfg, config_path, backends)
    }

    /// Opens the store (settling whatever a previous process left live), restores durable
    /// suspensions and starts the timer, over backends that are already running (the seam
    /// where tests inject a scripted backend).
    pub fn with_backends(
        cfg: Config,
        config_path: Option<PathBuf>,
        backends: BTreeMap<String, Arc<dyn Backend>>,
    ) -> Result<Engine, StartError> {
        let membership = cfg
            .cluster
            .as_ref()
            .map(cluster::Membership::new)
            .transpose()?;
        let store = Arc::new(open_store(&cfg)?);
        let recovered = store.recover()?;
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
        let tombstones = store.tombstones()?;
        let registry = Registry::new(
            limits,
            tombstones
                .into_iter()
                .map(|t| (t.digest, t.principal, Reason::parse(&t.reason))),
        );
        let approvals = Approvals::new(store.clone())?;
        let deaths = backends.values().filter_map(|b| b.deaths()).collect();
        let metrics = Arc::new(Metrics::default());
        let engine = Engine {
            inner: Arc::new(Inner {
                config: RwLock::new(Arc::new(cfg)),
                config_path,
                backends,
                registry,
                approvals,
                ledger: ledger::Ledger::new(metrics.clone()),
                metrics,
                continuity: continuity::Continuity::default(),
                journal: journal::Journal::start(store.clone(), membership.is_none())?,
                store,
                cluster: membership,
                shutdown: CancellationToken::new(),
                tracker: TaskTracker::new(),
                limiter: admission::Limiter::default(),
                jwt_cache: auth::jwt::Cache::default(),
            }),
        };
        engine.restore_durable()?;
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
        let old = self.config();
        if new.backends != old.backends {
            tracing::warn!(
                "backend settings changed in the config file; they apply after a restart"
            );
        }
        *self.inner.config.write() = Arc::new(new);
        Ok(())
    }

    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, ApiError> {
        auth::authenticate_cached(
            &self.config(),
            Some(&self.inner.jwt_cache),
            authorization,
            auth::jwt_now(),
        )
    }

    /// Model ids the principal may use, in config order.
    pub fn models_for(&self, principal: &Principal) -> Vec<String> {
        let cfg = self.config();
        let Some(client) = cfg.grant(&principal.id) else {
            return Vec::new();
        };
        cfg.models
            .iter()
            .filter(|m| client.may_use(&m.id))
            .map(|m| m.id.clone())
            .collect()
    }

    /// Store writable, the replica's lease (if it is one) renewed, and every agent backend
    /// has a live process.
    pub fn ready(&self) -> bool {
        self.store_ready() && self.lease_ready().unwrap_or(true) && self.backends_ready()
    }

    /// The store answers a write.
    pub fn store_ready(&self) -> bool {
        self.inner.store.writable()
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

    /// Live values for the gauges of `/metrics`.
    pub fn gauges(&self) -> Gauges {
        Gauges {
            suspended_executions: self.inner.registry.batch_count(),
            pending_continuations: self.inner.registry.pending_count(),
            tombstones: self.inner.registry.tombstone_count(),
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
            idle_threads: self.inner.continuity.len(),
        }
    }

    /// Daily usage totals: the caller's own, or, for an approver, everyone's (optionally one
    /// principal's). Reported usage not yet written is written first.
    pub fn usage(
        &self,
        principal: &Principal,
        mut q: crate::store::UsageQuery,
    ) -> Result<Vec<crate::store::UsageRow>, crate::store::StoreError> {
        if !principal.approver {
            q.principal = Some(principal.id.clone());
        }
        self.inner.ledger.flush(&self.inner.store)?;
        self.inner.store.usage(&q)
    }

    /// Writes the usage deltas to the store (the timer does this about once a second).
    fn flush_usage(&self) {
        if let Err(e) = self.inner.ledger.flush(&self.inner.store) {
            tracing::error!(error = %e, "could not write usage totals; kept for the next try");
        }
    }

    /// Cancelled when shutdown begins (long-lived streams end on it).
    pub fn stopping(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    pub fn approvals(&self) -> &Approvals {
        &self.inner.approvals
    }

    fn backend(&self, name: &str) -> Option<Arc<dyn Backend>> {
        self.inner.backends.get(name).cloned()
    }

    /// Runs one request: a fresh turn or the continuation of a suspended one.
    pub async fn execute(
        &self,
        principal: &Principal,
        input: TurnInput,
    ) -> Result<Leg, EngineError> {
        self.execute_hop(principal, input, false).await
    }

    /// [`Engine::execute`]; `forwarded` when another replica sent the request here as the
    /// turn's owner (it is never forwarded again).
    pub async fn execute_hop(
        &self,
        principal: &Principal,
        mut input: TurnInput,
        forwarded: bool,
    ) -> Result<Leg, EngineError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(EngineError::ShuttingDown);
        }
        let Some(c) = input.continuation.take() else {
            // Only fresh turns are limited: a continuation refused here would strand the
            // held turn it answers.
            let slot = self.admit(principal)?;
            return self.fresh(principal, input, slot).await;
        };
        let claimed = self.claim(principal, &input, &c, forwarded);
        match claimed {
            Err(ContinuationError::Elsewhere(owner)) => Err(EngineError::Forward(owner)),
            Err(e) => {
                let e = EngineError::from(e);
                self.inner
                    .metrics
                    .rejection(ApiError::from(e.clone()).code.as_str());
                Err(e)
            }
            Ok(claimed) => self.answer(claimed, input, c).await,
        }
    }

    /// Admission of a fresh turn under the principal's limits in the current config (so a
    /// reload applies at once): 429 `rate_limited` with `Retry-After` before anything runs.
    fn admit(&self, principal: &Principal) -> Result<admission::Slot, EngineError> {
        let cfg = self.config();
        let none = config::ClientLimits::default();
        let grant = cfg.grant(&principal.id);
        let limits = grant.as_ref().map_or(&none, |g| g.limits);
        let (all, durable) =
            if limits.max_suspended.is_some() || limits.concurrent_executions.is_some() {
                self.inner.registry.suspended_of(&principal.id)
            } else {
                (0, 0)
            };
        let counts = admission::SuspendedCounts { all, durable };
        self.inner
            .limiter
            .admit(&principal.id, limits, counts)
            .map_err(|r| {
                let secs = admission::retry_after_secs(r.retry_after);
                tracing::debug!(principal = %principal.id, limit = r.limit, retry_after = secs, "fresh turn refused by a client limit");
                EngineError::RateLimited {
                    limit: r.limit,
                    retry_after_secs: secs,
                }
            })
    }

    /// A place for one more long-lived response of the principal (an event stream, a
    /// streamed leg), under its `max_streams` in the current config; the response body holds
    /// it. Over the bound: 429 `capacity_exhausted`.
    pub fn open_stream(&self, principal: &Principal) -> Result<admission::Slot, EngineError> {
        let cfg = self.config();
        let max = cfg
            .grant(&principal.id)
            .and_then(|g| g.limits.max_streams)
            .unwrap_or(cfg.server.max_streams_per_client);
        self.inner.limiter.stream(&principal.id, max).ok_or_else(|| {
            tracing::debug!(principal = %principal.id, max, "stream refused: the client holds its maximum");
            EngineError::StreamCapacity(max)
        })
    }

    async fn fresh(
        &self,
        principal: &Principal,
        mut input: TurnInput,
        slot: admission::Slot,
    ) -> Result<Leg, EngineError> {
        let input = &mut input;
        if !self.admits_fresh() {
            return Err(EngineError::Store);
        }
        let cfg = self.config();
        let model = cfg
            .model(&input.model)
            .filter(|m| cfg.may_use(&principal.id, &m.id))
            .ok_or_else(|| EngineError::ModelNotFound(input.model.clone()))?;
        let backend = self
            .backend(&model.backend)
            .ok_or(EngineError::TurnFailed)?;
        backend.validate(&*input)?;
        let holds = backend.describe().holds;
        let kept = self.kept_thread(&principal.id, &model.id, holds, input)?;
        let meta = ExecutionMeta {
            id: new_id("exe-"),
            principal: principal.id.clone(),
            model: model.id.clone(),
            surface: input.surface,
            created: now_unix(),
        };
        // An agent's execution is journaled before it starts (a crash leaves it `lost`); a
        // stateless leg only if it suspends: one that just answers leaves nothing to recover,
        // and two store transactions per relayed request would cap the plain path.
        let journaled = holds == Holds::Turn;
        if journaled {
            if let Err(e) = self
                .inner
                .journal
                .started(&meta.id, &meta.principal, &meta.model)
            {
                tracing::error!(error = %e, "store unavailable");
                return Err(EngineError::Store);
            }
        }
        self.inner.metrics.overhead.observe(input.arrived.elapsed());
        let leg = LegRequest {
            execution_id: &meta.id,
            model,
            input: &*input,
            meter: self.inner.ledger.meter(&meta.principal, &meta.model),
            kept,
        };
        let turn = match backend.start(leg).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(execution = %meta.id, error = %e, "backend leg did not start");
                let reason = match holds {
                    Holds::Turn => EndReason::FailedToStart,
                    Holds::Nothing => EndReason::Failed,
                };
                self.end(&meta, journaled, reason, ());
                return Err(e.into());
            }
        };
        let exec = Execution {
            meta,
            holds,
            deadline: Instant::now() + cfg.continuations.execution_ttl,
            rounds: 0,
            journaled,
            turn,
            backlog: Default::default(),
            slot: Some(slot),
        };
        let ctx = LegContext::of(input, holds);
        Ok(self.drive(exec, ctx))
    }

    /// Stops new work: running legs end with an error and every held turn is settled `lost`
    /// (interrupted). Durable records stay in the store for the next start. Idempotent.
    pub fn begin_shutdown(&self) {
        self.inner.shutdown.cancel();
        for id in self.inner.registry.held_batches() {
            if let Some(s) = self.inner.registry.settle(id, Reason::Lost) {
                self.settled(s);
            }
        }
        self.inner.approvals.cancel_all();
        drop(self.inner.continuity.clear());
    }

    /// Stops legs, settles every held turn as `lost` (so replays after a restart answer 410),
    /// waits for owned tasks and reaps every backend child.
    pub async fn shutdown(&self) {
        self.begin_shutdown();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        self.flush_usage();
        let engine = self.clone();
        let _ = tokio::task::spawn_blocking(move || engine.inner.journal.close()).await;
        for b in self.inner.backends.values() {
            b.shutdown().await;
        }
    }
}

/// Opens the store the config names, as this replica's (reading the database password from
/// the environment variable the config names).
fn open_store(cfg: &Config) -> Result<Store, StartError> {
    use crate::store::StoreLocation;
    let owner = cfg.cluster.as_ref().map_or("", |c| c.replica_id.as_str());
    let store = match &cfg.store {
        config::StoreConfig::Sqlite { path } => Store::connect(&StoreLocation::Sqlite(path), owner),
        config::StoreConfig::Postgres { url, password_env } => {
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
                },
                owner,
            )
        }
    };
    Ok(store?)
}
