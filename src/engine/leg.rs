//! Legs: one task per leg turns the backend's [`TurnEvent`]s into [`LegEvent`]s on a bounded
//! channel that the surface frames. A leg ends with the answer, an error, or a suspension
//! (`suspension.rs`), whatever the backend kind. Tool calls of an agent are collected for
//! `batch_debounce_ms` before the flush, unless the agent says its batch is complete
//! (`TurnEvent::Yield`, as a stateless upstream always does).

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::ending::EndReason;
use super::execution::{Execution, LegContext};
use super::{Engine, EngineError};
use crate::backend::{HeldCall, Holds, TurnEvent};
use crate::turn::{ExposedCall, Usage};

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
        let stopping = self.inner.shutdown.clone();
        let fail = |exec: Execution, e: EngineError, reason: EndReason| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(LegEvent::Error(e)).await;
                self.end(&exec.meta.clone(), exec.journaled, reason, exec);
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
                    return self.end(&meta, exec.journaled, EndReason::Cancelled, exec);
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
                Some(TurnEvent::Usage(u)) => usage.add(u),
                Some(TurnEvent::Truncated) => {
                    let _ = tx.send(LegEvent::Truncated).await;
                }
                Some(TurnEvent::Approval(ask)) => self.on_approval(&exec.meta, *ask, &tx).await,
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
                        ..
                    } = exec;
                    self.keep_thread(&meta, holds, ctx, &text, turn);
                    let _ = tx
                        .send(LegEvent::End {
                            calls: Vec::new(),
                            usage,
                        })
                        .await;
                    return self.end(&meta, journaled, EndReason::Completed, slot);
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
}
