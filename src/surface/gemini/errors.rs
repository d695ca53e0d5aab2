//! Google's error envelope: `{"error": {"code", "message", "status", "details"}}`. `code` is
//! the HTTP status and `status` its canonical name (`INVALID_ARGUMENT`, `UNAUTHENTICATED`,
//! `PERMISSION_DENIED`, `NOT_FOUND`, `ABORTED` for a 409, `RESOURCE_EXHAUSTED` for a 429 or a
//! spent budget's 402, ...). The message leads with Turnstile's stable code, which is also the
//! `reason` of an `ErrorInfo` detail (upper case, domain `turnstile.dev`); a refused field is a
//! `BadRequest` field violation, and a wait a `RetryInfo` (`retryDelay`), which Gemini CLI
//! honours. An upstream's own refusal is relayed with its text alone.

use serde_json::{json, Value};

use crate::error::{ApiError, Param};

/// The canonical status name of an HTTP status.
fn status_name(status: u16) -> &'static str {
    match status {
        400 | 413 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        402 | 429 => "RESOURCE_EXHAUSTED",
        403 => "PERMISSION_DENIED",
        404 | 405 => "NOT_FOUND",
        408 | 504 => "DEADLINE_EXCEEDED",
        409 => "ABORTED",
        410 => "FAILED_PRECONDITION",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        502 | 503 => "UNAVAILABLE",
        _ => "INTERNAL",
    }
}

/// The error body, fields named by `field`.
pub fn body(e: &ApiError, field: fn(Param) -> &'static str) -> Value {
    let status = e.status();
    let message = match &e.upstream {
        Some(_) => e.message.clone(),
        None => format!("{}: {}", e.code.as_str(), e.message),
    };
    let mut details = vec![json!({
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": e.code.as_str().to_ascii_uppercase(),
        "domain": "turnstile.dev",
    })];
    if let Some(p) = e.param {
        details.push(json!({
            "@type": "type.googleapis.com/google.rpc.BadRequest",
            "fieldViolations": [{"field": field(p), "description": e.message}],
        }));
    }
    if let Some(secs) = e.retry_after {
        details.push(json!({
            "@type": "type.googleapis.com/google.rpc.RetryInfo",
            "retryDelay": format!("{secs}s"),
        }));
    }
    json!({"error": {"code": status, "message": message, "status": status_name(status),
                     "details": details}})
}
