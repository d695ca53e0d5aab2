//! Approvals API: list, show, decide, and the SSE event stream. Visibility is decided by the
//! approvals module; an approval the caller may not see is the same 404 as an unknown id.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

use super::caller::read_body;
use super::cluster::{to_owner, Hop, Replay};
use super::turn::holding;
use super::{AppState, Caller};
use crate::approvals::MAX_REASON_CHARS;
use crate::approvals::{to_json, visible, ApprovalState, DecideError, SettleReason};
use crate::engine::ApprovalRoute;
use crate::engine::Engine;
use crate::error::{ApiError, ErrorCode};

fn not_found() -> ApiError {
    ApiError::new(ErrorCode::ApprovalNotFound, "No approval with this id.")
}

/// `GET /v1/approvals?state=…&reason=…`.
#[derive(Deserialize)]
pub struct ListQuery {
    state: Option<String>,
    reason: Option<String>,
}

pub async fn list(
    State(gw): State<Engine>,
    Caller { principal: who, .. }: Caller,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) =
        query.map_err(|e| ApiError::invalid(format!("bad query string: {}", e.body_text())))?;
    let state = match q.state.as_deref() {
        None => None,
        Some(v) => Some(ApprovalState::parse(v).ok_or_else(|| {
            ApiError::invalid("`state` must be pending, approved or denied").with_param("state")
        })?),
    };
    let reason = match q.reason.as_deref() {
        None => None,
        Some(v) => Some(SettleReason::parse(v).ok_or_else(|| {
            ApiError::invalid(
                "`reason` must be human, expired, cancelled, orphaned or store_unavailable",
            )
            .with_param("reason")
        })?),
    };
    let records = gw
        .approvals()
        .list(state, reason, &who)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "approvals list failed");
            ApiError::new(
                ErrorCode::StoreUnavailable,
                "The approvals store is unavailable.",
            )
        })?;
    let data: Vec<_> = records.iter().map(to_json).collect();
    Ok(Json(json!({"object": "list", "data": data})).into_response())
}

