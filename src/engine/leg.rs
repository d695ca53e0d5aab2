//! Legs: one task per leg turns the backend's [`TurnEvent`]s into [`LegEvent`]s on a bounded
//! channel that the surface frames. A leg ends with the answer, an error, or a suspension,
//! whatever the backend kind, and every ending goes through one function ([`Engine::end`]).
//! Tool calls of an agent are collected for `batch_debounce_ms` before the flush, unless the
//! agent says its batch is complete (`TurnEvent::Yield`, as a stateless upstream always does).
//!
//! The one suspension path ([`Engine::suspend`]), for both backend kinds: bound the rounds,
//! mint a token per exposed call, digest the echo with the surface's projection, park the
//! turn (or keep only a stateless upstream's ids), register the batch in memory within the
//! bounds, record it durably, and only then send the tokens. Any failure on the way
//! interrupts the held calls and exposes no token.

use std::sync::atomic::Ordering;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::approval_policy;
use super::ending::{EndReason, Leftover};
use super::execution::{Execution, ExecutionMeta, History, LegContext, Suspended};
use super::suspensions::Refusal;
use super::{Engine, EngineError};
use crate::backend::{HeldCall, Holds, TurnEvent};
use crate::continuation::{token, Batch, Digests, Settled};
use crate::store::now_unix;
use crate::telemetry::{Held, LegSpan};
use crate::turn::{Call, ExposedCall, Message, Role, Usage};

/// What a leg sends to its surface, in order: deltas, then exactly one `End` or `Error`.
#[derive(Debug)]
pub enum LegEvent {
    Delta(String),
    /// Reasoning the backend shows; the surface carries it in its own form.
    Reasoning(String),
    /// The upstream's own Chat Completions chunk (or whole body), tool calls removed; only on
    /// a leg whose `native` flag is set, for a surface that relays that wire.
    Native(crate::backend::Native),
    /// Something a human watching the stream should know (an approval is pending).
    Notice(String),
    /// The answer was cut at the output token limit; `End` follows.
    Truncated,
    /// The leg is over: `calls` empty means the turn finished (`stop`), else it is suspended.
    End {
        calls: Vec<ExposedCall>,
        usage: Usage,
    },
    Error(EngineError),
}

