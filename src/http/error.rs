//! How an [`ApiError`] becomes a response: the status it decides, the body in the route's
//! shape (OpenAI's, the chat surface's, which every non-surface route shares; a surface's own on
//! its routes, through `turn::SurfaceError`), the stable code in `x-turnstile-error-code`,
//! `WWW-Authenticate` on 401 and `Retry-After` on 429. The code goes into the response's
//! extensions so the request log line names it once, at the boundary.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::error::{ApiError, ErrorCode};
use crate::surface::chat;

/// The error code of a response, for the request log.
#[derive(Clone, Copy)]
pub struct Code(pub &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = chat::error_body(&self);
        let status = self.status();
        render(self, status, body)
    }
}

/// The response of `e` with `status` and `body` (a surface's rendering of it). Every 429
/// says when to come back (`Retry-After`, 1 s unless the error knows better).
pub(super) fn render(e: ApiError, status: u16, body: Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (status, axum::Json(body)).into_response();
    resp.headers_mut().insert(
        "x-turnstile-error-code",
        HeaderValue::from_static(e.code.as_str()),
    );
    if e.code == ErrorCode::InvalidApiKey {
        resp.headers_mut()
            .insert("www-authenticate", HeaderValue::from_static("Bearer"));
    }
    // A caller without credentials, or over its bounds, does not keep the connection (nor a
    // body it may still be sending, which was never read).
    if matches!(
        e.code,
        ErrorCode::InvalidApiKey | ErrorCode::CapacityExhausted | ErrorCode::RequestTooLarge
    ) {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let retry_after = match status {
        StatusCode::TOO_MANY_REQUESTS => Some(e.retry_after.unwrap_or(1)),
        _ => e.retry_after,
    };
    if let Some(secs) = retry_after {
        resp.headers_mut()
            .insert("retry-after", HeaderValue::from(secs));
    }
    resp.extensions_mut().insert(Code(e.code.as_str()));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limited_carries_retry_after() {
        let mut e = ApiError::new(ErrorCode::RateLimited, "slow down");
        e.retry_after = Some(2);
        let resp = e.into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()["retry-after"], "2");
        // Every 429 says when to come back.
        let resp = ApiError::new(ErrorCode::CapacityExhausted, "busy").into_response();
        assert_eq!(resp.headers()["retry-after"], "1");
    }
}
