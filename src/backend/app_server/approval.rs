//! The backend's side-effect requests (command, file change, permissions, elicitation) as
//! approval asks: a redacted summary for the approver, the digest of the action without its
//! ids, and a responder that answers in the shape each method expects.

use std::sync::Arc;

use serde_json::{json, Value};

use super::process::Proc;
use super::rpc;
use crate::backend::{ApprovalAsk, ApprovalKind, ApprovalResponder};

/// Builds the approval event for a backend side-effect request; its responder writes
/// the answer in the shape the method expects.
pub(super) fn ask(proc: &Arc<Proc>, id: Value, method: &str, params: &Value) -> ApprovalAsk {
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
    let action_digest =
        crate::continuation::canonical::digest(&json!({"method": method, "action": action}));
    let granted = params
        .get("permissions")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let proc = Arc::downgrade(proc);
    let responder = ApprovalResponder::new(move |approve| {
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
        if let Some(p) = proc.upgrade() {
            p.send(rpc::response(&id, answer));
        }
    });
    ApprovalAsk {
        kind,
        summary: crate::backend::agent::redact(summary),
        action_digest,
        responder,
    }
}
