//! What a change announces: the changes the outbox may report, the [`Announce`] hook that
//! turns one into rows (the notifier implements it), and the store's side of it: writing a
//! change's rows in the caller's transaction and waking the delivery after commit.
//!
//! The store does not know what subscribes: an [`Announce`] set once at start turns each
//! change into rows. Without one (no endpoint configured) no write does any outbox work, and
//! a store call that may announce has a future no larger than without it.

use std::future::{Future, Ready};
use std::sync::Arc;

use futures::future::{BoxFuture, Either};
use futures::FutureExt;

use super::db::{vals, Tx};
use super::outbox::write;
use super::{ApprovalRecord, Lifecycle, Store, StoreError};

/// A change the outbox may report.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    ApprovalPending(&'a ApprovalRecord),
    /// Settled in any way (a human, an expiry, a cancellation).
    ApprovalDecided(&'a ApprovalRecord),
    /// A held turn's calls were exposed to the client.
    Held(Held<'a>),
    /// An execution ended.
    Ended(Ended<'a>),
    /// A Managed Agents session changed (`events`: the webhook events it makes, in
    /// Anthropic's names).
    Session {
        session_id: &'a str,
        principal: &'a str,
        events: &'a [&'static str],
    },
    /// A principal's usage crossed a threshold of one of its caps.
    Budget(Crossed<'a>),
}

/// A threshold of a principal's cap that a usage write crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crossed<'a> {
    pub principal: &'a str,
    /// `usd_per_day`, `usd_per_month` or `tokens_per_day`.
    pub cap: &'static str,
    /// Of the limit: 75, 95 or 100.
    pub percent: u8,
    /// In nano-USD, or tokens.
    pub limit: u64,
    pub used: u64,
    /// The first day of the cap's window (an event is sent once per window, threshold and
    /// limit).
    pub window: u32,
    /// Unix seconds when the window starts again.
    pub resets_at: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    pub execution_id: &'a str,
    pub principal: &'a str,
    pub model: &'a str,
    pub surface: &'a str,
    pub calls: usize,
    pub deadline_ms: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct Ended<'a> {
    pub execution_id: &'a str,
    pub principal: &'a str,
    pub model: &'a str,
    pub reason: &'a str,
}

/// Which kind of change (to ask whether anything subscribes before reading what a notice
/// needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Approval,
    Held,
    Ended,
    Session,
    Budget,
}

/// An outbox row to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The `webhook-id` of every attempt (`msg_…`).
    pub id: String,
    pub endpoint: String,
    pub event: String,
    pub principal: String,
    pub body: String,
    pub at_ms: u64,
    /// The decision links the body carries, stored with it.
    pub links: Vec<LinkRow>,
}

/// A single-use decision link: the digest of its token, bound to one approval, one decision
/// and an expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkRow {
    pub digest: [u8; 32],
    pub approval_id: String,
    /// `approve` or `deny`.
    pub decision: &'static str,
    pub endpoint: String,
    /// Unix seconds.
    pub expires_at: u64,
    /// Unix seconds, once used.
    pub used_at: Option<u64>,
}

/// The writes of a change's rows: none, or boxed.
pub(super) type Announced<'t> =
    Either<Ready<Result<(), StoreError>>, BoxFuture<'t, Result<(), StoreError>>>;

/// Turns changes into outbox rows (the notifier).
pub trait Announce: Send + Sync {
    fn wants(&self, kind: ChangeKind) -> bool;
    fn notices(&self, change: &Change<'_>) -> Vec<Notice>;
    /// A transaction that may have written rows committed: they can be delivered.
    fn committed(&self);
}

impl Store {
    /// Sets what turns changes into outbox rows (once, at start; a second call is ignored).
    pub fn announce_with(&self, a: Arc<dyn Announce>) {
        let _ = self.announce.set(a);
    }

    /// Whether a change of `kind` may write outbox rows.
    pub fn announces(&self, kind: ChangeKind) -> bool {
        self.announce.get().is_some_and(|a| a.wants(kind))
    }

