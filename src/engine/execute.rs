//! A request's way into the engine: a fresh turn is admitted under the principal's limits
//! and started on its model's backend; a continuation is claimed (`resume.rs`) and answered,
//! or, on a replica, handed back to the HTTP layer to forward to the replica that holds it
//! ([`Outcome::Forward`]). A compaction's summary turn runs here too.

use tokio::time::Instant;

use super::admission;
use super::compaction;
use super::ending::{EndReason, Leftover};
use super::execution::{Execution, ExecutionMeta, LegContext};
use super::leg::{Leg, LegEvent};
use super::placement::Owner;
use super::{ContinuationError, Engine, EngineError};
use crate::auth::Principal;
use crate::backend::{Holds, LegRequest};
use crate::config;
use crate::error::ApiError;
use crate::ids::new_id;
use crate::store::now_unix;
use crate::telemetry::Parent;
use crate::turn::{TurnInput, Usage};

/// Where a request's turn runs.
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    /// Here: its leg.
    Leg(Leg),
    /// On the replica that holds the turn (the HTTP layer relays the request).
    Forward(Owner),
}

impl Engine {
    /// Runs a turn here: a fresh one, or a continuation on a single gateway (the gateway's
    /// own summary turns, and tests).
    pub async fn execute(
        &self,
        principal: &Principal,
        input: TurnInput,
    ) -> Result<Leg, EngineError> {
        match self.execute_hop(principal, input, true, None).await? {
            Outcome::Leg(leg) => Ok(leg),
            // Unreachable: as `forwarded`, a turn held on another replica answers as lost
            // rather than forwarding (this caller cannot relay).
            Outcome::Forward(_) => Err(EngineError::TurnFailed),
        }
    }

