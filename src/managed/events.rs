//! Reading a session's log: `events.list` (paged by position, oldest first or newest first,
//! filtered by `types[]`) and what a stream that reconnects with `Last-Event-ID` missed.

use std::sync::Arc;

use serde_json::Value;

use super::log::{Live, Published};
use super::wire::{page, Paging};
use super::{refused, sessions, store_failed, Managed};
use crate::auth::Principal;
use crate::error::ApiError;

/// Rows read per store call while filtering.
const READ: usize = 200;

/// `GET /v1/sessions/{id}/events`.
pub async fn list(
    m: &Managed,
    who: &Principal,
    id: &str,
    query: Option<&str>,
) -> Result<Value, ApiError> {
    let q = Paging::read(query)?;
    let types: Vec<String> =
        serde_urlencoded::from_str::<Vec<(String, String)>>(query.unwrap_or_default())
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k == "types[]" || k == "types")
            .map(|(_, v)| v)
            .collect();
    sessions::load(m, who, id).await?;
    let descending = q.order.as_deref() == Some("desc");
    let mut after = match q.page.as_deref() {
        Some(p) => Some(
            p.parse::<i64>()
                .map_err(|_| refused("page", "is not a cursor this API issued"))?,
        ),
        None => None,
    };
    let limit = q.limit();
    let mut data = Vec::new();
    let mut last = None;
    let store = m.engine().store();
    'read: loop {
        let rows = store
            .events_list(id, after, READ, descending)
            .await
            .map_err(store_failed)?;
        for r in &rows {
            let Ok(event) = serde_json::from_str::<Value>(&r.body) else {
                continue;
            };
            let kind = event["type"].as_str().unwrap_or_default();
            if !types.is_empty() && !types.iter().any(|t| t == kind) {
                continue;
            }
            if data.len() == limit {
                break 'read;
            }
            data.push(event);
            last = Some(r.seq);
        }
        match rows.last() {
            Some(r) if rows.len() == READ => after = Some(r.seq),
            _ => {
                last = None;
                break;
            }
        }
    }
    Ok(page(data, last.map(|s| s.to_string())))
}

/// What a stream opened with `Last-Event-ID: last` missed: every event logged after it (a
/// 400 for an id that is not the session's).
pub async fn missed(m: &Managed, live: &Arc<Live>, last: &str) -> Result<Vec<Published>, ApiError> {
    let store = m.engine().store();
    let Some(mut after) = store
        .event_position(&live.id, last)
        .await
        .map_err(store_failed)?
    else {
        return Err(refused("Last-Event-ID", "is not an event of this session"));
    };
    let mut out = Vec::new();
    loop {
        let rows = store
            .events_list(&live.id, Some(after), READ, false)
            .await
            .map_err(store_failed)?;
        for r in &rows {
            let Ok(event) = serde_json::from_str::<Value>(&r.body) else {
                continue;
            };
            out.push(Published {
                seq: r.seq,
                id: event["id"].as_str().unwrap_or_default().to_string(),
                kind: event["type"].as_str().unwrap_or_default().to_string(),
                json: r.body.clone(),
            });
        }
        match rows.last() {
            Some(r) if rows.len() == READ => after = r.seq,
            _ => return Ok(out),
        }
    }
}
