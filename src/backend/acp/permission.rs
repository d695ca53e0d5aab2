//! `session/request_permission`: whether it asks about one of the client's own tools (allowed
//! once at once: the client owns them), and otherwise the approval ask the policy answers with
//! one of the agent's own once-options. An "always" option is never chosen.

use serde_json::{json, Value};

use crate::backend::{ApprovalAsk, ApprovalKind};

/// The name the bridge's MCP server has in the agent's `session/new`.
pub(super) const SERVER: &str = "t";

/// True when the permission request is for one of the client's tools served through the
/// bridge. Told by structure only, never by a title: agents write some titles from the
/// model's own arguments (Gemini CLI's `enter_plan_mode` is titled with the model's `reason`,
/// kind `other`), so a title can name any tool. A client tool's call is of kind `other` (or
/// none: never a command, edit, delete, move or fetch) and the tool it runs is the bridge's
/// own (server [`SERVER`], a declared name), as named by
/// - `_meta.claudeCode.toolName` (Claude's adapter sets it from the `tool_use` name): in the
///   request, or `announced` by the session's `tool_call` update of the same `toolCallId`;
/// - the `toolCallId`'s `<tool>__` prefix: Gemini CLI builds every call id from the registry
///   name of the tool it runs (`mcp_<server>_<tool>__…`), whatever id the model sent.
pub(super) fn is_bridge_call(tool_call: &Value, names: &[String], announced: Option<&str>) -> bool {
    if !matches!(tool_call["kind"].as_str(), None | Some("other")) {
        return false;
    }
    let meta_name = tool_call["_meta"]["claudeCode"]["toolName"]
        .as_str()
        .or(announced);
    let id = tool_call["toolCallId"].as_str().unwrap_or_default();
    names.iter().any(|n| {
        meta_name == Some(format!("mcp__{SERVER}__{n}").as_str())
            || id.starts_with(&format!("mcp_{SERVER}_{}__", gemini_name(n)))
    })
}

/// A tool name as Gemini CLI registers it (`generateValidName`): every character outside
/// `[A-Za-z0-9_.:-]` becomes `_`. (A registry name past 63 characters is shortened there and
/// not recognised here: such a call goes to the policy.)
fn gemini_name(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '.' | ':' | '-' => c,
            _ => '_',
        })
        .collect()
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
/// else permissions; the action digest covers the kind, title and input. The decision
/// reaches `reply` as the option chosen (None: the agent offered no once-option of that side).
pub(super) fn ask(
    cwd: &str,
    tool_call: &Value,
    options: &Value,
    reply: impl FnOnce(Option<String>) + Send + 'static,
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
    let action = json!({"kind": acp_kind, "title": title, "input": input});
    let (allow, reject) = (option(options, true), option(options, false));
    let decided = move |approve| reply(if approve { allow } else { reject });
    let responder = crate::backend::ApprovalResponder::new(decided);
    let mut ask = crate::backend::agent::approval(kind, summary, &action, responder);
    ask.tool_use = tool_call["toolCallId"]
        .as_str()
        .map(crate::backend::ToolUseKey::of);
    ask
}

/// A `tool_call_update` that ends its call (`completed` or `failed`): its text content (a
/// diff is named by its path).
pub(super) fn ended(update: &Value) -> Option<crate::backend::ToolEnded> {
    let failed = match update["status"].as_str()? {
        "completed" => false,
        "failed" => true,
        _ => return None,
    };
    let id = update["toolCallId"].as_str()?;
    let parts = update["content"].as_array().into_iter().flatten();
    let text: Vec<&str> = parts
        .filter_map(|p| match p["type"].as_str() {
            Some("content") => p["content"]["text"].as_str(),
            Some("diff") => p["path"].as_str(),
            _ => None,
        })
        .collect();
    Some(crate::backend::ToolEnded::new(id, &text.join("\n"), failed))
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
    fn the_clients_tools_are_recognised_by_structure_never_by_title() {
        let names = vec!["read_file".to_string(), "web get".to_string()];
        let claude = json!({"toolCallId": "toolu_01", "title": "mcp__t__read_file", "kind": "other",
            "_meta": {"claudeCode": {"toolName": "mcp__t__read_file"}}});
        assert!(is_bridge_call(&claude, &names, None));
        // Claude's adapter names the tool in the `tool_call` update before it asks.
        let asked =
            json!({"toolCallId": "toolu_01", "title": "mcp__t__read_file", "kind": "other"});
        assert!(is_bridge_call(&asked, &names, Some("mcp__t__read_file")));
        assert!(!is_bridge_call(&asked, &names, None), "a title alone");
        assert!(!is_bridge_call(&asked, &names, Some("Skill")));
        let gemini = json!({"toolCallId": "mcp_t_read_file__1765000000000_0",
            "title": "read_file (t MCP Server)", "kind": "other"});
        assert!(is_bridge_call(&gemini, &names, None));
        // Gemini CLI's registry name has invalid characters as `_`.
        let dashed = json!({"toolCallId": "mcp_t_web_get__17_0", "kind": "other"});
        assert!(is_bridge_call(&dashed, &names, None));
        // Gemini CLI's own tool titled with the model's text: its id names the tool it runs.
        let masquerade = json!({"toolCallId": "enter_plan_mode__mcp_t_read_file__1",
            "title": "read_file (t MCP Server)", "kind": "other"});
        assert!(!is_bridge_call(&masquerade, &names, None));
        let other_server = json!({"toolCallId": "mcp_x_read_file__1", "kind": "other"});
        assert!(!is_bridge_call(&other_server, &names, None));
        let undeclared = json!({"toolCallId": "mcp_t_write_file__1", "kind": "other"});
        assert!(!is_bridge_call(&undeclared, &names, None));
        // A command or an edit is never taken for a client tool, whatever names it.
        let command = json!({"toolCallId": "mcp_t_read_file__1", "kind": "execute"});
        assert!(!is_bridge_call(&command, &names, None));
        let edit = json!({"toolCallId": "toolu_2", "kind": "edit",
            "_meta": {"claudeCode": {"toolName": "mcp__t__read_file"}}});
        assert!(!is_bridge_call(&edit, &names, None));
    }

    #[test]
    fn an_update_that_ends_a_call_carries_its_text() {
        let done = json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed",
            "content": [{"type": "content", "content": {"type": "text", "text": "out"}},
                        {"type": "diff", "path": "/w/a.txt", "oldText": "", "newText": "x"}]});
        assert_eq!(
            ended(&done),
            Some(crate::backend::ToolEnded::new("t1", "out\n/w/a.txt", false))
        );
        let failed = json!({"toolCallId": "t2", "status": "failed"});
        assert_eq!(
            ended(&failed),
            Some(crate::backend::ToolEnded::new("t2", "", true))
        );
        assert_eq!(
            ended(&json!({"toolCallId": "t3", "status": "in_progress"})),
            None
        );
    }
}
