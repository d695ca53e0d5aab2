//! The claim path of a continuation, in this order (the first failure wins; nothing mutates
//! before the claim): principal-scoped lookup (404 / 409 / 410), deadline and liveness (410),
//! the answers' shape and the four digests (400, pure: [`check`]), authority under the current
//! config for the original model (403, the held turn is interrupted), the per-execution spend
//! cap (402, the execution is stopped and its tokens settle `budget_exceeded`), the atomic
//! claim (the loser gets 409). The claimed suspension is then answered by its backend and the next leg of
//! the same execution is driven.
//!
//! A held turn's tokens are spent at the claim (its answer cannot be taken back). A stateless
//! upstream's record is claimed in the store before the forward and spent only once the
//! upstream has answered with a success status: a forward that fails before (connect error,
//! timeout before headers, an error status) releases the claim and reinstates the batch as it
//! was, so the client may retry. A claim the process never released or spent (it crashed
//! mid-forward, or the spend could not be written) is settled `lost` at the next start: the
//! outcome is unknown, so the gateway fails closed rather than answer twice.

use crate::telemetry::LegSpan;
use std::collections::HashMap;

use tokio::time::Instant;

use super::ending::{EndReason, Leftover};
use super::execution::{Execution, ExecutionMeta, History, LegContext, Suspended};
use super::leg::Leg;
use super::suspensions::Taken;
use super::{ContinuationError, Engine, EngineError};
use crate::auth::Principal;
use crate::backend::{Answer, BackendError, Holds, LegRequest, Resume, Turn};
use crate::continuation::canonical::digest_of_digests;
use crate::continuation::{Digests, Head, Lookup, PendingView, Reason};
use crate::turn::{Continuation, TurnInput};

fn mismatch(why: impl Into<String>) -> ContinuationError {
    ContinuationError::Mismatch(why.into())
}

/// Where a continuation's parts sit in the suspended batch (exposure order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Positions {
    /// The batch position each result answers, in the client's order.
    pub results: Vec<usize>,
    /// The batch position of each call of the assistant message.
    pub calls: Vec<usize>,
}

/// The answers' shape and the digests, against the pending batch. Pure: it reads the view
/// and the request only.
pub(super) fn check(
    view: &PendingView,
    input: &TurnInput,
    c: &Continuation,
    max_result_bytes: usize,
) -> Result<Positions, ContinuationError> {
    if input.surface != view.surface {
        return Err(mismatch(
            "the tool calls were issued on another API surface",
        ));
    }
    if *input.model != *view.model {
        return Err(mismatch("`model` differs from the suspended request"));
    }
    let position: HashMap<[u8; 32], usize> = view
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (*t, i))
        .collect();
    let mut answered = vec![false; view.tokens.len()];
    let mut positions = Vec::with_capacity(c.results.len());
    for (digest, _) in &c.results {
        let Some(&pos) = position.get(digest) else {
            return Err(mismatch(
                "a tool result answers an id that is not in the assistant message",
            ));
        };
        if std::mem::replace(&mut answered[pos], true) {
            return Err(mismatch("a tool call is answered more than once"));
        }
        positions.push(pos);
    }
    if positions.len() != view.tokens.len() {
        return Err(mismatch(
            "every tool call of the assistant message must be answered",
        ));
    }
    if c.results
        .iter()
        .any(|(_, i)| input.messages[*i].text.len() > max_result_bytes)
    {
        return Err(mismatch(format!(
            "a tool result exceeds {max_result_bytes} bytes"
        )));
    }
    // A continuation by reference names the conversation instead of sending it: the
    // response id and the tokens bind it, so only tools and tool choice can drift.
    let (prefix, echo) = match &c.bound {
        None => (c.prefix, c.echo),
        Some(_) if !view.by_reference => {
            return Err(mismatch(
                "the gateway no longer holds this response's conversation (it restarted); send the whole conversation in `input` instead of `previous_response_id`",
            ))
        }
        Some(_) => (view.digests.prefix, view.digests.echo),
    };
    let got = Digests {
        tools: input.fingerprint.tools,
        tool_choice: input.fingerprint.tool_choice,
        prefix,
        echo,
    };
    if let Some(what) = view.digests.first_mismatch(&got) {
        return Err(mismatch(format!(
            "the {what} differs from the suspended request"
        )));
    }
    // The lookup found every call of the assistant message in this one batch.
    let calls = c
        .tokens
        .iter()
        .map(|t| position.get(t).copied().unwrap_or_default())
        .collect();
    Ok(Positions {
        results: positions,
        calls,
    })
}