    /// Runs one request: a fresh turn or the continuation of a suspended one, here or (a
    /// replica) on the replica that holds it. `forwarded` when another replica sent the
    /// request here as the turn's owner (it is never forwarded again); `admitted` when the
    /// request was admitted already (before its compaction items were read).
    pub async fn execute_hop(
        &self,
        principal: &Principal,
        mut input: TurnInput,
        forwarded: bool,
        admitted: Option<admission::Slot>,
    ) -> Result<Outcome, EngineError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(EngineError::ShuttingDown);
        }
        let Some(c) = input.continuation.take() else {
            // Only fresh turns are limited: a continuation refused here would strand the
            // held turn it answers.
            let slot = match admitted {
                Some(slot) => slot,
                None => self.admit(principal).await?,
            };
            return self.fresh(principal, input, slot).await.map(Outcome::Leg);
        };
        // Boxed: a continuation's futures are larger than a fresh turn's, and every request
        // would otherwise carry them (and copy them at each move).
        Box::pin(self.continuation(principal, input, *c, forwarded)).await
    }

    /// A continuation: claimed and answered here, or forwarded to the replica that holds it.
    async fn continuation(
        &self,
        principal: &Principal,
        input: TurnInput,
        c: crate::turn::Continuation,
        forwarded: bool,
    ) -> Result<Outcome, EngineError> {
        let claimed = self.claim(principal, &input, &c, forwarded).await;
        match claimed {
            Err(ContinuationError::Elsewhere(owner)) => Ok(Outcome::Forward(owner)),
            Err(e) => {
                let e = EngineError::from(e);
                self.inner
                    .metrics
                    .rejection(ApiError::from(e.clone()).code.as_str());
                Err(e)
            }
            Ok(claimed) => self.answer(claimed, input, c).await.map(Outcome::Leg),
        }
    }

    /// Admission of a fresh turn under the principal's limits in the current config (so a
    /// reload applies at once): 402 `budget_exceeded` at a budget cap, then 429
    /// `rate_limited` with `Retry-After`, before anything runs.
    async fn admit(&self, principal: &Principal) -> Result<admission::Slot, EngineError> {
        let cfg = self.config();
        let grant = cfg.grant(&principal.id, &principal.groups);
        let limits = grant.as_ref().map(|g| g.limits()).unwrap_or_default();
        // The budgets first (its own, then each group's pool): a refusal spends no rate.
        // Boxed where taken: a store read's future would otherwise be in every request's.
        let budgets = &self.inner.budgets;
        if limits.budget.gates_fresh() {
            Box::pin(budgets.within(&principal.id, &limits.budget)).await?;
        }
        for pool in grant.iter().flat_map(|g| g.pools()) {
            let id = crate::auth::grant::pool_id(&pool.name);
            Box::pin(budgets.within(&id, &pool.limits.budget)).await?;
        }
        let (all, durable) =
            if limits.max_suspended.is_some() || limits.concurrent_executions.is_some() {
                self.inner.suspensions.suspended_of(&principal.id)
            } else {
                (0, 0)
            };
        let counts = admission::SuspendedCounts { all, durable };
        self.inner
            .limiter
            .admit(&principal.id, &limits, counts)
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
            .grant(&principal.id, &principal.groups)
            .and_then(|g| g.limits().max_streams)
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
        if !self.inner.placement.admits_fresh() {
            return Err(EngineError::Store);
        }
        let cfg = self.config();
        let model = cfg
            .usable_model(&principal.id, &principal.groups, &input.model)
            .ok_or_else(|| EngineError::ModelNotFound(input.model.clone()))?;
        let backend = self
            .backend(&model.backend)
            .ok_or(EngineError::TurnFailed)?;
        backend.validate(&*input)?;
        let info = backend.describe();
        let holds = info.holds;
        let kept = (self.inner.threads).kept(&cfg, &principal.id, &model.id, holds, input)?;
        let mut meta = ExecutionMeta {
            id: new_id("exe-").into(),
            principal: principal.id.clone(),
            membership: membership(&cfg, principal),
            model: model.id.clone(),
            surface: input.surface,
            created: now_unix(),
            spent: None,
            cap: input.usd_cap,
            approvals: input.approvals,
            trace: Parent::current(),
        };
        let meter = self.inner.budgets.meter(&mut meta, model.price);
        // An agent's execution is journaled before it starts (a crash leaves it `lost`); a
        // stateless leg only if it suspends: one that just answers leaves nothing to recover,
        // and two store transactions per relayed request would cap the plain path.
        let journaled = holds == Holds::Turn;
        if journaled {
            if let Err(e) = Box::pin(self.inner.suspensions.started(&meta)).await {
                tracing::error!(error = %e, "store unavailable");
                return Err(EngineError::Store);
            }
        }
        let span = meta.leg_span(holds, &info, &model.id, input, 0);
        self.inner.metrics.overhead.observe(input.arrived.elapsed());
        let leg = LegRequest {
            execution_id: &meta.id,
            principal: &meta.principal,
            model,
            input: &*input,
            meter,
            kept,
            traceparent: span.traceparent(),
        };
        let turn = match backend.start(leg).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(execution = %meta.id, error = %e, "backend leg did not start");
                let reason = match holds {
                    Holds::Turn => EndReason::FailedToStart,
                    Holds::Nothing => EndReason::Failed,
                };
                span.fail(reason.as_str());
                let end = self.end(&meta, journaled, reason, Leftover::Nothing);
                Box::pin(end).await;
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
            span,
        };
        let ctx = LegContext::of(input, holds);
        Ok(self.drive(exec, ctx))
    }

    /// Runs one summary turn of `input`'s model over its conversation, for `principal`, and
    /// keeps the summary. Returns the handle and the turn's usage.
    pub async fn compact(
        &self,
        principal: &Principal,
        input: TurnInput,
        admitted: Option<admission::Slot>,
    ) -> Result<(String, Usage), EngineError> {
        let turn = compaction::summary_turn(input);
        let model = turn.model.clone();
        let leg = self.execute_hop(principal, turn, true, admitted).await?;
        let Outcome::Leg(mut leg) = leg else {
            return Err(EngineError::TurnFailed);
        };
        let limits = self.config().continuations.compactions;
        let mut summary = String::new();
        let usage = loop {
            match leg.events.recv().await {
                // What lies past the bound is not kept (cut on a character boundary below).
                Some(LegEvent::Delta(d)) if summary.len() <= limits.max_summary_bytes => {
                    summary.push_str(&d)
                }
                Some(LegEvent::End { calls, usage }) if calls.is_empty() => break usage,
                Some(LegEvent::End { .. }) | None => return Err(EngineError::TurnFailed),
                Some(LegEvent::Error(e)) => return Err(e),
                Some(_) => {}
            }
        };
        let summary = compaction::bounded(summary.trim().to_string(), limits.max_summary_bytes);
        let ttl = self.config().continuations.compaction_ttl.as_secs();
        let store = &self.inner.store;
        let handle = compaction::keep(store, &principal.id, &model, &summary, ttl, &limits).await?;
        Ok((handle, usage))
    }

    /// The summaries behind a request's compaction handles, each distinct handle read and
    /// opened once. Bounded before anything costs: at most `max_compaction_items` items
    /// (else 400); a fresh turn is admitted first (model 404, budget 402, rate 429; its slot
    /// is returned for the turn), so a refused request reads nothing; and the conversation
    /// they expand to must fit `max_body_bytes` (else 413), checked before any is opened.
    pub async fn compacted(
        &self,
        principal: &Principal,
        ask: CompactionAsk<'_>,
    ) -> Result<(Vec<(String, String)>, Option<admission::Slot>), ApiError> {
        let cfg = self.config();
        let max = cfg.continuations.compactions.max_items;
        if ask.handles.len() > max {
            let n = ask.handles.len();
            return Err(ApiError::invalid(format!(
                "A request may carry at most {max} compaction item(s); this one has {n}."
            ))
            .with_param("input"));
        }
        let limit = cfg.server.max_body_bytes;
        let slot = match ask.fresh {
            true => {
                if cfg
                    .usable_model(&principal.id, &principal.groups, ask.model)
                    .is_none()
                {
                    return Err(EngineError::ModelNotFound(ask.model.to_string()).into());
                }
                drop(cfg);
                Some(self.admit(principal).await?)
            }
            false => None,
        };
        let mut distinct: Vec<&str> = Vec::new();
        for h in ask.handles {
            if !distinct.contains(&h.as_str()) {
                distinct.push(h);
            }
        }
        let mut found = Vec::with_capacity(distinct.len());
        let mut expanded = ask.body_bytes;
        for handle in distinct {
            let Some(sealed) = compaction::lookup(&self.inner.store, &principal.id, handle).await?
            else {
                return Err(EngineError::from(ContinuationError::ResponseNotFound).into());
            };
            let uses = ask.handles.iter().filter(|h| *h == handle).count();
            expanded = expanded.saturating_add(uses.saturating_mul(sealed.text_len()));
            found.push((handle, sealed));
        }
        if expanded > limit {
            return Err(ApiError::too_large(limit));
        }
        let mut summaries = Vec::with_capacity(found.len());
        for (handle, sealed) in found {
            let Some(text) = sealed.open(handle) else {
                return Err(EngineError::from(ContinuationError::ResponseNotFound).into());
            };
            summaries.push((handle.to_string(), text));
        }
        Ok((summaries, slot))
    }
}

/// What [`Engine::compacted`] is asked.
pub struct CompactionAsk<'a> {
    /// The model the request names.
    pub model: &'a str,
    /// The handles as they occur in the request (a repeat counts again).
    pub handles: &'a [String],
    /// The request is a fresh turn (not a continuation, which is never limited).
    pub fresh: bool,
    /// The request's size before its items are expanded.
    pub body_bytes: usize,
}

/// What an execution of `principal` keeps of its groups: None for a principal without any.
fn membership(
    cfg: &config::Config,
    principal: &Principal,
) -> Option<std::sync::Arc<super::execution::Membership>> {
    if principal.groups.is_empty() {
        return None;
    }
    let pools = (cfg.grant(&principal.id, &principal.groups).iter())
        .flat_map(|g| g.pools())
        .map(|g| crate::auth::grant::pool_id(&g.name))
        .collect();
    Some(std::sync::Arc::new(super::execution::Membership {
        groups: principal.groups.clone(),
        pools,
    }))
}
