//! The gateway's domain core: executions and their legs.
//!
//! An execution is one client-visible assistant turn. It starts on a fresh request, runs a
//! backend turn, and is driven leg by leg: a leg streams the turn's events to one HTTP
//! response and ends with the answer (`stop`), an error, or a suspension (`tool_calls`). At a
//! suspension the execution, which owns the backend's held turn, is parked in the
//! continuation registry under the digests of its tokens, registered before any token is
//! written to the client. A continuation request is validated in the spec's order and, after
//! the atomic claim, answers the held calls and drives the next leg of the same turn.
//!
//! Stateless HTTP upstreams (`relay.rs`) share the validation and the claim; their pending
//! records carry the upstream's call ids instead of a held turn, and live in the store.
//!
//! This module never imports axum; `http/` maps its results onto responses.

mod limits;
mod relay;

pub use relay::RelayBody;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::approvals::Approvals;
use crate::auth::{self, Principal};
use crate::backend::app_server::AppServer;
use crate::backend::upstream::Upstream;
use crate::backend::{
    render, ApprovalAsk, ApprovalKind, Backend, HeldCall, Turn, TurnEvent, TurnRequest,
};
use crate::config::{self, Config, ConfigError, Decision};
use crate::continuation::canonical::{
    echo_digest, echo_digest_of, message_digest, prefix_digest, prefix_digest_of,
    tool_choice_digest, tools_digest,
};
use crate::continuation::detect::{detect, Continuation, Detected};
use crate::continuation::{
    token, Digests, Limits, Lookup, NewBatch, Parked, Reason, RegisterError, Registry,
};
use crate::error::{ApiError, ErrorCode};
use crate::metrics::{Gauges, Metrics};
use crate::openai::{tool_def, ChatRequest, ExposedCall, ResponseMeta, ToolDef, Usage};
use crate::store::{now_unix, Store};

/// What a leg sends to its HTTP response, in order: deltas, then exactly one `End` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum LegEvent {
    Delta(String),
    /// Something a human watching the stream should know (an approval is pending); streams
    /// carry it as an SSE comment.
    Notice(String),
    /// The leg is over: `calls` empty means the turn finished (`stop`), else it is suspended.
    End {
        calls: Vec<ExposedCall>,
        usage: Usage,
    },
    Error(ApiError),
}

/// A leg that has started: its response identity and its event stream.
pub struct Leg {
    pub meta: ResponseMeta,
    pub execution_id: String,
    pub events: mpsc::Receiver<LegEvent>,
}

/// A running or suspended execution. Owns the backend turn: dropping it interrupts the turn
/// (if still running) and frees the backend session.
pub struct Execution {
    id: String,
    principal: String,
    model: String,
    created: u64,
    deadline: Instant,
    rounds: u32,
    turn: Turn,
    /// Calls the backend issued that were not exposed yet (late arrivals, one-per-leg mode).
    backlog: VecDeque<HeldCall>,
    /// Token digest -> invocation, for the calls exposed at the current suspension.
    /// A short list: a batch holds a handful of calls.
    awaiting: Vec<([u8; 32], u64)>,
    /// Its place in the principal's live executions, freed when the execution is dropped.
    _slot: limits::Slot,
}

/// The identity of an execution, for work that awaits (an `Execution` is not `Sync`).
struct Who {
    id: String,
    principal: String,
    model: String,
}

/// What a pending record keeps alive: a held backend turn, or (stateless upstream) just
/// what is needed to forward the continuation.
pub enum Suspended {
    Held(Execution),
    Upstream(relay::UpstreamSuspension),
}

impl Parked for Suspended {
    fn is_alive(&self) -> bool {
        match self {
            Suspended::Held(e) => e.turn.control.is_alive(),
            Suspended::Upstream(_) => true,
        }
    }

    fn upstream(&self) -> Option<(&[String], u32, u64)> {
        match self {
            Suspended::Held(_) => None,
            Suspended::Upstream(u) => Some((&u.upstream_ids, u.rounds, u.created)),
        }
    }
}

/// What a chat request gets back.
pub enum Reply {
    /// A leg of a held (stateful) turn, framed by the HTTP layer.
    Leg(Leg),
    /// A stateless upstream's answer, already rewritten.
    Relay {
        execution_id: String,
        body: relay::RelayBody,
    },
}

