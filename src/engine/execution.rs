//! An execution's state: running ([`Execution`], which owns the backend turn of its current
//! leg) or suspended ([`Suspended`], parked in the registry behind its tokens).

use std::sync::Arc;

use tokio::time::Instant;

use super::admission::Slot;
use super::ledger::Spent;
use crate::auth::grant::Groups;
use crate::backend::{BackendInfo, HeldCall, Hold, Holds, Turn};
use crate::continuation::{Batch, Digests, Parked};
use crate::store::now_unix;
use crate::telemetry::{Held, LegInfo, LegSpan, Parent};
use crate::turn::{DigestFn, EchoFn, ExposedCall, Fingerprint, Message, SurfaceId, TurnInput};

/// The identity of an execution, shared by every state it goes through.
#[derive(Debug, Clone)]
pub struct ExecutionMeta {
    /// Shared with the registry's batch, the slot and the meter while it runs and is
    /// parked (one copy each, not one per holder).
    pub id: Arc<str>,
    pub principal: Arc<str>,
    /// Its principal's groups when it started; None without any (one pointer: the meta is
    /// in every held turn's future).
    pub membership: Option<Arc<Membership>>,
    pub model: Arc<str>,
    pub surface: SurfaceId,
    pub created: u64,
    /// What it has spent so far, when its model is priced.
    pub spent: Spent,
    /// Its own spend cap besides the principal's ([`TurnInput::usd_cap`]).
    pub cap: Option<u64>,
    /// Its own narrowing of the model's approval policy ([`TurnInput::approvals`]).
    pub approvals: Option<crate::config::ApprovalPolicy>,
    /// Its root in a trace (the request that started it); empty when traces are off.
    pub trace: Parent,
}

/// The groups an execution's principal belonged to when it started.
#[derive(Debug, Default)]
pub struct Membership {
    /// What its token named.
    pub groups: Groups,
    /// The ledger ids of the group budgets its usage is pooled into
    /// ([`crate::auth::grant::pool_id`]).
    pub pools: Groups,
}

impl ExecutionMeta {
    pub fn groups(&self) -> &[String] {
        self.membership.as_deref().map_or(&[], |m| &m.groups)
    }

    pub fn pools(&self) -> Groups {
        self.membership
            .as_deref()
            .map(|m| m.pools.clone())
            .unwrap_or_default()
    }

    /// The span of the execution's leg `round` on a backend described by `info`.
    pub fn leg_span(
        &self,
        holds: Holds,
        info: &BackendInfo,
        model: &str,
        input: &TurnInput,
        round: u32,
    ) -> LegSpan {
        let leg = LegInfo {
            agent: holds == Holds::Turn,
            provider: info.provider,
            model,
            execution_id: &self.id,
            conversation: input.conversation.as_deref().unwrap_or(&self.id),
            response_id: input.response_id,
            round,
        };
        LegSpan::start(&self.trace, leg)
    }
}

/// A running execution. Owns the backend turn: dropping it interrupts the turn (if still
/// running) and frees the backend session and the principal's slot.
pub struct Execution {
    pub meta: ExecutionMeta,
    pub holds: Holds,
    pub deadline: Instant,
    pub rounds: u32,
    /// The execution has a journal row (an agent's from the start; a stateless upstream's
    /// only once it suspends, since a leg that just answers leaves nothing to recover).
    pub journaled: bool,
    pub turn: Turn,
    /// Calls the backend issued that were not exposed yet (late arrivals, one-per-leg mode).
    pub backlog: Vec<HeldCall>,
    pub slot: Option<Slot>,
    /// The span of its current leg.
    pub span: LegSpan,
}

/// A suspended execution: what the registry keeps behind a batch of tokens.
pub struct Suspended {
    pub meta: ExecutionMeta,
    pub holds: Holds,
    pub deadline: Instant,
    pub rounds: u32,
    pub hold: Hold,
    pub backlog: Vec<HeldCall>,
    /// A held turn keeps its slot; a durable record holds none.
    pub slot: Option<Slot>,
    /// What a continuation by reference needs (surfaces that keep history only; in memory,
    /// never in the store).
    /// Boxed: most parked executions keep none, and thousands may be parked.
    pub history: Option<Box<History>>,
    /// For the activity view, in memory only: when this suspension began (Unix seconds) and
    /// the names of the calls it exposed. Unknown (0, empty) for a record read back from the
    /// store. (Plain, not an `Option`, and a boxed slice, not a `Vec`: every byte here is
    /// in every parked execution.)
    pub suspended_at: u64,
    pub tools: Box<[Box<str>]>,
    /// The spans of the held calls, ended by the claim.
    pub held: Held,
}

