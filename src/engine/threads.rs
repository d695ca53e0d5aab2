//! The threads: idle backend threads kept for a conversation's next turn (the bounded set
//! in `continuity.rs`), and the conversation logic around them: finding the kept thread a
//! fresh request continues (by the conversation it sends, or by reference), and keeping a
//! completed turn's thread. This component owns the set; nothing else touches it.

use std::sync::Arc;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::activity::{sees, unix_at, ThreadView};
use super::continuity::{Binding, Continuity, Entry, Miss, RefMiss};
use super::execution::{ExecutionMeta, LegContext};
use super::{ContinuationError, EngineError};
use crate::auth::Principal;
use crate::backend::{BackendError, Holds, Kept, Turn};
use crate::config::Config;
use crate::continuation::canonical::digest_of_digests;
use crate::metrics::Metrics;
use crate::store::now_unix;
use crate::turn::{Message, Role, TurnInput};

pub(super) struct Threads {
    continuity: Continuity,
    metrics: Arc<Metrics>,
}

impl Threads {
    pub fn new(metrics: Arc<Metrics>) -> Threads {
        Threads {
            continuity: Continuity::default(),
            metrics,
        }
    }

    /// The kept thread this fresh request continues, if any. A request naming a completed
    /// response (`follows`) must find it: unknown, released or another principal's is 404,
    /// another model, tool set, tool choice or effort is 400 (nothing is taken); its input
    /// is then spliced after the kept conversation's digests. Otherwise a request that is a
    /// kept conversation plus new user messages continues it, and anything else runs on a
    /// fresh thread (counted as a miss if it had an answer in it).
    pub fn kept(
        &self,
        cfg: &Config,
        principal: &str,
        model: &str,
        holds: Holds,
        input: &mut TurnInput,
    ) -> Result<Option<Kept>, EngineError> {
        let enabled = cfg.continuity.enabled && holds == Holds::Turn && !input.ephemeral;
        if enabled {
            // Kept conversations are found by digest.
            input.digest_messages();
        }
        let metrics = &self.metrics;
        let binding = Binding::new(principal, model, input.surface, &input.fingerprint);
        if let Some(execution) = input.follows.take() {
            let taken = match enabled {
                true => self.continuity.take_execution(&execution, &binding),
                false => Err(RefMiss::NotFound),
            };
            let entry = match taken {
                Ok(e) => e,
                Err(RefMiss::NotFound) => {
                    metrics.continuity("miss", "unknown");
                    return Err(ContinuationError::ResponseNotFound.into());
                }
                Err(RefMiss::Mismatch(what)) => {
                    metrics.continuity("miss", "binding");
                    return Err(ContinuationError::Mismatch(format!(
                        "the {what} differs from the previous response"
                    ))
                    .into());
                }
            };
            if input.messages.iter().any(|m| m.role != Role::User) {
                // Put back what a malformed request would otherwise consume.
                self.keep_entry(cfg, entry);
                return Err(EngineError::Backend(BackendError::Invalid {
                    message: "after a completed response, `input` must hold only new user messages"
                        .into(),
                    param: crate::error::Param::Conversation,
                }));
            }
            metrics.continuity("hit", "");
            let mut digests = entry.digests.clone();
            digests.append(&mut input.message_digests);
            input.fingerprint.prefix = digest_of_digests(&digests);
            input.message_digests = digests;
            return Ok(Some(Kept {
                thread: entry.into_idle(),
                from: 0,
            }));
        }
        // A follow-up turn: some answer in the conversation.
        let Some(answer) = input
            .messages
            .iter()
            .rposition(|m| m.role == Role::Assistant)
        else {
            return Ok(None);
        };
        if !enabled {
            return Ok(None);
        }
        let new = &input.messages[answer + 1..];
        if new.is_empty() || new.iter().any(|m| m.role != Role::User) {
            metrics.continuity("miss", Miss::Input.as_str());
            return Ok(None);
        }
        let conversation = digest_of_digests(&input.message_digests[..=answer]);
        match self.continuity.take(&conversation, &binding) {
            Ok(entry) => {
                metrics.continuity("hit", "");
                tracing::debug!(execution = %entry.execution_id, "continuing a kept backend thread");
                Ok(Some(Kept {
                    thread: entry.into_idle(),
                    from: answer + 1,
                }))
            }
            Err(miss) => {
                metrics.continuity("miss", miss.as_str());
                Ok(None)
            }
        }
    }

    /// After a completed turn: keeps its thread idle under the conversation as the client
    /// will send it back (the leg's messages and the answer `text`), within the bounds.
    pub fn keep(
        &self,
        cfg: &Config,
        meta: &ExecutionMeta,
        holds: Holds,
        ctx: LegContext,
        text: &str,
        turn: Turn,
    ) {
        if !cfg.continuity.enabled || holds != Holds::Turn || !ctx.keep {
            return;
        }
        let Some(idle) = turn.keep() else { return };
        let answer = Message::text(Role::Assistant, text);
        let mut digests = ctx.digests;
        digests.push((ctx.digest)(&answer));
        let entry = Entry::new(
            digest_of_digests(&digests),
            Binding::new(&meta.principal, &meta.model, meta.surface, &ctx.fingerprint),
            meta.id.to_string(),
            digests,
            idle,
            Instant::now() + cfg.continuity.idle_ttl,
        );
        self.keep_entry(cfg, entry);
    }

    fn keep_entry(&self, cfg: &Config, entry: Entry) {
        for (released, why) in self.continuity.keep(entry, &cfg.continuity) {
            self.metrics.continuity("released", why);
            drop(released);
        }
    }

    /// Releases the thread kept after this principal's execution, if it still is.
    pub fn release_execution(&self, principal: &str, execution_id: &str) {
        if let Some(e) = self.continuity.remove_execution(execution_id, principal) {
            self.metrics.continuity("released", "owner");
            drop(e);
        }
    }

    /// Releases the kept threads past their idle TTL.
    pub fn release_idle(&self, now: Instant) {
        for e in self.continuity.expire(now) {
            self.metrics.continuity("released", "ttl");
            drop(e);
        }
    }

    /// Idle threads kept.
    pub fn len(&self) -> usize {
        self.continuity.len()
    }

    /// Notified when a thread is kept (the earliest expiry may be earlier).
    pub fn changed(&self) -> &Notify {
        self.continuity.changed()
    }

    pub fn next_expiry(&self) -> Option<Instant> {
        self.continuity.next_expiry()
    }

    /// Releases every kept thread (shutdown).
    pub fn clear(&self) {
        drop(self.continuity.clear());
    }

    /// The principal's idle threads (everyone's for an approver), most recently kept first.
    pub fn views(&self, who: &Principal) -> Vec<ThreadView> {
        let (now, unix) = (Instant::now(), now_unix());
        self.continuity.snapshot(|e| {
            sees(who, &e.binding.principal).then(|| ThreadView {
                execution_id: e.execution_id.clone(),
                client: e.binding.principal.clone(),
                model: e.binding.model.clone(),
                surface: e.binding.surface.as_str(),
                messages: e.digests.len(),
                kept_at: e.kept_at,
                expires_at: unix_at(e.expires, now, unix),
                usable: e.idle.usable(),
            })
        })
    }
}

#[cfg(test)]
mod tests;
