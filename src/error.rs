//! Stable error codes and the one place that decides their statuses. Every rejection the
//! gateway makes ends as an [`ApiError`] carrying an [`ErrorCode`]; `ErrorCode::status` and
//! `ErrorCode::kind` are exhaustive, so a new code forces both decisions. Domain modules return
//! their own error enums (`engine::EngineError` and the enums inside it); the `From` impls at
//! the bottom of `engine/error.rs` are the only place that picks a code and a message for them.
//! This module knows no web framework and no wire format: each surface renders an `ApiError`
//! in its own body shape (`surface::chat` in OpenAI's).

/// Stable snake_case codes (the error table in `docs/src/http.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidApiKey,
    ModelNotFound,
    InvalidRequest,
    UnsupportedToolChoice,
    /// A structured-output request (a JSON schema) the model's backend cannot honour.
    UnsupportedResponseFormat,
    RequestTooLarge,
    RequestTimeout,
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
    StoreUnavailable,
    ShuttingDown,
    /// The replica that holds a turn did not answer a forwarded continuation.
    ReplicaUnavailable,
    ApprovalNotFound,
    ApprovalAlreadyDecided,
    NotFound,
    MethodNotAllowed,
    Internal,
    /// An upstream's own 4xx, relayed with its status (kept in `ApiError::upstream`).
    UpstreamRejected,
    /// A budget cap of the principal is reached.
    BudgetExceeded,
    /// The execution was stopped at its per-execution spend cap.
    ExecutionBudgetExceeded,
}

impl ErrorCode {
    /// Every code, in declaration order (the book's table is checked against it).
    pub const ALL: [ErrorCode; 28] = {
        use ErrorCode::*;
        [
            InvalidApiKey,
            ModelNotFound,
            InvalidRequest,
            UnsupportedToolChoice,
            UnsupportedResponseFormat,
            RequestTooLarge,
            RequestTimeout,
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
            StoreUnavailable,
            ShuttingDown,
            ReplicaUnavailable,
            ApprovalNotFound,
            ApprovalAlreadyDecided,
            NotFound,
            MethodNotAllowed,
            Internal,
            UpstreamRejected,
            BudgetExceeded,
            ExecutionBudgetExceeded,
        ]
    };

    /// The HTTP status. `UpstreamRejected` answers the upstream's own status
    /// ([`ApiError::status`]); 400 is its fallback when that status is not a 4xx.
    pub fn status(self) -> u16 {
        use ErrorCode::*;
        match self {
            InvalidApiKey => 401,
            ModelNotFound | ContinuationNotFound | ApprovalNotFound | NotFound => 404,
            InvalidRequest
            | UnsupportedToolChoice
            | UnsupportedResponseFormat
            | ContinuationMismatch => 400,
            RequestTooLarge => 413,
            RequestTimeout => 408,
            ContinuationAlreadyResolved | ApprovalAlreadyDecided => 409,
            ContinuationExpired | ContinuationLost | ExecutionBudgetExceeded => 410,
            BudgetExceeded => 402,
            UnauthorizedTarget => 403,
            CapacityExhausted | RateLimited => 429,
            UpstreamError => 502,
            UpstreamTimeout => 504,
            StoreUnavailable | ShuttingDown | ReplicaUnavailable => 503,
            MethodNotAllowed => 405,
            Internal => 500,
            UpstreamRejected => 400,
        }
    }

    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            InvalidApiKey => "invalid_api_key",
            ModelNotFound => "model_not_found",
            InvalidRequest => "invalid_request",
            UnsupportedToolChoice => "unsupported_tool_choice",
            UnsupportedResponseFormat => "unsupported_response_format",
            RequestTooLarge => "request_too_large",
            RequestTimeout => "request_timeout",
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
            StoreUnavailable => "store_unavailable",
            ShuttingDown => "shutting_down",
            ReplicaUnavailable => "replica_unavailable",
            ApprovalNotFound => "approval_not_found",
            ApprovalAlreadyDecided => "approval_already_decided",
            NotFound => "not_found",
            MethodNotAllowed => "method_not_allowed",
            Internal => "internal_error",
            UpstreamRejected => "upstream_rejected",
            BudgetExceeded => "budget_exceeded",
            ExecutionBudgetExceeded => "execution_budget_exceeded",
        }
    }

    /// The class of the error in OpenAI's vocabulary (the `type` field SDKs read). Other
    /// surfaces translate it into their own (`surface::messages` later).
    pub fn kind(self) -> &'static str {
        use ErrorCode::*;
        match self {
            InvalidApiKey => "authentication_error",
            UnauthorizedTarget => "permission_error",
            ModelNotFound | ContinuationNotFound | ApprovalNotFound | NotFound => "not_found_error",
            CapacityExhausted | RateLimited => "rate_limit_error",
            BudgetExceeded => "insufficient_quota",
            UpstreamError | UpstreamTimeout | StoreUnavailable | ShuttingDown
            | ReplicaUnavailable | Internal => "server_error",
            InvalidRequest
            | UnsupportedToolChoice
            | UnsupportedResponseFormat
            | RequestTooLarge
            | RequestTimeout
            | ContinuationAlreadyResolved
            | ContinuationMismatch
            | ContinuationExpired
            | ContinuationLost
            | ExecutionBudgetExceeded
            | ApprovalAlreadyDecided
            | MethodNotAllowed
            | UpstreamRejected => "invalid_request_error",
        }
    }
}

