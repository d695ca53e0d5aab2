//! HTTP surface: the router (routes and layers in one function), thin handlers and SSE
//! framing. Handlers authenticate, parse and hand over to [`Gateway`]; every error is an
//! [`ApiError`] rendered in the OpenAI shape, including the 404 fallback and 405s. This module
//! never sees backend ids.

mod approvals;
mod sse;

use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::json;

use crate::auth::Principal;
use crate::error::{ApiError, ErrorCode};
use crate::gateway::{Gateway, LegEvent, RelayBody, Reply};
use crate::openai::{completion, ChatRequest};

pub fn router(gw: Gateway) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/v1/approvals", get(approvals::list))
        .route("/v1/approvals/events", get(approvals::events))
        .route("/v1/approvals/{id}", get(approvals::show))
        .route("/v1/approvals/{id}/decision", post(approvals::decide))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(gw.clone(), log_request))
        .with_state(gw)
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "Unknown route.")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "Method not allowed on this route.",
    )
}

/// The execution a response belongs to, for the request log line.
#[derive(Clone)]
struct ExecutionId(String);

/// One log line per request: request id, method, route, status, execution id, duration.
/// Never bodies, headers or credentials. Also counts requests for `/metrics` and sets
/// `x-request-id`.
async fn log_request(State(gw): State<Gateway>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let request_id = crate::continuation::token::new_id("req-");
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let mut resp = next.run(req).await;
    let status = resp.status().as_u16();
    let micros = started.elapsed().as_micros() as u64;
    let execution = resp
        .extensions()
        .get::<ExecutionId>()
        .map(|e| e.0.clone())
        .unwrap_or_default();
    gw.metrics().request(&route, status);
    if let Ok(v) = header::HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    if status >= 500 {
        tracing::error!(request = %request_id, %method, %route, status, %execution, micros, "request");
    } else {
        tracing::info!(request = %request_id, %method, %route, status, %execution, micros, "request");
    }
    resp
}

async fn metrics(State(gw): State<Gateway>) -> Response {
    let text = gw.metrics().render(&gw.gauges());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

/// Reads the body under the configured limit: 413 before any parsing or digest work.
async fn read_body(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            ErrorCode::RequestTooLarge,
            format!("The request body exceeds {limit} bytes."),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(_) => Err(ApiError::invalid("The request body could not be read.")),
    }
}

fn principal(gw: &Gateway, headers: &HeaderMap) -> Result<Principal, ApiError> {
    gw.authenticate(authorization(headers))
}

async fn chat(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let limit = gw.config().server.max_body_bytes;
    let bytes = read_body(body, &headers, limit).await?;
    let principal = principal(&gw, &headers)?;
    let req: ChatRequest = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("Invalid request body: {e}")))?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid("`messages` must not be empty").with_param("messages"));
    }
    let stream = req.stream;
    let include_usage = req
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let (execution, mut resp) = match gw.chat(&principal, req, bytes, started).await? {
        Reply::Leg(leg) => {
            let execution = ExecutionId(leg.execution_id.clone());
            let resp = if stream {
                let keepalive = gw.config().server.keepalive;
                sse::respond(leg, include_usage, keepalive).await?
            } else {
                collect(leg).await?
            };
            (execution, resp)
        }
        Reply::Relay { execution_id, body } => {
            let resp = match body {
                RelayBody::Json(v) => Json(v).into_response(),
                RelayBody::Sse(stream) => sse::relay(stream)?,
            };
            (ExecutionId(execution_id), resp)
        }
    };
    // For streams this is when headers and the first bytes are ready to go.
    gw.metrics().ttfb.observe(started.elapsed());
    resp.extensions_mut().insert(execution);
    Ok(resp)
}

/// Non-streaming: waits for the leg's end and answers one `chat.completion`.
async fn collect(mut leg: crate::gateway::Leg) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(ev) = leg.events.recv().await {
        match ev {
            LegEvent::Delta(d) => text.push_str(&d),
            LegEvent::Notice(_) => {}
            LegEvent::Error(e) => return Err(e),
            LegEvent::End { calls, usage } => {
                let finish = if calls.is_empty() {
                    "stop"
                } else {
                    "tool_calls"
                };
                let content = if text.is_empty() && !calls.is_empty() {
                    None
                } else {
                    Some(text)
                };
                let body = completion(&leg.meta, content, &calls, finish, usage);
                return Ok(Json(body).into_response());
            }
        }
    }
    Err(ApiError::upstream())
}

