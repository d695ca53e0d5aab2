//! The durable store: an append-only journal of execution lifecycle events, the executions
//! that are live, the digests of pending continuation tokens, the per-client tombstone rings,
//! approvals, usage totals and, with replicas, their leases: only digests, ids and reason
//! codes, never prompts, arguments, results, tokens or keys. The one exception is the Managed
//! Agents API's objects and session event logs (`managed.rs`), which hold content because the
//! API's contract is to page it back; they are principal-owned, bounded in bytes per principal,
//! and deleted with their session. Tokens stay out of them too.
//!
//! One interface over two engines (`db.rs`): embedded SQLite (WAL), the default, and
//! PostgreSQL, which replicas share. Every statement is written once; versioned migrations
//! (`migrations.rs`) bring either to the current layout at start. Writes are small and
//! synchronous under one connection lock that is never held across an `.await`.
//! SQLite's `synchronous=NORMAL` in WAL mode survives a process crash (the case restarts must
//! handle); an OS or power failure may lose the last transactions: a held turn's then read as
//! `lost`, but a stateless record whose claim was lost reads as pending again, so a gateway
//! that must stay exactly once across power loss runs on PostgreSQL (`synchronous_commit` on).
//!
//! Every live row names its owner replica (`""` for a single gateway), and a start settles only
//! its own replica's leftovers, so replicas sharing a database never settle each other's work
//! except through an expired lease (`cluster.rs`).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

mod announce;
mod approvals;
mod cluster;
mod compactions;
mod db;
mod feed;
mod fused;
mod lifecycle;
mod links;
mod managed;
mod migrations;
mod outbox;
mod sso;
mod suspensions;
mod usage;

use db::{vals, Db};

pub use announce::{Announce, Change, ChangeKind, Crossed, Ended, Held, LinkRow, Notice};
pub use approvals::ApprovalRecord;
pub use cluster::{Lease, RemotePending, ReplicaSettlement};
pub use compactions::CompactionRecord;
pub use db::default_pool_size;
pub use feed::{ApprovalChange, ApprovalFeed, Listening};
pub use lifecycle::{Lifecycle, Settlement};
pub use managed::{AppendError, EventRow, ListRows, ManagedRow};
pub use outbox::{Attempt, Delivery, DeliveryRow};
pub use sso::{SessionRow, MAX_SESSIONS_PER_SUBJECT};
pub use suspensions::{StoredSuspension, SuspensionRecord};
pub use usage::{
    civil_of, date_of, day_from_date, day_of, day_of_civil, UsageQuery, UsageRow, UsageTotals,
    Watch,
};

/// Why a store call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed a statement, or cannot be reached (SQLite's or
    /// PostgreSQL's message with its cause chain; never a statement's parameters).
    #[error("store: {0}")]
    Database(String),
    /// A row read back is not of the shape this build wrote.
    #[error("store: column {column} is not {want}")]
    Shape { column: usize, want: &'static str },
    /// The store was written by a newer build.
    #[error("store: the store's schema is version {found}, newer than this build's {current}; run the newer build")]
    NewerSchema { found: i64, current: i64 },
    /// A row the gateway relies on is missing.
    #[error("store: no {0} row")]
    Missing(&'static str),
    /// The store cannot be opened where the config says (a folder, a URL).
    #[error("store: {0}")]
    Setup(String),
    /// A probe rolled its transaction back on purpose.
    #[error("store: rolled back")]
    RolledBack,
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Database(e.to_string())
    }
}

/// Where the store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation<'a> {
    Sqlite(&'a Path),
    /// A PostgreSQL URL without a password, the password, and the pool's size.
    Postgres {
        url: &'a str,
        password: Option<&'a str>,
        pool_size: usize,
    },
}

pub struct Store {
    db: Db,
    /// This replica's id: the owner written into live rows (`""` for a single gateway).
    owner: String,
    /// What turns a change into outbox rows (unset: no endpoint, no outbox work).
    announce: std::sync::OnceLock<std::sync::Arc<dyn Announce>>,
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A tombstone as recovered from the store, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTombstone {
    pub digest: [u8; 32],
    pub principal: String,
    pub reason: String,
}

pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What startup recovery settled.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    pub executions_lost: usize,
    pub tokens_lost: usize,
}

impl Store {
    /// Opens the store where the config says, migrated, for replica `owner`.
    pub async fn connect(at: &StoreLocation<'_>, owner: &str) -> Result<Store, StoreError> {
        let db = match at {
            StoreLocation::Sqlite(path) => sqlite_file(path)?,
            StoreLocation::Postgres {
                url,
                password,
                pool_size,
            } => Db::postgres(url, *password, *pool_size).await?,
        };
        Store::over(db, owner).await
    }

    /// The SQLite file at `path`, for a single gateway.
    pub async fn open(path: &Path) -> Result<Store, StoreError> {
        Store::over(sqlite_file(path)?, "").await
    }

