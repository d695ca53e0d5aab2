//! The extractors for what every authenticated route checks from the headers alone, before
//! any body byte is read, in this order: a declared `Content-Length` over the route's limit
//! is 413, a missing or bad credential 401. [`Admitted`] then reads the body under the
//! configured limit and within the body-read timeout.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::AppState;
use crate::auth::Principal;
use crate::config::Config;
use crate::error::{ApiError, ErrorCode};

/// The authenticated caller of a route whose body is at most `LIMIT` bytes (no limit by
/// default: a route without a body, or one that checks its own).
pub struct Caller<const LIMIT: usize = { usize::MAX }> {
    pub principal: Principal,
    /// The credential as sent, for the re-checks of a long-lived stream.
    pub credential: Option<String>,
}

impl<const LIMIT: usize> FromRequestParts<AppState> for Caller<LIMIT> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        declared_within(&parts.headers, LIMIT)?;
        let principal = app.admit(&parts.headers).await?;
        let credential = authorization(&parts.headers);
        Ok(Caller {
            principal,
            credential: credential.map(|c| c.into_owned()),
        })
    }
}

/// A request whose body the gateway reads: a declared length over `max_body_bytes` is 413
/// and a request without valid credentials 401, both from the headers alone (no body byte is
/// read, so an unauthenticated caller costs no memory, and the connection closes); only then
/// the body, under the limit (413 before any parsing or digest work).
pub struct Admitted {
    pub arrived: tokio::time::Instant,
    pub cfg: std::sync::Arc<Config>,
    pub bytes: Bytes,
    pub principal: Principal,
}

impl FromRequest<AppState> for Admitted {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &AppState) -> Result<Self, ApiError> {
        let arrived = tokio::time::Instant::now();
        let cfg = app.engine.config();
        let server = &cfg.server;
        declared_within(req.headers(), server.max_body_bytes)?;
        let principal = app.admit(req.headers()).await?;
        let body = req.into_body();
        let bytes = read_body(body, server.max_body_bytes, server.body_read_timeout).await?;
        Ok(Admitted {
            arrived,
            cfg,
            bytes,
            principal,
        })
    }
}

/// The credential: `Authorization`, else an Anthropic client's `x-api-key` (the same keys and
/// JWTs, as a bearer token), else a console session's cookie, only beside its CSRF header.
pub(super) fn authorization(headers: &HeaderMap) -> Option<std::borrow::Cow<'_, str>> {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    match header(header::AUTHORIZATION.as_str()) {
        Some(a) => Some(a.into()),
        None => match header("x-api-key") {
            Some(k) => Some(format!("Bearer {k}").into()),
            None => console_cookie(headers).map(|c| format!("Bearer {c}").into()),
        },
    }
}

/// The console session cookie, when the request also carries its CSRF token (which a
/// cross-site page cannot set).
fn console_cookie(headers: &HeaderMap) -> Option<&str> {
    use crate::sso::console::{csrf_of, CSRF_HEADER};
    let cookie = session_cookie(headers)?;
    let csrf = headers.get(CSRF_HEADER)?.to_str().ok()?;
    let ok = subtle::ConstantTimeEq::ct_eq(csrf.as_bytes(), csrf_of(cookie).as_bytes());
    bool::from(ok).then_some(cookie)
}

/// The console session cookie's value (`__Host-` or loopback name), if sent.
pub(super) fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    use crate::sso::console::{COOKIE_LOOPBACK, COOKIE_SECURE};
    cookie(headers, COOKIE_SECURE).or_else(|| cookie(headers, COOKIE_LOOPBACK))
}

/// The value of cookie `name` among the request's `Cookie` headers.
pub(super) fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    (headers.get_all(header::COOKIE).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
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
/// the declared length and the credential first.
pub(super) async fn read_body(
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
