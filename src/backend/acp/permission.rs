//! `session/request_permission`: whether it asks about one of the client's own tools (allowed
//! once at once: the client owns them), and otherwise the approval ask the policy answers with
//! one of the agent's own once-options. An "always" option is never chosen.

use std::sync::Weak;

use serde_json::{json, Value};

use super::session::Session;
use crate::backend::{ApprovalAsk, ApprovalKind, ApprovalResponder};

/// The name the bridge's MCP server has in the agent's `session/new`.
pub(super) const SERVER: &str = "t";

/// True when the tool call is one of the client's tools served through the bridge: a call of
/// kind `other` (never a command, edit, delete, move or fetch) that agents name
/// `mcp__<server>__<tool>` (Claude Code, also in the call's `_meta`) or
/// `<tool> (<server> MCP Server)` (Gemini CLI), matched exactly.
pub(super) fn is_bridge_call(tool_call: &Value, names: &[String]) -> bool {
    if !matches!(tool_call["kind"].as_str(), None | Some("other")) {
        return false;
    }
    let title = tool_call["title"].as_str().unwrap_or_default();
    let meta_name = tool_call["_meta"]["claudeCode"]["toolName"].as_str();
    names.iter().any(|n| {
        let prefixed = format!("mcp__{SERVER}__{n}");
        meta_name == Some(prefixed.as_str())
            || title == prefixed
            || title == format!("{n} ({SERVER} MCP Server)")
    })
}

/// The agent's once-option to allow (or reject), if it offers one.
pub(super) fn option(options: &Value, allow: bool) -> Option<String> {
    let kind = if allow { "allow_once" } else { "reject_once" };
    options
        .as_array()?
        .iter()
        .find(|o| o["kind"] == kind)
        .and_then(|o| o["optionId"].as_str())
        .map(str::to_string)
}

/// The response to the permission request `id`: the option chosen, or cancelled when the
/// agent offered no once-option of that side (nothing is allowed by default).
pub(super) fn response(id: &Value, chosen: Option<&str>) -> Value {
    let outcome = match chosen {
        Some(option) => json!({"outcome": "selected", "optionId": option}),
        None => json!({"outcome": "cancelled"}),
    };
    json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": outcome}})
}

/// The approval ask for the agent's own tool call: `execute` is a command (its
/// `rawInput.command`, else its title), `edit`, `delete` and `move` a file change, anything
/// else permissions; the action digest covers the kind, title and input.
pub(super) fn ask(
    session: Weak<Session>,
    cwd: &str,
    id: Value,
    tool_call: &Value,
    options: &Value,
) -> ApprovalAsk {
    let acp_kind = tool_call["kind"].as_str().unwrap_or("other");
    let title = &tool_call["title"];
    let input = &tool_call["rawInput"];
    let kind = match acp_kind {
        "execute" => ApprovalKind::Command,
        "edit" | "delete" | "move" => ApprovalKind::FileChange,
        _ => ApprovalKind::Permissions,
    };
    let summary = match kind {
        ApprovalKind::Command => {
            let command = match &input["command"] {
                Value::Null => title.clone(),
                c => c.clone(),
            };
            json!({"command": command, "cwd": cwd, "backend_reason": input["description"]})
        }
        ApprovalKind::FileChange => json!({"tool": title, "kind": acp_kind,
            "path": tool_call["locations"][0]["path"], "backend_reason": Value::Null}),
        _ => {
            json!({"tool": title, "kind": acp_kind, "input": input, "backend_reason": Value::Null})
        }
    };
    let action_digest = crate::continuation::canonical::digest(
        &json!({"kind": acp_kind, "title": title, "input": input}),
    );
    let (allow, reject) = (option(options, true), option(options, false));
    let responder = ApprovalResponder::new(move |approve| {
        let Some(s) = session.upgrade() else { return };
        // After `session/cancel` a pending request is answered `cancelled` (as ACP asks).
        let chosen = match (s.cancelling(), approve) {
            (true, _) => None,
            (false, true) => allow,
            (false, false) => reject,
        };
        s.write(&response(&id, chosen.as_deref()));
    });
    ApprovalAsk {
        kind,
        summary: crate::backend::agent::redact(summary),
        action_digest,
        responder,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_options_only() {
        let options = json!([
            {"optionId": "a", "kind": "allow_always"},
            {"optionId": "b", "kind": "allow_once"},
            {"optionId": "c", "kind": "reject_once"},
            {"optionId": "d", "kind": "reject_always"},
        ]);
        assert_eq!(option(&options, true).as_deref(), Some("b"));
        assert_eq!(option(&options, false).as_deref(), Some("c"));
        let only_always = json!([{"optionId": "a", "kind": "allow_always"}]);
        assert_eq!(option(&only_always, true), None);
        assert_eq!(
            response(&json!(7), None)["result"]["outcome"],
            json!({"outcome": "cancelled"})
        );
    }

    #[test]
    fn the_clients_tools_are_recognised() {
        let names = vec!["read_file".to_string()];
        let claude = json!({"title": "mcp__t__read_file", "_meta": {"claudeCode": {"toolName": "mcp__t__read_file"}}});
        let gemini = json!({"title": "read_file (t MCP Server)"});
        let other = json!({"title": "mcp__x__read_file"});
        assert!(is_bridge_call(&claude, &names));
        assert!(is_bridge_call(&gemini, &names));
        assert!(!is_bridge_call(&other, &names));
        assert!(!is_bridge_call(&json!({"title": "Bash"}), &names));
        // A command or an edit is never taken for a client tool, whatever its title says.
        let command = json!({"title": "read_file (t MCP Server)", "kind": "execute"});
        assert!(!is_bridge_call(&command, &names));
        let edit = json!({"title": "mcp__t__read_file", "kind": "edit"});
        assert!(!is_bridge_call(&edit, &names));
        let longer = json!({"title": "read_file (t MCP Server); rm -rf ~", "kind": "other"});
        assert!(!is_bridge_call(&longer, &names));
    }
}
