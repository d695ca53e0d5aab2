//! HTTP: the router (routes and layers in one function) and thin handlers. A handler
//! authenticates from the headers, reads the body under the limit, lets its surface translate the request, hands the
//! neutral turn to the [`Engine`] and lets the surface frame the answer. Every error is an
//! [`ApiError`] (`error.rs` renders it), including the 404 fallback and 405s. This module never
//! sees backend ids and knows no wire format.

pub mod access;
mod activity;
mod approvals;
mod caller;
pub mod cluster;
mod console;
mod decisions;
mod error;
mod managed;
mod socket;
mod sso;
mod sso_console;
mod surfaces;
mod turn;
mod usage;
mod webhooks;

use axum::extract::{FromRef, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;

use self::caller::{authorization, Admitted, Caller};
use self::surfaces::Surfaces;
use crate::auth::{Authenticator, Principal};
use crate::engine::Engine;
use crate::error::{ApiError, ErrorCode};
use crate::surface::{Chat, Messages, Responses};

/// What every handler may extract: the engine, and the authenticator in front of it
/// (`State<Engine>` extracts the engine alone).
#[derive(Clone)]
pub struct AppState {
    engine: Engine,
    auth: Arc<Authenticator>,
    /// The Managed Agents API's sessions loaded here.
    managed: crate::managed::Managed,
    /// Sign-in through identity providers (None in router tests without a store key).
    sso: Option<Arc<crate::sso::Sso>>,
}

impl From<Engine> for AppState {
    fn from(engine: Engine) -> AppState {
        AppState {
            managed: crate::managed::Managed::new(engine.clone()),
            engine,
            auth: Arc::default(),
            sso: None,
        }
    }
}

impl FromRef<AppState> for Engine {
    fn from_ref(app: &AppState) -> Engine {
        app.engine.clone()
    }
}

impl AppState {
    /// The principal behind a request's credential, under the current config.
    fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        let credential = authorization(headers);
        self.auth
            .authenticate(&self.engine.config(), credential.as_deref())
    }

    /// [`AppState::authenticate`], fetching an OpenID provider's keys again when a token
    /// names one they lack (what a request's first authentication does).
    async fn admit(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        let credential = authorization(headers);
        (self.auth)
            .authenticate_fetching(&self.engine.config(), credential.as_deref())
            .await
    }

    /// The principal behind a credential, under the current config (a long-lived stream
    /// re-checks its own this way).
    async fn recheck(&self, credential: Option<&str>) -> Result<Principal, ApiError> {
        let cfg = self.engine.config();
        self.auth.authenticate_fetching(&cfg, credential).await
    }

    /// The same state, with sign-in through identity providers served and its tokens
    /// accepted.
    pub fn with_sso(self, sso: Arc<crate::sso::Sso>) -> AppState {
        AppState {
            auth: Arc::new(Authenticator::with_sso(sso.clone())),
            sso: Some(sso),
            ..self
        }
    }
}

/// Every public route over `state` (one [`AppState`] may serve several listeners).
pub fn router(state: impl Into<AppState>) -> Router {
    let app: AppState = state.into();
    let gw = app.engine.clone();
    let surfaces = Surfaces::default()
        .with::<Chat>()
        .with::<Responses>()
        .with::<Messages>()
        .with::<crate::surface::gemini::Gemini>();
    let router = surfaces
        .router()
        .route("/v1/usage", get(usage::usage))
        .route("/v1/approvals", get(approvals::list))
        .route("/v1/approvals/events", get(approvals::events))
        .route("/v1/approvals/{id}", get(approvals::show))
        .route("/v1/approvals/{id}/decision", post(approvals::decide))
        .route(
            "/v1/decisions/{token}",
            get(decisions::show).post(decisions::decide),
        )
        .route("/v1/webhooks", get(webhooks::list))
        .route("/v1/webhooks/{id}/test", post(webhooks::test))
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
        .merge(managed::routes(&app))
        .merge(sso::routes())
        .merge(sso_console::routes())
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(gw, log_request));
    // The server span is a layer of its own, there only when traces are on.
    let router = match crate::telemetry::on() {
        true => router.layer(middleware::from_fn(trace_request)),
        false => router,
    };
    router.with_state(app)
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "Method not allowed on this route.",
    )
}

/// The execution a response belongs to, for the request log line.
#[derive(Clone, Default)]
pub(super) struct ExecutionId(std::sync::Arc<str>);

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
    let execution = &*execution.0;
    gw.metrics().request(route, status);
    let request_id = header::HeaderValue::from_bytes(&request_id);
    let Ok(request_id) = request_id else {
        return resp;
    };
    resp.headers_mut()
        .insert("x-request-id", request_id.clone());
    access::log(&access::Line {
        request: request_id.to_str().unwrap_or_default(),
        method: method.as_str(),
        route,
        status,
        code,
        execution,
        micros,
    });
    resp
}

/// With traces on, a layer outside [`log_request`]: the request's server span, around the
/// request and, with its status, open until the body is done (a stream's span covers the
/// whole stream).
async fn trace_request(req: Request, next: Next) -> Response {
    let route = req.extensions().get::<axum::extract::MatchedPath>();
    let route = route.map_or("unmatched", |p| p.as_str());
    let span = crate::telemetry::server_span(req.method().as_str(), route, req.headers());
    if span.is_disabled() {
        return next.run(req).await;
    }
    let resp = crate::telemetry::in_request(span.clone(), next.run(req)).await;
    let status = resp.status().as_u16();
    span.record("http.response.status_code", i64::from(status));
    if let Some(code) = resp.extensions().get::<error::Code>() {
        span.record("error.type", code.0);
    }
    if status >= 500 {
        span.record("otel.status_code", "error");
    }
    turn::holding(resp, Some(span))
}

/// Public (a scraper needs no credential), but only an approver's scrape names principals:
/// another principal's usage is not for anyone who can reach the listener.
async fn metrics(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let clients = app.authenticate(&headers).is_ok_and(|p| p.approver);
    let gw = &app.engine;
    let mut text = gw.metrics().render(&gw.gauges(), clients);
    if let Some(n) = gw.notifier() {
        n.render_metrics(&mut text).await;
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// `GET /readyz`: 200 when the store takes writes, the replica's lease is renewed (with
/// `[cluster]`) and every backend can take a turn; else 503. Each check is listed.
async fn readyz(State(gw): State<Engine>) -> Response {
    let store = gw.store_ready().await;
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