/// A leg that has started: its execution's identity and its event stream.
pub struct Leg {
    pub execution_id: String,
    pub created: u64,
    pub model: String,
    /// Tool rounds of the execution before this leg (0 for its first leg).
    pub round: u32,
    /// The events include the upstream's own chunks (`LegEvent::Native`).
    pub native: bool,
    pub events: mpsc::Receiver<LegEvent>,
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Engine {
    /// Starts the leg task and hands back its stream.
    pub(super) fn drive(&self, exec: Execution, ctx: LegContext) -> Leg {
        let (tx, rx) = mpsc::channel(64);
        let leg = Leg {
            execution_id: exec.meta.id.clone(),
            created: exec.meta.created,
            model: exec.meta.model.clone(),
            round: exec.rounds,
            native: exec.turn.native,
            events: rx,
        };
        let engine = self.clone();
        self.inner
            .tracker
            .spawn(async move { engine.run_leg(exec, ctx, tx).await });
        leg
    }

    async fn run_leg(&self, mut exec: Execution, ctx: LegContext, tx: mpsc::Sender<LegEvent>) {
        let debounce = self.config().continuations.batch_debounce;
        let mut text = String::new();
        let mut usage = Usage::default();
        let mut calls: Vec<HeldCall> = exec.backlog.drain(..).collect();
        let mut flush_at = (!calls.is_empty()).then(|| Instant::now() + debounce);
        let deadline = exec.deadline;
        // The execution's spend crossed its per-execution cap at a report of this leg: its
        // next model request (the next report) stops it. The cap is read once per leg, and
        // only for a priced execution.
        let budget = (exec.meta.spent.is_some())
            .then(|| self.budget_of(&exec.meta.principal))
            .filter(|b| b.usd_per_execution.is_some());
        let mut crossed = None;
        let stopping = self.inner.shutdown.clone();
        let fail = |exec: Execution, e: EngineError, reason: EndReason| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(LegEvent::Error(e)).await;
                self.end(
                    &exec.meta.clone(),
                    exec.journaled,
                    reason,
                    Leftover::Running(exec),
                )
                .await;
            }
        };
        loop {
            let event = tokio::select! {
                biased;
                _ = stopping.cancelled() => {
                    return fail(exec, EngineError::ShuttingDown, EndReason::Cancelled).await;
                }
                _ = tx.closed() => {
                    tracing::info!(execution = %exec.meta.id, "client went away mid-leg; interrupting the turn");
                    let meta = exec.meta.clone();
                    return self.end(&meta, exec.journaled, EndReason::Cancelled, Leftover::Running(exec)).await;
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return fail(exec, EngineError::Deadline, EndReason::Expired).await;
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
                Some(TurnEvent::Reasoning(r)) => {
                    let _ = tx.send(LegEvent::Reasoning(r)).await;
                }
                Some(TurnEvent::Native(v)) => {
                    let _ = tx.send(LegEvent::Native(v)).await;
                }
                Some(TurnEvent::ToolCall(call)) => {
                    calls.push(call);
                    if exec.holds == Holds::Turn {
                        flush_at.get_or_insert_with(|| Instant::now() + debounce);
                    }
                }
                Some(TurnEvent::Usage(u)) => {
                    usage.add(u);
                    exec.span.usage(u);
                    if let Some(exceeded) = crossed {
                        tracing::info!(execution = %exec.meta.id, "per-execution spend cap reached; turn interrupted");
                        let e = self.execution_stopped(exceeded);
                        return fail(exec, e, EndReason::BudgetExceeded).await;
                    }
                    if let (Some(b), Some(spent)) = (&budget, &exec.meta.spent) {
                        crossed = b.execution_reached(spent.load(Ordering::Relaxed));
                    }
                }
                Some(TurnEvent::Truncated) => {
                    let _ = tx.send(LegEvent::Truncated).await;
                }
                Some(TurnEvent::Approval(ask)) => {
                    let (cfg, i) = (self.config(), &self.inner);
                    let (at, meta) = (exec.span.parent(), &exec.meta);
                    let notice =
                        approval_policy::apply(&cfg, &i.store, &i.approvals, meta, *ask, &at).await;
                    if let Some(n) = notice {
                        let _ = tx.send(LegEvent::Notice(n)).await;
                    }
                }
                Some(TurnEvent::Yield) if !calls.is_empty() => {
                    return self.suspend(exec, ctx, calls, text, usage, tx).await;
                }
                // An agent's batch already went out with the debounce: its turn goes on.
                Some(TurnEvent::Yield) if exec.holds == Holds::Turn => {}
                Some(TurnEvent::Completed | TurnEvent::Yield) => {
                    // The thread is kept before the client learns the answer is complete,
                    // so its next request finds it.
                    let Execution {
                        meta,
                        holds,
                        journaled,
                        turn,
                        slot,
                        span,
                        ..
                    } = exec;
                    (self.inner.threads).keep(&self.config(), &meta, holds, ctx, &text, turn);
                    let _ = tx
                        .send(LegEvent::End {
                            calls: Vec::new(),
                            usage,
                        })
                        .await;
                    span.finish("stop");
                    return self
                        .end(&meta, journaled, EndReason::Completed, Leftover::Slot(slot))
                        .await;
                }
                Some(TurnEvent::Failed(detail)) => {
                    tracing::warn!(execution = %exec.meta.id, detail_len = detail.len(), "backend turn failed");
                    return fail(exec, EngineError::TurnFailed, EndReason::Failed).await;
                }
                Some(TurnEvent::TimedOut) => {
                    tracing::warn!(execution = %exec.meta.id, "backend timed out mid-leg");
                    return fail(exec, EngineError::TurnTimedOut, EndReason::Failed).await;
                }
                Some(TurnEvent::Interrupted) => {
                    return fail(exec, EngineError::TurnFailed, EndReason::Interrupted).await;
                }
                Some(TurnEvent::Lost(why)) => {
                    tracing::warn!(execution = %exec.meta.id, %why, "backend lost mid-leg");
                    return fail(exec, EngineError::TurnFailed, EndReason::Lost).await;
                }
                None => return fail(exec, EngineError::TurnFailed, EndReason::Lost).await,
            }
        }
    }

