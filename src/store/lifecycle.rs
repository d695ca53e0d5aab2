//! An execution's lifecycle in the store: its start, its end and its settled batches of
//! tokens, each written on its own or, as the engine's journal writer queued them, in order
//! in one transaction.

use std::sync::Arc;

use super::db::{self, vals};
use super::suspensions::settled_rows;
use super::{fused, now_unix, ChangeKind, Store, StoreError};

/// An execution's start or end (`at`: Unix seconds when it happened, not when it was
/// written), or a batch of its tokens settled, as the journal writer queues them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lifecycle {
    Started {
        execution_id: String,
        principal: String,
        model: String,
        at: u64,
    },
    Ended {
        execution_id: String,
        reason: &'static str,
        at: u64,
    },
    Settled(Settlement),
}

/// A held turn's settled batch (never a stateless upstream's, whose durable records are
/// settled at once): its tokens' pending rows become tombstones (`reason`), the tombstones
/// the principal's ring pushed out are deleted, and the journal says how many were settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub execution_id: Arc<str>,
    pub principal: Arc<str>,
    pub tokens: Vec<[u8; 32]>,
    pub reason: &'static str,
    pub evicted: Vec<[u8; 32]>,
}

impl Store {
    pub async fn execution_started(
        &self,
        execution_id: &str,
        principal: &str,
        model: &str,
    ) -> Result<(), StoreError> {
        let (owner, row) = (self.owner.as_str(), (execution_id, principal, model));
        if self.db.engine() == db::Engine::Postgres {
            let at = now_unix();
            return self
                .db
                .read(async |t| fused::started(t, row, at, owner).await)
                .await;
        }
        self.db
            .tx(async |t| started_rows(t, row, now_unix(), owner).await)
            .await
    }

    /// Lifecycle rows queued behind the request path, in order, in one transaction (the
    /// engine's journal writer); on PostgreSQL each run of starts and ends is one statement.
    pub async fn executions_journaled(&self, rows: &[Lifecycle]) -> Result<(), StoreError> {
        let owner = self.owner.as_str();
        let announces = self.announces(ChangeKind::Ended);
        if self.db.engine() == db::Engine::Postgres && !announces {
            return self
                .db
                .read(async |t| fused_runs(t, rows, owner).await)
                .await;
        }
        self.announcing(async |t| {
            if t.engine() == db::Engine::Postgres {
                fused_runs(t, rows, owner).await?;
                return self.announce_ends(t, rows).await;
            }
            for row in rows {
                match row {
                    Lifecycle::Started {
                        execution_id,
                        principal,
                        model,
                        at,
                    } => started_rows(t, (execution_id, principal, model), *at, owner).await?,
                    Lifecycle::Ended {
                        execution_id,
                        reason,
                        at,
                    } => ended_rows(t, execution_id, reason, *at).await?,
                    Lifecycle::Settled(s) => {
                        let who = (&*s.execution_id, &*s.principal, false);
                        let batch = (&s.tokens[..], s.reason, &s.evicted[..]);
                        settled_rows(t, who, batch, now_unix()).await?;
                    }
                }
            }
            if announces {
                self.announce_ends(t, rows).await?;
            }
            Ok(())
        })
        .await
    }

    pub async fn execution_ended(
        &self,
        execution_id: &str,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.announcing(async |t| {
            ended_rows(t, execution_id, reason, now_unix()).await?;
            if self.announces(ChangeKind::Ended) {
                Box::pin(self.announce_end(t, execution_id, reason)).await?;
            }
            Ok(())
        })
        .await
    }
}

/// PostgreSQL: each run of starts and ends as one fused statement, each settled batch as its
/// own.
async fn fused_runs(t: &mut db::Tx<'_>, rows: &[Lifecycle], owner: &str) -> Result<(), StoreError> {
    let settled = |r: &Lifecycle| matches!(r, Lifecycle::Settled(_));
    for run in rows.chunk_by(|a, b| settled(a) == settled(b)) {
        if !settled(&run[0]) {
            fused::journaled(t, run, owner).await?;
            continue;
        }
        for row in run {
            if let Lifecycle::Settled(s) = row {
                let who = (&*s.execution_id, &*s.principal);
                fused::settled(t, who, &s.tokens, s.reason, &s.evicted, now_unix()).await?;
            }
        }
    }
    Ok(())
}

/// An execution's live row and its `execution_started` journal entry.
async fn started_rows(
    t: &mut db::Tx<'_>,
    (execution_id, principal, model): (&str, &str, &str),
    at: u64,
    owner: &str,
) -> Result<(), StoreError> {
    let detail = format!("principal={principal} model={model}");
    t.exec(
        "INSERT INTO executions (execution_id, principal, model, state, created_at, owner)
         VALUES (?1, ?2, ?3, 'live', ?4, ?5)",
        vals![execution_id, principal, model, at, owner],
    )
    .await?;
    t.exec(
        "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'execution_started', ?3)",
        vals![at, execution_id, &detail],
    ).await?;
    Ok(())
}

/// An execution's end and its `execution_ended` journal entry. A row another replica already
/// ended (settled `lost`) keeps that ending.
async fn ended_rows(
    t: &mut db::Tx<'_>,
    execution_id: &str,
    reason: &str,
    at: u64,
) -> Result<(), StoreError> {
    let detail = format!("reason={reason}");
    t.exec(
        "UPDATE executions SET state = 'ended', reason = ?2, ended_at = ?3
         WHERE execution_id = ?1 AND state = 'live'",
        vals![execution_id, reason, at],
    )
    .await?;
    t.exec(
        "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'execution_ended', ?3)",
        vals![at, execution_id, &detail],
    ).await?;
    Ok(())
}
