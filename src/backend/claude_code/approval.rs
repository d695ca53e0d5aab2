//! A built-in about to run, as an approval ask: Claude Code asks through the PreToolUse hook
//! (every use of an enabled built-in, even one it would let run) or `can_use_tool`, and the
//! model's approval policy answers in the shape of the request.

use serde_json::{json, Value};

use super::control;
use crate::backend::{ApprovalAsk, ApprovalKind};

/// The approval ask for a built-in about to run: a redacted summary for the approver (`Bash`
/// is a command, the file tools a file change, anything else permissions), the digest of the
/// tool and its input, and a responder that hands the decision and the decider's reason to
/// `reply` (which answers the request the CLI sent).
pub(super) fn ask(
    (cwd, use_id): (&str, &str),
    tool: &str,
    input: &Value,
    reply: impl FnOnce((bool, Option<String>)) + Send + 'static,
) -> ApprovalAsk {
    let kind = match tool {
        "Bash" => ApprovalKind::Command,
        "Edit" | "Write" | "MultiEdit" | "NotebookEdit" => ApprovalKind::FileChange,
        _ => ApprovalKind::Permissions,
    };
    let summary = match kind {
        ApprovalKind::Command => json!({"command": input["command"], "cwd": cwd,
                                       "backend_reason": input["description"]}),
        ApprovalKind::FileChange => json!({"tool": tool,
            "path": input.get("file_path").or(input.get("notebook_path")),
            "backend_reason": Value::Null}),
        _ => json!({"tool": tool, "input": input, "backend_reason": Value::Null}),
    };
    let action = json!({"tool": tool, "input": input});
    let responder = crate::backend::ApprovalResponder::with_reason(move |a, r| reply((a, r)));
    let mut ask = crate::backend::agent::approval(kind, summary, &action, responder);
    ask.tool_use = (!use_id.is_empty()).then(|| crate::backend::ToolUseKey::of(use_id));
    ask
}

/// Which request a policy decision answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    Hook,
    CanUse,
}

/// What the model hears of a decline without a reason.
const DECLINED: &str = "declined by the gateway's policy";

impl Answer {
    /// The answer to request `id`; a decline carries `reason` (the decider's) to the model.
    pub fn write(self, id: &str, allow: bool, input: &Value, reason: Option<&str>) -> String {
        let reason = reason.unwrap_or(DECLINED);
        let response = match (self, allow) {
            // Allowed: no decision, so Claude Code's own checks still run (a `can_use_tool`
            // they raise for this use is then answered at once, nobody is asked twice).
            (Answer::Hook, true) => json!({}),
            (Answer::Hook, false) => json!({"hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": reason,
            }}),
            (Answer::CanUse, true) => json!({"behavior": "allow", "updatedInput": input}),
            (Answer::CanUse, false) => {
                json!({"behavior": "deny", "message": reason})
            }
        };
        control::success(id, response)
    }
}
