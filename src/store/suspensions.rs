//! Suspensions in the store: pending token digests of held turns, the durable records of
//! stateless upstream suspensions (digests, the upstream's call ids, no content), and the
//! per-client tombstones. This file owns the byte layout of those rows: the four digests are
//! one 128-byte blob (tools | tool_choice | prefix | echo), one row per token.

use rusqlite::{params, Connection};

use super::{now_unix, run, Store, StoreError};
use crate::continuation::Digests;
use crate::digest::log_ref;
use crate::turn::Surface;

/// A suspension about to be exposed (register-before-exposure).
pub struct SuspensionRecord<'a> {
    pub execution_id: &'a str,
    pub principal: &'a str,
    pub model: &'a str,
    pub surface: Surface,
    /// Unix milliseconds.
    pub deadline_ms: u64,
    pub digests: &'a Digests,
    /// Token digests in exposure order.
    pub tokens: &'a [[u8; 32]],
    /// For a stateless upstream (durable across restarts): its call ids, in token order.
    pub ids: Option<&'a [String]>,
    pub rounds: u32,
    pub created_at: u64,
}

/// A durable suspension as recovered at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSuspension {
    pub execution_id: String,
    pub principal: String,
    pub model: String,
    pub surface: Surface,
    pub deadline_ms: u64,
    pub digests: Digests,
    pub tokens: Vec<[u8; 32]>,
    pub ids: Vec<String>,
    pub rounds: u32,
    pub created_at: u64,
}

fn pack(d: &Digests) -> [u8; 128] {
    let mut out = [0u8; 128];
    for (i, part) in [d.tools, d.tool_choice, d.prefix, d.echo]
        .iter()
        .enumerate()
    {
        out[i * 32..(i + 1) * 32].copy_from_slice(part);
    }
    out
}

fn unpack(blob: &[u8]) -> Option<Digests> {
    let part = |i: usize| -> Option<[u8; 32]> { blob.get(i * 32..(i + 1) * 32)?.try_into().ok() };
    Some(Digests {
        tools: part(0)?,
        tool_choice: part(1)?,
        prefix: part(2)?,
        echo: part(3)?,
    })
}

/// Brings a store written by an older version up to this layout.
pub(super) fn migrate(c: &Connection) -> rusqlite::Result<()> {
    let has_surface = c
        .prepare("SELECT 1 FROM pragma_table_info('upstream_pending') WHERE name = 'surface'")?
        .exists([])?;
    if !has_surface {
        c.execute_batch(
            "ALTER TABLE upstream_pending ADD COLUMN surface TEXT NOT NULL DEFAULT 'chat'",
        )?;
    }
    Ok(())
}

