//! What every agent kind does with a turn the same way: what it refuses ([`validate`]), the
//! client's tools as its MCP server declares them ([`mcp_tools`]), and how the client's
//! answers continue a live turn ([`answer`]).

use serde_json::Value;

use crate::backend::{BackendError, Hold, Resume, Turn};
use crate::error::Param;
use crate::turn::{ToolChoice, ToolDef, TurnInput};

use super::render;

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

/// Whether an agent kind can give its answer in a JSON schema the client asked for.
#[derive(Debug, Clone, Copy)]
pub enum Structured {
    /// A turn takes a schema for its final answer (Codex's `outputSchema`).
    Schema,
    /// It cannot: why, for the 400.
    Refused(&'static str),
}

/// What every agent kind refuses: an agent cannot be forced to call a tool (`kind` names it
/// in the 400), takes only well-formed function tools, gives a schema'd answer only where
/// `structured` says so, and needs a user message as the turn's input.
pub fn validate(
    input: &TurnInput,
    kind: &'static str,
    structured: Structured,
) -> Result<(), BackendError> {
    match input.tool_choice {
        ToolChoice::Auto | ToolChoice::None => {}
        ToolChoice::Required | ToolChoice::Named(_) => {
            return Err(BackendError::UnsupportedToolChoice { kind })
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
    if let Some(format) = &input.sampling.response_format {
        match structured {
            Structured::Refused(why) => return Err(BackendError::UnsupportedResponseFormat(why)),
            Structured::Schema if output_schema(format).is_none() => {
                return Err(BackendError::UnsupportedResponseFormat(
                    "This model's agent takes a JSON schema for its answer, not JSON mode \
                     without one: give a `json_schema` format with its `schema`.",
                ))
            }
            Structured::Schema => {}
        }
    }
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

/// The JSON schema of a structured-output request (the Chat Completions shape of
/// `Sampling::response_format`), if it has one.
pub fn output_schema(format: &Value) -> Option<&Value> {
    let schema = &format["json_schema"]["schema"];
    (format["type"] == "json_schema" && schema.is_object()).then_some(schema)
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input(v: Value) -> TurnInput {
        let t = tokio::time::Instant::now();
        crate::surface::chat::parse(v.to_string().into(), t)
            .unwrap()
            .0
    }

    #[test]
    fn a_forced_choice_is_refused_naming_the_kind_and_a_schema_only_where_taken() {
        let forced = input(
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}),
        );
        let e = validate(&forced, "acp", Structured::Schema).unwrap_err();
        assert_eq!(e, BackendError::UnsupportedToolChoice { kind: "acp" });
        let format = |f: Value| {
            input(
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                         "response_format": f}),
            )
        };
        let schema = format(json!({"type": "json_schema", "json_schema": {"name": "a",
            "schema": {"type": "object"}}}));
        assert!(validate(&schema, "app-server", Structured::Schema).is_ok());
        let refused = validate(&schema, "acp", Structured::Refused("no"));
        assert_eq!(refused, Err(BackendError::UnsupportedResponseFormat("no")));
        let mode = format(json!({"type": "json_object"}));
        let e = validate(&mode, "app-server", Structured::Schema).unwrap_err();
        assert!(matches!(e, BackendError::UnsupportedResponseFormat(_)));
        // Plain text is no request for structure.
        let text = format(json!({"type": "text"}));
        assert!(validate(&text, "acp", Structured::Refused("no")).is_ok());
    }
}
