//! What Anthropic's clients read from a response's status and headers, per Anthropic's Claude
//! Code gateway protocol (`docs/src/conformance.md`): a budget refusal is 429 `billing_error`
//! with the blocked-request headers, a model the caller may not use is 400, a refusal no
//! retry can change says `x-should-retry: false`, and a successful answer of a capped caller
//! carries its standing in the `anthropic-ratelimit-unified-*` headers (Claude Code shows
//! "You've used NN%" past 75% and 95%).

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::budget::Cap;
use crate::engine::Standing;
use crate::error::{ApiError, ErrorCode};

/// The status of an error on the Messages routes.
pub fn status(e: &ApiError) -> u16 {
    match e.code {
        ErrorCode::BudgetExceeded => 429,
        // A denied model and an unknown one are one answer (another principal's model is
        // indistinguishable from none).
        ErrorCode::ModelNotFound => 400,
        _ => e.status(),
    }
}

/// The Anthropic error type of an error answered with `status`.
pub fn error_type(e: &ApiError, status: u16) -> &'static str {
    if e.code == ErrorCode::BudgetExceeded {
        return "billing_error";
    }
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// `x-should-retry: false` where a retry cannot succeed (a bad credential, a settled or
/// conflicting continuation, a reached cap); a budget refusal also says which cap, until
/// when, in the blocked-request headers (`representative-claim` and `overage-status` left
/// off, so the client prints the message as it is).
pub fn on_error(e: &ApiError, h: &mut HeaderMap) {
    let futile = e.code == ErrorCode::BudgetExceeded || matches!(e.status(), 401 | 409 | 410);
    if futile {
        h.insert("x-should-retry", HeaderValue::from_static("false"));
    }
    let Some(exceeded) = e.exceeded.filter(|_| e.code == ErrorCode::BudgetExceeded) else {
        return;
    };
    put(h, "anthropic-ratelimit-unified-status", "rejected");
    if let Some(at) = exceeded.resets_at {
        put(h, "anthropic-ratelimit-unified-reset", &at.to_string());
        put(
            h,
            "anthropic-ratelimit-unified-overage-reset",
            &at.to_string(),
        );
        put(
            h,
            "anthropic-ratelimit-unified-overage-period",
            period(exceeded.cap),
        );
    }
    put(h, "anthropic-ratelimit-unified-overage-utilization", "1");
    put(
        h,
        "anthropic-ratelimit-unified-overage-surpassed-threshold",
        "1",
    );
    put(
        h,
        "anthropic-ratelimit-unified-overage-disabled-reason",
        "org_spend_cap_reached",
    );
}

/// The standing of a capped caller on a successful answer: `allowed`, or
/// `allowed_warning` past 75%, with the threshold passed; utilization kept below 1 while
/// requests are still allowed.
pub fn on_answer(s: &Standing, h: &mut HeaderMap) {
    let used = (s.fraction * 100.0).floor() / 100.0;
    let used = used.clamp(0.0, 0.99);
    let threshold = [0.95, 0.75].into_iter().find(|t| s.fraction >= *t);
    let status = match threshold {
        Some(_) => "allowed_warning",
        None => "allowed",
    };
    let reset = s.resets_at.to_string();
    put(h, "anthropic-ratelimit-unified-status", status);
    put(
        h,
        "anthropic-ratelimit-unified-representative-claim",
        "overage",
    );
    put(h, "anthropic-ratelimit-unified-overage-status", status);
    put(
        h,
        "anthropic-ratelimit-unified-overage-utilization",
        &format!("{used:.2}"),
    );
    if let Some(t) = threshold {
        put(
            h,
            "anthropic-ratelimit-unified-overage-surpassed-threshold",
            &format!("{t:.2}"),
        );
    }
    put(h, "anthropic-ratelimit-unified-reset", &reset);
    put(h, "anthropic-ratelimit-unified-overage-reset", &reset);
}

/// The protocol's name of a cap's window.
fn period(cap: Cap) -> &'static str {
    match cap {
        Cap::UsdPerMonth => "monthly",
        _ => "daily",
    }
}

