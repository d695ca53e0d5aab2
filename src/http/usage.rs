//! `GET /v1/usage`: daily token totals per client and model, as the backends reported them.
//! A client sees its own; an approver sees everyone's and may filter by `client`. Query:
//! `from` / `to` (inclusive `YYYY-MM-DD`, UTC) and `client`.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::Caller;
use crate::engine::Engine;
use crate::error::{ApiError, ErrorCode};
use crate::store::{date_of, day_from_date, UsageQuery, UsageRow};
use crate::turn::Usage;

fn totals(u: &Usage, requests: u64) -> serde_json::Map<String, Value> {
    [
        ("input_tokens", u.prompt_tokens),
        ("cached_input_tokens", u.cached_tokens),
        ("cache_write_input_tokens", u.cache_write_tokens),
        ("output_tokens", u.completion_tokens),
        ("reasoning_tokens", u.reasoning_tokens),
        ("total_tokens", u.prompt_tokens + u.completion_tokens),
        ("requests", requests),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), json!(v)))
    .collect()
}

fn row_json(r: &UsageRow) -> Value {
    let mut o = serde_json::Map::new();
    o.insert("date".into(), json!(date_of(r.day)));
    o.insert("client".into(), json!(r.principal));
    o.insert("model".into(), json!(r.model));
    o.extend(totals(&r.usage, r.requests));
    Value::Object(o)
}

/// `GET /v1/usage?from=…&to=…&client=…`.
#[derive(Deserialize)]
pub struct Params {
    from: Option<String>,
    to: Option<String>,
    client: Option<String>,
}

pub async fn usage(
    State(gw): State<Engine>,
    Caller { principal: who, .. }: Caller,
    query: Result<Query<Params>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) =
        query.map_err(|e| ApiError::invalid(format!("bad query string: {}", e.body_text())))?;
    let day = |value: Option<&str>, param: &'static str| {
        value
            .map(|v| {
                day_from_date(v).ok_or_else(|| {
                    ApiError::invalid(format!("`{param}` must be a date (YYYY-MM-DD)"))
                        .with_param(param)
                })
            })
            .transpose()
    };
    let q = UsageQuery {
        from_day: day(p.from.as_deref(), "from")?,
        to_day: day(p.to.as_deref(), "to")?,
        principal: p.client,
    };
    // A client asking for another client's usage sees nothing (the engine scopes it to its
    // own, and that filter then matches no row).
    let foreign = !who.approver && q.principal.as_ref().is_some_and(|p| *p != who.id);
    let rows = match foreign {
        true => Vec::new(),
        false => gw.usage(&who, q).await.map_err(|e| {
            tracing::error!(error = %e, "usage read failed");
            ApiError::new(
                ErrorCode::StoreUnavailable,
                "The usage store is unavailable.",
            )
        })?,
    };
    let mut sum = Usage::default();
    let mut requests = 0;
    for r in &rows {
        sum.add(r.usage);
        requests += r.requests;
    }
    let data: Vec<Value> = rows.iter().map(row_json).collect();
    Ok(
        Json(json!({"object": "list", "data": data, "total": totals(&sum, requests)}))
            .into_response(),
    )
}