/// A claimed continuation: the suspended execution, where the answers sit in its batch, and
/// the batch itself (without the execution), which spending its tokens or putting it back
/// takes.
pub(super) struct Claimed {
    suspended: Suspended,
    positions: Positions,
    batch: Head,
}

/// A taken stateless batch, put back as it was unless the upstream answered: when the forward
/// fails, and when the request is dropped (the client left) before the upstream answered.
struct Reinstate {
    engine: Engine,
    batch: Option<(Head, Suspended)>,
}

impl Reinstate {
    /// The upstream answered: the tokens are spent, in memory at once (a replay here is
    /// 409). If the store cannot record it, the record stays claimed in the store, which a
    /// restart settles as `lost` and no other replica claims: never answered twice.
    async fn spend(mut self) {
        if let Some((b, _)) = self.batch.take() {
            let suspensions = &self.engine.inner.suspensions;
            if suspensions.spend(&b, Reason::Resolved).await.is_none() {
                tracing::warn!(execution = %b.execution_id, "the spend stays a claim in the store; it settles lost at the next start");
            }
        }
    }

    /// The forward failed: the batch goes back before the client hears of it.
    async fn put_back(mut self) {
        if let Some((head, parked)) = self.batch.take() {
            self.engine
                .inner
                .suspensions
                .reinstate(head.join(parked))
                .await;
        }
    }
}

impl Drop for Reinstate {
    /// The request was dropped (the client left) before the upstream answered: the batch
    /// goes back by a task of its own.
    fn drop(&mut self) {
        if let Some((head, parked)) = self.batch.take() {
            let engine = self.engine.clone();
            self.engine.inner.tracker.spawn(async move {
                engine.inner.suspensions.reinstate(head.join(parked)).await;
            });
        }
    }
}

impl Engine {
    /// The batch of a continuation: in this process, else (a replica) in the store.
    async fn lookup_anywhere(
        &self,
        principal: &Principal,
        input: &TurnInput,
        c: &Continuation,
        forwarded: bool,
    ) -> Result<Box<PendingView>, ContinuationError> {
        let suspensions = &self.inner.suspensions;
        for attempt in 0..2 {
            match suspensions.lookup(&principal.id, &c.tokens) {
                Lookup::NotFound if attempt == 0 => {
                    let max = self.config().continuations.max_tool_result_bytes;
                    let found = self
                        .inner
                        .placement
                        .find(principal, input, c, forwarded, max)
                        .await?;
                    // A racing request may have taken it in first; either way, look again.
                    suspensions.take_in(found);
                }
                Lookup::NotFound => return Err(ContinuationError::NotFound),
                Lookup::Settled(reason) => return Err(ContinuationError::Settled(reason)),
                Lookup::Partial => {
                    return Err(ContinuationError::Mismatch(
                        "the tool calls do not form one pending batch".into(),
                    ))
                }
                Lookup::Pending(v) => return Ok(v),
            }
        }
        Err(ContinuationError::NotFound)
    }

