//! Single sign-on in the store: the key that signs the gateway's access tokens (written once,
//! by the first replica to start, and read by every other), and the sign-in sessions behind
//! them. A session's refresh token is kept only as its digest; the provider's refresh token
//! is kept sealed by the caller.

use super::db::vals;
use super::{Store, StoreError};

/// Sign-in sessions one subject keeps at most: a new one beyond it removes the oldest.
pub const MAX_SESSIONS_PER_SUBJECT: usize = 20;

/// One sign-in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub id: String,
    pub issuer: String,
    pub subject: String,
    /// The groups its provider named at the last sign-in or refresh (a JSON array).
    pub groups: Vec<String>,
    /// The provider's refresh token, sealed; None when it gave none.
    pub idp_refresh: Option<Vec<u8>>,
    /// Raised when its groups change: access tokens of an older generation are refused.
    pub generation: i64,
    pub created_at: u64,
    pub refreshed_at: u64,
    pub expires_at: u64,
    pub revoked_at: Option<u64>,
}

impl SessionRow {
    /// Neither revoked nor past its end at `now`.
    pub fn live(&self, now: u64) -> bool {
        self.revoked_at.is_none() && now < self.expires_at
    }
}

const COLUMNS: &str = "id, issuer, subject, groups, idp_refresh, generation, created_at,
                       refreshed_at, expires_at, revoked_at";

fn session(r: &super::db::Row) -> Result<SessionRow, StoreError> {
    let groups: Vec<String> = serde_json::from_str(&r.t(3)?).unwrap_or_default();
    Ok(SessionRow {
        id: r.t(0)?,
        issuer: r.t(1)?,
        subject: r.t(2)?,
        groups,
        idp_refresh: r.ob(4)?,
        generation: r.i(5)?,
        created_at: r.i(6)? as u64,
        refreshed_at: r.i(7)? as u64,
        expires_at: r.i(8)? as u64,
        revoked_at: r.oi(9)?.map(|v| v as u64),
    })
}

impl Store {
    /// The access-token signing key: the stored one, or `fresh` when none is stored yet
    /// (replicas starting together agree on the first written).
    pub async fn sso_key(&self, fresh: &[u8], now: u64) -> Result<Vec<u8>, StoreError> {
        self.db
            .tx(async |t| {
                t.exec(
                    "INSERT INTO sso_keys (id, secret, created_at) VALUES ('access', ?1, ?2)
                     ON CONFLICT (id) DO NOTHING",
                    vals![fresh, now],
                )
                .await?;
                let rows = t
                    .rows("SELECT secret FROM sso_keys WHERE id = 'access'", &[])
                    .await?;
                rows.first().ok_or(StoreError::Missing("sso_keys"))?.b(0)
            })
            .await
    }

    /// Records a new sign-in whose refresh token has digest `refresh`; the subject's oldest
    /// sessions beyond [`MAX_SESSIONS_PER_SUBJECT`], and its ended ones, are removed.
    pub async fn sso_session_create(
        &self,
        s: &SessionRow,
        refresh: &[u8; 32],
    ) -> Result<(), StoreError> {
        let groups = serde_json::to_string(&s.groups).unwrap_or_else(|_| "[]".into());
        let idp = s.idp_refresh.as_deref();
        self.db
            .tx(async |t| {
                t.exec(
                    "DELETE FROM sso_sessions WHERE issuer = ?1 AND subject = ?2
                       AND (revoked_at IS NOT NULL OR expires_at <= ?3)",
                    vals![&s.issuer, &s.subject, s.created_at],
                )
                .await?;
                let ids = t
                    .rows(
                        "SELECT id FROM sso_sessions WHERE issuer = ?1 AND subject = ?2
                         ORDER BY created_at DESC, id DESC",
                        vals![&s.issuer, &s.subject],
                    )
                    .await?;
                for r in ids.iter().skip(MAX_SESSIONS_PER_SUBJECT - 1) {
                    t.exec("DELETE FROM sso_sessions WHERE id = ?1", vals![&r.t(0)?])
                        .await?;
                }
                t.exec(
                    "INSERT INTO sso_sessions (id, refresh_digest, issuer, subject, groups,
                       idp_refresh, generation, created_at, refreshed_at, expires_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                    vals![
                        &s.id,
                        refresh,
                        &s.issuer,
                        &s.subject,
                        &groups,
                        idp,
                        s.generation,
                        s.created_at,
                        s.refreshed_at,
                        s.expires_at
                    ],
                )
                .await?;
                Ok(())
            })
            .await
    }

