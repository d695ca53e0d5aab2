//! The backend's side-effect requests (command, file change, permissions, elicitation) as
//! approval asks: a redacted summary for the approver, the digest of the action without its
//! ids, and a responder that answers in the shape each method expects.

use serde_json::{json, Value};

use crate::backend::{ApprovalAsk, ApprovalKind};

/// Builds the approval event for a backend side-effect request; its responder hands `reply`
/// the answer in the shape the method expects.
pub(super) fn ask(
    method: &str,
    params: &Value,
    reply: impl FnOnce(Value) + Send + 'static,
) -> ApprovalAsk {
    let kind = match method {
        "item/commandExecution/requestApproval" => ApprovalKind::Command,
        "item/fileChange/requestApproval" => ApprovalKind::FileChange,
        "item/permissions/requestApproval" => ApprovalKind::Permissions,
        _ => ApprovalKind::Elicitation,
    };
    let text = |k: &str| params.get(k).cloned().unwrap_or(Value::Null);
    let summary = match kind {
        ApprovalKind::Command => json!({"command": text("command"), "cwd": text("cwd"),
                                       "backend_reason": text("reason")}),
        ApprovalKind::FileChange => {
            json!({"grant_root": text("grantRoot"), "backend_reason": text("reason")})
        }
        ApprovalKind::Permissions => {
            json!({"permissions": text("permissions"), "backend_reason": text("reason")})
        }
        ApprovalKind::Elicitation => {
            json!({"server": text("serverName"), "message": text("message"),
                                           "mode": text("mode")})
        }
    };
    // The action without the backend's ids and timestamps.
    let mut action = params.clone();
    if let Some(o) = action.as_object_mut() {
        for k in ["threadId", "turnId", "itemId", "startedAtMs", "approvalId"] {
            o.remove(k);
        }
    }
    let action = json!({"method": method, "action": action});
    let granted = params
        .get("permissions")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let decided = move |approve| {
        let answer = match (kind, approve) {
            (ApprovalKind::Command | ApprovalKind::FileChange, true) => {
                json!({"decision": "accept"})
            }
            (ApprovalKind::Command | ApprovalKind::FileChange, false) => {
                json!({"decision": "decline"})
            }
            (ApprovalKind::Permissions, true) => {
                json!({"permissions": granted, "scope": "turn"})
            }
            (ApprovalKind::Permissions, false) => json!({"permissions": {}}),
            (ApprovalKind::Elicitation, true) => json!({"action": "accept", "content": null}),
            (ApprovalKind::Elicitation, false) => json!({"action": "decline", "content": null}),
        };
        reply(answer);
    };
    let responder = crate::backend::ApprovalResponder::new(decided);
    crate::backend::agent::approval(kind, summary, &action, responder)
}
