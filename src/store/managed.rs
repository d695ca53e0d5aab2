//! The Managed Agents API's objects and session event logs. Agents (one row per version),
//! environments and sessions are kept as the API object's JSON, owned by one principal; a
//! session's events are its transcript, in order (`seq`). Unlike every other table, the
//! event log holds content (messages, tool inputs and results): it is the product the API
//! sells, read back by `events.list` after a restart and on any replica. It is bounded per
//! principal (`managed_quota`, kept in the same transaction as each append) and deleted with
//! its session.

use super::announce::session_events;
use super::db::vals;
use super::{ChangeKind, Store, StoreError};

/// A stored API object: its latest (or asked-for) version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedRow {
    pub id: String,
    pub version: i64,
    pub body: String,
    pub archived: bool,
    pub created_at_ms: u64,
    /// The replica whose process last ran the session (`""` for a single gateway).
    pub owner: String,
}

/// Which rows a list reads.
#[derive(Debug, Clone, Default)]
pub struct ListRows<'a> {
    pub include_archived: bool,
    /// Rows strictly after this position in the list's order (its page cursor).
    pub after: Option<(u64, &'a str)>,
    pub limit: usize,
    /// Oldest first (else newest first).
    pub ascending: bool,
}

/// One stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub seq: i64,
    pub body: String,
}

/// Why an append was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AppendError {
    /// The principal's events would exceed their byte bound.
    #[error("the principal's stored events would exceed {0} bytes")]
    Full(u64),
    #[error(transparent)]
    Store(#[from] StoreError),
}

const COLUMNS: &str = "id, version, body, archived, created_at_ms, owner";

fn row(r: &super::db::Row) -> Result<ManagedRow, StoreError> {
    Ok(ManagedRow {
        id: r.t(0)?,
        version: r.i(1)?,
        body: r.t(2)?,
        archived: r.i(3)? != 0,
        created_at_ms: r.i(4)? as u64,
        owner: r.t(5)?,
    })
}

impl Store {
    /// Stores a new object (or a new version of one), unless the principal already has
    /// `max` objects of the kind (a new version of its own agent is always taken). Returns
    /// whether it was stored.
    pub async fn managed_insert(
        &self,
        kind: &str,
        principal: &str,
        r: &ManagedRow,
        max: usize,
    ) -> Result<bool, StoreError> {
        let owner = self.owner.as_str();
        self.announcing(async |t| {
            if r.version == 1 {
                let n = t
                    .rows(
                        "SELECT COUNT(*) FROM managed_objects
                             WHERE principal = ?1 AND kind = ?2 AND version = 1",
                        vals![principal, kind],
                    )
                    .await?;
                let n = n.first().map(|r| r.i(0)).transpose()?.unwrap_or(0);
                if n as usize >= max {
                    return Ok(false);
                }
            }
            t.exec(
                "INSERT INTO managed_objects
                       (kind, id, version, principal, body, archived, created_at_ms, owner)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                vals![
                    kind,
                    &r.id,
                    r.version,
                    principal,
                    &r.body,
                    i64::from(r.archived),
                    r.created_at_ms,
                    owner
                ],
            )
            .await?;
            if kind == "session" && r.version == 1 {
                self.announce_session(t, &r.id, principal, &["session.created"])
                    .await?;
            }
            Ok(true)
        })
        .await
    }

