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
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::approval_policy;
use super::ending::{EndReason, Leftover};
use super::execution::{Execution, ExecutionMeta, History, LegContext, Suspended};
use super::suspensions::Refusal;
use super::{Engine, EngineError};
use crate::backend::{HeldCall, Holds, TurnEvent};
use crate::budget::{Budget, Exceeded};
use crate::continuation::{token, Digests, Settled};
use crate::telemetry::LegSpan;
use crate::turn::{Call, ExposedCall, Message, Role, Usage};

/// What a leg sends to its surface, in order: deltas, then exactly one `End` or `Error`.
#[derive(Debug)]
pub enum LegEvent {
    Delta(String),
    /// Reasoning the backend shows; the surface carries it in its own form.
    Reasoning(String),
    /// The upstream's own Chat Completions chunk (or whole body), tool calls removed; only on
    /// a leg whose `native` flag is set, for a surface that relays that wire.
    Relayed(crate::turn::Relayed),
    /// A side effect of the backend's own, as the approval policy answered it (a pending
    /// approval is something a human watching the stream should know).
    Approval(super::ApprovalNotice),
    /// A tool use of the backend's own ended (one its approval notice named).
    ToolEnded(crate::backend::ToolEnded),
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
    pub execution_id: Arc<str>,
    pub created: u64,
    pub model: Arc<str>,
    /// Tool rounds of the execution before this leg (0 for its first leg).
    pub round: u32,
    /// The events include the upstream's own chunks (`LegEvent::Relayed`).
    pub native: bool,
    /// What the execution has spent so far (nano-USD), when its model is priced.
    pub spent: super::Spent,
    /// When the execution ends at the latest (a call it holds then expires).
    pub deadline: Instant,
    pub events: mpsc::Receiver<LegEvent>,
}

/// Sends `ev` to the leg's surface: at once when the channel has room (the common case),
/// else when it has. A closed channel (the client left) drops it; the leg sees that next.
async fn emit(tx: &mpsc::Sender<LegEvent>, ev: LegEvent) {
    if let Err(mpsc::error::TrySendError::Full(ev)) = tx.try_send(ev) {
        let _ = tx.send(ev).await;
    }
}

/// The most events a leg takes in a row without looking at its deadline, its client and
/// the gateway's shutdown.
const BURST: u32 = 32;

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What a leg has gathered of its turn so far.
struct Gathered {
    text: String,
    usage: Usage,
    calls: Vec<HeldCall>,
    /// When the calls collected so far go out as a batch.
    flush_at: Option<Instant>,
    budget: Option<Budget>,
    crossed: Option<Exceeded>,
}

/// What ends the leg's loop.
enum Next {
    Suspend,
    Complete,
    Stop(Stop),
}

/// Why a running execution ends early.
enum Stop {
    /// The client hears the error; the execution ends for the reason.
    Fail(EngineError, EndReason),
    /// The client went away: nobody to tell.
    Gone,
}

/// A batch's calls with their fresh tokens: what the client sees, the tokens' digests, and
/// the backend's invocation numbers, in one order.
struct Minted {
    exposed: Vec<ExposedCall>,
    tokens: Vec<[u8; 32]>,
    invocations: Vec<u64>,
}

impl Minted {
    fn new(calls: Vec<HeldCall>) -> Minted {
        let mut m = Minted {
            exposed: Vec::with_capacity(calls.len()),
            tokens: Vec::with_capacity(calls.len()),
            invocations: Vec::with_capacity(calls.len()),
        };
        for call in calls {
            let (tok, digest) = token::new_token();
            m.tokens.push(digest);
            m.invocations.push(call.invocation);
            m.exposed.push(ExposedCall {
                id: tok,
                name: call.name,
                arguments: call.arguments,
            });
        }
        m
    }
}

/// The assistant message of a suspended leg: its text and the calls it exposed.
fn assistant(text: String, exposed: &[ExposedCall]) -> Message {
    Message {
        role: Role::Assistant,
        text,
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
    }
}

