//! Single-use decision links in the store: digests only, bound to one approval, one decision
//! and an expiry; written with the outbox row of their message (`outbox.rs`).

use super::db::vals;
use super::{LinkRow, Store, StoreError};

impl Store {
    /// The decision link with this token digest (used or not).
    pub async fn link_get(&self, digest: &[u8; 32]) -> Result<Option<LinkRow>, StoreError> {
        let rows = self
            .db
            .read(async |t| {
                t.rows(
                    "SELECT approval_id, decision, endpoint, expires_at, used_at
                     FROM decision_links WHERE digest = ?1",
                    vals![digest],
                )
                .await
            })
            .await?;
        let Some(r) = rows.first() else {
            return Ok(None);
        };
        let decision = match r.t(1)?.as_str() {
            "approve" => "approve",
            _ => "deny",
        };
        Ok(Some(LinkRow {
            digest: *digest,
            approval_id: r.t(0)?,
            decision,
            endpoint: r.t(2)?,
            expires_at: r.i(3)? as u64,
            used_at: r.oi(4)?.map(|v| v as u64),
        }))
    }

    /// Uses the link once, unless it is used or expired: false when another use won. Its
    /// approval's other links (the other decision) are used up with it.
    pub async fn link_take(&self, l: &LinkRow, now: u64) -> Result<bool, StoreError> {
        self.db
            .tx(async |t| {
                let n = t
                    .exec(
                        "UPDATE decision_links SET used_at = ?2
                         WHERE digest = ?1 AND used_at IS NULL AND expires_at > ?2",
                        vals![&l.digest, now],
                    )
                    .await?;
                if n == 1 {
                    t.exec(
                        "UPDATE decision_links SET used_at = ?2
                         WHERE approval_id = ?1 AND used_at IS NULL",
                        vals![&l.approval_id, now],
                    )
                    .await?;
                }
                Ok(n == 1)
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Notice;

    #[tokio::test]
    async fn a_link_is_used_once_with_its_sibling_and_never_after_its_expiry() {
        let s = Store::open_in_memory().await.unwrap();
        let link = |d: u8, decision| LinkRow {
            digest: [d; 32],
            approval_id: "apr-1".into(),
            decision,
            endpoint: "slack".into(),
            expires_at: 100,
            used_at: None,
        };
        let n = Notice {
            id: "msg_1".into(),
            endpoint: "slack".into(),
            event: "approval.pending".into(),
            principal: "alice".into(),
            body: "{}".into(),
            at_ms: 0,
            links: vec![link(1, "approve"), link(2, "deny")],
        };
        s.outbox_enqueue(&[n]).await.unwrap();
        let approve = s.link_get(&[1; 32]).await.unwrap().unwrap();
        assert_eq!((approve.decision, approve.used_at), ("approve", None));
        assert!(!s.link_take(&approve, 100).await.unwrap(), "expired");
        assert!(s.link_take(&approve, 50).await.unwrap());
        assert!(!s.link_take(&approve, 51).await.unwrap(), "used");
        let deny = s.link_get(&[2; 32]).await.unwrap().unwrap();
        assert_eq!(deny.used_at, Some(50));
        assert!(!s.link_take(&deny, 52).await.unwrap());
        assert!(s.link_get(&[3; 32]).await.unwrap().is_none());
    }
}
