//! What every Managed Agents object shares on the wire: ids, RFC 3339 times, metadata, and
//! list pages (`{"data": [...], "next_page": cursor | null}`, the next page asked with
//! `page=cursor`).

use serde_json::{json, Map, Value};

use super::refused;
use crate::error::ApiError;
use crate::store::{civil_of, now_unix_ms};

/// A fresh id: the API's prefix (`agent_`, `env_`, `sesn_`, `sevt_`) and 128 CSPRNG bits.
pub fn new_id(prefix: &str) -> String {
    crate::ids::new_id(prefix)
}

/// Milliseconds since the epoch as RFC 3339 (UTC, millisecond precision).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (y, m, d) = civil_of((secs / 86_400) as u32);
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        ms % 1000
    )
}

/// Now, as [`rfc3339`] and as milliseconds.
pub fn now() -> (String, u64) {
    let ms = now_unix_ms();
    (rfc3339(ms), ms)
}

/// `metadata` on create: at most 16 string pairs, keys up to 64 characters, values up to 512.
pub fn metadata(v: Option<&Value>) -> Result<Map<String, Value>, ApiError> {
    let mut out = Map::new();
    patch_metadata(&mut out, v, false)?;
    Ok(out)
}

/// Applies a `metadata` patch (a null value deletes its key when `nulls` is allowed).
pub fn patch_metadata(
    into: &mut Map<String, Value>,
    v: Option<&Value>,
    nulls: bool,
) -> Result<(), ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let Some(pairs) = v.as_object() else {
        return Err(refused("metadata", "must be an object of strings"));
    };
    for (k, v) in pairs {
        if k.chars().count() > 64 {
            return Err(refused("metadata", "keys are at most 64 characters"));
        }
        match v {
            Value::String(s) if s.chars().count() <= 512 => {
                into.insert(k.clone(), v.clone());
            }
            Value::String(_) => {
                return Err(refused("metadata", "values are at most 512 characters"))
            }
            Value::Null if nulls => {
                into.remove(k);
            }
            _ => return Err(refused("metadata", "values must be strings")),
        }
    }
    if into.len() > 16 {
        return Err(refused("metadata", "at most 16 pairs"));
    }
    Ok(())
}

/// Refuses the fields of `body` that `known` does not list, naming the first.
pub fn only(body: &Value, known: &[&str]) -> Result<(), ApiError> {
    let Some(obj) = body.as_object() else {
        return Err(ApiError::invalid("The request body must be a JSON object."));
    };
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(refused(k.clone(), "is not a field of this request")),
        None => Ok(()),
    }
}

/// List filters of the API that this gateway does not apply.
const UNAPPLIED: &[&str] = &[
    "created_at[",
    "agent_id",
    "agent_version",
    "statuses[",
    "deployment_id",
    "memory_store_id",
];

/// A list query's paging: `limit` (1 to 100, default 20) and the `page` cursor.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct Paging {
    pub limit: Option<usize>,
    pub page: Option<String>,
    pub include_archived: Option<bool>,
    pub order: Option<String>,
}

impl Paging {
    pub fn read(query: Option<&str>) -> Result<Paging, ApiError> {
        // `types[]` is read by the events list; a filter this gateway does not apply is
        // refused (a page that ignored it would be wrong); other keys are ignored.
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or_default())
            .map_err(|_| ApiError::invalid("The query string could not be read."))?;
        let mut p = Paging::default();
        for (k, v) in pairs {
            match k.as_str() {
                "limit" => {
                    let n: usize = v
                        .parse()
                        .map_err(|_| refused("limit", "must be a number"))?;
                    if !(1..=100).contains(&n) {
                        return Err(refused("limit", "must be between 1 and 100"));
                    }
                    p.limit = Some(n);
                }
                "page" => p.page = Some(v),
                "include_archived" => p.include_archived = Some(v == "true"),
                "order" => match v.as_str() {
                    "asc" | "desc" => p.order = Some(v),
                    _ => return Err(refused("order", "must be asc or desc")),
                },
                f if UNAPPLIED.iter().any(|u| f.starts_with(u)) => {
                    return Err(refused(f, "is not supported by this gateway"))
                }
                _ => {}
            }
        }
        Ok(p)
    }

    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(20)
    }
}

/// A page of `data`: `next_page` is the cursor of its last item when more may follow.
pub fn page(data: Vec<Value>, next: Option<String>) -> Value {
    json!({"data": data, "next_page": next})
}

/// An object list's cursor: its position (creation time and id).
pub fn object_cursor(created_at_ms: u64, id: &str) -> String {
    format!("{created_at_ms}.{id}")
}

/// Reads [`object_cursor`].
pub fn read_object_cursor(c: &str) -> Result<(u64, &str), ApiError> {
    c.split_once('.')
        .and_then(|(at, id)| Some((at.parse().ok()?, id)))
        .ok_or_else(|| refused("page", "is not a cursor this API issued"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_780_000_000_123), "2026-05-28T20:26:40.123Z");
    }

    #[test]
    fn metadata_is_bounded_and_patched() {
        let mut m = metadata(Some(&json!({"a": "1", "b": "2"}))).unwrap();
        patch_metadata(&mut m, Some(&json!({"a": null, "c": "3"})), true).unwrap();
        assert_eq!(Value::Object(m), json!({"b": "2", "c": "3"}));
        assert!(metadata(Some(&json!({"a": 1}))).is_err());
        let many: Map<String, Value> = (0..17).map(|i| (i.to_string(), json!("v"))).collect();
        assert!(metadata(Some(&Value::Object(many))).is_err());
    }

    #[test]
    fn paging_reads_the_sdks_query() {
        let p = Paging::read(Some("limit=2&page=5.x&types%5B%5D=agent.message")).unwrap();
        assert_eq!((p.limit(), p.page.as_deref()), (2, Some("5.x")));
        assert!(Paging::read(Some("limit=0")).is_err());
        assert!(Paging::read(Some("agent_id=agent_1")).is_err());
        assert!(Paging::read(Some("created_at%5Bgte%5D=2026-01-01T00:00:00Z")).is_err());
        assert_eq!(read_object_cursor("5.sesn_1").unwrap(), (5, "sesn_1"));
    }
}
