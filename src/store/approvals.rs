//! Approvals in the store: one row per approval, settled by a conditional write (only a
//! pending row changes), each change journaled in the same transaction.

use super::db::{vals, Row};
use super::feed;
use super::{now_unix, Change, ChangeKind, Store, StoreError};

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
    /// The replica whose backend request waits on it (`""` for a single gateway).
    pub owner: String,
    /// What the human who decided gave as the reason, if anything.
    pub decision_reason: Option<String>,
}

const COLUMNS: &str = "id, principal, execution_id, invocation_id, kind, model, action_digest, summary, state, reason, created_at, expires_at, decided_at, decided_by, owner, decision_reason";

fn record(r: &Row) -> Result<ApprovalRecord, StoreError> {
    Ok(ApprovalRecord {
        id: r.t(0)?,
        principal: r.t(1)?,
        execution_id: r.t(2)?,
        invocation_id: r.t(3)?,
        kind: r.t(4)?,
        model: r.t(5)?,
        action_digest: r.t(6)?,
        summary: serde_json::from_str(&r.t(7)?).unwrap_or(serde_json::Value::Null),
        state: r.t(8)?,
        reason: r.ot(9)?,
        created_at: r.i(10)? as u64,
        expires_at: r.i(11)? as u64,
        decided_at: r.oi(12)?.map(|v| v as u64),
        decided_by: r.ot(13)?,
        owner: r.t(14)?,
        decision_reason: r.ot(15)?,
    })
}

impl Store {
    /// Records a new approval (its owner is [`Store::owner`]).
    pub async fn approval_insert(&self, a: &ApprovalRecord) -> Result<(), StoreError> {
        let summary = a.summary.to_string();
        let detail = format!(
            "approval={} kind={} action={}",
            a.id,
            a.kind,
            a.action_digest.get(..8).unwrap_or_default()
        );
        self.announcing(async |t| {
            t.exec(
                &format!("INSERT INTO approvals ({COLUMNS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16)"),
                vals![
                    &a.id, &a.principal, &a.execution_id, &a.invocation_id, &a.kind, &a.model,
                    &a.action_digest, &summary, &a.state, a.reason.as_ref(), a.created_at,
                    a.expires_at, a.decided_at, a.decided_by.as_ref(), &a.owner,
                    a.decision_reason.as_ref()
                ],
            ).await?;
            t.exec(
                "INSERT INTO journal (at, execution_id, event, detail) VALUES (?1, ?2, 'approval_created', ?3)",
                vals![a.created_at, &a.execution_id, &detail],
            ).await?;
            let write = self.announce(t, &Change::ApprovalPending(a));
            write.await?;
            feed::notify(t, &a.id, &self.owner).await
        }).await
    }

    /// Settles pending approvals in one transaction; returns the ids that were still pending.
    /// A human's decision names who decided and the reason they gave.
    pub async fn approvals_settle(
        &self,
        ids: &[String],
        state: &str,
        reason: &str,
        decided_by: Option<(&str, Option<&str>)>,
    ) -> Result<Vec<String>, StoreError> {
        let (decided_by, decision_reason) = decided_by.unzip();
        let decision_reason = decision_reason.flatten();
        let now = now_unix();
        self.announcing(async |t| {
            let mut settled = Vec::new();
            for id in ids {
                let n = t.exec(
                    "UPDATE approvals SET state = ?2, reason = ?3, decided_at = ?4, decided_by = ?5,
                     decision_reason = ?6 WHERE id = ?1 AND state = 'pending'",
                    vals![id, state, reason, now, decided_by, decision_reason],
                ).await?;
                if n == 1 {
                    let detail = format!("approval={id} state={state} reason={reason}");
                    t.exec(
                        "INSERT INTO journal (at, execution_id, event, detail)
                         SELECT ?1, execution_id, 'approval_settled', ?2 FROM approvals WHERE id = ?3",
                        vals![now, &detail, id],
                    ).await?;
                    if self.announces(ChangeKind::Approval) {
                        let sql = format!("SELECT {COLUMNS} FROM approvals WHERE id = ?1");
                        if let Some(r) = t.rows(&sql, vals![id]).await?.first() {
                            let write = self.announce(t, &Change::ApprovalDecided(&record(r)?));
                            write.await?;
                        }
                    }
                    feed::notify(t, id, &self.owner).await?;
                    settled.push(id.clone());
                }
            }
            Ok(settled)
        }).await
    }

    pub async fn approval_get(&self, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        let rows = self
            .db
            .read(async |t| {
                t.rows(
                    &format!("SELECT {COLUMNS} FROM approvals WHERE id = ?1"),
                    vals![id],
                )
                .await
            })
            .await?;
        rows.first().map(record).transpose()
    }

    /// The newest 1000 approvals of `principal` (None: everyone's, for an approver),
    /// optionally of one state and one settle reason. The principal filters in SQL, before the
    /// limit, so another principal's approvals never push one's own out of its list.
    pub async fn approvals_list(
        &self,
        principal: Option<&str>,
        state: Option<&str>,
        reason: Option<&str>,
    ) -> Result<Vec<ApprovalRecord>, StoreError> {
        let filters = [
            ("principal", principal),
            ("state", state),
            ("reason", reason),
        ];
        let mut clauses = Vec::new();
        let mut params = Vec::new();
        for (column, value) in filters {
            if let Some(v) = value {
                params.push(super::db::Val::from(v));
                clauses.push(format!("{column} = ?{}", params.len()));
            }
        }
        let filter = match clauses.is_empty() {
            true => String::new(),
            false => format!("WHERE {}", clauses.join(" AND ")),
        };
        let sql = format!("SELECT {COLUMNS} FROM approvals {filter} ORDER BY seq DESC LIMIT 1000");
        let rows = self.db.read(async |t| t.rows(&sql, &params).await).await?;
        rows.iter().map(record).collect()
    }

    /// At startup: every approval this replica still has pending belongs to a turn that is
    /// gone.
    pub async fn approvals_orphan(&self) -> Result<usize, StoreError> {
        let now = now_unix();
        let owner = self.owner.as_str();
        let n =
            self.db
                .tx(async |t| {
                    t.exec(
                "UPDATE approvals SET state = 'denied', reason = 'orphaned', decided_at = ?1
                 WHERE state = 'pending' AND owner = ?2",
                vals![now, owner],
            ).await
                })
                .await?;
        Ok(n as usize)
    }
}
