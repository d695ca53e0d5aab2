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
    let mut ask = crate::backend::agent::approval(kind, summary, &action, responder);
    ask.tool_use = params["itemId"]
        .as_str()
        .map(crate::backend::ToolUseKey::of);
    ask
}

/// A command or file change item that completed (ran, failed or was declined), as the end
/// of the tool use its approval named; other items are not the agent's own tool uses.
pub(super) fn ended(item: &Value) -> Option<crate::backend::ToolEnded> {
    let id = item["id"].as_str()?;
    let ok = item["status"] == "completed";
    let output = match item["type"].as_str()? {
        "commandExecution" => {
            let out = item["aggregatedOutput"].as_str().unwrap_or_default();
            let failed = item["exitCode"].as_i64().is_some_and(|c| c != 0);
            return Some(crate::backend::ToolEnded::new(id, out, !ok || failed));
        }
        "fileChange" => {
            let changes = item["changes"].as_array().into_iter().flatten();
            let paths: Vec<&str> = changes.filter_map(|c| c["path"].as_str()).collect();
            paths.join("\n")
        }
        _ => return None,
    };
    Some(crate::backend::ToolEnded::new(id, &output, !ok))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ToolEnded;

    #[test]
    fn a_completed_command_or_file_change_ends_its_use() {
        let ran = json!({"type": "commandExecution", "id": "c1", "status": "completed",
            "exitCode": 0, "aggregatedOutput": "ok\n"});
        assert_eq!(ended(&ran), Some(ToolEnded::new("c1", "ok\n", false)));
        let exit =
            json!({"type": "commandExecution", "id": "c2", "status": "completed", "exitCode": 2});
        assert_eq!(ended(&exit), Some(ToolEnded::new("c2", "", true)));
        let declined = json!({"type": "fileChange", "id": "f1", "status": "declined",
            "changes": [{"path": "/w/a"}, {"path": "/w/b"}]});
        assert_eq!(
            ended(&declined),
            Some(ToolEnded::new("f1", "/w/a\n/w/b", true))
        );
        assert_eq!(ended(&json!({"type": "agentMessage", "id": "m"})), None);
    }

    #[test]
    fn an_output_is_cut_on_a_character_boundary() {
        let long = "é".repeat(ToolEnded::MAX_OUTPUT);
        let t = ToolEnded::new("c", &long, false);
        assert!(
            t.output.len() <= ToolEnded::MAX_OUTPUT && t.output.len() >= ToolEnded::MAX_OUTPUT - 1
        );
        assert!(t.output.chars().all(|c| c == 'é'));
    }
}