impl Engine {
    /// Starts the leg task and hands back its stream.
    pub(super) fn drive(&self, exec: Execution, ctx: LegContext) -> Leg {
        let (tx, rx) = mpsc::channel(64);
        let leg = Leg {
            execution_id: exec.meta.id.clone(),
            spent: exec.meta.spent.clone(),
            created: exec.meta.created,
            model: exec.meta.model.clone(),
            round: exec.rounds,
            native: exec.turn.native,
            deadline: exec.deadline,
            events: rx,
        };
        let engine = self.clone();
        // Boxed: the task holds a pointer, not the leg's state machine, which would be copied
        // into the task and again at each change of its stage.
        let run = Box::pin(async move { engine.run_leg(exec, ctx, tx).await });
        self.inner.tracker.spawn(run);
        leg
    }

    async fn run_leg(&self, mut exec: Execution, ctx: LegContext, tx: mpsc::Sender<LegEvent>) {
        let debounce = self.config().continuations.batch_debounce;
        let calls: Vec<HeldCall> = exec.backlog.drain(..).collect();
        let mut got = Gathered {
            flush_at: (!calls.is_empty()).then(|| Instant::now() + debounce),
            calls,
            // Sized for a short answer: grown once, if at all.
            text: String::with_capacity(256),
            usage: Usage::default(),
            // The execution's spend crossed its per-execution cap at a report of this leg:
            // its next model request (the next report) stops it. The cap is read once per
            // leg, and only for a priced execution.
            budget: (exec.meta.spent.is_some())
                .then(|| {
                    self.config()
                        .execution_budget(&exec.meta.principal, exec.meta.groups())
                })
                .map(|b| b.capped(exec.meta.cap))
                .filter(|b| b.usd_per_execution.is_some()),
            crossed: None,
        };
        // Made once for the leg, not at each event: a timer registered, and a waiter.
        let shutdown = self.inner.shutdown.clone();
        let mut stopping = std::pin::pin!(shutdown.cancelled());
        let mut expired = std::pin::pin!(tokio::time::sleep_until(exec.deadline));
        let next = {
            // Made once too: a fresh waiter at each event registered and dropped one each time.
            let mut gone = std::pin::pin!(tx.closed());
            let mut burst = 0;
            loop {
                // The events the backend already has ready are taken a burst at a time (at
                // most BURST) without the leg's other checks, which come first after it.
                let ready = match burst < BURST {
                    true => exec.turn.ready_event().await,
                    false => None,
                };
                if let Some(ev) = ready {
                    burst += 1;
                    match self.on_event(&mut exec, &mut got, ev, debounce, &tx).await {
                        Some(next) => break next,
                        None => continue,
                    }
                }
                burst = 0;
                let next = tokio::select! {
                    biased;
                    _ = &mut stopping => Some(Next::Stop(Stop::Fail(EngineError::ShuttingDown, EndReason::Cancelled))),
                    _ = &mut gone => {
                        tracing::info!(execution = %exec.meta.id, "client went away mid-leg; interrupting the turn");
                        Some(Next::Stop(Stop::Gone))
                    }
                    _ = &mut expired => Some(Next::Stop(Stop::Fail(EngineError::Deadline, EndReason::Expired))),
                    _ = sleep_until_opt(got.flush_at) => Some(Next::Suspend),
                    ev = exec.turn.next_event() => self.on_event(&mut exec, &mut got, ev, debounce, &tx).await,
                };
                if let Some(next) = next {
                    break next;
                }
            }
        };
        match next {
            Next::Suspend => {
                let Gathered {
                    calls, text, usage, ..
                } = got;
                let suspend = self.suspend(exec, ctx, calls, text, usage, tx);
                Box::pin(suspend).await
            }
            Next::Complete => Box::pin(self.complete(exec, ctx, got, tx)).await,
            Next::Stop(stop) => Box::pin(self.stop(exec, stop, &tx)).await,
        }
    }

