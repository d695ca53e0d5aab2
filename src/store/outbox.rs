//! The notification outbox: one row per (event, endpoint), written in the transaction of the
//! change it reports, delivered after commit by whichever replica leases it.
//!
//! A row is `pending` until an attempt succeeds (`delivered`) or its retry window closes
//! (`dead`). Leasing a row moves its `due_at_ms` past the attempt's bound and names the
//! replica in `owner`: a replica that dies mid-attempt leaves a row that falls due again by
//! itself, and the conditional write lets exactly one replica lease a due row. The body is
//! rendered when the row is written (ids, kinds and summaries only); it is signed when sent.
//!
//! The store does not know what subscribes: an [`Announce`] set once at start turns each
//! change into rows. Without one (no endpoint configured) no write does any outbox work.

use std::sync::Arc;

use super::db::{vals, Row, Tx};
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

/// Turns changes into outbox rows (the notifier).
pub trait Announce: Send + Sync {
    fn wants(&self, kind: ChangeKind) -> bool;
    fn notices(&self, change: &Change<'_>) -> Vec<Notice>;
    /// A transaction that may have written rows committed: they can be delivered.
    fn committed(&self);
}

/// A leased row, to attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: String,
    pub endpoint: String,
    pub event: String,
    pub body: String,
    /// Attempts made before this one.
    pub attempts: u32,
    pub created_ms: u64,
}