    /// Writes the rows `change` makes, in the caller's transaction. The rows are made before
    /// the returned future runs and their writes are boxed, so a store call that may announce
    /// holds neither the change nor the writes across an await: with nothing subscribed its
    /// future (and every request's that contains it) is no larger. Bind the future with `let`
    /// before awaiting it, so that a temporary change is dropped first.
    pub(super) fn announce<'t>(&self, t: &'t mut Tx<'_>, change: &Change<'_>) -> Announced<'t> {
        match self.announce.get().map(|a| a.notices(change)) {
            Some(notices) if !notices.is_empty() => {
                Either::Right(Box::pin(async move { write(t, &notices).await }))
            }
            _ => Either::Left(std::future::ready(Ok(()))),
        }
    }

    /// One transaction, as `Db::tx`, after which the rows it announced can be delivered.
    pub(super) fn announcing<'s, T: 's>(
        &'s self,
        f: impl AsyncFnOnce(&mut Tx<'_>) -> Result<T, StoreError> + 's,
    ) -> impl Future<Output = Result<T, StoreError>> + 's {
        self.db.tx(f).inspect(move |done| {
            if let (Ok(_), Some(a)) = (done, self.announce.get()) {
                a.committed();
            }
        })
    }
}

/// The webhook events a session log entry makes: its status changes, in Anthropic's names.
pub(super) fn session_events(body: &str) -> &'static [&'static str] {
    #[derive(serde::Deserialize)]
    struct Entry<'a> {
        #[serde(borrow, rename = "type")]
        kind: &'a str,
        #[serde(default)]
        stop_reason: Option<StopReason<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct StopReason<'a> {
        #[serde(borrow, rename = "type")]
        kind: &'a str,
    }
    let Ok(e) = serde_json::from_str::<Entry<'_>>(body) else {
        return &[];
    };
    match (e.kind, e.stop_reason.map(|s| s.kind)) {
        ("session.status_running", _) => &["session.running"],
        ("session.status_idle", Some("requires_action")) => &["session.requires_action"],
        ("session.status_idle", Some("budget_reached")) => {
            &["session.budget_reached", "session.idled"]
        }
        ("session.status_idle", _) => &["session.idled"],
        ("session.status_terminated", _) => &["session.status_terminated"],
        _ => &[],
    }
}

impl Store {
    /// The outbox rows of a session's change, in its transaction.
    pub(super) async fn announce_session(
        &self,
        t: &mut Tx<'_>,
        session_id: &str,
        principal: &str,
        events: &[&'static str],
    ) -> Result<(), StoreError> {
        if events.is_empty() || !self.announces(ChangeKind::Session) {
            return Ok(());
        }
        let change = Change::Session {
            session_id,
            principal,
            events,
        };
        let write = self.announce(t, &change);
        write.await
    }
}

impl Store {
    /// The outbox rows of the ends among `rows`, in their transaction.
    pub(super) async fn announce_ends(
        &self,
        t: &mut Tx<'_>,
        rows: &[Lifecycle],
    ) -> Result<(), StoreError> {
        for row in rows {
            if let Lifecycle::Ended {
                execution_id,
                reason,
                ..
            } = row
            {
                Box::pin(self.announce_end(t, execution_id, reason)).await?;
            }
        }
        Ok(())
    }

    pub(super) async fn announce_end(
        &self,
        t: &mut Tx<'_>,
        execution_id: &str,
        reason: &str,
    ) -> Result<(), StoreError> {
        let rows = t
            .rows(
                "SELECT principal, model FROM executions WHERE execution_id = ?1",
                vals![execution_id],
            )
            .await?;
        let Some(r) = rows.first() else {
            return Ok(());
        };
        let (principal, model) = (r.t(0)?, r.t(1)?);
        let end = Ended {
            execution_id,
            principal: &principal,
            model: &model,
            reason,
        };
        let write = self.announce(t, &Change::Ended(end));
        write.await
    }
}
