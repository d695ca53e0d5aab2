//! The hot writes as one statement each, on PostgreSQL: a held turn's start, the recording of
//! its pending tokens, their settlement, and a batch of the journal writer's starts and ends. Each is what the portable form does in a
//! transaction of several statements, written as data-modifying `WITH` clauses, so it costs
//! one round trip and commits by itself. SQLite keeps the portable form (its statements are
//! local calls, not round trips).

use std::collections::{HashMap, HashSet};

use super::db::{vals, Tx, Val};
use super::{Lifecycle, StoreError};

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
            Val::Digests(p.tokens),
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
                Val::Digests(digests),
                principal,
                reason,
                at,
                Val::Digests(evicted),
                execution_id
            ],
        )
        .await?;
    let n = rows.first().map(|r| r.i(0)).transpose()?.unwrap_or(0);
    Ok(n as usize)
}

/// The journal writer's batch as columns: the executions it starts (with their end when it
/// is in the same batch: a statement's parts do not see each other's rows), the ends of
/// executions started before, and every journal entry in order.
#[derive(Default)]
struct Columns<'a> {
    started: [Vec<Option<&'a str>>; 4],
    started_at: Vec<i64>,
    ended_at_start: Vec<i64>,
    ended: [Vec<Option<&'a str>>; 2],
    ended_at: Vec<i64>,
    journal: [Vec<Option<&'a str>>; 2],
    journal_at: Vec<i64>,
    details: Vec<String>,
}

pub(super) async fn journaled(
    t: &mut Tx<'_>,
    rows: &[Lifecycle],
    owner: &str,
) -> Result<(), StoreError> {
    let mut c = Columns::default();
    let (mut starts, mut ends) = (HashSet::new(), HashMap::new());
    for row in rows {
        match row {
            Lifecycle::Started { execution_id, .. } => {
                starts.insert(execution_id.as_str());
            }
            Lifecycle::Ended {
                execution_id,
                reason,
                at,
            } => {
                ends.insert(execution_id.as_str(), (*reason, *at));
            }
            // Written on their own (`lifecycle::fused_runs`).
            Lifecycle::Settled(_) => {}
        }
    }
    for row in rows {
        match row {
            Lifecycle::Started {
                execution_id,
                principal,
                model,
                at,
            } => {
                let end = ends.get(execution_id.as_str());
                let [id, who, m, reason] = &mut c.started;
                id.push(Some(execution_id));
                who.push(Some(principal));
                m.push(Some(model));
                reason.push(end.map(|e| e.0));
                c.started_at.push(*at as i64);
                c.ended_at_start.push(end.map_or(0, |e| e.1 as i64));
                c.details
                    .push(format!("principal={principal} model={model}"));
                c.journal[0].push(Some(execution_id));
                c.journal[1].push(Some("execution_started"));
                c.journal_at.push(*at as i64);
            }
            Lifecycle::Ended {
                execution_id,
                reason,
                at,
            } => {
                if !starts.contains(execution_id.as_str()) {
                    c.ended[0].push(Some(execution_id));
                    c.ended[1].push(Some(reason));
                    c.ended_at.push(*at as i64);
                }
                c.details.push(format!("reason={reason}"));
                c.journal[0].push(Some(execution_id));
                c.journal[1].push(Some("execution_ended"));
                c.journal_at.push(*at as i64);
            }
            Lifecycle::Settled(_) => {}
        }
    }
    let details: Vec<Option<&str>> = c.details.iter().map(|d| Some(d.as_str())).collect();
    let [id, who, model, reason] = &c.started;
    t.exec(
        "WITH started AS (
           INSERT INTO executions (execution_id, principal, model, state, created_at, owner,
                                   reason, ended_at)
           SELECT id, principal, model, CASE WHEN reason IS NULL THEN 'live' ELSE 'ended' END,
                  at, ?1, reason, CASE WHEN reason IS NULL THEN NULL ELSE ended_at END
           FROM unnest(?2::text[], ?3::text[], ?4::text[], ?5::text[], ?6::bigint[], ?7::bigint[])
             AS s(id, principal, model, reason, at, ended_at)),
         ended AS (
           UPDATE executions SET state = 'ended', reason = e.reason, ended_at = e.at
           FROM unnest(?8::text[], ?9::text[], ?10::bigint[]) AS e(id, reason, at)
           WHERE executions.execution_id = e.id AND executions.state = 'live')
         INSERT INTO journal (at, execution_id, event, detail)
         SELECT at, id, event, detail
         FROM unnest(?11::bigint[], ?12::text[], ?13::text[], ?14::text[]) WITH ORDINALITY
           AS j(at, id, event, detail, n)
         ORDER BY n",
        vals![
            owner,
            Val::Texts(id),
            Val::Texts(who),
            Val::Texts(model),
            Val::Texts(reason),
            Val::Ints(&c.started_at),
            Val::Ints(&c.ended_at_start),
            Val::Texts(&c.ended[0]),
            Val::Texts(&c.ended[1]),
            Val::Ints(&c.ended_at),
            Val::Ints(&c.journal_at),
            Val::Texts(&c.journal[0]),
            Val::Texts(&c.journal[1]),
            Val::Texts(&details)
        ],
    )
    .await?;
    Ok(())
}