    pub async fn open_in_memory() -> Result<Store, StoreError> {
        let conn = rusqlite::Connection::open_in_memory()?;
        Store::over(Db::sqlite(conn), "").await
    }

    async fn over(db: Db, owner: &str) -> Result<Store, StoreError> {
        let applied = db.tx(migrations::migrate).await?;
        if !applied.is_empty() {
            tracing::info!(versions = ?applied, "store migrated");
        }
        Ok(Store {
            db,
            owner: owner.to_string(),
            announce: std::sync::OnceLock::new(),
        })
    }

    /// This replica's id (`""` for a single gateway): the owner of the live rows it writes.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Round trips to the database server since start (PostgreSQL; SQLite has none).
    pub fn round_trips(&self) -> u64 {
        self.db.round_trips()
    }

    /// `sqlite` or `postgres`.
    pub fn engine_name(&self) -> &'static str {
        match self.db.engine() {
            db::Engine::Sqlite => "sqlite",
            db::Engine::Postgres => "postgres",
        }
    }

    /// Settles everything this replica's previous process left live: its executions are
    /// `lost` and their pending tokens become `lost` tombstones, so replays answer 410 instead
    /// of starting anew. Unclaimed stateless records stay (they hold nothing in memory); the
    /// ones it had claimed (a forward in flight, or a spend it could not write) are `lost`.
    pub async fn recover(&self) -> Result<Recovery, StoreError> {
        let owner = self.owner.as_str();
        self.db
            .tx(async |t| lose_owner(t, owner, now_unix(), "reason=lost (gateway restart)").await)
            .await
    }

    pub async fn journal(
        &self,
        execution_id: &str,
        event: &str,
        detail: &str,
    ) -> Result<(), StoreError> {
        self.db
            .tx(async |t| {
                t.exec(
                    "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, ?3, ?4)",
                    vals![now_unix(), execution_id, event, detail],
                )
                .await
                .map(|_| ())
            })
            .await
    }

    pub async fn tombstones(&self) -> Result<Vec<StoredTombstone>, StoreError> {
        let rows = self
            .db
            .read(async |t| {
                t.rows(
                    "SELECT digest, principal, reason FROM tombstones ORDER BY seq",
                    &[],
                )
                .await
            })
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            if let Some(digest) = r.digest(0)? {
                out.push(StoredTombstone {
                    digest,
                    principal: r.t(1)?,
                    reason: r.t(2)?,
                });
            }
        }
        Ok(out)
    }

    /// The journal's events of an execution, in order (tests).
    #[cfg(test)]
    pub async fn journal_events(&self, execution_id: &str) -> Result<Vec<String>, StoreError> {
        let rows = self
            .db
            .read(async |t| {
                t.rows(
                    "SELECT event FROM journal WHERE execution_id = ?1 ORDER BY seq",
                    vals![execution_id],
                )
                .await
            })
            .await?;
        rows.iter().map(|r| r.t(0)).collect()
    }

    /// The approvals change feed of the replicas sharing this database (PostgreSQL only).
    pub fn approval_feed(&self) -> Option<ApprovalFeed> {
        self.db.listener()
    }

    /// Cheap write probe for readiness: a transaction that writes and is rolled back.
    pub async fn writable(&self) -> bool {
        let probe = self
            .db
            .tx(async |t| {
                t.exec(
                    "UPDATE schema_migrations SET applied_at = applied_at WHERE version = 1",
                    &[],
                )
                .await?;
                Err::<(), _>(StoreError::RolledBack)
            })
            .await;
        matches!(probe, Err(StoreError::RolledBack))
    }
}

