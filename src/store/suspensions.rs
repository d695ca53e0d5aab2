//! Suspensions in the store: pending token digests of held turns, the durable records of
//! stateless upstream suspensions (digests, the upstream's call ids, no content), and the
//! per-client tombstones. This file owns the byte layout of those rows: the four digests are
//! one 128-byte blob (tools | tool_choice | prefix | echo), one row per token.

use super::db::{vals, Engine, Row, Tx};
use super::fused;
use super::{now_unix, Change, ChangeKind, Held, Store, StoreError};
use crate::continuation::Digests;
use crate::digest::log_ref;
use crate::turn::SurfaceId;

/// A suspension about to be exposed (register-before-exposure).
pub struct SuspensionRecord<'a> {
    pub execution_id: &'a str,
    pub principal: &'a str,
    pub model: &'a str,
    pub surface: SurfaceId,
    /// Unix milliseconds.
    pub deadline_ms: u64,
    pub digests: &'a Digests,
    /// Token digests in exposure order.
    pub tokens: &'a [[u8; 32]],
    /// For a stateless upstream (durable across restarts): its call ids, in token order.
    pub ids: Option<&'a [String]>,
    pub rounds: u32,
    pub created_at: u64,
    /// What the execution has spent so far, in nano-USD (a stateless record's; its
    /// per-execution cap is checked against it wherever it is claimed).
    pub spend: u64,
}

/// What the outbox reports of a recorded suspension.
fn held<'a>(r: &SuspensionRecord<'a>) -> Held<'a> {
    Held {
        execution_id: r.execution_id,
        principal: r.principal,
        model: r.model,
        surface: r.surface.as_str(),
        calls: r.tokens.len(),
        deadline_ms: r.deadline_ms,
    }
}

/// A durable suspension as recovered at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSuspension {
    pub execution_id: String,
    pub principal: String,
    pub model: String,
    pub surface: SurfaceId,
    pub deadline_ms: u64,
    pub digests: Digests,
    pub tokens: Vec<[u8; 32]>,
    pub ids: Vec<String>,
    pub rounds: u32,
    pub created_at: u64,
    pub spend: u64,
}

pub(super) fn pack(d: &Digests) -> [u8; 128] {
    let mut out = [0u8; 128];
    for (i, part) in [d.tools, d.tool_choice, d.prefix, d.echo]
        .iter()
        .enumerate()
    {
        out[i * 32..(i + 1) * 32].copy_from_slice(part);
    }
    out
}

pub(super) fn unpack(blob: &[u8]) -> Option<Digests> {
    let part = |i: usize| -> Option<[u8; 32]> { blob.get(i * 32..(i + 1) * 32)?.try_into().ok() };
    Some(Digests {
        tools: part(0)?,
        tool_choice: part(1)?,
        prefix: part(2)?,
        echo: part(3)?,
    })
}

/// The columns of a durable record, as [`durable_rows`] folds them.
pub(super) const DURABLE_COLUMNS: &str = "digest, execution_id, principal, model, deadline_ms, digests, upstream_id, rounds, created_at, surface, spend_nanousd";

/// Folds rows of [`DURABLE_COLUMNS`] ordered by execution and position into suspensions.
pub(super) fn durable_rows(rows: &[Row]) -> Result<Vec<StoredSuspension>, StoreError> {
    let mut out: Vec<StoredSuspension> = Vec::new();
    for r in rows {
        let (Some(token), Some(digests), Some(surface)) =
            (r.digest(0)?, unpack(&r.b(5)?), SurfaceId::parse(&r.t(9)?))
        else {
            continue;
        };
        let execution_id = r.t(1)?;
        match out.last_mut() {
            Some(s) if s.execution_id == execution_id => {
                s.tokens.push(token);
                s.ids.push(r.t(6)?);
            }
            _ => out.push(StoredSuspension {
                execution_id,
                principal: r.t(2)?,
                model: r.t(3)?,
                surface,
                deadline_ms: r.i(4)? as u64,
                digests,
                tokens: vec![token],
                ids: vec![r.t(6)?],
                rounds: r.i(7)? as u32,
                created_at: r.i(8)? as u64,
                spend: r.i(10)? as u64,
            }),
        }
    }
    Ok(out)
}