    /// Validates a continuation and claims its batch.
    pub(super) async fn claim(
        &self,
        principal: &Principal,
        input: &TurnInput,
        c: &Continuation,
        forwarded: bool,
    ) -> Result<Claimed, ContinuationError> {
        let suspensions = &self.inner.suspensions;
        let view = self.lookup_anywhere(principal, input, c, forwarded).await?;
        // A reference to another execution (another principal's, unknown or just another
        // response) is answered as an unknown token.
        if c.bound.as_ref().is_some_and(|b| **b != *view.execution_id) {
            return Err(ContinuationError::NotFound);
        }
        // A replica whose lease lapsed may have been given up by the others.
        let fenced = !view.durable && !self.inner.placement.may_claim_held();
        for (stale, reason) in [
            (Instant::now() >= view.deadline, Reason::Expired),
            (!view.alive || fenced, Reason::Lost),
        ] {
            if stale {
                if let Some(s) = suspensions.settle(view.batch, reason) {
                    self.settled(s).await;
                }
                return Err(ContinuationError::Settled(reason));
            }
        }
        let cfg = self.config();
        let positions = check(&view, input, c, cfg.continuations.max_tool_result_bytes)?;

        // Authority under the current config, for the original model.
        let allowed = cfg
            .usable_model(&principal.id, &principal.groups, &view.model)
            .is_some();
        if !allowed {
            if let Some(s) = suspensions.settle(view.batch, Reason::Revoked) {
                tracing::info!(execution = %s.execution_id, "grant revoked while suspended; turn interrupted");
                self.settled(s).await;
            }
            return Err(ContinuationError::Revoked);
        }

        // The per-execution spend cap, reached at an earlier round or while suspended: the
        // execution stops here, and its tokens answer replays with 410. (An execution that
        // spent nothing, an unpriced model's, has nothing to check.)
        let over = (view.spent > 0)
            .then(|| {
                let budget =
                    (cfg.execution_budget(&principal.id, &principal.groups)).capped(view.cap);
                budget.execution_reached(view.spent)
            })
            .flatten();
        if let Some(exceeded) = over {
            self.inner.metrics.budget_refusal(exceeded.cap.as_str());
            if let Some(s) = suspensions.settle(view.batch, Reason::BudgetExceeded) {
                tracing::info!(execution = %s.execution_id, "per-execution spend cap reached; turn interrupted");
                self.settled(s).await;
            }
            return Err(ContinuationError::BudgetExceeded(exceeded));
        }

        // The claim: exactly one caller gets the execution.
        match suspensions.take(view.batch).await? {
            Taken::Claimed(batch, suspended) => Ok(Claimed {
                suspended,
                positions,
                batch,
            }),
            Taken::Gone(suspended) => {
                let meta = suspended.meta.clone();
                self.end(&meta, true, EndReason::Lost, Leftover::Parked(suspended))
                    .await;
                Err(ContinuationError::Settled(Reason::Lost))
            }
        }
    }

    /// Hands the claimed suspension and the client's answers to its backend and drives the
    /// next leg of the same execution.
    pub(super) async fn answer(
        &self,
        claimed: Claimed,
        mut input: TurnInput,
        mut c: Continuation,
    ) -> Result<Leg, EngineError> {
        let Claimed {
            suspended: mut s,
            positions,
            batch,
        } = claimed;
        let again = s.reinstatable();
        if c.bound.is_some() {
            expand(
                &mut input,
                &mut c,
                s.history.take().map(|h| *h).unwrap_or_default(),
            );
        }
        let (input, c) = (&mut input, &c);
        let cfg = self.config();
        let backend = cfg
            .model(&s.meta.model)
            .and_then(|m| Some((m, self.backend(&m.backend)?)));
        let Some((model, backend)) = backend else {
            return Err(self.unservable(s, &batch, again.is_some()).await);
        };
        let answers = answers(&positions.results, c, input);
        let Suspended {
            mut meta,
            holds,
            deadline,
            rounds,
            hold,
            backlog,
            slot,
            held,
            ..
        } = s;
        // The claim ends the client's part of the round.
        held.answered();
        let durable = again.is_some();
        let reinstate = Reinstate {
            engine: self.clone(),
            batch: again.map(|parked| (batch, parked)),
        };
        let meter = self.inner.budgets.meter(&mut meta, model.price);
        let span = meta.leg_span(holds, &backend.describe(), &model.id, input, rounds);
        let resume = Resume {
            leg: LegRequest {
                execution_id: &meta.id,
                principal: &meta.principal,
                model,
                input: &*input,
                meter,
                kept: None,
                traceparent: span.traceparent(),
            },
            continuation: c,
            answers,
            echo_calls: positions.calls,
        };
        self.inner.metrics.overhead.observe(input.arrived.elapsed());
        let resumed = backend.resume(hold, resume).await;
        let (turn, span) = (self.resumed(resumed, reinstate, &meta, holds, span)).await?;
        tracing::debug!(execution = %meta.id, results = c.results.len(), "continuation claimed; held calls answered");
        let exec = Execution {
            // A stateless execution is a new request each leg: it gets a fresh deadline and a
            // live-execution slot while it runs.
            deadline: match durable {
                true => Instant::now() + cfg.continuations.execution_ttl,
                false => deadline,
            },
            slot: slot.or_else(|| Some(self.inner.limiter.hold(&meta.principal))),
            meta,
            holds,
            rounds,
            journaled: true,
            turn,
            backlog,
            span,
        };
        let ctx = LegContext::of(input, holds);
        Ok(self.drive(exec, ctx))
    }