/// Settles what a replica (`owner`) held: its pending tokens and the stateless records it had
/// claimed become `lost` tombstones, its live executions (but those suspended on a stateless
/// upstream and unclaimed, which hold nothing in a process) end `lost`, journaled with `why`.
async fn lose_owner(
    t: &mut db::Tx<'_>,
    owner: &str,
    now: u64,
    why: &str,
) -> Result<Recovery, StoreError> {
    let tokens = t
        .exec(
            "INSERT INTO tombstones (digest, principal, reason, at)
         SELECT digest, principal, 'lost', ?1 FROM pending_tokens WHERE owner = ?2
         ON CONFLICT (digest) DO NOTHING",
            vals![now, owner],
        )
        .await?;
    t.exec("DELETE FROM pending_tokens WHERE owner = ?1", vals![owner])
        .await?;
    // A stateless record this replica had claimed was being forwarded: whether the upstream
    // answered (and the client got that answer) is unknown, so it is spent as `lost`, never
    // put back (exactly once, failing closed). Its execution ends below or, when another
    // replica owns its row, here.
    let claimed = t
        .rows(
            "SELECT DISTINCT execution_id FROM upstream_pending WHERE claimed_by = ?1",
            vals![owner],
        )
        .await?;
    let tokens = tokens
        + t.exec(
            "INSERT INTO tombstones (digest, principal, reason, at)
             SELECT digest, principal, 'lost', ?1 FROM upstream_pending WHERE claimed_by = ?2
             ON CONFLICT (digest) DO NOTHING",
            vals![now, owner],
        )
        .await?;
    t.exec(
        "DELETE FROM upstream_pending WHERE claimed_by = ?1",
        vals![owner],
    )
    .await?;
    let mut executions = 0;
    for r in &claimed {
        let id: String = r.t(0)?;
        let ended = t
            .exec(
                "UPDATE executions SET state = 'ended', reason = 'lost', ended_at = ?2
             WHERE execution_id = ?1 AND state = 'live' AND owner <> ?3",
                vals![&id, now, owner],
            )
            .await?;
        if ended > 0 {
            t.exec(
                "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'execution_ended', ?3)",
                vals![now, &id, why],
            ).await?;
            executions += ended;
        }
    }
    t.exec(
        "INSERT INTO journal (at, execution_id, event, detail)
         SELECT ?1, execution_id, 'execution_ended', ?3
         FROM executions WHERE state = 'live' AND owner = ?2
         AND execution_id NOT IN (SELECT execution_id FROM upstream_pending)",
        vals![now, owner, why],
    )
    .await?;
    let executions = executions
        + t.exec(
            "UPDATE executions SET state = 'ended', reason = 'lost', ended_at = ?1
             WHERE state = 'live' AND owner = ?2
             AND execution_id NOT IN (SELECT execution_id FROM upstream_pending)",
            vals![now, owner],
        )
        .await?;
    Ok(Recovery {
        executions_lost: executions as usize,
        tokens_lost: tokens as usize,
    })
}

fn sqlite_file(path: &Path) -> Result<Db, StoreError> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Setup(format!("cannot create {}: {e}", dir.display())))?;
        }
    }
    let conn = rusqlite::Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // Only this process writes; a lock held elsewhere is a fault to report quickly.
    conn.busy_timeout(std::time::Duration::from_secs(1))?;
    // Room for every statement this module runs.
    conn.set_prepared_statement_cache_capacity(64);
    Ok(Db::sqlite(conn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::continuation::Digests;
    use crate::turn::SurfaceId;

    /// Records a held turn's pending tokens.
    pub(super) async fn held(s: &Store, execution_id: &str, principal: &str, tokens: &[[u8; 32]]) {
        let digests = Digests {
            tools: [0; 32],
            tool_choice: [0; 32],
            prefix: [0; 32],
            echo: [0; 32],
        };
        s.suspension_recorded(&SuspensionRecord {
            execution_id,
            principal,
            model: "m",
            surface: SurfaceId::Chat,
            deadline_ms: u64::MAX / 2,
            digests: &digests,
            tokens,
            ids: None,
            rounds: 1,
            created_at: 0,
            spend: 0,
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn recovery_turns_live_state_into_lost_tombstones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            let s = Store::open(&path).await.unwrap();
            s.execution_started("exe-1", "alice", "demo").await.unwrap();
            held(&s, "exe-1", "alice", &[[1; 32], [2; 32]]).await;
            s.tokens_settled("exe-1", "alice", &[[1; 32]], "resolved", &[])
                .await
                .unwrap();
        }
        let s = Store::open(&path).await.unwrap();
        let r = s.recover().await.unwrap();
        assert_eq!(
            r,
            Recovery {
                executions_lost: 1,
                tokens_lost: 1
            }
        );
        let t = s.tombstones().await.unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].digest, t[0].reason.as_str()), ([1; 32], "resolved"));
        assert_eq!((t[1].digest, t[1].reason.as_str()), ([2; 32], "lost"));
        assert_eq!(s.recover().await.unwrap(), Recovery::default());
        let ev = s.journal_events("exe-1").await.unwrap();
        assert_eq!(
            ev,
            [
                "execution_started",
                "tokens_registered",
                "tokens_settled",
                "execution_ended"
            ]
        );
    }

    #[tokio::test]
    async fn evicted_tombstones_are_deleted() {
        let s = Store::open_in_memory().await.unwrap();
        for i in 0..5u8 {
            held(&s, "e", "alice", &[[i; 32]]).await;
            let evicted: &[[u8; 32]] = if i >= 3 { &[[i - 3; 32]] } else { &[] };
            s.tokens_settled("e", "alice", &[[i; 32]], "resolved", evicted)
                .await
                .unwrap();
        }
        held(&s, "e", "bob", &[[9; 32]]).await;
        s.tokens_settled("e", "bob", &[[9; 32]], "resolved", &[])
            .await
            .unwrap();
        let t = s.tombstones().await.unwrap();
        let alice: Vec<u8> = t
            .iter()
            .filter(|t| t.principal == "alice")
            .map(|t| t.digest[0])
            .collect();
        assert_eq!(alice, [2, 3, 4]);
        assert_eq!(t.iter().filter(|t| t.principal == "bob").count(), 1);
    }
}
