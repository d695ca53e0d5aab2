//! How an [`ApiError`] becomes a response: the status it decides, the OpenAI-shaped body (the
//! chat surface's, which every non-surface route shares), `WWW-Authenticate` on 401 and
//! `Retry-After` on 429. The code goes into the response's extensions so the request log line
//! names it once, at the boundary.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ErrorCode};
use crate::surface::chat::error_body;

/// The error code of a response, for the request log.
#[derive(Clone, Copy)]
pub struct Code(pub &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, axum::Json(error_body(&self))).into_response();
        if self.code == ErrorCode::InvalidApiKey {
            resp.headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
        }
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from(secs));
        }
        resp.extensions_mut().insert(Code(self.code.as_str()));
        resp
    }
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
    }
}