    /// Parks the execution behind fresh tokens and ends the leg with `tool_calls`.
    pub(super) async fn suspend(
        &self,
        mut exec: Execution,
        ctx: LegContext,
        mut calls: Vec<HeldCall>,
        text: String,
        usage: Usage,
        tx: mpsc::Sender<LegEvent>,
    ) {
        let cfg = self.config();
        let max_rounds = cfg.continuations.max_rounds;
        let refuse = |exec: Execution, e: EngineError, reason: EndReason| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(LegEvent::Error(e)).await;
                self.end(
                    &exec.meta.clone(),
                    exec.journaled,
                    reason,
                    Leftover::Running(exec),
                )
                .await;
            }
        };
        if exec.rounds >= max_rounds {
            return refuse(
                exec,
                EngineError::MaxRounds(max_rounds),
                EndReason::MaxRounds,
            )
            .await;
        }
        if tx.is_closed() {
            let meta = exec.meta.clone();
            return self
                .end(
                    &meta,
                    exec.journaled,
                    EndReason::Cancelled,
                    Leftover::Running(exec),
                )
                .await;
        }
        if !exec.journaled {
            let m = &exec.meta;
            if let Err(e) = self.inner.suspensions.started_now(m).await {
                tracing::error!(execution = %m.id, error = %e, "store unavailable; no token exposed");
                return refuse(exec, EngineError::Store, EndReason::StoreUnavailable).await;
            }
            exec.journaled = true;
        }
        if !ctx.parallel && calls.len() > 1 {
            exec.backlog.extend(calls.drain(1..));
        }

        let mut exposed = Vec::with_capacity(calls.len());
        let mut tokens = Vec::with_capacity(calls.len());
        let mut invocations = Vec::with_capacity(calls.len());
        for call in calls {
            let (tok, digest) = token::new_token();
            tokens.push(digest);
            invocations.push(call.invocation);
            exposed.push(ExposedCall {
                id: tok,
                name: call.name,
                arguments: call.arguments,
            });
        }
        let digests = Digests {
            tools: ctx.fingerprint.tools,
            tool_choice: ctx.fingerprint.tool_choice,
            prefix: ctx.fingerprint.prefix,
            echo: (ctx.echo)(&text, &exposed),
        };
        let history = ctx.keeps_history.then(|| {
            let mut h = History {
                digests: ctx.digests,
                messages: ctx.messages,
            };
            let assistant = Message {
                role: Role::Assistant,
                text: text.clone(),
                images: Vec::new(),
                name: None,
                tool_calls: exposed
                    .iter()
                    .map(|c| Call {
                        id: c.id.clone(),
                        name: c.name.clone(),
                        arguments: c.arguments.clone(),
                    })
                    .collect(),
                tool_call_id: None,
                is_error: false,
            };
            h.digests.push((ctx.digest)(&assistant));
            if let Some(m) = h.messages.as_mut() {
                m.push(assistant);
            }
            h
        });
        let Execution {
            meta,
            holds,
            deadline,
            rounds,
            turn,
            backlog,
            slot,
            span,
            ..
        } = exec;
        let hold = turn.suspend(invocations);
        let tools = exposed.iter().map(|c| c.name.clone()).collect();
        // Each held call's span starts as its batch is parked, just before its token goes out.
        let held = Held::start(&span, exposed.iter().map(|c| c.name.as_str()), rounds);
        let parked = Suspended {
            meta: meta.clone(),
            holds,
            deadline,
            rounds: rounds + 1,
            // A durable record holds no live-execution slot while suspended.
            slot: if hold.is_durable() { None } else { slot },
            hold,
            backlog,
            history,
            suspended_at: Some(now_unix()),
            tools,
            held,
        };
        let batch = Batch {
            principal: meta.principal.clone(),
            execution_id: meta.id.clone(),
            model: meta.model.clone(),
            surface: meta.surface,
            deadline,
            tokens,
            digests,
            parked,
        };
        match self.inner.suspensions.suspend(batch).await {
            Ok(()) => {}
            Err(Refusal::Capacity(refused)) => {
                span.fail(EndReason::Capacity.as_str());
                let _ = tx
                    .send(LegEvent::Error(EngineError::SuspensionCapacity))
                    .await;
                return self
                    .end(&meta, true, EndReason::Capacity, Leftover::Batch(refused))
                    .await;
            }
            Err(Refusal::Store(withdrawn)) => {
                span.fail(EndReason::StoreUnavailable.as_str());
                let _ = tx.send(LegEvent::Error(EngineError::Store)).await;
                let left = withdrawn.map_or(Leftover::Nothing, Leftover::Batch);
                return self
                    .end(&meta, true, EndReason::StoreUnavailable, left)
                    .await;
            }
        }
        tracing::debug!(execution = %meta.id, calls = exposed.len(), "execution suspended");
        let _ = tx
            .send(LegEvent::End {
                calls: exposed,
                usage,
            })
            .await;
        span.finish("tool_calls");
    }

    /// Ends an execution: its approvals are cancelled first, then what still holds its turn
    /// or record is dropped (which interrupts an unfinished turn and returns its session).
    pub(super) async fn end(
        &self,
        meta: &ExecutionMeta,
        journaled: bool,
        reason: EndReason,
        mut left: Leftover,
    ) {
        if let Leftover::Running(exec) = &mut left {
            std::mem::replace(&mut exec.span, LegSpan::none()).fail(reason.as_str());
        }
        self.inner.approvals.cancel_execution(&meta.id).await;
        drop(left);
        // A stateless leg that simply answered is the request's own log line; every other
        // ending is worth a line of its own.
        if journaled || reason != EndReason::Completed {
            tracing::info!(execution = %meta.id, reason = reason.as_str(), "execution ended");
        } else {
            tracing::debug!(execution = %meta.id, reason = reason.as_str(), "execution ended");
        }
        self.inner.metrics.ended(reason.as_str());
        if journaled {
            self.inner
                .suspensions
                .ended(&meta.id, reason.as_str())
                .await;
        }
    }

    /// Persists a settled batch's tombstones and, unless it was claimed, ends its execution.
    /// Returns the suspension of a claimed batch.
    pub(super) async fn settled(&self, s: Settled<Suspended>) -> Option<Suspended> {
        self.inner.suspensions.persist_settled(&s).await;
        match EndReason::of_settlement(s.reason) {
            None => Some(s.parked),
            Some(end) => {
                let meta = s.parked.meta.clone();
                self.end(&meta, true, end, Leftover::Parked(s.parked)).await;
                None
            }
        }
    }
}