/// A row as the console lists it (no body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRow {
    pub id: String,
    pub endpoint: String,
    pub event: String,
    pub principal: String,
    /// `pending`, `delivered` or `dead`.
    pub state: String,
    pub attempts: u32,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    pub created_ms: u64,
    pub done_ms: Option<u64>,
    pub latency_ms: Option<u64>,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Delivered {
        status: u16,
        latency_ms: u64,
    },
    /// Retried at `retry_at_ms`, or dead-lettered when `None`.
    Failed {
        status: Option<u16>,
        error: String,
        retry_at_ms: Option<u64>,
    },
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

    /// Writes the rows `change` makes, in the caller's transaction.
    pub(super) async fn announce(
        &self,
        t: &mut Tx<'_>,
        change: &Change<'_>,
    ) -> Result<(), StoreError> {
        let Some(a) = self.announce.get() else {
            return Ok(());
        };
        write(t, &a.notices(change)).await
    }

    /// One transaction, as `Db::tx`, after which the rows it announced can be delivered.
    pub(super) async fn announcing<T>(
        &self,
        f: impl AsyncFnOnce(&mut Tx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let done = self.db.tx(f).await;
        if let (Ok(_), Some(a)) = (&done, self.announce.get()) {
            a.committed();
        }
        done
    }

    /// Writes rows by themselves (a test event).
    pub async fn outbox_enqueue(&self, notices: &[Notice]) -> Result<(), StoreError> {
        self.db.tx(async |t| write(t, notices).await).await
    }

    /// Leases up to `limit` due rows for this replica until `until_ms`.
    pub async fn outbox_lease(
        &self,
        now_ms: u64,
        until_ms: u64,
        limit: u32,
    ) -> Result<Vec<Delivery>, StoreError> {
        let owner = self.owner.as_str();
        // The outer conditions are evaluated again on a row another replica leased while
        // this statement waited for it (PostgreSQL's read committed), so only one wins.
        let rows = self
            .db
            .tx(async |t| {
                t.rows(
                    "UPDATE outbox SET owner = ?1, due_at_ms = ?2, leased = 1
                     WHERE state = 'pending' AND due_at_ms <= ?3 AND id IN (
                       SELECT id FROM outbox WHERE state = 'pending' AND due_at_ms <= ?3
                       ORDER BY due_at_ms LIMIT ?4)
                     RETURNING id, endpoint, event, body, attempts, created_ms",
                    vals![owner, until_ms, now_ms, limit],
                )
                .await
            })
            .await?;
        rows.iter()
            .map(|r| {
                Ok(Delivery {
                    id: r.t(0)?,
                    endpoint: r.t(1)?,
                    event: r.t(2)?,
                    body: r.t(3)?,
                    attempts: r.i(4)? as u32,
                    created_ms: r.i(5)? as u64,
                })
            })
            .collect()
    }

    /// At start: the rows this replica's previous process had leased (an attempt cut short)
    /// are due now.
    pub async fn outbox_reclaim(&self, now_ms: u64) -> Result<u64, StoreError> {
        let owner = self.owner.as_str();
        self.db
            .tx(async |t| {
                t.exec(
                    "UPDATE outbox SET due_at_ms = ?1, leased = 0
                     WHERE owner = ?2 AND leased = 1 AND state = 'pending'",
                    vals![now_ms, owner],
                )
                .await
            })
            .await
    }

    /// Records an attempt on a row this replica leased (a row another replica leased since
    /// is left to it).
    pub async fn outbox_attempted(
        &self,
        id: &str,
        attempt: &Attempt,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let owner = self.owner.as_str();
        self.db
            .tx(async |t| {
                match attempt {
                    Attempt::Delivered { status, latency_ms } => {
                        t.exec(
                            "UPDATE outbox SET state = 'delivered', attempts = attempts + 1,
                             last_status = ?3, last_error = NULL, done_ms = ?4, latency_ms = ?5
                             WHERE id = ?1 AND owner = ?2 AND state = 'pending'",
                            vals![id, owner, u32::from(*status), now_ms, *latency_ms],
                        )
                        .await?
                    }
                    Attempt::Failed {
                        status,
                        error,
                        retry_at_ms: Some(at),
                    } => {
                        t.exec(
                            "UPDATE outbox SET attempts = attempts + 1, last_status = ?3,
                             last_error = ?4, due_at_ms = ?5, leased = 0
                             WHERE id = ?1 AND owner = ?2 AND state = 'pending'",
                            vals![id, owner, status.map(u32::from), error, *at],
                        )
                        .await?
                    }
                    Attempt::Failed { status, error, .. } => {
                        t.exec(
                            "UPDATE outbox SET state = 'dead', attempts = attempts + 1,
                             last_status = ?3, last_error = ?4, done_ms = ?5
                             WHERE id = ?1 AND owner = ?2 AND state = 'pending'",
                            vals![id, owner, status.map(u32::from), error, now_ms],
                        )
                        .await?
                    }
                };
                Ok(())
            })
            .await
    }

    /// When the earliest pending row falls due (None: nothing pending).
    pub async fn outbox_next_due(&self) -> Result<Option<u64>, StoreError> {
        let rows = self
            .db
            .read(async |t| {
                t.rows(
                    "SELECT MIN(due_at_ms) FROM outbox WHERE state = 'pending'",
                    &[],
                )
                .await
            })
            .await?;
        Ok(rows
            .first()
            .map(|r| r.oi(0))
            .transpose()?
            .flatten()
            .map(|v| v as u64))
    }

    /// The newest `limit` rows, newest first (one endpoint's, or all).
    pub async fn outbox_recent(
        &self,
        endpoint: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        let columns = "SELECT id, endpoint, event, principal, state, attempts, last_status,
             last_error, created_ms, done_ms, latency_ms FROM outbox";
        let rows = self
            .db
            .read(async |t| match endpoint {
                Some(e) => {
                    let sql = format!("{columns} WHERE endpoint = ?1 ORDER BY seq DESC LIMIT ?2");
                    t.rows(&sql, vals![e, limit]).await
                }
                None => {
                    let sql = format!("{columns} ORDER BY seq DESC LIMIT ?1");
                    t.rows(&sql, vals![limit]).await
                }
            })
            .await?;
        rows.iter().map(delivery_row).collect()
    }

    /// Rows waiting (`pending`) and dead-lettered (`dead`, kept until pruned), per endpoint:
    /// `(endpoint, state, count)`, every replica's.
    pub async fn outbox_counts(&self) -> Result<Vec<(String, String, u64)>, StoreError> {
        let rows = self
            .db
            .read(async |t| {
                t.rows(
                    "SELECT endpoint, state, COUNT(*) FROM outbox
                     WHERE state IN ('pending', 'dead') GROUP BY endpoint, state",
                    &[],
                )
                .await
            })
            .await?;
        rows.iter()
            .map(|r| Ok((r.t(0)?, r.t(1)?, r.i(2)? as u64)))
            .collect()
    }

    /// Deletes delivered and dead rows finished before `before_ms`.
    pub async fn outbox_prune(&self, before_ms: u64) -> Result<u64, StoreError> {
        self.db
            .tx(async |t| {
                t.exec(
                    "DELETE FROM outbox WHERE state <> 'pending' AND done_ms < ?1",
                    vals![before_ms],
                )
                .await
            })
            .await
    }
}

fn delivery_row(r: &Row) -> Result<DeliveryRow, StoreError> {
    Ok(DeliveryRow {
        id: r.t(0)?,
        endpoint: r.t(1)?,
        event: r.t(2)?,
        principal: r.t(3)?,
        state: r.t(4)?,
        attempts: r.i(5)? as u32,
        last_status: r.oi(6)?.map(|v| v as u16),
        last_error: r.ot(7)?,
        created_ms: r.i(8)? as u64,
        done_ms: r.oi(9)?.map(|v| v as u64),
        latency_ms: r.oi(10)?.map(|v| v as u64),
    })
}