    /// The principal's object: `version`, or its latest. Another principal's is `None`.
    pub async fn managed_get(
        &self,
        kind: &str,
        id: &str,
        principal: &str,
        version: Option<i64>,
    ) -> Result<Option<ManagedRow>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM managed_objects
             WHERE kind = ?1 AND id = ?2 AND principal = ?3 AND (?4 = 0 OR version = ?4)
             ORDER BY version DESC LIMIT 1"
        );
        let v = version.unwrap_or(0);
        self.db
            .read(async |t| {
                let rows = t.rows(&sql, vals![kind, id, principal, v]).await?;
                rows.first().map(row).transpose()
            })
            .await
    }

    /// Rewrites one version of the principal's object in place (a session's status, an
    /// archive); with `owner`, names this replica as the one that runs it. Returns whether
    /// it exists.
    pub async fn managed_update(
        &self,
        kind: &str,
        principal: &str,
        r: &ManagedRow,
        claim: bool,
    ) -> Result<bool, StoreError> {
        let owner = self.owner.as_str();
        self.db
            .read(async |t| {
                let n = t
                    .exec(
                        "UPDATE managed_objects
                         SET body = ?1, archived = ?2, owner = CASE WHEN ?3 = 1 THEN ?4 ELSE owner END
                         WHERE kind = ?5 AND id = ?6 AND version = ?7 AND principal = ?8",
                        vals![
                            &r.body,
                            i64::from(r.archived),
                            i64::from(claim),
                            owner,
                            kind,
                            &r.id,
                            r.version,
                            principal
                        ],
                    )
                    .await?;
                Ok(n > 0)
            })
            .await
    }

    /// Names this replica as the one that runs the principal's object, if `lapsed` still
    /// does (a replica whose lease lapsed): of two replicas taking it over, one wins.
    /// Returns whether this one did.
    pub async fn managed_claim(
        &self,
        kind: &str,
        id: &str,
        principal: &str,
        lapsed: &str,
    ) -> Result<bool, StoreError> {
        let owner = self.owner.as_str();
        self.db
            .read(async |t| {
                let n = t
                    .exec(
                        "UPDATE managed_objects SET owner = ?1
                         WHERE kind = ?2 AND id = ?3 AND principal = ?4 AND owner = ?5",
                        vals![owner, kind, id, principal, lapsed],
                    )
                    .await?;
                Ok(n > 0)
            })
            .await
    }

    /// The principal's objects of a kind, each at its latest version, newest first (or
    /// oldest first), from a cursor.
    pub async fn managed_list(
        &self,
        kind: &str,
        principal: &str,
        q: &ListRows<'_>,
    ) -> Result<Vec<ManagedRow>, StoreError> {
        let (cmp, order) = match q.ascending {
            true => (">", "ASC"),
            false => ("<", "DESC"),
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM managed_objects m
             WHERE kind = ?1 AND principal = ?2 AND (?3 = 1 OR archived = 0)
               AND version = (SELECT MAX(version) FROM managed_objects v
                              WHERE v.kind = m.kind AND v.id = m.id)
               AND (?4 = 0 OR created_at_ms {cmp} ?5 OR (created_at_ms = ?5 AND id {cmp} ?6))
             ORDER BY created_at_ms {order}, id {order} LIMIT ?7"
        );
        let (has, at, after) = match q.after {
            Some((at, id)) => (1, at, id),
            None => (0, 0, ""),
        };
        let archived = i64::from(q.include_archived);
        self.db
            .read(async |t| {
                let rows = t
                    .rows(
                        &sql,
                        vals![
                            kind,
                            principal,
                            archived,
                            has as i64,
                            at,
                            after,
                            q.limit as i64
                        ],
                    )
                    .await?;
                rows.iter().map(row).collect()
            })
            .await
    }

    /// An agent's versions, newest first, below `before` (0: from the latest).
    pub async fn managed_versions(
        &self,
        kind: &str,
        id: &str,
        principal: &str,
        before: i64,
        limit: usize,
    ) -> Result<Vec<ManagedRow>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM managed_objects
             WHERE kind = ?1 AND id = ?2 AND principal = ?3 AND (?4 = 0 OR version < ?4)
             ORDER BY version DESC LIMIT ?5"
        );
        self.db
            .read(async |t| {
                let rows = t
                    .rows(&sql, vals![kind, id, principal, before, limit as i64])
                    .await?;
                rows.iter().map(row).collect()
            })
            .await
    }

    /// Deletes the principal's object (every version) and, for a session, its events,
    /// giving their bytes back to the principal's bound. Returns whether it existed.
    pub async fn managed_delete(
        &self,
        kind: &str,
        id: &str,
        principal: &str,
    ) -> Result<bool, StoreError> {
        self.announcing(async |t| {
                let n = t
                    .exec(
                        "DELETE FROM managed_objects WHERE kind = ?1 AND id = ?2 AND principal = ?3",
                        vals![kind, id, principal],
                    )
                    .await?;
                if n == 0 {
                    return Ok(false);
                }
                if kind == "session" {
                    self.announce_session(t, id, principal, &["session.deleted"]).await?;
                }
                let freed = t
                    .rows(
                        "SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM managed_events WHERE session_id = ?1",
                        vals![id],
                    )
                    .await?;
                let freed = freed.first().map(|r| r.i(0)).transpose()?.unwrap_or(0);
                t.exec(
                    "DELETE FROM managed_events WHERE session_id = ?1",
                    vals![id],
                )
                .await?;
                t.exec(
                    "UPDATE managed_quota SET event_bytes = event_bytes - ?1 WHERE principal = ?2",
                    vals![freed, principal],
                )
                .await?;
                Ok(true)
            })
            .await
    }

    /// Appends events to a session's log in order, in one transaction, within the
    /// principal's byte bound. Returns each event's position.
    pub async fn events_append(
        &self,
        session: &str,
        principal: &str,
        events: &[(&str, &str)],
        max_bytes: u64,
    ) -> Result<Vec<i64>, AppendError> {
        let bytes: u64 = events.iter().map(|(_, b)| b.len() as u64).sum();
        let added = self
            .announcing(async |t| {
                let n = t
                    .exec(
                        "INSERT INTO managed_quota (principal, event_bytes) VALUES (?1, ?2)
                         ON CONFLICT (principal) DO UPDATE
                         SET event_bytes = managed_quota.event_bytes + excluded.event_bytes
                         WHERE managed_quota.event_bytes + excluded.event_bytes <= ?3",
                        vals![principal, bytes, max_bytes],
                    )
                    .await?;
                if n == 0 || bytes > max_bytes {
                    return Err(StoreError::RolledBack);
                }
                let mut seqs = Vec::with_capacity(events.len());
                for (id, body) in events {
                    let rows = t
                        .rows(
                            "INSERT INTO managed_events (session_id, id, principal, body, bytes)
                             VALUES (?1, ?2, ?3, ?4, ?5) RETURNING seq",
                            vals![session, *id, principal, *body, body.len() as u64],
                        )
                        .await?;
                    seqs.push(rows.first().map(|r| r.i(0)).transpose()?.unwrap_or(0));
                    if self.announces(ChangeKind::Session) {
                        let events = session_events(body);
                        self.announce_session(t, session, principal, events).await?;
                    }
                }
                Ok(seqs)
            })
            .await;
        match added {
            Err(StoreError::RolledBack) => Err(AppendError::Full(max_bytes)),
            other => Ok(other?),
        }
    }

    /// The bytes of the principal's stored events (what its bound is measured against).
    pub async fn event_bytes(&self, principal: &str) -> Result<u64, StoreError> {
        self.db
            .read(async |t| {
                let rows = t
                    .rows(
                        "SELECT event_bytes FROM managed_quota WHERE principal = ?1",
                        vals![principal],
                    )
                    .await?;
                Ok(rows.first().map(|r| r.i(0)).transpose()?.unwrap_or(0) as u64)
            })
            .await
    }

    /// A session's events after position `after` (or before it, `descending`), at most
    /// `limit`.
    pub async fn events_list(
        &self,
        session: &str,
        after: Option<i64>,
        limit: usize,
        descending: bool,
    ) -> Result<Vec<EventRow>, StoreError> {
        let sql = match descending {
            false => {
                "SELECT seq, body FROM managed_events WHERE session_id = ?1 AND seq > ?2
                 ORDER BY seq ASC LIMIT ?3"
            }
            true => {
                "SELECT seq, body FROM managed_events WHERE session_id = ?1 AND seq < ?2
                 ORDER BY seq DESC LIMIT ?3"
            }
        };
        let from = after.unwrap_or(if descending { i64::MAX } else { 0 });
        self.db
            .read(async |t| {
                let rows = t.rows(sql, vals![session, from, limit as i64]).await?;
                rows.iter()
                    .map(|r| {
                        Ok(EventRow {
                            seq: r.i(0)?,
                            body: r.t(1)?,
                        })
                    })
                    .collect()
            })
            .await
    }

    /// The position of a session's event, by its id.
    pub async fn event_position(&self, session: &str, id: &str) -> Result<Option<i64>, StoreError> {
        self.db
            .read(async |t| {
                let rows = t
                    .rows(
                        "SELECT seq FROM managed_events WHERE session_id = ?1 AND id = ?2",
                        vals![session, id],
                    )
                    .await?;
                rows.first().map(|r| r.i(0)).transpose()
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(id: &str, version: i64, at: u64) -> ManagedRow {
        ManagedRow {
            id: id.into(),
            version,
            body: format!("{{\"id\":\"{id}\",\"version\":{version}}}"),
            archived: false,
            created_at_ms: at,
            owner: String::new(),
        }
    }

    #[tokio::test]
    async fn objects_are_their_principals_and_lists_page_by_cursor() {
        let s = Store::open_in_memory().await.unwrap();
        for (i, id) in ["a1", "a2", "a3"].iter().enumerate() {
            assert!(s
                .managed_insert("agent", "alice", &object(id, 1, i as u64), 3)
                .await
                .unwrap());
        }
        // A fourth is over the bound; a new version is not.
        assert!(!s
            .managed_insert("agent", "alice", &object("a4", 1, 9), 3)
            .await
            .unwrap());
        assert!(s
            .managed_insert("agent", "alice", &object("a1", 2, 0), 3)
            .await
            .unwrap());
        assert!(s
            .managed_get("agent", "a1", "bob", None)
            .await
            .unwrap()
            .is_none());
        let latest = s.managed_get("agent", "a1", "alice", None).await.unwrap();
        assert_eq!(latest.unwrap().version, 2);
        let first = s
            .managed_get("agent", "a1", "alice", Some(1))
            .await
            .unwrap();
        assert_eq!(first.unwrap().version, 1);
        let page = |after| ListRows {
            after,
            limit: 2,
            ..ListRows::default()
        };
        let one = s.managed_list("agent", "alice", &page(None)).await.unwrap();
        let ids: Vec<_> = one.iter().map(|r| (r.id.as_str(), r.version)).collect();
        assert_eq!(ids, [("a3", 1), ("a2", 1)]);
        let last = &one[1];
        let two = s
            .managed_list(
                "agent",
                "alice",
                &page(Some((last.created_at_ms, &last.id))),
            )
            .await
            .unwrap();
        let ids: Vec<_> = two.iter().map(|r| (r.id.as_str(), r.version)).collect();
        assert_eq!(ids, [("a1", 2)]);
        assert!(s
            .managed_list("agent", "bob", &page(None))
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn events_append_in_order_within_the_bound_and_go_with_their_session() {
        let s = Store::open_in_memory().await.unwrap();
        s.managed_insert("session", "alice", &object("s1", 1, 1), 9)
            .await
            .unwrap();
        let seqs = s
            .events_append("s1", "alice", &[("e1", "0123456789"), ("e2", "01234")], 20)
            .await
            .unwrap();
        assert_eq!(seqs.len(), 2);
        assert!(seqs[0] < seqs[1]);
        // 15 + 10 > 20: refused, nothing written.
        let over = s
            .events_append("s1", "alice", &[("e3", "0123456789")], 20)
            .await;
        assert!(matches!(over, Err(AppendError::Full(20))));
        let all = s.events_list("s1", None, 10, false).await.unwrap();
        assert_eq!(all.len(), 2);
        let after = s.events_list("s1", Some(seqs[0]), 10, false).await.unwrap();
        assert_eq!(
            after,
            [EventRow {
                seq: seqs[1],
                body: "01234".into()
            }]
        );
        assert_eq!(s.event_position("s1", "e2").await.unwrap(), Some(seqs[1]));
        // Deleting the session frees its bytes.
        assert!(!s.managed_delete("session", "s1", "bob").await.unwrap());
        assert!(s.managed_delete("session", "s1", "alice").await.unwrap());
        assert!(s
            .events_list("s1", None, 10, false)
            .await
            .unwrap()
            .is_empty());
        s.events_append("s2", "alice", &[("e4", "01234567890123456789")], 20)
            .await
            .unwrap();
    }
}