/// An error on its way to a client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub param: Option<Param>,
    /// For `UpstreamRejected`: the upstream's status, type, code and param, relayed as is.
    pub upstream: Option<Box<UpstreamDetail>>,
    /// For `RateLimited` and `BudgetExceeded`: whole seconds for the `Retry-After` header.
    pub retry_after: Option<u64>,
    /// For `BudgetExceeded`: the cap reached (a surface may describe it in headers).
    pub exceeded: Option<crate::budget::Exceeded>,
    /// Extra top-level body members (the settled approval of a 409).
    pub extra: Option<Box<(&'static str, serde_json::Value)>>,
}

/// The request field an error points at. The neutral ones are named by each surface in its
/// own wire (`Surface::field`): the conversation is Chat's `messages` and Responses' `input`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// The conversation as sent.
    Conversation,
    Tools,
    ToolChoice,
    /// The structured-output request (a JSON schema for the answer).
    ResponseFormat,
    Model,
    /// The requested reasoning effort.
    Effort,
    /// A field of one surface's wire, named as that surface names it.
    Field(&'static str),
}

impl From<&'static str> for Param {
    fn from(name: &'static str) -> Param {
        Param::Field(name)
    }
}

/// An upstream's own rejection, relayed to the client as it was.
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
            exceeded: None,
            extra: None,
        }
    }

    pub fn status(&self) -> u16 {
        match &self.upstream {
            Some(u) if (400..500).contains(&u.status) => u.status,
            _ => self.code.status(),
        }
    }

    pub fn with_param(mut self, param: impl Into<Param>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn with_extra(mut self, key: &'static str, value: serde_json::Value) -> Self {
        self.extra = Some(Box::new((key, value)));
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
        .with_param(Param::Model)
    }

    pub fn upstream() -> Self {
        Self::new(
            ErrorCode::UpstreamError,
            "The backend failed to complete the turn.",
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            ErrorCode::RequestTooLarge,
            format!("The request body exceeds {limit} bytes."),
        )
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes_follow_the_source() {
        assert_eq!(ErrorCode::StoreUnavailable.status(), 503);
        assert_eq!(ErrorCode::ShuttingDown.status(), 503);
        assert_eq!(ErrorCode::ContinuationMismatch.status(), 400);
        assert_eq!(
            ErrorCode::ContinuationMismatch.kind(),
            "invalid_request_error"
        );
        let mut e = ApiError::new(ErrorCode::UpstreamRejected, "context too long");
        e.upstream = Some(Box::new(UpstreamDetail {
            status: 422,
            kind: None,
            code: None,
            param: None,
        }));
        assert_eq!(e.status(), 422);
    }
}
