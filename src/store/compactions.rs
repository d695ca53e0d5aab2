//! Remote compaction summaries: one row per handle, found by the handle's digest and the
//! principal it was issued to, until it expires. The summary is stored sealed (the engine
//! seals it under a key only the handle derives), so the store never holds its text.

use super::db::vals;
use super::{Store, StoreError};

/// One stored summary.
pub struct CompactionRecord<'a> {
    pub digest: &'a [u8; 32],
    pub principal: &'a str,
    pub model: &'a str,
    pub sealed: &'a [u8],
    pub created_at: u64,
    pub expires_at: u64,
}

impl Store {
    /// Stores a summary, and drops the expired ones in the same transaction.
    pub async fn compaction_insert(&self, c: &CompactionRecord<'_>) -> Result<(), StoreError> {
        self.db
            .tx(async |t| {
                t.exec(
                    "DELETE FROM compactions WHERE expires_at <= ?1",
                    vals![c.created_at],
                )
                .await?;
                t.exec(
                "INSERT INTO compactions (digest, principal, model, sealed, created_at, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                vals![
                    c.digest,
                    c.principal,
                    c.model,
                    c.sealed,
                    c.created_at,
                    c.expires_at
                ],
            ).await?;
                Ok(())
            })
            .await
    }

    /// The sealed summary behind a handle's digest, if it is this principal's and has not
    /// expired at `now`.
    pub async fn compaction_get(
        &self,
        digest: &[u8; 32],
        principal: &str,
        now: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.db
            .read(async |t| {
                let rows = t
                    .rows(
                        "SELECT sealed FROM compactions
                 WHERE digest = ?1 AND principal = ?2 AND expires_at > ?3",
                        vals![digest, principal, now],
                    )
                    .await?;
                rows.first().map(|r| r.b(0)).transpose()
            })
            .await
    }
}
