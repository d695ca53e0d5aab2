//! The notification outbox: one row per (event, endpoint), written in the transaction of the
//! change it reports, delivered after commit by whichever replica leases it.
//!
//! A row is `pending` until an attempt succeeds (`delivered`) or its retry window closes
//! (`dead`). Leasing a row moves its `due_at_ms` past the attempt's bound and names the
//! replica in `owner`: a replica that dies mid-attempt leaves a row that falls due again by
//! itself, and the conditional write lets exactly one replica lease a due row. The body is
//! rendered when the row is written (ids, kinds and summaries only); it is signed when sent.
//! The rows come from `announce.rs`; this is their table.

use super::announce::Notice;
use super::db::{vals, Row, Tx};
use super::{Store, StoreError};

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
pub(super) async fn write(t: &mut Tx<'_>, notices: &[Notice]) -> Result<(), StoreError> {
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