pub async fn show(
    State(gw): State<Engine>,
    Caller { principal: who, .. }: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let record = gw.approvals().get(&id, &who).await.ok_or_else(not_found)?;
    Ok(Json(to_json(&record)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    decision: DecisionValue,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum DecisionValue {
    Approve,
    Deny,
}

/// The largest decision body.
const LIMIT: usize = 64 * 1024;

pub async fn decide(
    State(gw): State<Engine>,
    hop: Option<Extension<Hop>>,
    uri: Uri,
    headers: HeaderMap,
    // The headers first: no body byte is read for a caller without credentials.
    Caller { principal: who, .. }: Caller<LIMIT>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    // Visibility next: a foreign caller learns nothing, not even that its body was bad.
    let record = gw.approvals().get(&id, &who).await.ok_or_else(not_found)?;
    let timeout = gw.config().server.body_read_timeout;
    let bytes = read_body(body, LIMIT, timeout).await?;
    let body: DecisionBody = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::invalid(format!(
            "The body must be {{\"decision\":\"approve\"|\"deny\",\"reason\"?:string}}: {e}"
        ))
        .with_param("decision")
    })?;
    // The reason is recorded with the decision (never sent to the backend, never logged).
    let reason = body.reason.as_deref().filter(|r| !r.trim().is_empty());
    if reason.is_some_and(|r| r.chars().count() > MAX_REASON_CHARS) {
        return Err(ApiError::invalid(format!(
            "`reason` must be at most {MAX_REASON_CHARS} characters"
        ))
        .with_param("reason"));
    }
    // The backend request waits on another replica: the decision is taken there. An owner
    // that is gone has had its approvals orphaned, which the decision below then reports.
    if let (ApprovalRoute::Owner(owner), None) = (gw.approval_route(&record).await, hop) {
        let replay = Replay {
            method: &axum::http::Method::POST,
            uri: &uri,
            headers: &headers,
            body: bytes.clone(),
        };
        match to_owner(&gw, "approval", owner, &replay).await {
            Ok(resp) => return Ok(resp),
            // Alive by its lease but not answering: the approval is still pending there, so
            // this is not "already decided" but "retry" (nothing was decided).
            Err(e @ crate::engine::EngineError::ReplicaUnavailable) => return Err(e.into()),
            // Gone: its approvals are orphaned, which the decision below reports.
            Err(_) => {}
        }
    }
    match gw
        .approvals()
        .decide(&id, body.decision == DecisionValue::Approve, reason, &who)
        .await
    {
        Ok(record) => Ok(Json(to_json(&record)).into_response()),
        Err(DecideError::NotFound) => Err(not_found()),
        Err(DecideError::AlreadyDecided(record)) => Err(ApiError::new(
            ErrorCode::ApprovalAlreadyDecided,
            "This approval is already settled.",
        )
        .with_extra("approval", to_json(&record))),
        Err(DecideError::Store(_)) => Err(ApiError::new(
            ErrorCode::StoreUnavailable,
            "The decision could not be recorded; the backend was denied.",
        )),
    }
}

/// The credential of a long-lived stream, re-checked under the current config before each
/// event and keep-alive: authority lasts only as long as the config (and a JWT's `exp`)
/// grants it. The stream ends when the key or issuer is gone, the token expired, or the
/// principal's approver role changed.
pub(super) struct Authority {
    pub app: AppState,
    pub credential: Option<String>,
    pub opened: crate::auth::Principal,
}

impl Authority {
    pub async fn current(&self) -> Option<&crate::auth::Principal> {
        let now = self.app.recheck(self.credential.as_deref()).await.ok()?;
        (now.id == self.opened.id && now.approver == self.opened.approver).then_some(&self.opened)
    }
}

/// `GET /v1/approvals/events`: `created`, `decided`, `expired`, `cancelled` events of the
/// approvals the caller may see, as SSE, with keep-alive comments.
pub async fn events(State(app): State<AppState>, caller: Caller) -> Result<Response, ApiError> {
    let gw = app.engine.clone();
    let Caller {
        principal: opened,
        credential,
    } = caller;
    let slot = gw.open_stream(&opened)?;
    let rx = gw.approvals().subscribe();
    let keepalive = gw.config().server.keepalive;
    let stop = gw.stopping();
    let who = Authority {
        app,
        credential,
        opened,
    };
    let stream = futures::stream::unfold(
        (rx, who, stop, true),
        move |(mut rx, who, stop, first)| async move {
            if first {
                let hello = Bytes::from(": approvals events\n\n");
                return Some((
                    Ok::<_, std::convert::Infallible>(hello),
                    (rx, who, stop, false),
                ));
            }
            loop {
                let next = tokio::select! {
                    _ = stop.cancelled() => return None,
                    r = tokio::time::timeout(keepalive.max(Duration::from_millis(100)), rx.recv()) => r,
                };
                let Some(current) = who.current().await else {
                    tracing::info!(client = %who.opened.id, "approvals event stream ended: its authority is gone");
                    return None;
                };
                let chunk = match next {
                    Err(_) => ": keep-alive\n\n".to_string(),
                    Ok(Ok(ev)) if visible(&ev.record, current) => {
                        let kind = ev.kind.as_str();
                        let data = json!({"type": kind, "approval": to_json(&ev.record)});
                        format!("event: {kind}\ndata: {data}\n\n")
                    }
                    Ok(Ok(_)) => continue,
                    // How many were dropped counts everyone's events, so it is not shown.
                    Ok(Err(RecvError::Lagged(_))) => {
                        ": lagged; re-read GET /v1/approvals\n\n".to_string()
                    }
                    Ok(Err(RecvError::Closed)) => return None,
                };
                return Some((Ok(Bytes::from(chunk)), (rx, who, stop, false)));
            }
        },
    );
    let resp = Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .map_err(|_| ApiError::new(ErrorCode::Internal, "response build failed"))?;
    Ok(holding(resp, Some(slot)))
}
