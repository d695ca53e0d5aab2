//! The claim path of a continuation, in this order (the first failure wins; nothing mutates
//! before the claim): principal-scoped lookup (404 / 409 / 410), deadline and liveness (410),
//! the answers' shape and the four digests (400, pure: [`check`]), authority under the current
//! config for the original model (403, the held turn is interrupted), the atomic claim (the
//! loser gets 409). The claimed suspension is then answered by its backend and the next leg of
//! the same execution is driven.
//!
//! A held turn's tokens are spent at the claim (its answer cannot be taken back). A stateless
//! upstream's record is claimed in the store before the forward and spent only once the
//! upstream has answered with a success status: a forward that fails before (connect error,
//! timeout before headers, an error status) releases the claim and reinstates the batch as it
//! was, so the client may retry. A claim the process never released or spent (it crashed
//! mid-forward, or the spend could not be written) is settled `lost` at the next start: the
//! outcome is unknown, so the gateway fails closed rather than answer twice.

use std::collections::HashMap;

use tokio::time::Instant;

use super::ending::EndReason;
use super::execution::{Execution, History, LegContext, Suspended};
use super::leg::Leg;
use super::{ContinuationError, Engine, EngineError};
use crate::auth::Principal;
use crate::backend::{Answer, Hold, Holds, LegRequest, Resume};
use crate::continuation::canonical::digest_of_digests;
use crate::continuation::{Batch, Digests, PendingView, Reason};
use crate::turn::{Continuation, SurfaceId, TurnInput};

fn mismatch(why: impl Into<String>) -> ContinuationError {
    ContinuationError::Mismatch(why.into())
}

/// Where a continuation's parts sit in the suspended batch (exposure order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Placement {
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
) -> Result<Placement, ContinuationError> {
    if input.surface != view.surface {
        return Err(mismatch(
            "the tool calls were issued on another API surface",
        ));
    }
    if input.model != view.model {
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
    Ok(Placement {
        results: positions,
        calls,
    })
}

/// A claimed batch without its parked execution: what spending its tokens or putting it back
/// takes.
pub(super) struct Taken {
    principal: String,
    execution_id: String,
    model: String,
    surface: SurfaceId,
    deadline: Instant,
    tokens: Vec<[u8; 32]>,
    digests: Digests,
    /// Spent only once the upstream answered (a stateless upstream's batch).
    durable: bool,
}

impl Taken {
    fn of(b: Batch<Suspended>) -> (Taken, Suspended) {
        use crate::continuation::Parked;
        let taken = Taken {
            durable: b.parked.is_durable(),
            principal: b.principal,
            execution_id: b.execution_id,
            model: b.model,
            surface: b.surface,
            deadline: b.deadline,
            tokens: b.tokens,
            digests: b.digests,
        };
        (taken, b.parked)
    }

    fn into_batch(self, parked: Suspended) -> Batch<Suspended> {
        Batch {
            principal: self.principal,
            execution_id: self.execution_id,
            model: self.model,
            surface: self.surface,
            deadline: self.deadline,
            tokens: self.tokens,
            digests: self.digests,
            parked,
        }
    }
}

/// A taken stateless batch, put back as it was unless the upstream answered: when the forward
/// fails, and when the request is dropped (the client left) before the upstream answered.
struct Reinstate<'a> {
    engine: &'a Engine,
    batch: Option<Batch<Suspended>>,
}

impl Reinstate<'_> {
    /// The upstream answered: the tokens are spent, in memory at once (a replay here is
    /// 409). If the store cannot record it, the record stays claimed in the store, which a
    /// restart settles as `lost` and no other replica claims: never answered twice.
    fn spend(mut self) {
        if let Some(b) = self.batch.take() {
            let t = (&b.execution_id, &b.principal, &b.tokens);
            if self.engine.spend(t.0, t.1, t.2, Reason::Resolved).is_none() {
                tracing::warn!(execution = %b.execution_id, "the spend stays a claim in the store; it settles lost at the next start");
            }
        }
    }
}

