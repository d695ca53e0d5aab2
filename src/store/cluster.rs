//! What replicas sharing one database need of it: a lease per replica (renewed, fenced by
//! an epoch), finding a pending record or a tombstone that another replica wrote, claiming a
//! stateless record with one conditional write, and settling a replica whose lease lapsed, once,
//! by whichever replica notices first.
//!
//! Lease times are Unix milliseconds of the replicas' own clocks, which must agree to well
//! within a lease (NTP does).

use super::db::{vals, Row};
use super::suspensions::{durable_rows, unpack, DURABLE_COLUMNS};
use super::{lose_owner, now_unix, Store, StoreError, StoredSuspension};
use crate::continuation::Digests;
use crate::turn::SurfaceId;

/// A replica's lease as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub replica_id: String,
    /// Where its internal listener answers.
    pub url: String,
    pub epoch: i64,
    pub expires_at_ms: u64,
    /// Its leftovers were settled (after a lapse, or when it stopped).
    pub settled: bool,
}

impl Lease {
    pub fn live_at(&self, now_ms: u64) -> bool {
        !self.settled && self.expires_at_ms > now_ms
    }
}

/// A pending record found in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemotePending {
    /// A held turn: it lives in its owner replica's process.
    Held {
        owner: String,
        execution_id: String,
        principal: String,
        model: String,
        surface: SurfaceId,
        deadline_ms: u64,
        digests: Digests,
        /// The batch's token digests in exposure order.
        tokens: Vec<[u8; 32]>,
        /// The owner's lease, read in the same round trip (None: it has none).
        lease: Option<Lease>,
    },
    /// A stateless upstream's record: any replica may claim it.
    Durable(StoredSuspension),
}

/// What settling a lapsed replica did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaSettlement {
    pub tokens_lost: usize,
    pub executions_lost: usize,
    pub approvals_orphaned: Vec<String>,
}

/// A lease from columns `at..at + 5` of a joined row; None where the join found none.
fn lease_at(r: &Row, at: usize) -> Result<Option<Lease>, StoreError> {
    let Some(replica_id) = r.ot(at)? else {
        return Ok(None);
    };
    Ok(Some(Lease {
        replica_id,
        url: r.t(at + 1)?,
        epoch: r.i(at + 2)?,
        expires_at_ms: r.i(at + 3)? as u64,
        settled: r.i(at + 4)? != 0,
    }))
}

fn lease(r: &Row) -> Result<Lease, StoreError> {
    Ok(Lease {
        replica_id: r.t(0)?,
        url: r.t(1)?,
        epoch: r.i(2)?,
        expires_at_ms: r.i(3)? as u64,
        settled: r.i(4)? != 0,
    })
}

impl Store {
    /// Takes this replica's lease (a new epoch, so an older process under the same id is
    /// fenced off) until `expires_at_ms`. Returns the epoch.
    pub async fn lease_acquire(&self, url: &str, expires_at_ms: u64) -> Result<i64, StoreError> {
        let id = self.owner.as_str();
        let rows = self
            .db
            .tx(async |t| {
                t.rows(
                    "INSERT INTO replicas (replica_id, url, epoch, expires_at_ms, settled)
                 VALUES (?1, ?2, 1, ?3, 0)
                 ON CONFLICT (replica_id) DO UPDATE SET url = excluded.url,
                   epoch = replicas.epoch + 1, expires_at_ms = excluded.expires_at_ms, settled = 0
                 RETURNING epoch",
                    vals![id, url, expires_at_ms],
                )
                .await
            })
            .await?;
        rows.first().ok_or(StoreError::Missing("lease"))?.i(0)
    }

    /// Extends the lease of `epoch`; false when it is no longer this process's (another
    /// replica settled it after a lapse, or a newer process took the id).
    pub async fn lease_renew(&self, epoch: i64, expires_at_ms: u64) -> Result<bool, StoreError> {
        let id = self.owner.as_str();
        let n = self.db.tx(async |t| {
            t.exec(
                "UPDATE replicas SET expires_at_ms = ?3 WHERE replica_id = ?1 AND epoch = ?2 AND settled = 0",
                vals![id, epoch, expires_at_ms],
            ).await
        }).await?;
        Ok(n == 1)
    }

    /// Gives the lease up at a clean stop (the replica settled what it held itself).
    pub async fn lease_release(&self, epoch: i64) -> Result<(), StoreError> {
        let id = self.owner.as_str();
        self.db.tx(async |t| {
            t.exec(
                "UPDATE replicas SET expires_at_ms = 0, settled = 1 WHERE replica_id = ?1 AND epoch = ?2",
                vals![id, epoch],
            ).await
        }).await?;
        Ok(())
    }

    pub async fn leases(&self) -> Result<Vec<Lease>, StoreError> {
        let rows = self.db.read(async |t| {
            t.rows(
                "SELECT replica_id, url, epoch, expires_at_ms, settled FROM replicas ORDER BY replica_id",
                &[],
            ).await
        }).await?;
        rows.iter().map(lease).collect()
    }

    pub async fn lease_of(&self, replica: &str) -> Result<Option<Lease>, StoreError> {
        let rows = self.db.read(async |t| {
            t.rows(
                "SELECT replica_id, url, epoch, expires_at_ms, settled FROM replicas WHERE replica_id = ?1",
                vals![replica],
            ).await
        }).await?;
        rows.first().map(lease).transpose()
    }