/// Writes rows; a row whose id is already there is not written again (a budget threshold's id
/// names its window, so two replicas that both saw it cross write it once).
async fn write(t: &mut Tx<'_>, notices: &[Notice]) -> Result<(), StoreError> {
    for n in notices {
        t.exec(
            "INSERT INTO outbox (id, endpoint, event, principal, body, created_ms, due_at_ms,
             attempts, state, owner) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, 0, 'pending', '')
             ON CONFLICT (id) DO NOTHING",
            vals![&n.id, &n.endpoint, &n.event, &n.principal, &n.body, n.at_ms],
        )
        .await?;
        for l in &n.links {
            t.exec(
                "INSERT INTO decision_links (digest, approval_id, decision, endpoint, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                vals![
                    &l.digest,
                    &l.approval_id,
                    l.decision,
                    &l.endpoint,
                    l.expires_at
                ],
            )
            .await?;
        }
    }
    Ok(())
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
        self.announce(t, &change).await
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
                self.announce_end(t, execution_id, reason).await?;
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
        self.announce(t, &Change::Ended(end)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(id: &str) -> Notice {
        Notice {
            id: id.into(),
            endpoint: "ops".into(),
            event: "approval.pending".into(),
            principal: "alice".into(),
            body: "{}".into(),
            at_ms: 1_000,
            links: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_row_is_leased_once_until_its_lease_lapses_then_retried_and_dead_lettered() {
        let s = Store::open_in_memory().await.unwrap();
        s.outbox_enqueue(&[notice("msg_1")]).await.unwrap();
        assert_eq!(s.outbox_next_due().await.unwrap(), Some(1_000));
        let got = s.outbox_lease(1_000, 31_000, 10).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].id.as_str(), got[0].attempts), ("msg_1", 0));
        assert!(s.outbox_lease(30_999, 60_000, 10).await.unwrap().is_empty());
        // The lease lapsed (the replica died mid-attempt): due again.
        assert_eq!(s.outbox_lease(31_000, 61_000, 10).await.unwrap().len(), 1);
        // A restart makes its own cut-short attempt due at once.
        assert_eq!(s.outbox_reclaim(40_000).await.unwrap(), 1);
        assert_eq!(s.outbox_next_due().await.unwrap(), Some(40_000));
        assert_eq!(s.outbox_lease(40_000, 61_000, 10).await.unwrap().len(), 1);
        let retry = Attempt::Failed {
            status: Some(500),
            error: "status 500".into(),
            retry_at_ms: Some(70_000),
        };
        s.outbox_attempted("msg_1", &retry, 61_000).await.unwrap();
        assert_eq!(s.outbox_next_due().await.unwrap(), Some(70_000));
        let again = s.outbox_lease(70_000, 100_000, 10).await.unwrap();
        assert_eq!(again[0].attempts, 1);
        let dead = Attempt::Failed {
            status: None,
            error: "timed out".into(),
            retry_at_ms: None,
        };
        s.outbox_attempted("msg_1", &dead, 80_000).await.unwrap();
        assert_eq!(s.outbox_next_due().await.unwrap(), None);
        assert_eq!(
            s.outbox_counts().await.unwrap(),
            [("ops".to_string(), "dead".to_string(), 1)]
        );
        let row = &s.outbox_recent(None, 10).await.unwrap()[0];
        assert_eq!((row.state.as_str(), row.attempts), ("dead", 2));
        assert_eq!(s.outbox_prune(80_001).await.unwrap(), 1);
        assert!(s.outbox_recent(Some("ops"), 10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_delivery_is_recorded_once_and_only_by_its_leaseholder() {
        let s = Store::open_in_memory().await.unwrap();
        s.outbox_enqueue(&[notice("msg_1")]).await.unwrap();
        s.outbox_lease(1_000, 2_000, 10).await.unwrap();
        let ok = Attempt::Delivered {
            status: 204,
            latency_ms: 3,
        };
        s.outbox_attempted("msg_1", &ok, 1_500).await.unwrap();
        let row = &s.outbox_recent(Some("ops"), 10).await.unwrap()[0];
        assert_eq!(row.state, "delivered");
        assert_eq!((row.last_status, row.latency_ms), (Some(204), Some(3)));
        assert!(s.outbox_lease(10_000, 20_000, 10).await.unwrap().is_empty());
    }
}