    /// The session whose refresh token has this digest.
    pub async fn sso_session_by_refresh(
        &self,
        digest: &[u8; 32],
    ) -> Result<Option<SessionRow>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM sso_sessions WHERE refresh_digest = ?1");
        let rows = self
            .db
            .read(async |t| t.rows(&sql, vals![digest]).await)
            .await?;
        rows.first().map(session).transpose()
    }

    pub async fn sso_session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM sso_sessions WHERE id = ?1");
        let rows = self
            .db
            .read(async |t| t.rows(&sql, vals![id]).await)
            .await?;
        rows.first().map(session).transpose()
    }

    /// Live sessions, newest first: one subject's, or everyone's.
    pub async fn sso_sessions(
        &self,
        subject: Option<(&str, &str)>,
        now: u64,
    ) -> Result<Vec<SessionRow>, StoreError> {
        let (issuer, sub) = subject.unwrap_or_default();
        let sql = format!(
            "SELECT {COLUMNS} FROM sso_sessions
             WHERE revoked_at IS NULL AND expires_at > ?1
               AND (?2 = '' OR (issuer = ?2 AND subject = ?3))
             ORDER BY created_at DESC, id DESC LIMIT 1000"
        );
        let rows = self
            .db
            .read(async |t| t.rows(&sql, vals![now, issuer, sub]).await)
            .await?;
        rows.iter().map(session).collect()
    }

    /// A refresh of a live session: its groups and the provider's new refresh token (None
    /// keeps the old), its generation raised when the groups changed. The session after it;
    /// None when it was revoked or ended meanwhile.
    pub async fn sso_session_refreshed(
        &self,
        id: &str,
        groups: &[String],
        idp_refresh: Option<&[u8]>,
        now: u64,
    ) -> Result<Option<SessionRow>, StoreError> {
        let groups = serde_json::to_string(groups).unwrap_or_else(|_| "[]".into());
        let sql = format!("SELECT {COLUMNS} FROM sso_sessions WHERE id = ?1");
        self.db
            .tx(async |t| {
                t.exec(
                    "UPDATE sso_sessions SET
                       generation = generation + CASE WHEN groups = ?2 THEN 0 ELSE 1 END,
                       groups = ?2,
                       idp_refresh = COALESCE(?3, idp_refresh),
                       refreshed_at = ?4
                     WHERE id = ?1 AND revoked_at IS NULL AND expires_at > ?4",
                    vals![id, &groups, idp_refresh, now],
                )
                .await?;
                let rows = t.rows(&sql, vals![id]).await?;
                Ok(rows
                    .first()
                    .map(session)
                    .transpose()?
                    .filter(|s| s.live(now)))
            })
            .await
    }

    /// Revokes a session; false when it was already revoked or unknown.
    pub async fn sso_session_revoke(&self, id: &str, now: u64) -> Result<bool, StoreError> {
        let n = self
            .db
            .tx(async |t| {
                t.exec(
                    "UPDATE sso_sessions SET revoked_at = ?2, idp_refresh = NULL
                     WHERE id = ?1 AND revoked_at IS NULL",
                    vals![id, now],
                )
                .await
            })
            .await?;
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, subject: &str, created_at: u64) -> SessionRow {
        SessionRow {
            id: id.into(),
            issuer: "https://idp.test".into(),
            subject: subject.into(),
            groups: vec!["dev".into()],
            idp_refresh: Some(b"sealed".to_vec()),
            generation: 0,
            created_at,
            refreshed_at: created_at,
            expires_at: created_at + 1000,
            revoked_at: None,
        }
    }

    #[tokio::test]
    async fn sessions_refresh_revoke_and_stay_bounded() {
        let store = Store::open_in_memory().await.unwrap();
        let key = store.sso_key(&[1; 32], 10).await.unwrap();
        assert_eq!(key, vec![1; 32]);
        assert_eq!(
            store.sso_key(&[2; 32], 11).await.unwrap(),
            key,
            "the first key stays"
        );

        store
            .sso_session_create(&row("s1", "alice", 100), &[7; 32])
            .await
            .unwrap();
        let s = store
            .sso_session_by_refresh(&[7; 32])
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (s.id.as_str(), s.groups.clone()),
            ("s1", vec!["dev".to_string()])
        );
        assert!(store
            .sso_session_by_refresh(&[8; 32])
            .await
            .unwrap()
            .is_none());

        // Same groups: same generation, the sealed token kept; other groups: raised.
        let same = ["dev".to_string()];
        let s = store
            .sso_session_refreshed("s1", &same, None, 200)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (s.generation, s.idp_refresh.as_deref()),
            (0, Some(&b"sealed"[..]))
        );
        let s = store
            .sso_session_refreshed("s1", &[], Some(b"new"), 300)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((s.generation, s.refreshed_at), (1, 300));
        assert!(
            store
                .sso_session_refreshed("s1", &[], None, 1100)
                .await
                .unwrap()
                .is_none(),
            "ended"
        );

        assert!(store.sso_session_revoke("s1", 400).await.unwrap());
        assert!(!store.sso_session_revoke("s1", 401).await.unwrap());
        let s = store.sso_session("s1").await.unwrap().unwrap();
        assert_eq!((s.revoked_at, s.idp_refresh), (Some(400), None));
        assert!(store
            .sso_session_refreshed("s1", &[], None, 402)
            .await
            .unwrap()
            .is_none());

        // At most MAX_SESSIONS_PER_SUBJECT each; the oldest go first.
        for i in 0..(MAX_SESSIONS_PER_SUBJECT + 3) {
            let r = row(&format!("b{i:02}"), "bob", 500 + i as u64);
            store
                .sso_session_create(&r, &[i as u8 + 20; 32])
                .await
                .unwrap();
        }
        let bobs = store
            .sso_sessions(Some(("https://idp.test", "bob")), 600)
            .await
            .unwrap();
        assert_eq!(bobs.len(), MAX_SESSIONS_PER_SUBJECT);
        assert_eq!(bobs[0].id, format!("b{:02}", MAX_SESSIONS_PER_SUBJECT + 2));
        assert!(store.sso_session("b00").await.unwrap().is_none());
        assert_eq!(
            store.sso_sessions(None, 600).await.unwrap().len(),
            MAX_SESSIONS_PER_SUBJECT
        );
    }
}