async fn models(State(gw): State<Gateway>, headers: HeaderMap) -> Result<Response, ApiError> {
    let principal = principal(&gw, &headers)?;
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

async fn readyz(State(gw): State<Gateway>) -> Response {
    if gw.ready() {
        Json(json!({"status": "ready"})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "not_ready"})),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    //! Router tests with `oneshot`: routing, extractor failures and error shapes, with a
    //! gateway that has clients but no backends.

    use super::*;
    use axum::http::Request as HttpRequest;
    use serde_json::Value;
    use tower::ServiceExt;

    async fn app() -> (Router, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[server]\nmax_body_bytes = 1024\n[store]\npath = \"t.db\"\n\
             [[clients]]\nid = \"alice\"\nkey_sha256 = \"{}\"\n",
            crate::auth::hash_key("sk-a")
        );
        let cfg = crate::config::from_toml_str(&text, dir.path()).unwrap();
        let gw = Gateway::start(cfg, None).await.unwrap();
        (router(gw), dir)
    }

    async fn send(app: &Router, req: HttpRequest<Body>) -> (StatusCode, Value) {
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    fn chat_req(key: Option<&str>, body: impl Into<Body>) -> HttpRequest<Body> {
        let mut b =
            HttpRequest::post("/v1/chat/completions").header("content-type", "application/json");
        if let Some(k) = key {
            b = b.header("authorization", format!("Bearer {k}"));
        }
        b.body(body.into()).unwrap()
    }

    #[tokio::test]
    async fn unknown_route_and_wrong_method_are_openai_shaped() {
        let (app, _d) = app().await;
        let (s, v) = send(&app, HttpRequest::get("/nope").body(Body::empty()).unwrap()).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        assert_eq!(v["error"]["code"], "not_found");
        let (s, v) = send(
            &app,
            HttpRequest::delete("/v1/chat/completions")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(v["error"]["code"], "method_not_allowed");
    }

    #[tokio::test]
    async fn size_limit_comes_before_auth_and_parsing() {
        let (app, _d) = app().await;
        let (s, v) = send(&app, chat_req(None, "x".repeat(2000))).await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(v["error"]["code"], "request_too_large");
        // Without a Content-Length (streamed body) the limit still holds.
        let stream =
            futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from("y".repeat(2000)))]);
        let (s, _) = send(&app, chat_req(Some("sk-a"), Body::from_stream(stream))).await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn auth_then_json_then_model() {
        let (app, _d) = app().await;
        let (s, v) = send(&app, chat_req(None, "{bad")).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("invalid_api_key"))
        );
        let (s, v) = send(&app, chat_req(Some("sk-other"), "{}")).await;
        assert_eq!(
            (s, v["error"]["type"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("authentication_error"))
        );
        let (s, v) = send(&app, chat_req(Some("sk-a"), "{bad")).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_request"))
        );
        let (s, _) = send(
            &app,
            chat_req(Some("sk-a"), r#"{"model":"m","messages":[]}"#),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"unknown_field":1}"#;
        let (s, v) = send(&app, chat_req(Some("sk-a"), body)).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("model_not_found"))
        );
        assert_eq!(v["error"]["param"], "model");
    }

    #[tokio::test]
    async fn models_health_and_readiness() {
        let (app, _d) = app().await;
        let req = HttpRequest::get("/v1/models")
            .header("authorization", "Bearer sk-a")
            .body(Body::empty())
            .unwrap();
        let (s, v) = send(&app, req).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(v, json!({"object": "list", "data": []}));
        let (s, _) = send(
            &app,
            HttpRequest::get("/v1/models").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        let (s, v) = send(
            &app,
            HttpRequest::get("/healthz").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("ok")));
        let (s, _) = send(
            &app,
            HttpRequest::get("/readyz").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::OK);
    }
}
