//! The Responses surface's tools: `function` tools, `custom` (freeform) tools and `namespace`
//! groups are client-owned; every other type (`web_search`, `file_search`, `mcp`, ...) is a
//! hosted tool the gateway does not run, so it is not declared to the backend.
//!
//! Backends see one flat list of function tools ([`ToolDef`]): a namespaced tool is declared
//! as `{namespace}__{name}` (a numeric suffix if that collides), a custom tool as a function
//! with one string parameter `input`. The [`ToolMap`] restores the client's view of each call
//! on the way out: its name, namespace and kind.

use serde_json::{json, Value};

use crate::error::{ApiError, ErrorCode};
use crate::turn::{ToolChoice, ToolDef};

/// One client-owned tool as the client declared it, and its name towards the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTool {
    pub neutral: String,
    pub name: String,
    pub namespace: Option<String>,
    pub custom: bool,
}

/// The client tools of one request, by their neutral name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolMap {
    tools: Vec<ClientTool>,
}

impl ToolMap {
    /// The neutral name of a call the client sent back (an undeclared tool keeps its
    /// flattened name).
    pub fn neutral(&self, namespace: Option<&str>, name: &str) -> String {
        let namespace = namespace.filter(|n| !n.is_empty());
        self.tools
            .iter()
            .find(|t| t.name == name && t.namespace.as_deref() == namespace)
            .map(|t| t.neutral.clone())
            .unwrap_or_else(|| match namespace {
                Some(ns) => format!("{ns}__{name}"),
                None => name.to_string(),
            })
    }

    /// The client's tool behind a neutral name.
    pub fn client(&self, neutral: &str) -> Option<&ClientTool> {
        self.tools.iter().find(|t| t.neutral == neutral)
    }
}

/// The client tools read from `tools`.
pub struct Tools {
    /// Declared to the backend, or why they cannot be.
    pub defs: Result<Vec<ToolDef>, String>,
    pub map: ToolMap,
}

struct Declared<'a> {
    tool: &'a Value,
    namespace: Option<&'a str>,
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// What a backend needs to call a custom tool well: its description and the grammar of its
/// input, if it has one.
fn custom_description(tool: &Value) -> String {
    let mut d = str_of(tool, "description").unwrap_or_default().to_string();
    let format = &tool["format"];
    if format["type"] == "grammar" {
        if let Some(def) = format["definition"].as_str() {
            let syntax = format["syntax"].as_str().unwrap_or("lark");
            d.push_str(&format!(
                "\n\nPut the raw freeform input in `input`; it must match this {syntax} grammar:\n{def}"
            ));
        }
    } else {
        d.push_str("\n\nPut the raw freeform input in `input`.");
    }
    d
}

/// Reads the tools (none when `tool_choice` is `none`).
pub fn read(tools: Option<&[Value]>, choice_none: bool) -> Tools {
    let mut declared = Vec::new();
    for t in tools.unwrap_or_default() {
        match t["type"].as_str() {
            Some("function" | "custom") => declared.push(Declared {
                tool: t,
                namespace: None,
            }),
            Some("namespace") => {
                let ns = str_of(t, "name");
                for inner in t["tools"].as_array().into_iter().flatten() {
                    declared.push(Declared {
                        tool: inner,
                        namespace: Some(ns.unwrap_or("namespace")),
                    });
                }
            }
            // Hosted tools run at the provider, not at the client: not ours to declare.
            _ => {}
        }
    }
    let mut map = ToolMap::default();
    let mut defs = Vec::new();
    let mut problem = None;
    // Plain names first, so that a flattened name never takes a client's own.
    declared.sort_by_key(|d| d.namespace.is_some());
    for d in &declared {
        let Some(name) = str_of(d.tool, "name") else {
            problem.get_or_insert("each function and custom tool needs a `name`".to_string());
            continue;
        };
        let custom = d.tool["type"] == "custom";
        if map
            .tools
            .iter()
            .any(|t| t.name == name && t.namespace.as_deref() == d.namespace)
        {
            problem.get_or_insert(format!("duplicate tool name `{name}`"));
            continue;
        }
        let mut neutral = match d.namespace {
            Some(ns) => format!("{ns}__{name}"),
            None => name.to_string(),
        };
        let base = neutral.clone();
        let mut n = 1;
        while map.tools.iter().any(|t| t.neutral == neutral) {
            n += 1;
            neutral = format!("{base}_{n}");
        }
        let (description, parameters) = if custom {
            (
                custom_description(d.tool),
                json!({"type": "object", "properties": {"input": {"type": "string"}},
                       "required": ["input"], "additionalProperties": false}),
            )
        } else {
            (
                str_of(d.tool, "description")
                    .unwrap_or_default()
                    .to_string(),
                d.tool
                    .get("parameters")
                    .filter(|p| p.is_object())
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            )
        };
        defs.push(ToolDef {
            name: neutral.clone(),
            description,
            parameters,
        });
        map.tools.push(ClientTool {
            neutral,
            name: name.to_string(),
            namespace: d.namespace.map(str::to_string),
            custom,
        });
    }
    let defs = match problem {
        Some(p) => Err(p),
        None if choice_none => Ok(Vec::new()),
        None => Ok(defs),
    };
    Tools { defs, map }
}