impl Store {
    /// Records a suspension before any of its tokens is exposed: a stateless upstream's in
    /// full (it must survive a restart), a held turn's as pending token digests (which a
    /// restart turns into `lost` tombstones).
    pub fn suspension_recorded(&self, r: &SuspensionRecord<'_>) -> Result<(), StoreError> {
        let Some(ids) = r.ids else {
            let detail = format!(
                "count={} tokens={} tools={} prefix={} echo={}",
                r.tokens.len(),
                r.tokens.iter().map(log_ref).collect::<Vec<_>>().join(","),
                log_ref(&r.digests.tools),
                log_ref(&r.digests.prefix),
                log_ref(&r.digests.echo)
            );
            return self.tokens_registered(r.execution_id, r.principal, r.tokens, &detail);
        };
        let now = now_unix() as i64;
        let blob = pack(r.digests);
        self.with(|c| {
            let tx = c.transaction()?;
            for (i, (token, id)) in r.tokens.iter().zip(ids).enumerate() {
                run(&tx,
                    "INSERT INTO upstream_pending (digest, execution_id, principal, model, deadline_ms, digests,
                     upstream_id, position, rounds, created_at, surface) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)",
                    params![&token[..], r.execution_id, r.principal, r.model, r.deadline_ms as i64,
                            &blob[..], id, i as u32, r.rounds, r.created_at as i64, r.surface.as_str()],
                )?;
            }
            run(&tx,
                "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'tokens_registered', ?3)",
                params![now, r.execution_id, format!("count={} upstream=1", r.tokens.len())],
            )?;
            tx.commit()
        })
    }

    /// Records a batch of pending token digests of a held turn.
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
                run(&tx,
                    "INSERT INTO pending_tokens (digest, principal, execution_id) VALUES (?1, ?2, ?3)",
                    params![&d[..], principal, execution_id],
                )?;
            }
            run(&tx,
                "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'tokens_registered', ?3)",
                params![now, execution_id, detail],
            )?;
            tx.commit()
        })
    }

    /// Turns pending tokens into tombstones and deletes the tombstones the principal's ring
    /// evicted (the registry owns the ring; deleting by key keeps this O(evicted)).
    pub fn tokens_settled(
        &self,
        execution_id: &str,
        principal: &str,
        digests: &[[u8; 32]],
        reason: &str,
        evicted: &[[u8; 32]],
    ) -> Result<(), StoreError> {
        let now = now_unix() as i64;
        self.with(|c| {
            let tx = c.transaction()?;
            for d in digests {
                run(&tx, "DELETE FROM pending_tokens WHERE digest = ?1", params![&d[..]])?;
                run(&tx, "DELETE FROM upstream_pending WHERE digest = ?1", params![&d[..]])?;
                run(&tx,
                    "INSERT OR REPLACE INTO tombstones (digest, principal, reason, at) VALUES (?1, ?2, ?3, ?4)",
                    params![&d[..], principal, reason, now],
                )?;
            }
            for d in evicted {
                run(&tx, "DELETE FROM tombstones WHERE digest = ?1", params![&d[..]])?;
            }
            run(&tx,
                "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'tokens_settled', ?3)",
                params![now, execution_id, format!("reason={reason} count={}", digests.len())],
            )?;
            tx.commit()
        })
    }

    /// Every durable (stateless upstream) suspension still pending, one per execution.
    pub fn durable_suspensions(&self) -> Result<Vec<StoredSuspension>, StoreError> {
        let rows = self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT digest, execution_id, principal, model, deadline_ms, digests, upstream_id, rounds,
                 created_at, surface FROM upstream_pending ORDER BY execution_id, position",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, Vec<u8>>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)? as u64,
                    r.get::<_, Vec<u8>>(5)?,
                    r.get::<_, String>(6)?,
                    r.get::<_, u32>(7)?,
                    r.get::<_, i64>(8)? as u64,
                    r.get::<_, String>(9)?,
                ))
            })?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
        })?;
        let mut out: Vec<StoredSuspension> = Vec::new();
        for (
            token,
            execution_id,
            principal,
            model,
            deadline_ms,
            blob,
            id,
            rounds,
            created_at,
            surface,
        ) in rows
        {
            let (Ok(token), Some(digests), Some(surface)) = (
                <[u8; 32]>::try_from(token.as_slice()),
                unpack(&blob),
                Surface::parse(&surface),
            ) else {
                continue;
            };
            match out.last_mut() {
                Some(s) if s.execution_id == execution_id => {
                    s.tokens.push(token);
                    s.ids.push(id);
                }
                _ => out.push(StoredSuspension {
                    execution_id,
                    principal,
                    model,
                    surface,
                    deadline_ms,
                    digests,
                    tokens: vec![token],
                    ids: vec![id],
                    rounds,
                    created_at,
                }),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_durable_suspension_round_trips() {
        let s = Store::open_in_memory().unwrap();
        let digests = Digests {
            tools: [1; 32],
            tool_choice: [2; 32],
            prefix: [3; 32],
            echo: [4; 32],
        };
        let ids = vec!["call_a".to_string(), "call_b".to_string()];
        s.suspension_recorded(&SuspensionRecord {
            execution_id: "exe-1",
            principal: "alice",
            model: "m",
            surface: Surface::Chat,
            deadline_ms: 99,
            digests: &digests,
            tokens: &[[7; 32], [8; 32]],
            ids: Some(&ids),
            rounds: 2,
            created_at: 5,
        })
        .unwrap();
        let got = s.durable_suspensions().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].digests, digests);
        assert_eq!(got[0].tokens, [[7; 32], [8; 32]]);
        assert_eq!(got[0].ids, ids);
        assert_eq!((got[0].rounds, got[0].deadline_ms), (2, 99));
        s.tokens_settled("exe-1", "alice", &[[7; 32], [8; 32]], "resolved", &[])
            .unwrap();
        assert!(s.durable_suspensions().unwrap().is_empty());
    }
}
