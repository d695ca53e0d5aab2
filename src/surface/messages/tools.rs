//! The request's tools and `tool_choice`: the client's tools (typed ones are Anthropic's
//! server tools, never declared to a backend), and the choice in neutral and canonical form.

use serde_json::{json, Value};
use std::sync::LazyLock;

use crate::continuation::canonical::digest;
use crate::error::{ApiError, ErrorCode};
use crate::turn::{ToolChoice, ToolDef};

/// A client-owned tool: no `type`, or `"custom"`.
pub(super) fn is_custom(tool: &Value) -> bool {
    matches!(tool.get("type"), None | Some(Value::Null)) || tool["type"] == "custom"
}

pub(super) fn without_cache_control(tool: &Value) -> Value {
    let mut t = tool.clone();
    if let Some(o) = t.as_object_mut() {
        o.remove("cache_control");
    }
    t
}

/// The client-owned tools, or why they cannot be read.
pub(super) fn tools(tools: &[Value]) -> Result<Vec<ToolDef>, String> {
    let mut out: Vec<ToolDef> = Vec::new();
    for t in tools.iter().filter(|t| is_custom(t)) {
        let name = t["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or("each tool needs a `name`")?;
        if out.iter().any(|d| d.name == name) {
            return Err(format!("duplicate tool name `{name}`"));
        }
        out.push(ToolDef {
            name: name.to_string(),
            description: t["description"].as_str().unwrap_or_default().to_string(),
            parameters: t
                .get("input_schema")
                .filter(|s| s.is_object())
                .cloned()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        });
    }
    Ok(out)
}

/// The request's `tool_choice`: neutral, its canonical form for the digest (none when the
/// request has none), and whether it disables parallel tool use.
pub(super) struct Choice {
    pub neutral: ToolChoice,
    canonical: Option<Value>,
    pub disable_parallel: bool,
}

impl Choice {
    pub fn read(v: Option<&Value>, tools: &[Value]) -> Result<Choice, ApiError> {
        let Some(o) = v.filter(|v| !v.is_null()) else {
            return Ok(Choice {
                neutral: ToolChoice::Auto,
                canonical: None,
                disable_parallel: false,
            });
        };
        let disable_parallel = o["disable_parallel_tool_use"].as_bool().unwrap_or(false);
        let name = o["name"].as_str().unwrap_or_default();
        let neutral = match o["type"].as_str() {
            Some("auto") => ToolChoice::Auto,
            Some("any") => ToolChoice::Required,
            Some("none") => ToolChoice::None,
            Some("tool") => {
                let server = tools.iter().find(|t| t["name"] == name && !is_custom(t));
                if let Some(t) = server {
                    return Err(ApiError::new(
                        ErrorCode::UnsupportedToolChoice,
                        format!(
                            "`tool_choice` forces the server tool `{name}` ({}), which this gateway does not run.",
                            t["type"].as_str().unwrap_or("typed")
                        ),
                    )
                    .with_param("tool_choice"));
                }
                ToolChoice::Named(name.to_string())
            }
            _ => ToolChoice::Invalid,
        };
        let mut canonical =
            json!({"type": o["type"], "disable_parallel_tool_use": disable_parallel});
        if matches!(neutral, ToolChoice::Named(_)) {
            canonical["name"] = json!(name);
        }
        Ok(Choice {
            neutral,
            canonical: Some(canonical),
            disable_parallel,
        })
    }

    /// The digest of this choice with `output_config.effort` (a plain request's, with
    /// neither, computed once).
    pub fn digest(&self, effort: Option<&Value>) -> [u8; 32] {
        fn of(effort: Value, choice: Option<&Value>) -> [u8; 32] {
            let auto = || json!({"type": "auto", "disable_parallel_tool_use": false});
            let choice = choice.cloned().unwrap_or_else(auto);
            digest(&json!({"effort": effort, "tool_choice": choice}))
        }
        match (effort.filter(|e| !e.is_null()), &self.canonical) {
            (None, None) => {
                static PLAIN: LazyLock<[u8; 32]> = LazyLock::new(|| of(Value::Null, None));
                *PLAIN
            }
            (effort, choice) => of(effort.cloned().unwrap_or_default(), choice.as_ref()),
        }
    }
}