/// Turns pending rows into tombstones; only the rows still pending (another replica may have
/// settled them first). A held turn's tokens are only in `pending_tokens`; with `stateless`,
/// `upstream_pending` is looked in too. Returns the digests this call settled.
async fn settle(
    t: &mut Tx<'_>,
    (principal, stateless): (&str, bool),
    digests: &[[u8; 32]],
    reason: &str,
    now: u64,
) -> Result<Vec<[u8; 32]>, StoreError> {
    let mut settled = Vec::with_capacity(digests.len());
    for d in digests {
        let mut n = t
            .exec("DELETE FROM pending_tokens WHERE digest = ?1", vals![d])
            .await?;
        if stateless {
            n += t
                .exec("DELETE FROM upstream_pending WHERE digest = ?1", vals![d])
                .await?;
        }
        if n > 0 {
            t.exec(
                "INSERT INTO tombstones (digest, principal, reason, at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (digest) DO UPDATE SET principal = excluded.principal,
                 reason = excluded.reason, at = excluded.at",
                vals![d, principal, reason, now],
            )
            .await?;
            settled.push(*d);
        }
    }
    Ok(settled)
}

/// A settled batch's rows on SQLite (`super::Settlement`): its tokens (a held turn's, or with
/// `stateless` possibly a stateless upstream's), `reason` and the tombstones evicted. How
/// many tokens it settled.
pub(super) async fn settled_rows(
    t: &mut Tx<'_>,
    (execution_id, principal, stateless): (&str, &str, bool),
    (digests, reason, evicted): (&[[u8; 32]], &str, &[[u8; 32]]),
    now: u64,
) -> Result<usize, StoreError> {
    let settled = settle(t, (principal, stateless), digests, reason, now).await?;
    for d in evicted {
        t.exec("DELETE FROM tombstones WHERE digest = ?1", vals![d])
            .await?;
    }
    let detail = format!("reason={reason} count={}", settled.len());
    t.exec(
        "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'tokens_settled', ?3)",
        vals![now, execution_id, &detail],
    )
    .await?;
    Ok(settled.len())
}

impl Store {
    /// A held turn's pending tokens on PostgreSQL: one fused statement, in a transaction only
    /// while an endpoint subscribes to held turns (their outbox rows go with it).
    async fn pending_fused(
        &self,
        r: &SuspensionRecord<'_>,
        pending: &fused::Pending<'_>,
    ) -> Result<(), StoreError> {
        if !self.announces(ChangeKind::Held) {
            return self
                .db
                .read(async |t| fused::pending(t, pending).await)
                .await;
        }
        self.announcing(async |t| {
            fused::pending(t, pending).await?;
            let write = self.announce(t, &Change::Held(held(r)));
            write.await
        })
        .await
    }