impl Drop for Reinstate<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.batch.take() {
            self.engine.unclaim_durable(&b.execution_id);
            self.engine.inner.registry.reinstate(b);
        }
    }
}

impl Engine {
    /// Tombstones a taken batch's tokens, in memory and durably. Returns whether the store
    /// still had them pending (false when another replica settled them first), None when the
    /// store could not be written.
    fn spend(
        &self,
        execution_id: &str,
        principal: &str,
        tokens: &[[u8; 32]],
        reason: Reason,
    ) -> Option<bool> {
        let evicted = self.inner.registry.commit(principal, tokens, reason);
        self.persist_tombstones((execution_id, principal, tokens), reason, &evicted)
            .map(|n| n == tokens.len())
    }

    /// Tombstones a claimed held batch's tokens: behind the request path where the journal
    /// writes behind (`journal.rs`), else at once. Never for a stateless batch, whose durable
    /// record must not be claimable again.
    fn spend_held(&self, t: &Taken) -> Option<bool> {
        if !self.inner.journal.behind() {
            return self.spend(&t.execution_id, &t.principal, &t.tokens, Reason::Resolved);
        }
        let evicted = self
            .inner
            .registry
            .commit(&t.principal, &t.tokens, Reason::Resolved);
        self.inner.journal.tombstones(super::journal::Tombstones {
            execution_id: t.execution_id.clone(),
            principal: t.principal.clone(),
            tokens: t.tokens.clone(),
            reason: Reason::Resolved.as_str(),
            evicted,
        });
        Some(true)
    }

    /// Validates a continuation and claims its batch. Returns the claimed suspension, the
    /// batch position of each result and the claimed batch.
    pub(super) fn claim(
        &self,
        principal: &Principal,
        input: &TurnInput,
        c: &Continuation,
        forwarded: bool,
    ) -> Result<(Suspended, Placement, Taken), ContinuationError> {
        let registry = &self.inner.registry;
        let view = self.lookup_anywhere(principal, input, c, forwarded)?;
        // A reference to another execution (another principal's, unknown or just another
        // response) is answered as an unknown token.
        if c.bound.as_ref().is_some_and(|b| *b != view.execution_id) {
            return Err(ContinuationError::NotFound);
        }
        // A replica whose lease lapsed may have been given up by the others.
        let fenced = !view.durable && !self.may_claim_held();
        for (stale, reason) in [
            (Instant::now() >= view.deadline, Reason::Expired),
            (!view.alive || fenced, Reason::Lost),
        ] {
            if stale {
                if let Some(s) = registry.settle(view.batch, reason) {
                    self.settled(s);
                }
                return Err(ContinuationError::Settled(reason));
            }
        }
        let cfg = self.config();
        let placement = check(&view, input, c, cfg.continuations.max_tool_result_bytes)?;

        // Authority under the current config, for the original model.
        let allowed = cfg.model(&view.model).is_some() && cfg.may_use(&principal.id, &view.model);
        if !allowed {
            if let Some(s) = registry.settle(view.batch, Reason::Revoked) {
                tracing::info!(execution = %s.execution_id, "grant revoked while suspended; turn interrupted");
                self.settled(s);
            }
            return Err(ContinuationError::Revoked);
        }

        // The claim: exactly one caller gets the execution.
        let batch = registry
            .take(view.batch)
            .ok_or(ContinuationError::Settled(Reason::Resolved))?;
        let (taken, claimed) = Taken::of(batch);
        if taken.durable {
            if let Err(e) = self.claim_durable(&taken.execution_id, &taken.tokens) {
                if e == ContinuationError::StoreUnavailable {
                    registry.reinstate(taken.into_batch(claimed));
                }
                return Err(e);
            }
        } else {
            let spent = self.spend_held(&taken);
            if spent == Some(false) && self.replica_id().is_some() {
                // Another replica settled this held turn (this one's lease had lapsed).
                let meta = claimed.meta.clone();
                self.end(&meta, true, EndReason::Lost, claimed);
                return Err(ContinuationError::Settled(Reason::Lost));
            }
        }
        Ok((claimed, placement, taken))
    }

