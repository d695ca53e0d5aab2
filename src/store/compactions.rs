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
    /// Stores a summary, and drops in the same transaction the expired ones and the
    /// principal's oldest beyond `keep` (a count and a number of sealed bytes; the new one
    /// always stays).
    pub async fn compaction_insert(
        &self,
        c: &CompactionRecord<'_>,
        keep: (usize, u64),
    ) -> Result<(), StoreError> {
        let (count, bytes) = (keep.0 as u64, keep.1);
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
                t.exec(
                    "DELETE FROM compactions WHERE principal = ?1 AND digest IN (
                       SELECT digest FROM (
                         SELECT digest,
                                ROW_NUMBER() OVER w AS n,
                                SUM(LENGTH(sealed)) OVER w AS kept
                         FROM compactions WHERE principal = ?1
                         WINDOW w AS (ORDER BY CASE WHEN digest = ?2 THEN 0 ELSE 1 END,
                                      created_at DESC, digest ROWS UNBOUNDED PRECEDING)
                       ) AS ranked
                       WHERE n > ?3 OR (kept > ?4 AND digest <> ?2))",
                    vals![c.principal, c.digest, count, bytes],
                )
                .await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record<'a>(
        digest: &'a [u8; 32],
        principal: &'a str,
        sealed: &'a [u8],
        at: u64,
    ) -> CompactionRecord<'a> {
        CompactionRecord {
            digest,
            principal,
            model: "m",
            sealed,
            created_at: at,
            expires_at: at + 1000,
        }
    }

    #[tokio::test]
    async fn a_principals_oldest_summaries_go_beyond_its_count_and_bytes() {
        let store = Store::open_in_memory().await.unwrap();
        let digests: Vec<[u8; 32]> = (0..5u8).map(|i| [i; 32]).collect();
        let present =
            async |d: &[u8; 32], p: &str| store.compaction_get(d, p, 10).await.unwrap().is_some();
        // Bob's row is never another principal's to evict.
        store
            .compaction_insert(&record(&[9; 32], "bob", &[0; 10], 1), (3, 100))
            .await
            .unwrap();
        // All in one second: the one just written stays whatever the order.
        for d in &digests[..4] {
            store
                .compaction_insert(&record(d, "alice", &[0; 10], 5), (3, 100))
                .await
                .unwrap();
        }
        let mut kept = 0;
        for d in &digests[..4] {
            kept += usize::from(present(d, "alice").await);
        }
        assert_eq!(kept, 3, "three by count");
        assert!(present(&digests[3], "alice").await, "the newest stays");
        // 85 bytes more: over 100 bytes, the oldest go until it fits.
        store
            .compaction_insert(&record(&digests[4], "alice", &[0; 85], 6), (3, 100))
            .await
            .unwrap();
        assert!(present(&digests[4], "alice").await);
        let mut kept = 0;
        for d in &digests[..4] {
            kept += usize::from(present(d, "alice").await);
        }
        assert_eq!(kept, 1, "85 + 10 + 10 > 100");
        assert!(present(&[9; 32], "bob").await);
    }
}
