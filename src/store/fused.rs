//! The hot writes as one statement each, on PostgreSQL: a held turn's start, the recording of
//! its pending tokens, and their settlement. Each is what the portable form does in a
//! transaction of several statements, written as data-modifying `WITH` clauses, so it costs
//! one round trip and commits by itself. SQLite keeps the portable form (its statements are
//! local calls, not round trips).

use super::db::{vals, Tx};
use super::StoreError;

/// `executions` row and `execution_started` journal entry.
pub(super) async fn started(
    t: &mut Tx<'_>,
    (execution_id, principal, model): (&str, &str, &str),
    at: u64,
    owner: &str,
) -> Result<(), StoreError> {
    let detail = format!("principal={principal} model={model}");
    t.exec(
        "WITH started AS (
           INSERT INTO executions (execution_id, principal, model, state, created_at, owner)
           VALUES (?1, ?2, ?3, 'live', ?4, ?5))
         INSERT INTO journal (at, execution_id, event, detail)
         VALUES (?4, ?1, 'execution_started', ?6)",
        vals![execution_id, principal, model, at, owner, &detail],
    )
    .await?;
    Ok(())
}

/// A held turn's pending tokens (positions in order) and its `tokens_registered` entry.
pub(super) struct Pending<'a> {
    pub tokens: &'a [[u8; 32]],
    pub principal: &'a str,
    pub execution_id: &'a str,
    pub owner: &'a str,
    pub model: &'a str,
    pub surface: &'a str,
    pub deadline_ms: u64,
    pub digests: &'a [u8],
    pub at: u64,
    pub detail: &'a str,
}

pub(super) async fn pending(t: &mut Tx<'_>, p: &Pending<'_>) -> Result<(), StoreError> {
    t.exec(
        "WITH registered AS (
           INSERT INTO pending_tokens (digest, principal, execution_id, owner, model, surface,
                                       deadline_ms, digests, position)
           SELECT token, ?2, ?3, ?4, ?5, ?6, ?7, ?8, n - 1
           FROM unnest(?1::bytea[]) WITH ORDINALITY AS batch(token, n))
         INSERT INTO journal (at, execution_id, event, detail)
         VALUES (?9, ?3, 'tokens_registered', ?10)",
        vals![
            crate::store::db::Val::Digests(p.tokens),
            p.principal,
            p.execution_id,
            p.owner,
            p.model,
            p.surface,
            p.deadline_ms,
            p.digests,
            p.at,
            p.detail
        ],
    )
    .await?;
    Ok(())
}

/// Settles the still-pending ones of `digests` (held or stateless) as tombstones, deletes the
/// tombstones the ring evicted and journals `tokens_settled`. Returns how many it settled.
pub(super) async fn settled(
    t: &mut Tx<'_>,
    (execution_id, principal): (&str, &str),
    digests: &[[u8; 32]],
    reason: &str,
    evicted: &[[u8; 32]],
    at: u64,
) -> Result<usize, StoreError> {
    let rows = t
        .rows(
            "WITH held AS (DELETE FROM pending_tokens WHERE digest = ANY(?1) RETURNING digest),
                  stateless AS (DELETE FROM upstream_pending WHERE digest = ANY(?1) RETURNING digest),
                  settled AS (
                    INSERT INTO tombstones (digest, principal, reason, at)
                    SELECT digest, ?2::text, ?3::text, ?4::bigint FROM held
                    UNION ALL SELECT digest, ?2::text, ?3::text, ?4::bigint FROM stateless
                    ON CONFLICT (digest) DO UPDATE SET principal = excluded.principal,
                      reason = excluded.reason, at = excluded.at
                    RETURNING digest),
                  evicted AS (DELETE FROM tombstones WHERE digest = ANY(?5)),
                  logged AS (
                    INSERT INTO journal (at, execution_id, event, detail)
                    SELECT ?4::bigint, ?6::text, 'tokens_settled',
                           'reason=' || ?3::text || ' count=' || count(*) FROM settled)
             SELECT count(*) FROM settled",
            vals![
                crate::store::db::Val::Digests(digests),
                principal,
                reason,
                at,
                crate::store::db::Val::Digests(evicted),
                execution_id
            ],
        )
        .await?;
    let n = rows.first().map(|r| r.i(0)).transpose()?.unwrap_or(0);
    Ok(n as usize)
}