    /// Hands the claimed suspension and the client's answers to its backend and drives the
    /// next leg of the same execution.
    pub(super) async fn answer(
        &self,
        (mut s, placement, taken): (Suspended, Placement, Taken),
        mut input: TurnInput,
        mut c: Continuation,
    ) -> Result<Leg, EngineError> {
        // What reinstating a stateless batch needs back (its ids are all its hold).
        let kept = taken.durable.then(|| match &s.hold {
            Hold::Ids(ids) => (ids.clone(), s.history.clone()),
            Hold::Live { .. } => (Vec::new(), None),
        });
        if c.bound.is_some() {
            expand(&mut input, &mut c, s.history.take().unwrap_or_default());
        }
        let (input, c) = (&mut input, &c);
        let cfg = self.config();
        let backend = cfg
            .model(&s.meta.model)
            .and_then(|m| Some((m, self.backend(&m.backend)?)));
        let Some((model, backend)) = backend else {
            if taken.durable {
                self.spend(
                    &taken.execution_id,
                    &taken.principal,
                    &taken.tokens,
                    Reason::Lost,
                );
            }
            self.end(&s.meta.clone(), true, EndReason::Lost, s);
            return Err(EngineError::TurnFailed);
        };
        let answers = placement
            .results
            .iter()
            .zip(&c.results)
            .map(|(&call, &(_, message))| Answer {
                call,
                message,
                text: &input.messages[message].text,
                failed: input.messages[message].is_error,
            })
            .collect();
        let Suspended {
            meta,
            holds,
            deadline,
            rounds,
            hold,
            backlog,
            slot,
            history: _,
            suspended_at,
            tools,
        } = s;
        let durable = hold.is_durable();
        let reinstate = Reinstate {
            engine: self,
            batch: kept.map(|(ids, history)| {
                taken.into_batch(Suspended {
                    meta: meta.clone(),
                    holds,
                    deadline,
                    rounds,
                    hold: Hold::Ids(ids),
                    backlog: backlog.clone(),
                    slot: None,
                    history,
                    suspended_at,
                    tools: tools.clone(),
                })
            }),
        };
        let resume = Resume {
            leg: LegRequest {
                execution_id: &meta.id,
                model,
                input: &*input,
                meter: self.inner.ledger.meter(&meta.principal, &meta.model),
                kept: None,
            },
            continuation: c,
            answers,
            echo_calls: placement.calls,
        };
        self.inner.metrics.overhead.observe(input.arrived.elapsed());
        let turn = match backend.resume(hold, resume).await {
            Ok(t) => {
                reinstate.spend();
                t
            }
            Err(e) if reinstate.batch.is_some() => {
                // Nothing reached the client and nothing is held: the batch goes back.
                tracing::info!(execution = %meta.id, error = %e, "forward failed before the upstream answered; the tokens stay pending");
                drop(reinstate);
                return Err(e.into());
            }
            Err(e) => {
                tracing::warn!(execution = %meta.id, error = %e, "resume failed");
                let reason = match holds {
                    Holds::Turn => EndReason::Lost,
                    Holds::Nothing => EndReason::Failed,
                };
                self.end(&meta, true, reason, ());
                return Err(e.into());
            }
        };
        tracing::debug!(execution = %meta.id, results = c.results.len(), "continuation claimed; held calls answered");
        let exec = Execution {
            // A stateless execution is a new request each leg: it gets a fresh deadline and a
            // live-execution slot while it runs.
            deadline: if durable {
                Instant::now() + cfg.continuations.execution_ttl
            } else {
                deadline
            },
            slot: slot.or_else(|| Some(self.inner.limiter.hold(&meta.principal))),
            meta,
            holds,
            rounds,
            journaled: true,
            turn,
            backlog,
        };
        let ctx = LegContext::of(input, holds);
        Ok(self.drive(exec, ctx))
    }
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