/// Digests and options of the request that drives a leg, kept for its suspension point.
struct LegContext {
    tools: [u8; 32],
    tool_choice: [u8; 32],
    prefix: [u8; 32],
    parallel: bool,
}

impl LegContext {
    fn of(req: &ChatRequest) -> LegContext {
        Self::with_prefix(req, prefix_digest(&req.messages))
    }

    /// When the caller already has the digest of all of `req.messages`.
    fn with_prefix(req: &ChatRequest, prefix: [u8; 32]) -> LegContext {
        LegContext {
            tools: tools_digest(req.tools.as_deref()),
            tool_choice: tool_choice_digest(req.tool_choice.as_ref()),
            prefix,
            parallel: req.parallel_tool_calls.unwrap_or(true),
        }
    }
}

struct Inner {
    config: RwLock<Arc<Config>>,
    config_path: Option<PathBuf>,
    backends: BTreeMap<String, Arc<dyn Backend>>,
    registry: Registry<Suspended>,
    upstreams: BTreeMap<String, Arc<Upstream>>,
    approvals: Approvals,
    metrics: Metrics,
    store: Arc<Store>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    /// Per-principal admission limits of fresh turns.
    limiter: limits::Limiter,
    /// Verified JWTs by digest (each entry bound to the config generation that verified it).
    jwt_cache: auth::jwt::Cache,
}

/// Cheap-clone handle to the gateway state.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

/// How often parked executions are checked for expiry and dead backends.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