impl Suspended {
    /// A running execution parked behind a batch of fresh `tokens`: its turn suspended on
    /// the backend's `invocations` for the `exposed` calls; with the leg's span, for the
    /// ending.
    pub fn park(
        exec: Execution,
        invocations: Vec<u64>,
        exposed: &[ExposedCall],
        history: Option<Box<History>>,
        tokens: Vec<[u8; 32]>,
        digests: Digests,
    ) -> (Batch<Suspended>, LegSpan) {
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
        // Each held call's span starts as its batch is parked, just before its token goes out.
        let held = Held::start(&span, exposed.iter().map(|c| c.name.as_str()), rounds);
        let parked = Suspended {
            holds,
            deadline,
            rounds: rounds + 1,
            // A durable record holds no live-execution slot while suspended.
            slot: if hold.is_durable() { None } else { slot },
            hold,
            backlog,
            history,
            suspended_at: now_unix(),
            tools: exposed.iter().map(|c| c.name.as_str().into()).collect(),
            held,
            meta,
        };
        let batch = Batch {
            tokens,
            digests,
            parked,
        };
        (batch, span)
    }

    /// What reinstating a claimed stateless suspension needs (its ids are all its hold, so a
    /// copy can go back behind its tokens if the forward fails); None for a held turn.
    pub fn reinstatable(&self) -> Option<Suspended> {
        let Hold::Ids(ids) = &self.hold else {
            return None;
        };
        Some(Suspended {
            meta: self.meta.clone(),
            holds: self.holds,
            deadline: self.deadline,
            rounds: self.rounds,
            hold: Hold::Ids(ids.clone()),
            backlog: self.backlog.clone(),
            slot: None,
            history: self.history.clone(),
            suspended_at: self.suspended_at,
            tools: self.tools.clone(),
            held: Held::default(),
        })
    }
}

impl Parked for Suspended {
    fn principal(&self) -> &Arc<str> {
        &self.meta.principal
    }

    fn execution_id(&self) -> &Arc<str> {
        &self.meta.id
    }

    fn model(&self) -> &Arc<str> {
        &self.meta.model
    }

    fn surface(&self) -> SurfaceId {
        self.meta.surface
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }

    fn is_alive(&self) -> bool {
        self.hold.is_alive()
    }

    fn is_durable(&self) -> bool {
        self.hold.is_durable()
    }

    fn by_reference(&self) -> bool {
        self.history.is_some()
    }

    fn spent(&self) -> u64 {
        (self.meta.spent.as_ref()).map_or(0, |s| s.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn cap(&self) -> Option<u64> {
        self.meta.cap
    }

    fn kept_bytes(&self) -> usize {
        let messages = self.history.as_ref().and_then(|h| h.messages.as_ref());
        messages.map_or(0, |m| m.iter().map(Message::kept_bytes).sum())
    }
}

/// The conversation of a suspension, for a continuation that names it by reference: the
/// digest of every message up to and including the exposed assistant message (the next
/// suspension's prefix), and for a stateless upstream, which holds nothing itself, the
/// messages (its next request).
#[derive(Debug, Clone, Default)]
pub struct History {
    pub digests: Vec<[u8; 32]>,
    pub messages: Option<Vec<Message>>,
}

/// What a leg's ending needs from the request that drives it: a suspension, and a completed
/// agent turn whose thread is kept (continuity).
pub struct LegContext {
    /// Its `prefix` once [`LegContext::digested`].
    pub fingerprint: Fingerprint,
    pub parallel: bool,
    pub echo: EchoFn,
    pub digest: DigestFn,
    /// The surface keeps a suspension's conversation (answers by reference).
    pub keeps_history: bool,
    /// The digest of every message of the leg's conversation (an agent's, or on a surface
    /// that keeps history; empty otherwise), once digested.
    pub digests: Vec<[u8; 32]>,
    /// The messages, for a stateless upstream on a surface that keeps history, or until
    /// they are digested.
    pub messages: Option<Vec<Message>>,
    /// A completed turn's thread may be kept for the conversation (not an ephemeral turn's).
    pub keep: bool,
    /// `digests` and the fingerprint's prefix are computed; a stateless leg computes them
    /// only if it suspends ([`LegContext::digest_messages`]).
    pub digested: bool,
}

impl LegContext {
    /// Takes what the leg's ending needs out of a request whose backend leg has started.
    pub fn of(input: &mut TurnInput, holds: Holds) -> LegContext {
        let keeps_history = input.surface.keeps_history();
        // An agent's thread is kept by its conversation's digests; a stateless leg digests
        // its conversation only if it suspends.
        if holds == Holds::Turn {
            input.digest_messages();
        }
        let digests = match keeps_history || holds == Holds::Turn {
            true => std::mem::take(&mut input.message_digests),
            false => Vec::new(),
        };
        let messages = holds == Holds::Nothing && (keeps_history || !input.digested);
        LegContext {
            fingerprint: input.fingerprint,
            parallel: input.parallel_tool_calls,
            echo: input.echo,
            digest: input.digest,
            keeps_history,
            digests,
            messages: messages.then(|| std::mem::take(&mut input.messages)),
            keep: !input.ephemeral,
            digested: input.digested,
        }
    }

    /// Digests the leg's conversation, once: its messages are kept after only where the
    /// surface keeps history.
    pub fn digest_messages(&mut self) {
        if self.digested {
            return;
        }
        let messages = self.messages.as_deref().unwrap_or_default();
        let (each, all) = crate::turn::digests(messages, self.digest);
        self.fingerprint.prefix = all;
        if self.keeps_history {
            self.digests = each;
        } else {
            self.messages = None;
        }
        self.digested = true;
    }
}
