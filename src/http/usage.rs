//! `GET /v1/usage`: daily token totals and spend per client and model, as the backends
//! reported them, and the caps of a budget with what is left of each. A client sees its own;
//! an approver sees everyone's and may filter by `client` (whose budget it then sees). Query:
//! `from` / `to` (inclusive `YYYY-MM-DD`, UTC) and `client`.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::Caller;
use crate::budget::{usd, Cap};
use crate::engine::CapView;
use crate::engine::Engine;
use crate::error::{ApiError, ErrorCode};
use crate::store::{date_of, day_from_date, day_of, UsageQuery, UsageRow};
use crate::turn::Usage;

fn totals(u: &Usage, requests: u64, spend: u64) -> serde_json::Map<String, Value> {
    let mut o: serde_json::Map<String, Value> = [
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
    .collect();
    o.insert("spend_usd".into(), json!(usd(spend)));
    o
}

/// Each cap: its amount, what its window used and what is left, and when it resets.
fn budget_json(caps: &[CapView]) -> Value {
    let amount = |cap: Cap, n: u64| match cap.in_usd() {
        true => json!(usd(n)),
        false => json!(n),
    };
    let o: serde_json::Map<String, Value> = caps
        .iter()
        .map(|c| {
            let mut v = json!({"cap": amount(c.cap, c.limit)});
            if let (Some(used), Some(at)) = (c.used, c.resets_at) {
                v["used"] = amount(c.cap, used);
                v["remaining"] = amount(c.cap, c.limit.saturating_sub(used));
                v["resets_at"] = json!(format!("{}T00:00:00Z", date_of(day_of(at))));
            }
            (c.cap.as_str().to_string(), v)
        })
        .collect();
    Value::Object(o)
}

fn row_json(r: &UsageRow) -> Value {
    let mut o = serde_json::Map::new();
    o.insert("date".into(), json!(date_of(r.day)));
    o.insert("client".into(), json!(r.principal));
    o.insert("model".into(), json!(r.model));
    o.extend(totals(&r.usage, r.requests, r.spend));
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
    let unavailable = |e: crate::store::StoreError| {
        tracing::error!(error = %e, "usage read failed");
        ApiError::new(
            ErrorCode::StoreUnavailable,
            "The usage store is unavailable.",
        )
    };
    // A client asking for another client's usage sees nothing (the engine scopes it to its
    // own, and that filter then matches no row).
    let foreign = !who.approver && q.principal.as_ref().is_some_and(|p| **p != *who.id);
    let rows = match foreign {
        true => Vec::new(),
        false => gw.usage(&who, q.clone()).await.map_err(unavailable)?,
    };
    let mut sum = Usage::default();
    let (mut requests, mut spend) = (0, 0);
    for r in &rows {
        sum.add(r.usage);
        requests += r.requests;
        spend += r.spend;
    }
    let data: Vec<Value> = rows.iter().map(row_json).collect();
    let mut body = json!({"object": "list", "data": data, "total": totals(&sum, requests, spend)});
    // The caller's own budget, or the one client an approver asked about.
    let whose = match (&q.principal, who.approver) {
        (Some(p), true) => Some(p.as_str()),
        (None, _) => Some(&*who.id),
        (Some(_), false) => (!foreign).then_some(&*who.id),
    };
    if let Some(whose) = whose {
        let caps = gw.budget_view(whose).await.map_err(unavailable)?;
        if !caps.is_empty() {
            body["budget"] = budget_json(&caps);
        }
    }
    Ok(Json(body).into_response())
}
