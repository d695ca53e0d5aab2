//! The substrate every agent kind stands on: a child process and its supervision
//! ([`child`]), its output split into bounded lines ([`lines`]), the session permits
//! ([`pool`]), a conversation rendered into an agent's first turn ([`render`]), what every
//! agent refuses ([`validate`]) and approval summaries capped ([`redact`]). A kind
//! (`app_server/`, Codex's JSON-RPC) adds only its protocol: what it writes to the child, what
//! its lines mean, how a turn is held and released.

pub mod bridge;
pub mod child;
pub mod lines;
pub mod pool;
pub mod render;
pub mod sessions;
mod stdin;

use serde_json::Value;

use crate::backend::{BackendError, Hold, Resume, Turn};
use crate::error::Param;
use crate::turn::{ToolChoice, ToolDef, TurnInput};

/// The client's tools as an MCP `tools/list` declares them, each named by `name` and marked
/// read-only (agents such as Claude Code run other MCP calls one at a time, so a parallel
/// batch would never form).
pub fn mcp_tools(tools: &[ToolDef], name: impl Fn(&str) -> String) -> Vec<Value> {
    tools
        .iter()
        .map(|t| {
            let schema = match &t.parameters {
                Value::Object(o) if !o.is_empty() => t.parameters.clone(),
                _ => serde_json::json!({"type": "object", "properties": {}}),
            };
            serde_json::json!({"name": name(&t.name), "description": t.description,
                               "inputSchema": schema, "annotations": {"readOnlyHint": true}})
        })
        .collect()
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

/// What every agent kind refuses: an agent cannot be forced to call a tool, takes only
/// well-formed function tools, and needs a user message as the turn's input.
pub fn validate(input: &TurnInput) -> Result<(), BackendError> {
    match input.tool_choice {
        ToolChoice::Auto | ToolChoice::None => {}
        ToolChoice::Required | ToolChoice::Named(_) => {
            return Err(BackendError::UnsupportedToolChoice)
        }
        ToolChoice::Invalid => {
            return Err(BackendError::Invalid {
                message: "`tool_choice` must be \"auto\", \"none\", \"required\" or a function"
                    .into(),
                param: Param::ToolChoice,
            })
        }
    }
    input.tools.as_ref().map_err(|why| BackendError::Invalid {
        message: why.clone(),
        param: Param::Tools,
    })?;
    if input.client_tool_history {
        // The agent ran those calls itself or never: results for ids it did not issue
        // cannot enter its turn.
        return Err(BackendError::Invalid {
            message: "trailing tool results must answer Turnstile continuation ids (`srct-`) on this model; results for the client's own call ids are accepted only by stateless upstream models".into(),
            param: Param::Conversation,
        });
    }
    render::input_index(&input.messages).map(|_| ())
}

/// Continues a live turn with the client's answers: the text the client sent beside its
/// results is steered in first (best effort: the claim is made, so a refused steer must not
/// lose the answers), then each held call is answered with its result, verbatim.
pub async fn answer(backend: &str, hold: Hold, r: Resume<'_>) -> Result<Turn, BackendError> {
    let Hold::Live { turn, invocations } = hold else {
        return Err(BackendError::Lost);
    };
    let last = r.answers.iter().map(|a| a.message).max().unwrap_or(0);
    let beside: Vec<String> = r.leg.input.messages[last + 1..]
        .iter()
        .filter(|m| m.role == crate::turn::Role::User && !m.text.is_empty())
        .map(|m| m.text.clone())
        .collect();
    if !beside.is_empty() {
        if let Err(e) = turn.control.steer(beside).await {
            tracing::warn!(backend, execution = %r.leg.execution_id, error = %e, "text beside the tool results not delivered");
        }
    }
    for a in &r.answers {
        turn.control
            .answer_tool(invocations[a.call], a.text, !a.failed)?;
    }
    Ok(turn)
}