    /// What one backend event does to the leg: None while it goes on.
    async fn on_event(
        &self,
        exec: &mut Execution,
        got: &mut Gathered,
        event: Option<TurnEvent>,
        debounce: std::time::Duration,
        tx: &mpsc::Sender<LegEvent>,
    ) -> Option<Next> {
        let fail = |e, reason| Some(Next::Stop(Stop::Fail(e, reason)));
        match event {
            // A native leg's surface relays the upstream's own chunks, which carry the text.
            Some(TurnEvent::Delta(d)) => {
                got.text.push_str(&d);
                if !exec.turn.native {
                    emit(tx, LegEvent::Delta(d)).await;
                }
            }
            Some(TurnEvent::Reasoning(r)) if !exec.turn.native => {
                emit(tx, LegEvent::Reasoning(r)).await;
            }
            Some(TurnEvent::Reasoning(_)) => {}
            Some(TurnEvent::Relayed { chunk, text }) => {
                got.text.push_str(&text);
                emit(tx, LegEvent::Relayed(chunk)).await;
            }
            Some(TurnEvent::ToolCall(call)) => {
                got.calls.push(call);
                if exec.holds == Holds::Turn {
                    got.flush_at
                        .get_or_insert_with(|| Instant::now() + debounce);
                }
            }
            Some(TurnEvent::Usage(u)) => {
                got.usage.add(u);
                exec.span.usage(u);
                if let Some(exceeded) = got.crossed {
                    tracing::info!(execution = %exec.meta.id, "per-execution spend cap reached; turn interrupted");
                    let e = self.inner.budgets.stopped(exceeded);
                    return fail(e, EndReason::BudgetExceeded);
                }
                if let (Some(b), Some(spent)) = (&got.budget, &exec.meta.spent) {
                    got.crossed = b.execution_reached(spent.load(Ordering::Relaxed));
                }
            }
            Some(TurnEvent::Truncated) => {
                emit(tx, LegEvent::Truncated).await;
            }
            Some(TurnEvent::ToolEnded(t)) => {
                emit(tx, LegEvent::ToolEnded(t)).await;
            }
            Some(TurnEvent::Approval(ask)) => {
                let (cfg, i) = (self.config(), &self.inner);
                let (at, meta) = (exec.span.parent(), &exec.meta);
                let apply = approval_policy::apply(&cfg, &i.store, &i.approvals, meta, *ask, &at);
                let notice = Box::pin(apply).await;
                if let Some(n) = notice {
                    emit(tx, LegEvent::Approval(n)).await;
                }
            }
            Some(TurnEvent::Yield) if !got.calls.is_empty() => return Some(Next::Suspend),
            // An agent's batch already went out with the debounce: its turn goes on.
            Some(TurnEvent::Yield) if exec.holds == Holds::Turn => {}
            Some(TurnEvent::Completed | TurnEvent::Yield) => return Some(Next::Complete),
            Some(TurnEvent::Failed(detail)) => {
                tracing::warn!(execution = %exec.meta.id, detail_len = detail.len(), "backend turn failed");
                return fail(EngineError::TurnFailed, EndReason::Failed);
            }
            Some(TurnEvent::TimedOut) => {
                tracing::warn!(execution = %exec.meta.id, "backend timed out mid-leg");
                return fail(EngineError::TurnTimedOut, EndReason::Failed);
            }
            Some(TurnEvent::Interrupted) => {
                return fail(EngineError::TurnFailed, EndReason::Interrupted)
            }
            Some(TurnEvent::Lost(why)) => {
                tracing::warn!(execution = %exec.meta.id, %why, "backend lost mid-leg");
                return fail(EngineError::TurnFailed, EndReason::Lost);
            }
            None => return fail(EngineError::TurnFailed, EndReason::Lost),
        }
        None
    }

    /// The turn completed: its thread is kept before the client learns the answer is
    /// complete (so its next request finds it), then the leg ends with `stop`.
    async fn complete(
        &self,
        exec: Execution,
        ctx: LegContext,
        got: Gathered,
        tx: mpsc::Sender<LegEvent>,
    ) {
        let Execution {
            meta,
            holds,
            journaled,
            turn,
            slot,
            span,
            ..
        } = exec;
        (self.inner.threads).keep(&self.config(), &meta, holds, ctx, &got.text, turn);
        let end = LegEvent::End {
            calls: Vec::new(),
            usage: got.usage,
        };
        emit(&tx, end).await;
        span.finish("stop");
        self.end(&meta, journaled, EndReason::Completed, Leftover::Slot(slot))
            .await;
    }

    /// Ends a running execution early: the client hears the error (unless it is gone).
    async fn stop(&self, exec: Execution, stop: Stop, tx: &mpsc::Sender<LegEvent>) {
        let reason = match stop {
            Stop::Fail(e, reason) => {
                emit(tx, LegEvent::Error(e)).await;
                reason
            }
            Stop::Gone => EndReason::Cancelled,
        };
        let meta = exec.meta.clone();
        self.end(&meta, exec.journaled, reason, Leftover::Running(exec))
            .await;
    }