    /// Records a suspension before any of its tokens is exposed: a stateless upstream's in
    /// full (it must survive a restart), a held turn's as pending token digests with what
    /// another replica needs to validate a continuation before forwarding it here (a restart
    /// of this replica turns them into `lost` tombstones).
    pub async fn suspension_recorded(&self, r: &SuspensionRecord<'_>) -> Result<(), StoreError> {
        let now = now_unix();
        let blob = pack(r.digests);
        let owner = self.owner.as_str();
        let detail = match r.ids {
            None => format!(
                "count={} tokens={} tools={} prefix={} echo={}",
                r.tokens.len(),
                r.tokens.iter().map(log_ref).collect::<Vec<_>>().join(","),
                log_ref(&r.digests.tools),
                log_ref(&r.digests.prefix),
                log_ref(&r.digests.echo)
            ),
            Some(_) => format!("count={} upstream=1", r.tokens.len()),
        };
        if let (None, Engine::Postgres) = (r.ids, self.db.engine()) {
            let pending = fused::Pending {
                tokens: r.tokens,
                principal: r.principal,
                execution_id: r.execution_id,
                owner,
                model: r.model,
                surface: r.surface.as_str(),
                deadline_ms: r.deadline_ms,
                digests: &blob[..],
                at: now,
                detail: &detail,
            };
            // One await here: `pending` lives in one state of this call's future, so the
            // branch below does not make it larger.
            return self.pending_fused(r, &pending).await;
        }
        self.announcing(async |t| {
            for (i, token) in r.tokens.iter().enumerate() {
                match r.ids {
                    None => t.exec(
                        "INSERT INTO pending_tokens (digest, principal, execution_id, owner, model, surface,
                         deadline_ms, digests, position) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9)",
                        vals![token, r.principal, r.execution_id, owner, r.model, r.surface.as_str(),
                              r.deadline_ms, &blob[..], i as u64],
                    ).await?,
                    Some(ids) => t.exec(
                        "INSERT INTO upstream_pending (digest, execution_id, principal, model, deadline_ms, digests,
                         upstream_id, position, rounds, created_at, surface, owner, spend_nanousd)
                         VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)",
                        vals![token, r.execution_id, r.principal, r.model, r.deadline_ms, &blob[..],
                              ids.get(i).map(String::as_str).unwrap_or_default(), i as u64, r.rounds,
                              r.created_at, r.surface.as_str(), owner, r.spend],
                    ).await?,
                };
            }
            t.exec(
                "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'tokens_registered', ?3)",
                vals![now, r.execution_id, &detail],
            ).await?;
            let write = self.announce(t, &Change::Held(held(r)));
            write.await
        }).await
    }

    /// Turns pending tokens into tombstones (only those still pending: the write is
    /// conditional, so a settlement by another replica wins once) and deletes the tombstones
    /// the principal's ring evicted (the registry owns the ring; deleting by key keeps this
    /// O(evicted)). Returns how many of `digests` this call settled.
    pub async fn tokens_settled(
        &self,
        execution_id: &str,
        principal: &str,
        digests: &[[u8; 32]],
        reason: &str,
        evicted: &[[u8; 32]],
    ) -> Result<usize, StoreError> {
        let now = now_unix();
        if self.db.engine() == Engine::Postgres {
            let who = (execution_id, principal);
            return self
                .db
                .read(async |t| fused::settled(t, who, digests, reason, evicted, now).await)
                .await;
        }
        let who = (execution_id, principal, true);
        self.db
            .tx(async |t| settled_rows(t, who, (digests, reason, evicted), now).await)
            .await
    }

    /// Every durable (stateless upstream) suspension of this replica still pending, one per
    /// execution.
    pub async fn durable_suspensions(&self) -> Result<Vec<StoredSuspension>, StoreError> {
        let owner = self.owner.as_str();
        let rows = self.db.read(async |t| {
            t.rows(
                &format!("SELECT {DURABLE_COLUMNS} FROM upstream_pending WHERE owner = ?1 ORDER BY execution_id, position"),
                vals![owner],
            ).await
        }).await?;
        durable_rows(&rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_durable_suspension_round_trips() {
        let s = Store::open_in_memory().await.unwrap();
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
            surface: SurfaceId::Chat,
            deadline_ms: 99,
            digests: &digests,
            tokens: &[[7; 32], [8; 32]],
            ids: Some(&ids),
            rounds: 2,
            created_at: 5,
            spend: 42,
        })
        .await
        .unwrap();
        let got = s.durable_suspensions().await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].digests, digests);
        assert_eq!(got[0].tokens, [[7; 32], [8; 32]]);
        assert_eq!(got[0].ids, ids);
        assert_eq!((got[0].rounds, got[0].deadline_ms), (2, 99));
        assert_eq!(got[0].spend, 42);
        s.tokens_settled("exe-1", "alice", &[[7; 32], [8; 32]], "resolved", &[])
            .await
            .unwrap();
        assert!(s.durable_suspensions().await.unwrap().is_empty());
    }

    /// Security review finding 4, in the store: a stateless record still claimed when its
    /// process went away has an unknown outcome; recovery spends it `lost` (never pending
    /// again), while an unclaimed one is restored.
    #[tokio::test]
    async fn a_claimed_stateless_record_is_lost_at_recovery_an_unclaimed_one_stays() {
        let s = Store::open_in_memory().await.unwrap();
        let digests = Digests {
            tools: [1; 32],
            tool_choice: [2; 32],
            prefix: [3; 32],
            echo: [4; 32],
        };
        let ids = vec!["call_a".to_string()];
        for (exe, token) in [("exe-claimed", [7; 32]), ("exe-free", [8; 32])] {
            s.execution_started(exe, "alice", "m").await.unwrap();
            s.suspension_recorded(&SuspensionRecord {
                execution_id: exe,
                principal: "alice",
                model: "m",
                surface: SurfaceId::Chat,
                deadline_ms: u64::MAX / 2,
                digests: &digests,
                tokens: &[token],
                ids: Some(&ids),
                rounds: 1,
                created_at: 5,
                spend: 0,
            })
            .await
            .unwrap();
        }
        assert!(s.upstream_claim("exe-claimed", 1).await.unwrap());
        // Its own earlier claim is this gateway's to take again.
        assert!(s.upstream_claim("exe-claimed", 1).await.unwrap());
        let r = s.recover().await.unwrap();
        assert_eq!((r.tokens_lost, r.executions_lost), (1, 1));
        let left = s.durable_suspensions().await.unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].execution_id, "exe-free");
        let t = s.tombstones().await.unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].digest, t[0].reason.as_str()), ([7; 32], "lost"));
    }
}
