//! An agent's side effect as an approval ask, built the same way for every kind.

use serde_json::Value;

use crate::backend::{ApprovalAsk, ApprovalKind, ApprovalResponder};

/// An approval ask for a side effect of `kind`: the summary approvers see (capped by
/// [`redact`]), the digest of `action` (what exactly is approved), and `responder`, which
/// answers the agent with the decision.
pub fn approval(
    kind: ApprovalKind,
    summary: Value,
    action: &Value,
    responder: ApprovalResponder,
) -> ApprovalAsk {
    ApprovalAsk {
        kind,
        summary: redact(summary),
        action_digest: crate::continuation::canonical::digest(action),
        responder,
        tool_use: None,
    }
}

/// Caps every string in an approval summary so that a huge command or message cannot flood
/// the approvals API; the action digest still covers the whole request.
pub fn redact(v: Value) -> Value {
    const MAX: usize = 1000;
    match v {
        Value::String(s) if s.len() > MAX => {
            let mut end = MAX;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            Value::String(format!("{}…", &s[..end]))
        }
        Value::Array(a) => Value::Array(a.into_iter().map(redact).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, redact(v))).collect()),
        other => other,
    }
}
