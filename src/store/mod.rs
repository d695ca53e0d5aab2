//! The durable store: embedded SQLite (WAL) holding an append-only journal of execution
//! lifecycle events, the executions that are live, the digests of pending continuation tokens
//! and the per-client tombstone rings. Only digests, ids and reason codes are written here;
//! never prompts, arguments, results, tokens or keys.
//!
//! Writes are small and synchronous under one connection lock that is never held across an
//! `.await`. `synchronous=NORMAL` in WAL mode survives a process crash (the case restarts must
//! handle); an OS crash may lose the last transactions, which then read as `lost`.

use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection};

mod suspensions;
mod usage;

pub use suspensions::{StoredSuspension, SuspensionRecord};
pub use usage::{date_of, day_from_date, day_of, UsageQuery, UsageRow};

#[derive(Debug, thiserror::Error)]
#[error("store: {0}")]
pub struct StoreError(String);

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError(e.to_string())
    }
}

pub struct Store {
    conn: Mutex<Connection>,
}

/// Executes one statement through the connection's prepared-statement cache (the same few
/// statements run on every suspension and claim; re-preparing them each time showed).
pub(super) fn run(c: &Connection, sql: &str, p: impl rusqlite::Params) -> rusqlite::Result<usize> {
    c.prepare_cached(sql)?.execute(p)
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

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS journal (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  at INTEGER NOT NULL,
  execution_id TEXT,
  event TEXT NOT NULL,
  detail TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS executions (
  execution_id TEXT PRIMARY KEY,
  principal TEXT NOT NULL,
  model TEXT NOT NULL,
  state TEXT NOT NULL,
  reason TEXT,
  created_at INTEGER NOT NULL,
  ended_at INTEGER
);
CREATE INDEX IF NOT EXISTS executions_state ON executions(state);
CREATE TABLE IF NOT EXISTS pending_tokens (
  digest BLOB PRIMARY KEY,
  principal TEXT NOT NULL,
  execution_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tombstones (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  digest BLOB NOT NULL UNIQUE,
  principal TEXT NOT NULL,
  reason TEXT NOT NULL,
  at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS tombstones_principal ON tombstones(principal, seq);
CREATE TABLE IF NOT EXISTS upstream_pending (
  digest BLOB PRIMARY KEY,
  execution_id TEXT NOT NULL,
  principal TEXT NOT NULL,
  model TEXT NOT NULL,
  deadline_ms INTEGER NOT NULL,
  digests BLOB NOT NULL,
  upstream_id TEXT NOT NULL,
  position INTEGER NOT NULL,
  rounds INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  surface TEXT NOT NULL DEFAULT 'chat'
);
CREATE TABLE IF NOT EXISTS approvals (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  principal TEXT NOT NULL,
  execution_id TEXT NOT NULL,
  invocation_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  model TEXT NOT NULL,
  action_digest TEXT NOT NULL,
  summary TEXT NOT NULL,
  state TEXT NOT NULL,
  reason TEXT,
  created_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  decided_at INTEGER,
  decided_by TEXT
);
CREATE INDEX IF NOT EXISTS approvals_state ON approvals(state);
";

/// One approval as stored (and as the API shows it, minus the digest and invocation id).
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRecord {
    pub id: String,
    pub principal: String,
    pub execution_id: String,
    pub invocation_id: String,
    pub kind: String,
    pub model: String,
    pub action_digest: String,
    pub summary: serde_json::Value,
    /// `pending`, `approved` or `denied`.
    pub state: String,
    /// None while pending; `human`, `expired`, `cancelled`, `orphaned`, `store_unavailable`.
    pub reason: Option<String>,
    pub created_at: u64,
    pub expires_at: u64,
    pub decided_at: Option<u64>,
    pub decided_by: Option<String>,
}

const APPROVAL_COLUMNS: &str = "id, principal, execution_id, invocation_id, kind, model, action_digest, summary, state, reason, created_at, expires_at, decided_at, decided_by";

fn approval_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ApprovalRecord> {
    let summary: String = r.get(7)?;
    Ok(ApprovalRecord {
        id: r.get(0)?,
        principal: r.get(1)?,
        execution_id: r.get(2)?,
        invocation_id: r.get(3)?,
        kind: r.get(4)?,
        model: r.get(5)?,
        action_digest: r.get(6)?,
        summary: serde_json::from_str(&summary).unwrap_or(serde_json::Value::Null),
        state: r.get(8)?,
        reason: r.get(9)?,
        created_at: r.get::<_, i64>(10)? as u64,
        expires_at: r.get::<_, i64>(11)? as u64,
        decided_at: r.get::<_, Option<i64>>(12)?.map(|v| v as u64),
        decided_by: r.get(13)?,
    })
}

impl Store {
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| StoreError(format!("cannot create {}: {e}", dir.display())))?;
            }
        }
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // Only this process writes; a lock held elsewhere is a fault to report quickly.
        conn.busy_timeout(std::time::Duration::from_secs(1))?;
        conn.execute_batch(SCHEMA)?;
        conn.execute_batch(usage::SCHEMA)?;
        suspensions::migrate(&conn)?;
        // Room for every statement this module runs.
        conn.set_prepared_statement_cache_capacity(64);
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    pub fn open_in_memory() -> Result<Store, StoreError> {
        let conn = Connection::open_in_memory()?;
        conn.execute_batch(SCHEMA)?;
        conn.execute_batch(usage::SCHEMA)?;
        suspensions::migrate(&conn)?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    pub(super) fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        // A poisoned lock means a panic mid-statement; SQLite rolled the statement back.
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        Ok(f(&mut conn)?)
    }

    /// Settles everything a previous process left live: its executions are `lost` and their
    /// pending tokens become `lost` tombstones, so replays answer 410 instead of starting anew.
    pub fn recover(&self) -> Result<Recovery, StoreError> {
        let now = now_unix() as i64;
        self.with(|c| {
            let tx = c.transaction()?;
            let tokens = run(&tx,
                "INSERT OR IGNORE INTO tombstones (digest, principal, reason, at)
                 SELECT digest, principal, 'lost', ?1 FROM pending_tokens",
                params![now],
            )?;
            run(&tx, "DELETE FROM pending_tokens", [])?;
            // Executions suspended on a stateless upstream hold nothing in memory: they stay.
            run(&tx,
                "INSERT INTO journal (at, execution_id, event, detail)
                 SELECT ?1, execution_id, 'execution_ended', 'reason=lost (gateway restart)'
                 FROM executions WHERE state = 'live'
                 AND execution_id NOT IN (SELECT execution_id FROM upstream_pending)",
                params![now],
            )?;
            let execs = run(&tx,
                "UPDATE executions SET state = 'ended', reason = 'lost', ended_at = ?1 WHERE state = 'live'
                 AND execution_id NOT IN (SELECT execution_id FROM upstream_pending)",
                params![now],
            )?;
            tx.commit()?;
            Ok(Recovery {
                executions_lost: execs,
                tokens_lost: tokens,
            })
        })
    }

    pub fn journal(&self, execution_id: &str, event: &str, detail: &str) -> Result<(), StoreError> {
        self.with(|c| {
            run(
                c,
                "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, ?3, ?4)",
                params![now_unix() as i64, execution_id, event, detail],
            )
            .map(|_| ())
        })
    }

    pub fn execution_started(
        &self,
        execution_id: &str,
        principal: &str,
        model: &str,
    ) -> Result<(), StoreError> {
        let now = now_unix() as i64;
        self.with(|c| {
            let tx = c.transaction()?;
            run(&tx,
                "INSERT INTO executions (execution_id, principal, model, state, created_at)
                 VALUES (?1, ?2, ?3, 'live', ?4)",
                params![execution_id, principal, model, now],
            )?;
            run(&tx,
                "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'execution_started', ?3)",
                params![now, execution_id, format!("principal={principal} model={model}")],
            )?;
            tx.commit()
        })
    }

    pub fn execution_ended(&self, execution_id: &str, reason: &str) -> Result<(), StoreError> {
        let now = now_unix() as i64;
        self.with(|c| {
            let tx = c.transaction()?;
            run(&tx,
                "UPDATE executions SET state = 'ended', reason = ?2, ended_at = ?3 WHERE execution_id = ?1",
                params![execution_id, reason, now],
            )?;
            run(&tx,
                "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'execution_ended', ?3)",
                params![now, execution_id, format!("reason={reason}")],
            )?;
            tx.commit()
        })
    }

    pub fn tombstones(&self) -> Result<Vec<StoredTombstone>, StoreError> {
        self.with(|c| {
            let mut stmt =
                c.prepare("SELECT digest, principal, reason FROM tombstones ORDER BY seq")?;
            let rows = stmt.query_map([], |r| {
                let d: Vec<u8> = r.get(0)?;
                Ok((d, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (d, principal, reason) = row?;
                if let Ok(digest) = <[u8; 32]>::try_from(d.as_slice()) {
                    out.push(StoredTombstone {
                        digest,
                        principal,
                        reason,
                    });
                }
            }
            Ok(out)
        })
    }

    /// The journal's events of an execution, in order (tests).
    #[cfg(test)]
    pub fn journal_events(&self, execution_id: &str) -> Result<Vec<String>, StoreError> {
        self.with(|c| {
            let mut stmt =
                c.prepare("SELECT event FROM journal WHERE execution_id = ?1 ORDER BY seq")?;
            let rows = stmt.query_map(params![execution_id], |r| r.get::<_, String>(0))?;
            rows.collect()
        })
    }

    pub fn approval_insert(&self, a: &ApprovalRecord) -> Result<(), StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            run(&tx,
                &format!("INSERT INTO approvals ({APPROVAL_COLUMNS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14)"),
                params![
                    a.id, a.principal, a.execution_id, a.invocation_id, a.kind, a.model, a.action_digest,
                    a.summary.to_string(), a.state, a.reason, a.created_at as i64, a.expires_at as i64,
                    a.decided_at.map(|v| v as i64), a.decided_by
                ],
            )?;
            run(&tx,
                "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'approval_created', ?3)",
                params![a.created_at as i64, a.execution_id, format!("approval={} kind={} action={}", a.id, a.kind, &a.action_digest[..8])],
            )?;
            tx.commit()
        })
    }

    /// Settles pending approvals in one transaction; returns the ids that were still pending.
    pub fn approvals_settle(
        &self,
        ids: &[String],
        state: &str,
        reason: &str,
        decided_by: Option<&str>,
    ) -> Result<Vec<String>, StoreError> {
        let now = now_unix() as i64;
        self.with(|c| {
            let tx = c.transaction()?;
            let mut settled = Vec::new();
            for id in ids {
                let n = run(&tx,
                    "UPDATE approvals SET state = ?2, reason = ?3, decided_at = ?4, decided_by = ?5
                     WHERE id = ?1 AND state = 'pending'",
                    params![id, state, reason, now, decided_by],
                )?;
                if n == 1 {
                    run(&tx,
                        "INSERT INTO journal (at, execution_id, event, detail)
                         SELECT ?1, execution_id, 'approval_settled', ?2 FROM approvals WHERE id = ?3",
                        params![now, format!("approval={id} state={state} reason={reason}"), id],
                    )?;
                    settled.push(id.clone());
                }
            }
            tx.commit()?;
            Ok(settled)
        })
    }

    pub fn approval_get(&self, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE id = ?1"
            ))?;
            let mut rows = stmt.query_map(params![id], approval_row)?;
            rows.next().transpose()
        })
    }

    /// Approvals newest first, optionally in one state.
    pub fn approvals_list(&self, state: Option<&str>) -> Result<Vec<ApprovalRecord>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE (?1 IS NULL OR state = ?1) ORDER BY seq DESC LIMIT 1000"
            ))?;
            let rows = stmt.query_map(params![state], approval_row)?;
            rows.collect()
        })
    }

    /// At startup: every approval still pending belongs to a turn that is gone.
    pub fn approvals_orphan(&self) -> Result<usize, StoreError> {
        let now = now_unix() as i64;
        self.with(|c| {
            run(c,
                "UPDATE approvals SET state = 'denied', reason = 'orphaned', decided_at = ?1 WHERE state = 'pending'",
                params![now],
            )
        })
    }

    /// Cheap write probe for readiness.
    pub fn writable(&self) -> bool {
        self.with(|c| c.execute_batch("BEGIN IMMEDIATE; ROLLBACK;"))
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_turns_live_state_into_lost_tombstones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            let s = Store::open(&path).unwrap();
            s.execution_started("exe-1", "alice", "demo").unwrap();
            s.tokens_registered("exe-1", "alice", &[[1; 32], [2; 32]], "n=2")
                .unwrap();
            s.tokens_settled("exe-1", "alice", &[[1; 32]], "resolved", &[])
                .unwrap();
        }
        let s = Store::open(&path).unwrap();
        let r = s.recover().unwrap();
        assert_eq!(
            r,
            Recovery {
                executions_lost: 1,
                tokens_lost: 1
            }
        );
        let t = s.tombstones().unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].digest, t[0].reason.as_str()), ([1; 32], "resolved"));
        assert_eq!((t[1].digest, t[1].reason.as_str()), ([2; 32], "lost"));
        assert_eq!(s.recover().unwrap(), Recovery::default());
        let ev = s.journal_events("exe-1").unwrap();
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

    #[test]
    fn evicted_tombstones_are_deleted() {
        let s = Store::open_in_memory().unwrap();
        for i in 0..5u8 {
            s.tokens_registered("e", "alice", &[[i; 32]], "").unwrap();
            let evicted: &[[u8; 32]] = if i >= 3 { &[[i - 3; 32]] } else { &[] };
            s.tokens_settled("e", "alice", &[[i; 32]], "resolved", evicted)
                .unwrap();
        }
        s.tokens_settled("e", "bob", &[[9; 32]], "resolved", &[])
            .unwrap();
        let t = s.tombstones().unwrap();
        let alice: Vec<u8> = t
            .iter()
            .filter(|t| t.principal == "alice")
            .map(|t| t.digest[0])
            .collect();
        assert_eq!(alice, [2, 3, 4]);
        assert_eq!(t.iter().filter(|t| t.principal == "bob").count(), 1);
    }
}