fn put(h: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(HeaderName::from_static(name), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Exceeded;

    fn standing(fraction: f64) -> HeaderMap {
        let mut h = HeaderMap::new();
        let s = Standing {
            cap: Cap::UsdPerDay,
            fraction,
            resets_at: 1_786_147_200,
        };
        on_answer(&s, &mut h);
        h
    }

    #[test]
    fn a_standing_warns_past_75_and_95_percent_and_stays_below_one() {
        let h = standing(0.5);
        assert_eq!(h["anthropic-ratelimit-unified-status"], "allowed");
        assert_eq!(h["anthropic-ratelimit-unified-overage-utilization"], "0.50");
        assert!(h
            .get("anthropic-ratelimit-unified-overage-surpassed-threshold")
            .is_none());
        assert_eq!(
            h["anthropic-ratelimit-unified-representative-claim"],
            "overage"
        );
        assert_eq!(h["anthropic-ratelimit-unified-reset"], "1786147200");
        let h = standing(0.82);
        assert_eq!(h["anthropic-ratelimit-unified-status"], "allowed_warning");
        assert_eq!(
            h["anthropic-ratelimit-unified-overage-status"],
            "allowed_warning"
        );
        assert_eq!(h["anthropic-ratelimit-unified-overage-utilization"], "0.82");
        assert_eq!(
            h["anthropic-ratelimit-unified-overage-surpassed-threshold"],
            "0.75"
        );
        let h = standing(0.999);
        assert_eq!(h["anthropic-ratelimit-unified-overage-utilization"], "0.99");
        assert_eq!(
            h["anthropic-ratelimit-unified-overage-surpassed-threshold"],
            "0.95"
        );
    }

    #[test]
    fn a_budget_refusal_is_a_billing_error_with_the_blocked_headers() {
        let mut e = ApiError::new(ErrorCode::BudgetExceeded, "spent");
        e.exceeded = Some(Exceeded {
            cap: Cap::UsdPerMonth,
            limit: 1,
            resets_at: Some(1_786_147_200),
        });
        assert_eq!(status(&e), 429);
        assert_eq!(error_type(&e, 429), "billing_error");
        let mut h = HeaderMap::new();
        on_error(&e, &mut h);
        assert_eq!(h["x-should-retry"], "false");
        assert_eq!(h["anthropic-ratelimit-unified-status"], "rejected");
        assert_eq!(h["anthropic-ratelimit-unified-overage-period"], "monthly");
        assert_eq!(h["anthropic-ratelimit-unified-overage-reset"], "1786147200");
        assert_eq!(h["anthropic-ratelimit-unified-overage-utilization"], "1");
        assert_eq!(
            h["anthropic-ratelimit-unified-overage-disabled-reason"],
            "org_spend_cap_reached"
        );
        assert!(h
            .get("anthropic-ratelimit-unified-representative-claim")
            .is_none());
        assert!(h
            .get("anthropic-ratelimit-unified-overage-status")
            .is_none());
    }

    #[test]
    fn a_denied_model_is_400_and_a_bad_key_is_not_retried() {
        let e = ApiError::model_not_found("m");
        assert_eq!(
            (status(&e), error_type(&e, 400)),
            (400, "invalid_request_error")
        );
        let revoked = ApiError::new(ErrorCode::UnauthorizedTarget, "revoked");
        assert_eq!(error_type(&revoked, status(&revoked)), "permission_error");
        let big = ApiError::too_large(1);
        assert_eq!(error_type(&big, status(&big)), "request_too_large");
        let busy = ApiError::new(ErrorCode::StoreUnavailable, "busy");
        assert_eq!(error_type(&busy, status(&busy)), "api_error");
        let mut h = HeaderMap::new();
        on_error(&ApiError::unauthenticated(), &mut h);
        assert_eq!(h["x-should-retry"], "false");
        let mut h = HeaderMap::new();
        on_error(&ApiError::new(ErrorCode::RateLimited, "slow"), &mut h);
        assert!(h.get("x-should-retry").is_none());
    }
}