impl Gateway {
    /// Opens the store (settling whatever a previous process left live), starts every
    /// backend's processes and the sweeper.
    pub async fn start(cfg: Config, config_path: Option<PathBuf>) -> Result<Gateway, String> {
        let store = Arc::new(Store::open(&cfg.store_path).map_err(|e| e.to_string())?);
        let recovered = store.recover().map_err(|e| e.to_string())?;
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
            tombstones_per_client: cfg.continuations.tombstones_per_client,
        };
        let registry = Registry::new(store.clone(), limits).map_err(|e| e.to_string())?;
        let approvals = Approvals::new(store.clone()).map_err(|e| e.to_string())?;
        let mut backends: BTreeMap<String, Arc<dyn Backend>> = BTreeMap::new();
        for (name, b) in &cfg.backends {
            let server = AppServer::start(name, b.clone())
                .await
                .map_err(|e| format!("backend `{name}` failed to start: {e}"))?;
            tracing::info!(backend = %name, user_agent = ?server.user_agent(), "backend ready");
            backends.insert(name.clone(), server);
        }
        let mut upstreams = BTreeMap::new();
        for (name, u) in &cfg.upstreams {
            upstreams.insert(name.clone(), Arc::new(Upstream::new(name, u)?));
        }
        relay::restore_pending(&registry, &store).map_err(|e| e.to_string())?;
        let gw = Gateway {
            inner: Arc::new(Inner {
                upstreams,
                config: RwLock::new(Arc::new(cfg)),
                config_path,
                backends,
                registry,
                approvals,
                metrics: Metrics::default(),
                store,
                shutdown: CancellationToken::new(),
                tracker: TaskTracker::new(),
                limiter: limits::Limiter::default(),
                jwt_cache: auth::jwt::Cache::default(),
            }),
        };
        let sweeper = gw.clone();
        gw.inner.tracker.spawn(async move { sweeper.sweep().await });
        Ok(gw)
    }

    pub fn config(&self) -> Arc<Config> {
        self.inner
            .config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Re-reads the config file. Clients, keys, allowlists and models take effect at once;
    /// backends keep running as started. A file that fails validation changes nothing.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let Some(path) = &self.inner.config_path else {
            return Ok(());
        };
        let new = config::load(path)?;
        if new.backends != self.config().backends {
            tracing::warn!(
                "backend settings changed in the config file; they apply after a restart"
            );
        }
        *self.inner.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(new);
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

    /// Admission of a fresh turn under the principal's limits in the current config (so a
    /// reload applies at once): 429 `rate_limited` with `Retry-After` before anything runs.
    fn admit(&self, principal: &Principal) -> Result<limits::Slot, ApiError> {
        let cfg = self.config();
        let none = config::ClientLimits::default();
        let grant = cfg.grant(&principal.id);
        let client_limits = grant.as_ref().map_or(&none, |g| g.limits);
        let (all, upstream) = if client_limits.max_suspended.is_some()
            || client_limits.concurrent_executions.is_some()
        {
            self.inner.registry.suspended_of(&principal.id)
        } else {
            (0, 0)
        };
        let suspended = limits::Suspended { all, upstream };
        self.inner
            .limiter
            .admit(&principal.id, client_limits, suspended)
            .map_err(|r| {
                let secs = limits::retry_after_secs(r.retry_after);
                tracing::debug!(principal = %principal.id, limit = r.limit, retry_after = secs, "fresh turn refused by a client limit");
                ApiError::rate_limited(r.limit, secs)
            })
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

    pub fn pending_continuations(&self) -> usize {
        self.inner.registry.pending_count()
    }

    pub fn tombstones(&self) -> usize {
        self.inner.registry.tombstone_count()
    }

    /// Store writable and every backend has a live process or room to start one.
    pub fn ready(&self) -> bool {
        self.inner.store.writable()
            && self
                .inner
                .backends
                .values()
                .all(|b| b.stats().processes_alive > 0)
    }

    pub fn backend_stats(&self) -> Vec<(String, crate::backend::SessionStats)> {
        self.inner
            .backends
            .iter()
            .map(|(n, b)| (n.clone(), b.stats()))
            .collect()
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
                .map(|(n, b)| {
                    let s = b.stats();
                    (n.clone(), s.busy, s.capacity)
                })
                .collect(),
        }
    }

    /// Handles one chat request: a fresh turn or the continuation of a suspended one.
    /// `started` is when the request arrived; the time until the backend is engaged is
    /// recorded as gateway overhead.
    pub async fn chat(
        &self,
        principal: &Principal,
        req: ChatRequest,
        raw: Bytes,
        started: std::time::Instant,
    ) -> Result<Reply, ApiError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(ApiError::new(
                ErrorCode::CapacityExhausted,
                "The gateway is shutting down.",
            ));
        }
        match detect(&req.messages)? {
            Detected::Fresh => {
                // Only fresh turns are limited: a continuation refused here would strand
                // the held turn it answers.
                let slot = self.admit(principal)?;
                self.fresh(principal, req, raw, started, slot).await
            }
            Detected::Continuation(c) => {
                // Each message is digested once: the prefix check uses those before the
                // assistant message, the next suspension's prefix all of them.
                let digests: Vec<[u8; 32]> = req.messages.iter().map(message_digest).collect();
                // The tools and tool_choice digests serve the check and the next leg alike.
                let ctx = LegContext::with_prefix(&req, prefix_digest_of(&digests));
                let claimed = self.resume(
                    principal,
                    &req,
                    &c,
                    &ctx,
                    prefix_digest_of(&digests[..c.assistant]),
                );
                match claimed {
                    Err(e) => {
                        self.inner.metrics.rejection(e.code.as_str());
                        Err(e)
                    }
                    Ok(Suspended::Held(exec)) => {
                        let leg = self.answer_held(exec, &req, &c, ctx);
                        if leg.is_ok() {
                            self.inner.metrics.overhead.observe(started.elapsed());
                        }
                        leg.map(Reply::Leg)
                    }
                    Ok(Suspended::Upstream(u)) => {
                        self.relay_continue(u, raw, &c, ctx, started).await
                    }
                }
            }
        }
    }

    async fn fresh(
        &self,
        principal: &Principal,
        req: ChatRequest,
        raw: Bytes,
        started: std::time::Instant,
        slot: limits::Slot,
    ) -> Result<Reply, ApiError> {
        let cfg = self.config();
        let model = cfg
            .model(&req.model)
            .filter(|m| cfg.grant(&principal.id).is_some_and(|g| g.may_use(&m.id)))
            .ok_or_else(|| ApiError::model_not_found(&req.model))?
            .clone();
        if let Some(up) = self.inner.upstreams.get(&model.backend).cloned() {
            return self
                .relay_fresh(up, principal, &model, &req, raw, started, slot)
                .await;
        }
        // A stateless upstream enforces any tool_choice itself; an agent backend cannot.
        check_tool_choice(req.tool_choice.as_ref())?;
        let tools = parse_tools(&req)?;
        if let Some(b) = cfg.backends.get(&model.backend) {
            if let Some(t) = tools
                .iter()
                .find(|t| b.reserved_tool_names.contains(&t.name))
            {
                return Err(ApiError::invalid(format!(
                    "the tool name `{}` is reserved by this model's backend (its built-in would run instead of your tool); rename the tool",
                    t.name
                ))
                .with_param("tools"));
            }
        }
        let rendered = render::render(&req.messages)?;
        let backend = self
            .inner
            .backends
            .get(&model.backend)
            .ok_or_else(ApiError::upstream)?
            .clone();
        let execution_id = token::new_id("exe-");
        let turn_req = TurnRequest {
            execution_id: execution_id.clone(),
            backend_model: model.backend_model.clone(),
            instructions: rendered.instructions,
            history: rendered.history,
            input: rendered.input,
            tools,
            approval_policy: model.approval_policy.clone(),
            sandbox: model.sandbox.clone(),
        };
        self.inner
            .store
            .execution_started(&execution_id, &principal.id, &model.id)
            .map_err(|e| {
                tracing::error!(error = %e, "store unavailable");
                ApiError::new(
                    ErrorCode::Internal,
                    "The gateway could not record the execution.",
                )
            })?;
        self.inner.metrics.overhead.observe(started.elapsed());
        let turn = match backend.start_turn(turn_req).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(execution = %execution_id, error = %e, "backend turn did not start");
                self.ended(&execution_id, "failed_to_start");
                return Err(e.into());
            }
        };
        let exec = Execution {
            id: execution_id,
            principal: principal.id.clone(),
            model: model.id.clone(),
            created: now_unix(),
            deadline: Instant::now() + cfg.continuations.execution_ttl,
            rounds: 0,
            turn,
            backlog: VecDeque::new(),
            awaiting: Vec::new(),
            _slot: slot,
        };
        Ok(Reply::Leg(self.drive(exec, LegContext::of(&req))))
    }

    /// Validates a continuation in the spec's order; nothing mutates before the claim.
    /// Returns the claimed suspension.
    fn resume(
        &self,
        principal: &Principal,
        req: &ChatRequest,
        c: &Continuation,
        ctx: &LegContext,
        prefix: [u8; 32],
    ) -> Result<Suspended, ApiError> {
        let registry = &self.inner.registry;
        let view = match registry.lookup(&principal.id, &c.tokens) {
            Lookup::NotFound => return Err(not_found()),
            Lookup::Settled(reason) => return Err(settled_error(reason)),
            Lookup::Partial => {
                return Err(mismatch("the tool calls do not form one pending batch"))
            }
            Lookup::Pending(v) => v,
        };
        if std::time::Instant::now() >= view.deadline {
            if let Some(s) = registry.settle(view.batch, Reason::Expired) {
                self.finish_parked(s.parked, "expired");
            }
            return Err(settled_error(Reason::Expired));
        }
        if !view.alive {
            if let Some(s) = registry.settle(view.batch, Reason::Lost) {
                self.finish_parked(s.parked, "lost");
            }
            return Err(settled_error(Reason::Lost));
        }

        // Digests and shape of the answer. Drift consumes nothing.
        let cfg = self.config();
        if req.model != view.model {
            return Err(mismatch("`model` differs from the suspended request"));
        }
        let mut answered: HashMap<[u8; 32], usize> = HashMap::new();
        for (digest, index) in &c.results {
            if !view.tokens.contains(digest) {
                return Err(mismatch(
                    "a tool result answers an id that is not in the assistant message",
                ));
            }
            if answered.insert(*digest, *index).is_some() {
                return Err(mismatch("a tool call is answered more than once"));
            }
        }
        if answered.len() != view.tokens.len() {
            return Err(mismatch(
                "every tool call of the assistant message must be answered",
            ));
        }
        let limit = cfg.continuations.max_tool_result_bytes;
        if c.results
            .iter()
            .any(|(_, i)| req.messages[*i].text().len() > limit)
        {
            return Err(mismatch(format!("a tool result exceeds {limit} bytes")));
        }
        let got = Digests {
            tools: ctx.tools,
            tool_choice: ctx.tool_choice,
            prefix,
            echo: echo_digest_of(&req.messages[c.assistant]),
        };
        if let Some(what) = view.digests.first_mismatch(&got) {
            return Err(mismatch(format!(
                "the {what} differs from the suspended request"
            )));
        }

        // Authority under the current config, for the original model.
        let allowed = cfg.model(&view.model).is_some()
            && cfg
                .grant(&principal.id)
                .is_some_and(|g| g.may_use(&view.model));
        if !allowed {
            if let Some(s) = registry.settle(view.batch, Reason::Revoked) {
                tracing::info!(execution = %s.execution_id, "grant revoked while suspended; turn interrupted");
                self.finish_parked(s.parked, "revoked");
            }
            return Err(ApiError::new(
                ErrorCode::UnauthorizedTarget,
                "Your access to this model was revoked; the suspended turn was cancelled.",
            ));
        }

        // The claim: exactly one caller gets the execution.
        let Some(settled) = registry.settle(view.batch, Reason::Resolved) else {
            return Err(settled_error(Reason::Resolved));
        };
        Ok(settled.parked)
    }

    /// Answers the held calls of a claimed execution and drives its next leg.
    fn answer_held(
        &self,
        mut exec: Execution,
        req: &ChatRequest,
        c: &Continuation,
        ctx: LegContext,
    ) -> Result<Leg, ApiError> {
        for (digest, index) in &c.results {
            let Some(pos) = exec.awaiting.iter().position(|(d, _)| d == digest) else {
                continue;
            };
            let (_, invocation) = exec.awaiting.swap_remove(pos);
            let text = req.messages[*index].text();
            if exec.turn.control.answer_tool(invocation, &text).is_err() {
                tracing::warn!(execution = %exec.id, "held turn vanished during resume");
                let id = exec.id.clone();
                drop(exec);
                self.ended(&id, "lost");
                return Err(settled_error(Reason::Lost));
            }
        }
        exec.awaiting.clear();
        tracing::debug!(execution = %exec.id, results = c.results.len(), "continuation claimed; held calls answered");
        Ok(self.drive(exec, ctx))
    }

    /// Starts the leg task and hands back its stream.
    fn drive(&self, exec: Execution, ctx: LegContext) -> Leg {
        let (tx, rx) = mpsc::channel(64);
        let meta = ResponseMeta {
            id: format!("chatcmpl-{}", exec.id.trim_start_matches("exe-")),
            created: exec.created,
            model: exec.model.clone(),
        };
        let execution_id = exec.id.clone();
        let gw = self.clone();
        self.inner
            .tracker
            .spawn(async move { gw.run_leg(exec, ctx, tx).await });
        Leg {
            meta,
            execution_id,
            events: rx,
        }
    }

    async fn run_leg(&self, mut exec: Execution, ctx: LegContext, tx: mpsc::Sender<LegEvent>) {
        let cfg = self.config();
        let debounce = cfg.continuations.batch_debounce;
        let mut text = String::new();
        let mut usage = Usage::default();
        let mut calls: Vec<HeldCall> = exec.backlog.drain(..).collect();
        let mut flush_at = (!calls.is_empty()).then(|| Instant::now() + debounce);
        let deadline = exec.deadline;
        loop {
            let event = tokio::select! {
                biased;
                _ = self.inner.shutdown.cancelled() => {
                    let _ = tx.send(LegEvent::Error(ApiError::new(ErrorCode::UpstreamError, "The gateway is shutting down."))).await;
                    return self.finish(exec, "cancelled");
                }
                _ = tx.closed() => {
                    tracing::info!(execution = %exec.id, "client went away mid-leg; interrupting the turn");
                    return self.finish(exec, "cancelled");
                }
                _ = tokio::time::sleep_until(deadline) => {
                    let _ = tx.send(LegEvent::Error(ApiError::new(ErrorCode::UpstreamTimeout, "The execution passed its deadline."))).await;
                    return self.finish(exec, "expired");
                }
                _ = sleep_until_opt(flush_at) => {
                    return self.suspend(exec, ctx, calls, text, usage, tx).await;
                }
                ev = exec.turn.next_event() => ev,
            };
            match event {
                Some(TurnEvent::Delta(d)) => {
                    text.push_str(&d);
                    // A send error means the client left; the next loop turn sees `closed`.
                    let _ = tx.send(LegEvent::Delta(d)).await;
                }
                Some(TurnEvent::ToolCall(call)) => {
                    calls.push(call);
                    flush_at.get_or_insert_with(|| Instant::now() + debounce);
                }
                Some(TurnEvent::Usage(u)) => usage.add(u),
                Some(TurnEvent::Approval(ask)) => {
                    let who = Who {
                        id: exec.id.clone(),
                        principal: exec.principal.clone(),
                        model: exec.model.clone(),
                    };
                    self.on_approval(&who, *ask, &tx).await
                }
                Some(TurnEvent::Completed) => {
                    let _ = tx
                        .send(LegEvent::End {
                            calls: Vec::new(),
                            usage,
                        })
                        .await;
                    return self.finish(exec, "completed");
                }
                Some(TurnEvent::Failed(detail)) => {
                    tracing::warn!(execution = %exec.id, detail_len = detail.len(), "backend turn failed");
                    let _ = tx.send(LegEvent::Error(ApiError::upstream())).await;
                    return self.finish(exec, "failed");
                }
                Some(TurnEvent::Interrupted) => {
                    let _ = tx.send(LegEvent::Error(ApiError::upstream())).await;
                    return self.finish(exec, "interrupted");
                }
                Some(TurnEvent::Lost(why)) => {
                    tracing::warn!(execution = %exec.id, %why, "backend lost mid-leg");
                    let _ = tx.send(LegEvent::Error(ApiError::upstream())).await;
                    return self.finish(exec, "lost");
                }
                None => {
                    let _ = tx.send(LegEvent::Error(ApiError::upstream())).await;
                    return self.finish(exec, "lost");
                }
            }
        }
    }

    /// Parks the execution behind fresh tokens and ends the leg with `tool_calls`.
    async fn suspend(
        &self,
        mut exec: Execution,
        ctx: LegContext,
        mut calls: Vec<HeldCall>,
        text: String,
        usage: Usage,
        tx: mpsc::Sender<LegEvent>,
    ) {
        let cfg = self.config();
        if exec.rounds >= cfg.continuations.max_rounds {
            let _ = tx
                .send(LegEvent::Error(ApiError::new(
                    ErrorCode::CapacityExhausted,
                    format!(
                        "The turn exceeded {} tool rounds and was stopped.",
                        cfg.continuations.max_rounds
                    ),
                )))
                .await;
            return self.finish(exec, "max_rounds");
        }
        if tx.is_closed() {
            return self.finish(exec, "cancelled");
        }
        if !ctx.parallel && calls.len() > 1 {
            exec.backlog.extend(calls.drain(1..));
        }
        let mut exposed = Vec::with_capacity(calls.len());
        let mut digests = Vec::with_capacity(calls.len());
        exec.awaiting.clear();
        exec.awaiting.reserve_exact(calls.len());
        for call in calls {
            let (tok, digest) = token::new_token();
            exec.awaiting.push((digest, call.invocation));
            digests.push(digest);
            exposed.push(ExposedCall {
                id: tok,
                name: call.name,
                arguments: call.arguments,
            });
        }
        let echo_calls: Vec<(String, String, String)> = exposed
            .iter()
            .map(|c| (c.id.clone(), c.name.clone(), c.arguments.clone()))
            .collect();
        exec.turn.park();
        exec.rounds += 1;
        let batch = NewBatch {
            principal: exec.principal.clone(),
            execution_id: exec.id.clone(),
            model: exec.model.clone(),
            deadline: exec.deadline.into_std(),
            tokens: digests,
            digests: Digests {
                tools: ctx.tools,
                tool_choice: ctx.tool_choice,
                prefix: ctx.prefix,
                echo: echo_digest(&text, &echo_calls),
            },
            parked: Suspended::Held(exec),
        };
        let execution_id = batch.execution_id.clone();
        match self.inner.registry.register(batch) {
            Ok(()) => {
                tracing::debug!(execution = %execution_id, calls = exposed.len(), "execution suspended");
                let _ = tx
                    .send(LegEvent::End {
                        calls: exposed,
                        usage,
                    })
                    .await;
            }
            Err(RegisterError::Capacity(parked)) => {
                let _ = tx
                    .send(LegEvent::Error(ApiError::new(
                        ErrorCode::CapacityExhausted,
                        "Too many suspended tool calls; retry later.",
                    )))
                    .await;
                self.finish_parked(parked, "capacity");
            }
            Err(RegisterError::Store(exec)) => {
                let _ = tx
                    .send(LegEvent::Error(ApiError::new(
                        ErrorCode::CapacityExhausted,
                        "The gateway could not record the suspension; retry later.",
                    )))
                    .await;
                match exec {
                    Some(parked) => self.finish_parked(parked, "store_unavailable"),
                    None => self.ended(&execution_id, "store_unavailable"),
                }
            }
        }
    }

    /// Applies the model's approval policy to a backend side-effect request.
    async fn on_approval(&self, exec: &Who, ask: ApprovalAsk, tx: &mpsc::Sender<LegEvent>) {
        let cfg = self.config();
        let policy = cfg.model(&exec.model).map(|m| &m.approvals);
        let decision = policy.map_or(Decision::Deny, |p| match ask.kind {
            ApprovalKind::Command => p.command,
            ApprovalKind::FileChange => p.file_change,
            ApprovalKind::Permissions => p.permissions,
            ApprovalKind::Elicitation => p.elicitation,
        });
        let kind = ask.kind.as_str();
        match decision {
            Decision::Allow | Decision::Deny => {
                let allow = decision == Decision::Allow;
                let detail = format!(
                    "kind={kind} decision={} action={}",
                    if allow { "allow" } else { "deny" },
                    token::short(&ask.action_digest)
                );
                if let Err(e) = self
                    .inner
                    .store
                    .journal(&exec.id, "approval_policy", &detail)
                {
                    tracing::error!(execution = %exec.id, error = %e, "approval not journaled; denied");
                    ask.responder.answer(false);
                    return;
                }
                tracing::info!(execution = %exec.id, kind, allow, "approval answered by policy");
                ask.responder.answer(allow);
            }
            Decision::Ask => {
                let created = self.inner.approvals.create(
                    &exec.principal,
                    &exec.id,
                    &exec.model,
                    ask,
                    cfg.approval_ttl,
                );
                if let Ok(record) = created {
                    let _ = tx
                        .send(LegEvent::Notice(format!(
                            "approval pending {} ({kind}); decide with POST /v1/approvals/{}/decision",
                            record.id, record.id
                        )))
                        .await;
                }
            }
        }
    }

    /// Cancelled when shutdown begins (long-lived streams end on it).
    pub fn stopping(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    pub fn approvals(&self) -> &Approvals {
        &self.inner.approvals
    }

    /// Ends an execution: its pending approvals are denied (cancelled), the turn is
    /// interrupted if still running (by dropping it) and the end is journaled.
    fn finish(&self, exec: Execution, reason: &str) {
        let id = exec.id.clone();
        self.inner.approvals.cancel_execution(&id);
        drop(exec);
        self.ended(&id, reason);
    }

    fn finish_parked(&self, parked: Suspended, reason: &str) {
        match parked {
            Suspended::Held(exec) => self.finish(exec, reason),
            Suspended::Upstream(u) => self.ended(&u.execution_id, reason),
        }
    }

    fn ended(&self, execution_id: &str, reason: &str) {
        tracing::info!(execution = %execution_id, reason, "execution ended");
        if let Err(e) = self.inner.store.execution_ended(execution_id, reason) {
            tracing::error!(execution = %execution_id, error = %e, "could not journal execution end");
        }
    }

    /// Expires parked executions past their deadline and settles those whose backend died.
    async fn sweep(&self) {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u64 = 0;
        loop {
            tokio::select! {
                _ = self.inner.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            ticks += 1;
            if ticks.is_multiple_of(600) {
                // About once a minute: rate state of idle principals.
                self.inner.limiter.forget_idle();
            }
            for s in self.inner.registry.take_expired(std::time::Instant::now()) {
                tracing::info!(execution = %s.execution_id, "suspended execution expired; turn interrupted");
                self.finish_parked(s.parked, "expired");
            }
            self.inner.approvals.expire_due(std::time::Instant::now());
            for s in self.inner.registry.take_dead() {
                tracing::warn!(execution = %s.execution_id, "backend of a suspended execution died");
                self.finish_parked(s.parked, "lost");
            }
        }
    }

    /// Stops new work: running legs end with an error and every suspended execution is
    /// settled `lost` (its turn interrupted). Idempotent.
    pub fn begin_shutdown(&self) {
        self.inner.shutdown.cancel();
        // Held turns die with the process; stateless upstream records stay in the store
        // and are restored by the next start.
        for id in self.inner.registry.held_batches() {
            if let Some(s) = self.inner.registry.settle(id, Reason::Lost) {
                self.finish_parked(s.parked, "lost");
            }
        }
        self.inner.approvals.cancel_all();
    }

    /// Stops legs, settles every suspended execution as `lost` (so replays after a restart
    /// answer 410), waits for owned tasks and reaps every backend child.
    pub async fn shutdown(&self) {
        self.begin_shutdown();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        for b in self.inner.backends.values() {
            b.shutdown().await;
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn not_found() -> ApiError {
    // Identical for unknown and foreign tokens: nothing in it depends on the lookup.
    ApiError::new(
        ErrorCode::ContinuationNotFound,
        "No pending tool call matches the tool_call_id values of this request.",
    )
    .with_param("messages")
}

fn mismatch(why: impl Into<String>) -> ApiError {
    ApiError::new(
        ErrorCode::ContinuationMismatch,
        format!(
            "This continuation does not match the suspended turn: {}.",
            why.into()
        ),
    )
    .with_param("messages")
}

fn settled_error(reason: Reason) -> ApiError {
    match reason {
        Reason::Resolved => ApiError::new(
            ErrorCode::ContinuationAlreadyResolved,
            "These tool calls were already answered.",
        ),
        Reason::Expired => ApiError::new(
            ErrorCode::ContinuationExpired,
            "The suspended turn passed its deadline and was cancelled.",
        ),
        Reason::Lost | Reason::Cancelled => ApiError::new(
            ErrorCode::ContinuationLost,
            "The suspended turn is gone (backend or gateway restart); start a new turn.",
        ),
        Reason::Revoked => ApiError::new(
            ErrorCode::UnauthorizedTarget,
            "Your access to this model was revoked; the suspended turn was cancelled.",
        ),
    }
    .with_param("messages")
}

/// `auto` (or absent) and `none` are supported; `required` and a named function cannot be
/// enforced on an agent backend and are refused before anything runs.
fn check_tool_choice(choice: Option<&Value>) -> Result<(), ApiError> {
    match choice {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if s == "auto" || s == "none" => Ok(()),
        Some(Value::String(s)) if s == "required" => Err(unsupported_choice()),
        Some(Value::Object(_)) => Err(unsupported_choice()),
        Some(_) => Err(ApiError::invalid(
            "`tool_choice` must be \"auto\", \"none\", \"required\" or a function",
        )
        .with_param("tool_choice")),
    }
}

fn unsupported_choice() -> ApiError {
    ApiError::new(
        ErrorCode::UnsupportedToolChoice,
        "This model supports tool_choice \"auto\" and \"none\" only.",
    )
    .with_param("tool_choice")
}

/// The client's tools as dynamic tools (none when `tool_choice` is `none`).
fn parse_tools(req: &ChatRequest) -> Result<Vec<ToolDef>, ApiError> {
    if req.tool_choice.as_ref().and_then(Value::as_str) == Some("none") {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for t in req.tools.iter().flatten() {
        let def = tool_def(t).ok_or_else(|| {
            ApiError::invalid("each tool must be {\"type\":\"function\",\"function\":{\"name\":…}}")
                .with_param("tools")
        })?;
        if out.iter().any(|d: &ToolDef| d.name == def.name) {
            return Err(
                ApiError::invalid(format!("duplicate tool name `{}`", def.name))
                    .with_param("tools"),
            );
        }
        out.push(def);
    }
    Ok(out)
}