    /// Parks the execution behind fresh tokens and ends the leg with `tool_calls`: the round
    /// bounded and the execution journaled, a token minted per exposed call, the echo digested
    /// and the history extended, the turn parked, the batch registered; only then do the
    /// tokens go out.
    pub(super) async fn suspend(
        &self,
        mut exec: Execution,
        ctx: LegContext,
        mut calls: Vec<HeldCall>,
        text: String,
        usage: Usage,
        tx: mpsc::Sender<LegEvent>,
    ) {
        if let Err(stop) = self.may_suspend(&mut exec, &tx).await {
            return self.stop(exec, stop, &tx).await;
        }
        if !ctx.parallel && calls.len() > 1 {
            exec.backlog.extend(calls.drain(1..));
        }
        let minted = Minted::new(calls);
        // Held as long as the batch is: no spare room (the leg sized it for a short answer).
        let mut text = text;
        text.shrink_to_fit();
        let mut ctx = ctx;
        ctx.digest_messages();
        let digests = Digests {
            tools: ctx.fingerprint.tools,
            tool_choice: ctx.fingerprint.tool_choice,
            prefix: ctx.fingerprint.prefix,
            echo: (ctx.echo)(&text, &minted.exposed),
        };
        let history = ctx.keeps_history.then(|| {
            let mut h = History {
                digests: ctx.digests,
                messages: ctx.messages,
            };
            let assistant = assistant(text, &minted.exposed);
            h.digests.push((ctx.digest)(&assistant));
            if let Some(m) = h.messages.as_mut() {
                m.push(assistant);
            }
            Box::new(h)
        });
        let Minted {
            exposed,
            tokens,
            invocations,
        } = minted;
        let (batch, span) = Suspended::park(exec, invocations, &exposed, history, tokens, digests);
        let (meta, calls) = (batch.parked.meta.clone(), exposed.len());
        if let Err(refused) = self.inner.suspensions.suspend(batch).await {
            let (error, reason, left) = match refused {
                Refusal::Capacity(b) => (
                    EngineError::SuspensionCapacity,
                    EndReason::Capacity,
                    Leftover::Batch(b),
                ),
                Refusal::Store(withdrawn) => (
                    EngineError::Store,
                    EndReason::StoreUnavailable,
                    withdrawn.map_or(Leftover::Nothing, Leftover::Batch),
                ),
            };
            span.fail(reason.as_str());
            emit(&tx, LegEvent::Error(error)).await;
            return self.end(&meta, true, reason, left).await;
        }
        tracing::debug!(execution = %meta.id, calls, "execution suspended");
        let _ = tx
            .send(LegEvent::End {
                calls: exposed,
                usage,
            })
            .await;
        span.finish("tool_calls");
    }

    /// Whether the execution may suspend once more: within its rounds, its client still
    /// there, and its start journaled (so no token goes out that the store cannot answer).
    async fn may_suspend(
        &self,
        exec: &mut Execution,
        tx: &mpsc::Sender<LegEvent>,
    ) -> Result<(), Stop> {
        let max_rounds = self.config().continuations.max_rounds;
        if exec.rounds >= max_rounds {
            let e = EngineError::MaxRounds(max_rounds);
            return Err(Stop::Fail(e, EndReason::MaxRounds));
        }
        if tx.is_closed() {
            return Err(Stop::Gone);
        }
        if !exec.journaled {
            let m = &exec.meta;
            if let Err(e) = self.inner.suspensions.started_now(m).await {
                tracing::error!(execution = %m.id, error = %e, "store unavailable; no token exposed");
                return Err(Stop::Fail(EngineError::Store, EndReason::StoreUnavailable));
            }
            exec.journaled = true;
        }
        Ok(())
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
        // Boxed where taken: a store write's future would otherwise be in every leg's.
        let approvals = &self.inner.approvals;
        if approvals.pending_for(&meta.id) {
            Box::pin(approvals.cancel_execution(&meta.id)).await;
        }
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
            let ended = self.inner.suspensions.ended(&meta.id, reason.as_str());
            Box::pin(ended).await;
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