    /// Settles a replica whose lease lapsed before `now_ms`: its held turns' tokens become
    /// `lost` tombstones, its live executions end `lost`, its pending approvals are denied
    /// `orphaned` and its claims on stateless records are released. The first caller wins (a
    /// conditional write on the lease); later ones get None.
    pub async fn settle_replica(
        &self,
        replica: &str,
        epoch: i64,
        now_ms: u64,
    ) -> Result<Option<ReplicaSettlement>, StoreError> {
        let now = now_unix();
        self.db
            .tx(async |t| {
                let won = t
                    .exec(
                        "UPDATE replicas SET settled = 1
                 WHERE replica_id = ?1 AND epoch = ?2 AND settled = 0 AND expires_at_ms <= ?3",
                        vals![replica, epoch, now_ms],
                    )
                    .await?;
                if won == 0 {
                    return Ok(None);
                }
                let lost =
                    lose_owner(t, replica, now, "reason=lost (replica lease lapsed)").await?;
                let orphaned = t.rows(
                "UPDATE approvals SET state = 'denied', reason = 'orphaned', decided_at = ?1
                 WHERE state = 'pending' AND owner = ?2 RETURNING id",
                vals![now, replica],
            ).await?;
                let orphaned: Vec<String> =
                    orphaned.iter().map(|r| r.t(0)).collect::<Result<_, _>>()?;
                for id in &orphaned {
                    super::feed::notify(t, id, &self.owner).await?;
                }
                Ok(Some(ReplicaSettlement {
                    tokens_lost: lost.tokens_lost,
                    executions_lost: lost.executions_lost,
                    approvals_orphaned: orphaned,
                }))
            })
            .await
    }

    /// The pending record a token digest belongs to, whichever replica wrote it. A held
    /// turn's batch comes with its owner's lease in one round trip (the lookup a forwarded
    /// continuation waits on).
    pub async fn pending_of(&self, digest: &[u8; 32]) -> Result<Option<RemotePending>, StoreError> {
        self.db.read(async |t| {
            let rows = t.rows(
                "SELECT p.digest, p.owner, p.principal, p.model, p.surface, p.deadline_ms,
                        p.digests, p.execution_id,
                        l.replica_id, l.url, l.epoch, l.expires_at_ms, l.settled
                 FROM pending_tokens p LEFT JOIN replicas l ON l.replica_id = p.owner
                 WHERE p.execution_id = (SELECT execution_id FROM pending_tokens WHERE digest = ?1)
                 ORDER BY p.position",
                vals![digest],
            ).await?;
            if let Some(first) = rows.first() {
                let (Some(surface), Some(digests)) = (
                    SurfaceId::parse(&first.t(4)?),
                    first.ob(6)?.as_deref().and_then(unpack),
                ) else {
                    return Ok(None);
                };
                let tokens = rows
                    .iter()
                    .map(|r| r.digest(0))
                    .collect::<Result<Option<Vec<_>>, _>>()?
                    .unwrap_or_default();
                return Ok(Some(RemotePending::Held {
                    owner: first.t(1)?,
                    execution_id: first.t(7)?,
                    principal: first.t(2)?,
                    model: first.t(3)?,
                    surface,
                    deadline_ms: first.i(5)? as u64,
                    digests,
                    tokens,
                    lease: lease_at(first, 8)?,
                }));
            }
            let durable = t.rows(
                "SELECT execution_id FROM upstream_pending WHERE digest = ?1",
                vals![digest],
            ).await?;
            let Some(r) = durable.first() else {
                return Ok(None);
            };
            let rows = t.rows(
                &format!("SELECT {DURABLE_COLUMNS} FROM upstream_pending WHERE execution_id = ?1 ORDER BY position"),
                vals![&r.t(0)?],
            ).await?;
            Ok(durable_rows(&rows)?.pop().map(RemotePending::Durable))
        }).await
    }

    /// The principal and reason of a tombstone, whichever replica wrote it.
    pub async fn tombstone_of(
        &self,
        digest: &[u8; 32],
    ) -> Result<Option<(String, String)>, StoreError> {
        let rows = self
            .db
            .read(async |t| {
                t.rows(
                    "SELECT principal, reason FROM tombstones WHERE digest = ?1",
                    vals![digest],
                )
                .await
            })
            .await?;
        rows.first().map(|r| Ok((r.t(0)?, r.t(1)?))).transpose()
    }

    /// Claims a stateless record for this replica (or single gateway) before its forward:
    /// one conditional write, so of replicas racing for it exactly one wins, and a claim that
    /// outlives its process settles the record `lost` at recovery (its outcome is unknown).
    /// False when another replica claimed it, or it is settled or gone. This replica's own
    /// earlier claim (a release that could not be written) is its to take again: its registry
    /// hands a batch to one caller at a time.
    pub async fn upstream_claim(
        &self,
        execution_id: &str,
        tokens: usize,
    ) -> Result<bool, StoreError> {
        let me = self.owner.as_str();
        let n = self
            .db
            .tx(async |t| {
                t.exec(
                    "UPDATE upstream_pending SET claimed_by = ?2
                 WHERE execution_id = ?1 AND (claimed_by IS NULL OR claimed_by = ?2)",
                    vals![execution_id, me],
                )
                .await
            })
            .await?;
        Ok(n > 0 && n as usize == tokens)
    }

    /// Releases this replica's claim (the forward failed before the upstream answered).
    pub async fn upstream_unclaim(&self, execution_id: &str) -> Result<(), StoreError> {
        let me = self.owner.as_str();
        self.db.tx(async |t| {
            t.exec(
                "UPDATE upstream_pending SET claimed_by = NULL WHERE execution_id = ?1 AND claimed_by = ?2",
                vals![execution_id, me],
            ).await
        }).await?;
        Ok(())
    }
}
