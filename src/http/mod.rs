//! HTTP: the router (routes and layers in one function) and thin handlers. A handler
//! authenticates from the headers, reads the body under the limit, lets its surface translate the request, hands the
//! neutral turn to the [`Engine`] and lets the surface frame the answer. Every error is an
//! [`ApiError`] (`error.rs` renders it), including the 404 fallback and 405s. This module never
//! sees backend ids and knows no wire format.

mod activity;
mod approvals;
mod caller;
pub mod cluster;
mod console;
mod error;
mod messages;
mod responses;
mod responses_ws;
mod turn;
mod usage;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::json;

use self::caller::Caller;
use self::turn::{turn, SurfaceError};
use crate::auth::Principal;
use crate::engine::Engine;
use crate::error::{ApiError, ErrorCode};
use crate::surface::{Chat, Messages, Responses};

pub fn router(gw: Engine) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(turn::<Chat>))
        .route(
            "/v1/responses",
            post(turn::<Responses>).get(responses_ws::upgrade),
        )
        .route("/v1/responses/compact", post(responses::compact))
        .route(
            "/v1/messages",
            post(turn::<Messages>).fallback(messages::method_not_allowed),
        )
        .route(
            "/v1/messages/count_tokens",
            post(messages::count_tokens).fallback(messages::method_not_allowed),
        )
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/usage", get(usage::usage))
        .route("/v1/approvals", get(approvals::list))
        .route("/v1/approvals/events", get(approvals::events))
        .route("/v1/approvals/{id}", get(approvals::show))
        .route("/v1/approvals/{id}/decision", post(approvals::decide))
        .route("/v1/whoami", get(activity::whoami))
        .route(
            "/v1/activity/executions",
            activity::listing(Engine::suspended_for),
        )
        .route(
            "/v1/activity/threads",
            activity::listing(Engine::threads_for),
        )
        .route(
            "/v1/activity/backends",
            activity::listing(Engine::backends_for),
        )
        .merge(console::routes())
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(gw.clone(), log_request))
        .with_state(gw)
}

/// An unknown route; under `/v1/messages` in Anthropic's shape.
async fn not_found(uri: axum::http::Uri) -> Response {
    let e = ApiError::new(ErrorCode::NotFound, "Unknown route.");
    if uri.path().starts_with("/v1/messages") {
        return SurfaceError::<Messages>::from(e).into_response();
    }
    e.into_response()
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "Method not allowed on this route.",
    )
}

/// The execution a response belongs to, for the request log line.
#[derive(Clone, Default)]
pub(super) struct ExecutionId(String);

/// One log line per request: request id, method, route, status, execution id, duration.
/// Never bodies, headers or credentials. Served requests log at info, gateway failures (5xx)
/// at error, rejections (4xx: a client's mistake, or forged tokens by the thousand) at debug:
/// they are counted in `/metrics`, and a flood of them never floods the log. Also counts
/// requests for `/metrics` and sets `x-request-id`.
async fn log_request(State(gw): State<Engine>, req: Request, next: Next) -> Response {
    let started = tokio::time::Instant::now();
    let request_id = crate::ids::request_id();
    let method = req.method().clone();
    // The matched route is shared (an `Arc<str>` inside), not copied.
    let matched = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .cloned();
    let mut resp = next.run(req).await;
    let route = matched.as_ref().map_or("unmatched", |p| p.as_str());
    let status = resp.status().as_u16();
    let code = resp.extensions().get::<error::Code>().map_or("", |c| c.0);
    let micros = started.elapsed().as_micros() as u64;
    let execution = resp
        .extensions_mut()
        .remove::<ExecutionId>()
        .unwrap_or_default();
    let execution = execution.0.as_str();
    gw.metrics().request(route, status);
    let request_id = header::HeaderValue::from_bytes(&request_id);
    let Ok(request_id) = request_id else {
        return resp;
    };
    resp.headers_mut()
        .insert("x-request-id", request_id.clone());
    let request_id = request_id.to_str().unwrap_or_default();
    if status >= 500 {
        tracing::error!(request = %request_id, %method, %route, status, code, %execution, micros, "request");
    } else if status >= 400 {
        tracing::debug!(request = %request_id, %method, %route, status, code, %execution, micros, "request");
    } else {
        tracing::info!(request = %request_id, %method, %route, status, code, %execution, micros, "request");
    }
    resp
}

/// Public (a scraper needs no credential), but only an approver's scrape names principals:
/// another principal's usage is not for anyone who can reach the listener.
async fn metrics(State(gw): State<Engine>, headers: HeaderMap) -> Response {
    let clients = principal(&gw, &headers).is_ok_and(|p| p.approver);
    let text = gw.metrics().render(&gw.gauges(), clients);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// The credential: `Authorization`, else an Anthropic client's `x-api-key` (the same keys and
/// JWTs, as a bearer token).
fn authorization(headers: &HeaderMap) -> Option<std::borrow::Cow<'_, str>> {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    match header(header::AUTHORIZATION.as_str()) {
        Some(a) => Some(a.into()),
        None => header("x-api-key").map(|k| format!("Bearer {k}").into()),
    }
}

