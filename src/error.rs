//! The one place that decides HTTP statuses. Every rejection the gateway makes is an
//! [`ApiError`] carrying a stable [`ErrorCode`]; `ErrorCode::status` is exhaustive, so a new code
//! forces a status decision. Domain modules convert their own errors into `ApiError`.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Stable snake_case codes from the product spec's error table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidApiKey,
    ModelNotFound,
    InvalidRequest,
    UnsupportedToolChoice,
    RequestTooLarge,
    ContinuationNotFound,
    ContinuationAlreadyResolved,
    ContinuationMismatch,
    ContinuationExpired,
    ContinuationLost,
    UnauthorizedTarget,
    CapacityExhausted,
    RateLimited,
    UpstreamError,
    UpstreamTimeout,
    ApprovalNotFound,
    ApprovalAlreadyDecided,
    NotFound,
    MethodNotAllowed,
    Internal,
    /// An upstream's own 4xx, relayed with its status (kept in `ApiError::upstream_status`).
    UpstreamRejected,
}

impl ErrorCode {
    pub fn status(self) -> StatusCode {
        use ErrorCode::*;
        match self {
            InvalidApiKey => StatusCode::UNAUTHORIZED,
            ModelNotFound | ContinuationNotFound | ApprovalNotFound | NotFound => {
                StatusCode::NOT_FOUND
            }
            InvalidRequest | UnsupportedToolChoice | ContinuationMismatch => {
                StatusCode::BAD_REQUEST
            }
            RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ContinuationAlreadyResolved | ApprovalAlreadyDecided => StatusCode::CONFLICT,
            ContinuationExpired | ContinuationLost => StatusCode::GONE,
            UnauthorizedTarget => StatusCode::FORBIDDEN,
            CapacityExhausted | RateLimited => StatusCode::TOO_MANY_REQUESTS,
            UpstreamError => StatusCode::BAD_GATEWAY,
            UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Internal => StatusCode::INTERNAL_SERVER_ERROR,
            UpstreamRejected => StatusCode::BAD_REQUEST,
        }
    }

    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            InvalidApiKey => "invalid_api_key",
            ModelNotFound => "model_not_found",
            InvalidRequest => "invalid_request",
            UnsupportedToolChoice => "unsupported_tool_choice",
            RequestTooLarge => "request_too_large",
            ContinuationNotFound => "continuation_not_found",
            ContinuationAlreadyResolved => "continuation_already_resolved",
            ContinuationMismatch => "continuation_mismatch",
            ContinuationExpired => "continuation_expired",
            ContinuationLost => "continuation_lost",
            UnauthorizedTarget => "unauthorized_target",
            CapacityExhausted => "capacity_exhausted",
            RateLimited => "rate_limited",
            UpstreamError => "upstream_error",
            UpstreamTimeout => "upstream_timeout",
            ApprovalNotFound => "approval_not_found",
            ApprovalAlreadyDecided => "approval_already_decided",
            NotFound => "not_found",
            MethodNotAllowed => "method_not_allowed",
            Internal => "internal_error",
            UpstreamRejected => "upstream_rejected",
        }
    }

    /// The OpenAI `type` field that SDKs read.
    fn kind(self) -> &'static str {
        use ErrorCode::*;
        match self {
            InvalidApiKey => "authentication_error",
            UnauthorizedTarget => "permission_error",
            ModelNotFound | ContinuationNotFound | ApprovalNotFound | NotFound => "not_found_error",
            CapacityExhausted | RateLimited => "rate_limit_error",
            UpstreamError | UpstreamTimeout | Internal => "server_error",
            _ => "invalid_request_error",
        }
    }
}

/// An error on its way to a client, in the OpenAI shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub param: Option<&'static str>,
    /// For `UpstreamRejected`: the upstream's status, type, code and param, relayed as is.
    pub upstream: Option<Box<UpstreamDetail>>,
    /// For `RateLimited`: whole seconds for the `Retry-After` header.
    pub retry_after: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamDetail {
    pub status: u16,
    pub kind: Option<String>,
    pub code: Option<String>,
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            param: None,
            upstream: None,
            retry_after: None,
        }
    }

    /// 429 `rate_limited`: a per-client limit refused a fresh turn; retry after `seconds`.
    pub fn rate_limited(limit: &str, seconds: u64) -> Self {
        let mut e = Self::new(
            ErrorCode::RateLimited,
            format!("Rate limit reached ({limit}); retry after {seconds} s."),
        );
        e.retry_after = Some(seconds);
        e
    }

    /// An upstream's 4xx: its status and message are kept (never its URL or credentials).
    pub fn upstream_client_error(
        status: u16,
        message: &str,
        kind: Option<&str>,
        code: Option<&str>,
        param: Option<&str>,
    ) -> Self {
        let mut e = Self::new(ErrorCode::UpstreamRejected, message);
        e.upstream = Some(Box::new(UpstreamDetail {
            status,
            kind: kind.map(str::to_owned),
            code: code.map(str::to_owned),
            param: param.map(str::to_owned),
        }));
        e
    }

    pub fn status(&self) -> StatusCode {
        self.upstream
            .as_ref()
            .and_then(|u| StatusCode::from_u16(u.status).ok())
            .unwrap_or_else(|| self.code.status())
    }

    pub fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    pub fn unauthenticated() -> Self {
        Self::new(
            ErrorCode::InvalidApiKey,
            "Missing or invalid credentials. Send `Authorization: Bearer <key>`.",
        )
    }

    pub fn model_not_found(model: &str) -> Self {
        // The model name is the caller's own input; echoing it tells nothing about others.
        Self::new(
            ErrorCode::ModelNotFound,
            format!("The model `{model}` does not exist or you do not have access to it."),
        )
        .with_param("model")
    }

    pub fn upstream() -> Self {
        Self::new(
            ErrorCode::UpstreamError,
            "The backend failed to complete the turn.",
        )
    }

    /// The JSON body, also used as the payload of a mid-stream SSE error event.
    pub fn body(&self) -> serde_json::Value {
        if let Some(u) = &self.upstream {
            return json!({"error": {
                "message": self.message,
                "type": u.kind.as_deref().unwrap_or("invalid_request_error"),
                "code": u.code.as_deref().unwrap_or(self.code.as_str()),
                "param": u.param,
            }});
        }
        json!({"error": {
            "message": self.message,
            "type": self.code.kind(),
            "code": self.code.as_str(),
            "param": self.param,
        }})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut resp = (status, axum::Json(self.body())).into_response();
        if self.code == ErrorCode::InvalidApiKey {
            resp.headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
        }
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from(secs));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::new(ErrorCode::ContinuationMismatch, "drift");
        let b = e.body();
        assert_eq!(b["error"]["code"], "continuation_mismatch");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["message"], "drift");
        assert!(b["error"]["param"].is_null());
        assert_eq!(e.code.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn rate_limited_carries_retry_after() {
        let e = ApiError::rate_limited("requests_per_minute", 2);
        assert_eq!(e.body()["error"]["code"], "rate_limited");
        assert_eq!(e.body()["error"]["type"], "rate_limit_error");
        let resp = e.into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()["retry-after"], "2");
    }
}