/// The neutral tool choice. A choice that forces a hosted tool is refused: the gateway
/// cannot run it, and ignoring it would silently change the request.
pub fn choice(v: Option<&Value>, map: &ToolMap) -> Result<ToolChoice, ApiError> {
    let named = |o: &Value| {
        let name = o["name"].as_str().unwrap_or_default();
        ToolChoice::Named(map.neutral(o["namespace"].as_str(), name))
    };
    Ok(match v {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => ToolChoice::Invalid,
        },
        Some(o @ Value::Object(_)) => match o["type"].as_str() {
            Some("function" | "custom") => named(o),
            // The allowed subset is not enforced; its mode is.
            Some("allowed_tools") => match o["mode"].as_str() {
                Some("required") => ToolChoice::Required,
                _ => ToolChoice::Auto,
            },
            Some(hosted) => {
                return Err(ApiError::new(
                    ErrorCode::UnsupportedToolChoice,
                    format!(
                        "`tool_choice` forces the hosted tool `{hosted}`, which this gateway does not run."
                    ),
                )
                .with_param("tool_choice"))
            }
            None => ToolChoice::Invalid,
        },
        Some(_) => ToolChoice::Invalid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_flatten_custom_tools_take_one_string_and_hosted_tools_are_skipped() {
        let tools = vec![
            json!({"type": "function", "name": "exec_command", "parameters": {"type": "object"}}),
            json!({"type": "namespace", "name": "multi", "tools": [
                {"type": "function", "name": "close", "description": "c"}]}),
            json!({"type": "function", "name": "multi__close"}),
            json!({"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}}),
            json!({"type": "web_search"}),
        ];
        let t = read(Some(&tools), false);
        let defs = t.defs.unwrap();
        let names: Vec<_> = defs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "exec_command",
                "multi__close",
                "apply_patch",
                "multi__close_2"
            ]
        );
        let patch = &defs[2];
        assert_eq!(patch.parameters["required"], json!(["input"]));
        assert!(patch.description.contains("start: x"));
        let close = t.map.client("multi__close_2").unwrap();
        assert_eq!(
            (close.name.as_str(), close.namespace.as_deref()),
            ("close", Some("multi"))
        );
        assert_eq!(t.map.neutral(Some("multi"), "close"), "multi__close_2");
        assert_eq!(t.map.neutral(None, "multi__close"), "multi__close");
        assert!(t.map.client("apply_patch").unwrap().custom);
    }

    #[test]
    fn bad_tools_are_carried_and_hosted_choices_refused() {
        let t = read(Some(&[json!({"type": "function"})]), false);
        assert!(t.defs.is_err());
        let dup = read(
            Some(&[
                json!({"type": "function", "name": "a"}),
                json!({"type": "custom", "name": "a"}),
            ]),
            false,
        );
        assert!(dup.defs.is_err());
        let map = ToolMap::default();
        assert_eq!(choice(None, &map).unwrap(), ToolChoice::Auto);
        assert_eq!(
            choice(Some(&json!({"type": "function", "name": "f"})), &map).unwrap(),
            ToolChoice::Named("f".into())
        );
        let e = choice(Some(&json!({"type": "web_search"})), &map).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnsupportedToolChoice);
        assert_eq!(
            choice(Some(&json!("sometimes")), &map).unwrap(),
            ToolChoice::Invalid
        );
    }
}
