//! The one suspension path, for both backend kinds: bound the rounds, mint a token per
//! exposed call, digest the echo with the surface's projection, park the turn (or keep only a
//! stateless upstream's ids), register the batch in memory within the bounds, record it
//! durably, and only then send the tokens. Any failure on the way interrupts the held calls
//! and exposes no token.

use std::collections::VecDeque;

use tokio::sync::mpsc;

use super::ending::EndReason;
use super::execution::{Execution, LegContext, Suspended};
use super::leg::LegEvent;
use super::{Engine, EngineError};
use crate::backend::{HeldCall, Hold};
use crate::continuation::{token, Batch, Digests};
use crate::store::{now_unix, now_unix_ms, SuspensionRecord};
use crate::turn::{Call, ExposedCall, Message, Role, Usage};

impl Engine {
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
                self.end(&exec.meta.clone(), exec.journaled, reason, exec);
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
            return self.end(&meta, exec.journaled, EndReason::Cancelled, exec);
        }
        if !exec.journaled {
            let m = &exec.meta;
            if let Err(e) = self
                .inner
                .store
                .execution_started(&m.id, &m.principal, &m.model)
            {
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
            let mut h = super::execution::History {
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
            ..
        } = exec;
        let hold = turn.suspend(invocations);
        let tools = exposed.iter().map(|c| c.name.clone()).collect();
        let ids = match &hold {
            Hold::Ids(ids) => Some(ids.clone()),
            Hold::Live { .. } => None,
        };
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
        };
        let batch = Batch {
            principal: meta.principal.clone(),
            execution_id: meta.id.clone(),
            model: meta.model.clone(),
            surface: meta.surface,
            deadline,
            tokens: tokens.clone(),
            digests,
            parked,
        };
        let id = match self.inner.registry.register(batch) {
            Ok(id) => id,
            Err(refused) => {
                let _ = tx
                    .send(LegEvent::Error(EngineError::SuspensionCapacity))
                    .await;
                return self.end(&meta, true, EndReason::Capacity, refused);
            }
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let record = SuspensionRecord {
            execution_id: &meta.id,
            principal: &meta.principal,
            model: &meta.model,
            surface: meta.surface,
            deadline_ms: now_unix_ms() + left.as_millis() as u64,
            digests: &digests,
            tokens: &tokens,
            ids: ids.as_deref(),
            rounds: rounds + 1,
            created_at: meta.created,
        };
        if let Err(e) = self.inner.store.suspension_recorded(&record) {
            tracing::error!(execution = %meta.id, error = %e, "could not record the suspension; no token exposed");
            // Nobody can have claimed the batch: its tokens were never exposed.
            let withdrawn = self.inner.registry.withdraw(id);
            let _ = tx.send(LegEvent::Error(EngineError::Store)).await;
            return self.end(&meta, true, EndReason::StoreUnavailable, withdrawn);
        }
        tracing::debug!(execution = %meta.id, calls = exposed.len(), "execution suspended");
        let _ = tx
            .send(LegEvent::End {
                calls: exposed,
                usage,
            })
            .await;
    }

    /// Puts back the durable suspensions a previous process left pending.
    pub(super) fn restore_durable(&self) -> Result<(), crate::store::StoreError> {
        for s in self.inner.store.durable_suspensions()? {
            self.inner.registry.restore(durable_batch(s));
        }
        Ok(())
    }
}

/// A durable (stateless upstream) record from the store as a registry batch, its deadline
/// carried over from wall-clock time.
pub(super) fn durable_batch(s: crate::store::StoredSuspension) -> Batch<Suspended> {
    let left = std::time::Duration::from_millis(s.deadline_ms.saturating_sub(now_unix_ms()));
    let deadline = tokio::time::Instant::now() + left;
    let meta = super::execution::ExecutionMeta {
        id: s.execution_id.clone(),
        principal: s.principal.clone(),
        model: s.model.clone(),
        surface: s.surface,
        created: s.created_at,
    };
    Batch {
        principal: s.principal,
        execution_id: s.execution_id,
        model: s.model,
        surface: s.surface,
        deadline,
        tokens: s.tokens,
        digests: s.digests,
        parked: Suspended {
            meta,
            holds: crate::backend::Holds::Nothing,
            deadline,
            rounds: s.rounds,
            hold: Hold::Ids(s.ids),
            backlog: VecDeque::new(),
            slot: None,
            history: None,
            suspended_at: None,
            tools: Vec::new(),
        },
    }
}
