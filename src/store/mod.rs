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
";

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
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    pub fn open_in_memory() -> Result<Store, StoreError> {
        let conn = Connection::open_in_memory()?;
        conn.execute_batch(SCHEMA)?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(
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
            let tokens = tx.execute(
                "INSERT OR IGNORE INTO tombstones (digest, principal, reason, at)
                 SELECT digest, principal, 'lost', ?1 FROM pending_tokens",
                params![now],
            )?;
            tx.execute("DELETE FROM pending_tokens", [])?;
            tx.execute(
                "INSERT INTO journal (at, execution_id, event, detail)
                 SELECT ?1, execution_id, 'execution_ended', 'reason=lost (gateway restart)'
                 FROM executions WHERE state = 'live'",
                params![now],
            )?;
            let execs = tx.execute(
                "UPDATE executions SET state = 'ended', reason = 'lost', ended_at = ?1 WHERE state = 'live'",
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
            c.execute(
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
            tx.execute(
                "INSERT INTO executions (execution_id, principal, model, state, created_at)
                 VALUES (?1, ?2, ?3, 'live', ?4)",
                params![execution_id, principal, model, now],
            )?;
            tx.execute(
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
            tx.execute(
                "UPDATE executions SET state = 'ended', reason = ?2, ended_at = ?3 WHERE execution_id = ?1",
                params![execution_id, reason, now],
            )?;
            tx.execute(
                "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'execution_ended', ?3)",
                params![now, execution_id, format!("reason={reason}")],
            )?;
            tx.commit()
        })
    }

    /// Records a batch of pending token digests (register-before-exposure).
    pub fn tokens_registered(
        &self,
        execution_id: &str,
        principal: &str,
        digests: &[[u8; 32]],
        detail: &str,
    ) -> Result<(), StoreError> {
        let now = now_unix() as i64;
        self.with(|c| {
            let tx = c.transaction()?;
            for d in digests {
                tx.execute(
                    "INSERT INTO pending_tokens (digest, principal, execution_id) VALUES (?1, ?2, ?3)",
                    params![&d[..], principal, execution_id],
                )?;
            }
            tx.execute(
                "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'tokens_registered', ?3)",
                params![now, execution_id, detail],
            )?;
            tx.commit()
        })
    }

    /// Turns pending tokens into tombstones and trims the principal's ring to `ring` entries.
    pub fn tokens_settled(
        &self,
        execution_id: &str,
        principal: &str,
        digests: &[[u8; 32]],
        reason: &str,
        ring: usize,
    ) -> Result<(), StoreError> {
        let now = now_unix() as i64;
        self.with(|c| {
            let tx = c.transaction()?;
            for d in digests {
                tx.execute("DELETE FROM pending_tokens WHERE digest = ?1", params![&d[..]])?;
                tx.execute(
                    "INSERT OR REPLACE INTO tombstones (digest, principal, reason, at) VALUES (?1, ?2, ?3, ?4)",
                    params![&d[..], principal, reason, now],
                )?;
            }
            tx.execute(
                "DELETE FROM tombstones WHERE principal = ?1 AND seq NOT IN
                 (SELECT seq FROM tombstones WHERE principal = ?1 ORDER BY seq DESC LIMIT ?2)",
                params![principal, ring as i64],
            )?;
            tx.execute(
                "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'tokens_settled', ?3)",
                params![now, execution_id, format!("reason={reason} count={}", digests.len())],
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

    /// Number of journal rows for an execution (tests and diagnostics).
    pub fn journal_events(&self, execution_id: &str) -> Result<Vec<String>, StoreError> {
        self.with(|c| {
            let mut stmt =
                c.prepare("SELECT event FROM journal WHERE execution_id = ?1 ORDER BY seq")?;
            let rows = stmt.query_map(params![execution_id], |r| r.get::<_, String>(0))?;
            rows.collect()
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
            s.tokens_settled("exe-1", "alice", &[[1; 32]], "resolved", 10)
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
    fn tombstone_ring_is_bounded_per_principal() {
        let s = Store::open_in_memory().unwrap();
        for i in 0..5u8 {
            s.tokens_registered("e", "alice", &[[i; 32]], "").unwrap();
            s.tokens_settled("e", "alice", &[[i; 32]], "resolved", 3)
                .unwrap();
        }
        s.tokens_settled("e", "bob", &[[9; 32]], "resolved", 3)
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