/// A declared `Content-Length` over the limit: 413 from the headers, before anything else.
fn declared_within(headers: &HeaderMap, limit: usize) -> Result<(), ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > limit as u64 => Err(ApiError::too_large(limit)),
        _ => Ok(()),
    }
}

/// Reads the body under the configured limit (413 before any parsing or digest work) and
/// within the body-read timeout (408: a body trickled in is not waited for). Callers check
/// the declared length ([`declared_within`]) and the credential first.
async fn read_body(
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, ApiError> {
    let read = tokio::time::timeout(timeout, Limited::new(body, limit).collect());
    let Ok(read) = read.await else {
        return Err(ApiError::new(
            ErrorCode::RequestTimeout,
            format!(
                "The request body did not arrive within {} seconds.",
                timeout.as_secs()
            ),
        ));
    };
    match read {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::too_large(limit)),
        Err(_) => Err(ApiError::invalid("The request body could not be read.")),
    }
}

fn principal(gw: &Engine, headers: &HeaderMap) -> Result<Principal, ApiError> {
    gw.authenticate(authorization(headers).as_deref())
}

/// What every handler that reads a body does first, in this order: a declared length over the limit is
/// 413 and a request without valid credentials 401, both from the headers alone (no body
/// byte is read, so an unauthenticated caller costs no memory, and the connection closes);
/// only then the body, under the limit (413 before any parsing or digest work).
pub(super) struct Admitted {
    arrived: tokio::time::Instant,
    cfg: std::sync::Arc<crate::config::Config>,
    bytes: Bytes,
    principal: Principal,
}

pub(super) async fn admitted(
    gw: &Engine,
    headers: &HeaderMap,
    body: Body,
) -> Result<Admitted, ApiError> {
    let arrived = tokio::time::Instant::now();
    let cfg = gw.config();
    let server = &cfg.server;
    declared_within(headers, server.max_body_bytes)?;
    let principal = principal(gw, headers)?;
    let bytes = read_body(body, server.max_body_bytes, server.body_read_timeout).await?;
    Ok(Admitted {
        arrived,
        cfg,
        bytes,
        principal,
    })
}

/// Whether a request comes from an Anthropic client (it names the API version).
fn anthropic(headers: &HeaderMap) -> bool {
    headers.contains_key("anthropic-version")
}

async fn models(State(gw): State<Engine>, headers: HeaderMap, uri: Uri) -> Response {
    if anthropic(&headers) {
        return messages::models(&gw, &headers, &uri).into_response();
    }
    openai_models(&gw, &headers).into_response()
}

async fn model(
    State(gw): State<Engine>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    if anthropic(&headers) {
        return messages::model_of(&gw, &headers, &id).into_response();
    }
    let found = principal(&gw, &headers)
        .map(|p| gw.models_for(&p).contains(&id))
        .and_then(|ok| {
            ok.then_some(())
                .ok_or_else(|| ApiError::model_not_found(&id))
        });
    match found {
        Ok(()) => Json(json!({"id": id, "object": "model", "created": 0, "owned_by": "turnstile"}))
            .into_response(),
        Err(e) => e.into_response(),
    }
}

fn openai_models(gw: &Engine, headers: &HeaderMap) -> Result<Response, ApiError> {
    let principal = principal(gw, headers)?;
    let data: Vec<_> = gw
        .models_for(&principal)
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "turnstile"}))
        .collect();
    Ok(Json(json!({"object": "list", "data": data})).into_response())
}

async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// `GET /readyz`: 200 when the store takes writes, the replica's lease is renewed (with
/// `[cluster]`) and every backend can take a turn; else 503. Each check is listed.
async fn readyz(State(gw): State<Engine>) -> Response {
    let store = gw.store_ready();
    let lease = gw.lease_ready();
    let backends = gw.backends_ready();
    let ok = |b: bool| if b { "ok" } else { "failing" };
    let mut checks = json!({
        "store": {"status": ok(store), "engine": gw.store_engine()},
        "backends": {"status": ok(backends)},
    });
    if let (Some(lease), Some(id)) = (lease, gw.replica_id()) {
        checks["lease"] = json!({"status": ok(lease), "replica_id": id});
    }
    let ready = store && lease.unwrap_or(true) && backends;
    let status = if ready { "ready" } else { "not_ready" };
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(json!({"status": status, "checks": checks}))).into_response()
}

#[cfg(test)]
mod tests;