    /// A claimed suspension whose model or backend is gone (a reload removed it): its record
    /// is spent and the execution ends as lost.
    async fn unservable(&self, s: Suspended, batch: &Head, durable: bool) -> EngineError {
        if durable {
            self.inner.suspensions.spend(batch, Reason::Lost).await;
        }
        self.end(&s.meta.clone(), true, EndReason::Lost, Leftover::Parked(s))
            .await;
        EngineError::TurnFailed
    }

    /// The backend's answer to the resume: the claim spent once it took the results; a
    /// stateless batch the upstream never saw goes back behind its tokens; any other failure
    /// ends the execution.
    async fn resumed(
        &self,
        resumed: Result<Turn, BackendError>,
        reinstate: Reinstate,
        meta: &ExecutionMeta,
        holds: Holds,
        span: LegSpan,
    ) -> Result<(Turn, LegSpan), EngineError> {
        match resumed {
            Ok(t) => {
                reinstate.spend().await;
                Ok((t, span))
            }
            Err(e) if reinstate.batch.is_some() => {
                // Nothing reached the client and nothing is held: the batch goes back.
                tracing::info!(execution = %meta.id, error = %e, "forward failed before the upstream answered; the tokens stay pending");
                span.fail("unavailable");
                reinstate.put_back().await;
                Err(e.into())
            }
            Err(e) => {
                tracing::warn!(execution = %meta.id, error = %e, "resume failed");
                let reason = match holds {
                    Holds::Turn => EndReason::Lost,
                    Holds::Nothing => EndReason::Failed,
                };
                span.fail(reason.as_str());
                self.end(meta, true, reason, Leftover::Nothing).await;
                Err(e.into())
            }
        }
    }
}

/// The client's results as the backend takes them, in the order the calls were made,
/// whatever order the results came in: an agent that lists results as their calls complete
/// then lists them as it made them.
fn answers<'a>(calls: &[usize], c: &Continuation, input: &'a TurnInput) -> Vec<Answer<'a>> {
    let mut answers: Vec<Answer> = calls
        .iter()
        .zip(&c.results)
        .map(|(&call, &(_, message))| Answer {
            call,
            message,
            text: &input.messages[message].text,
            failed: input.messages[message].is_error,
        })
        .collect();
    answers.sort_by_key(|a| a.call);
    answers
}

/// Expands a continuation by reference into the whole conversation the suspension kept:
/// its digests always (the next suspension's prefix), its messages for a stateless upstream.
fn expand(input: &mut TurnInput, c: &mut Continuation, history: History) {
    let offset = match history.messages {
        Some(mut messages) => {
            let n = messages.len();
            messages.append(&mut input.messages);
            input.messages = messages;
            n
        }
        None => 0,
    };
    c.assistant = offset.saturating_sub(1);
    for r in &mut c.results {
        r.1 += offset;
    }
    let mut digests = history.digests;
    digests.append(&mut input.message_digests);
    input.fingerprint.prefix = digest_of_digests(&digests);
    input.message_digests = digests;
}
