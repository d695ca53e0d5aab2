//! The request's tools, `toolConfig` and `generationConfig`.
//!
//! Tools: each `functionDeclarations` entry is a client tool, its schema
//! `parametersJsonSchema` (JSON Schema) or `parameters` (Google's `Schema`, converted: type
//! names lower-cased, `nullable` as a `"null"` type, `propertyOrdering` dropped). Other tools
//! (`googleSearch`, `codeExecution`, `urlContext`, ...) run at Google and are not declared to
//! a backend. `toolConfig.functionCallingConfig.mode`: `AUTO`, `VALIDATED` (as `AUTO`), `NONE`
//! (no tools), `ANY` (a call is required; with one `allowedFunctionNames` entry, that one;
//! with several, only those are declared).
//!
//! `generationConfig`: `temperature`, `topP`, `maxOutputTokens`, `stopSequences`; `responseMimeType`
//! `application/json` with `responseJsonSchema` or `responseSchema` as a structured-output
//! request (JSON mode without one); `thinkingConfig` as effort (`thinkingLevel` by name;
//! `thinkingBudget` 0 is `minimal`, -1 the backend's own, below 4,096 `low`, below 16,384
//! `medium`, below 32,768 `high`, beyond `xhigh`) and `includeThoughts` as shown reasoning.
//! `candidateCount` above 1 is refused; the other keys (`topK`, `seed`, penalties, modalities)
//! are not passed on.

use serde_json::{json, Map, Value};

use super::contents::member;
use crate::error::{ApiError, Param};
use crate::turn::{Effort, Sampling, ToolChoice, ToolDef};

/// The `functionDeclarations` of `tools`, in order (400 on a `tools` that is not an array).
pub(super) fn declared_tools(tools: Option<&Value>) -> Result<Vec<&Value>, ApiError> {
    let list = match tools {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => {
            return Err(
                ApiError::invalid("`tools` must be an array of Tool objects")
                    .with_param(Param::Tools),
            )
        }
    };
    Ok(list
        .iter()
        .filter_map(|t| member(t, "functionDeclarations", "function_declarations"))
        .filter_map(Value::as_array)
        .flatten()
        .collect())
}

/// The client's tools (only those in `allowed`, when it names any), or why they cannot be
/// read.
pub(super) fn tools(declared: &[&Value], allowed: &[String]) -> Result<Vec<ToolDef>, String> {
    let mut out: Vec<ToolDef> = Vec::with_capacity(declared.len());
    for f in declared {
        let name = (f["name"].as_str())
            .filter(|n| !n.is_empty())
            .ok_or("each function declaration needs a `name`")?;
        if out.iter().any(|d| d.name == name) {
            return Err(format!("duplicate function name `{name}`"));
        }
        if !allowed.is_empty() && !allowed.iter().any(|a| a == name) {
            continue;
        }
        let parameters = match member(f, "parametersJsonSchema", "parameters_json_schema") {
            Some(s) => s.clone(),
            None => member(f, "parameters", "parameters")
                .map(json_schema)
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        };
        out.push(ToolDef {
            name: name.to_string(),
            description: f["description"].as_str().unwrap_or_default().to_string(),
            parameters,
        });
    }
    Ok(out)
}

/// Google's OpenAPI-style `Schema` as JSON Schema.
pub(super) fn json_schema(s: &Value) -> Value {
    let Some(o) = s.as_object() else {
        return s.clone();
    };
    let mut out = Map::with_capacity(o.len());
    for (k, v) in o {
        match k.as_str() {
            "type" => {
                if let Some(t) = v.as_str().filter(|t| *t != "TYPE_UNSPECIFIED") {
                    out.insert(k.clone(), json!(t.to_ascii_lowercase()));
                }
            }
            "properties" => {
                let props = v.as_object().into_iter().flatten();
                let props = props.map(|(name, p)| (name.clone(), json_schema(p)));
                out.insert(k.clone(), Value::Object(props.collect()));
            }
            "items" | "not" => {
                out.insert(k.clone(), json_schema(v));
            }
            "anyOf" | "any_of" | "oneOf" | "allOf" => {
                let list = v.as_array().into_iter().flatten().map(json_schema);
                out.insert(k.replace("any_of", "anyOf"), Value::Array(list.collect()));
            }
            "nullable" | "propertyOrdering" | "property_ordering" => {}
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if o.get("nullable") == Some(&Value::Bool(true)) {
        if let Some(t) = out.get("type").cloned() {
            out.insert("type".into(), json!([t, "null"]));
        }
    }
    Value::Object(out)
}

/// The request's `toolConfig`: neutral, and the names `ANY` narrows the tools to.
pub(super) struct Choice {
    pub neutral: ToolChoice,
    pub allowed: Vec<String>,
}

impl Choice {
    pub fn read(v: Option<&Value>) -> Result<Choice, ApiError> {
        let config = v.and_then(|v| member(v, "functionCallingConfig", "function_calling_config"));
        let Some(config) = config else {
            return Ok(Choice {
                neutral: ToolChoice::Auto,
                allowed: Vec::new(),
            });
        };
        let names = member(config, "allowedFunctionNames", "allowed_function_names");
        let allowed: Vec<String> = (names.and_then(Value::as_array).into_iter().flatten())
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
        let neutral = match config["mode"].as_str() {
            None | Some("AUTO" | "MODE_UNSPECIFIED" | "VALIDATED") => ToolChoice::Auto,
            Some("NONE") => ToolChoice::None,
            Some("ANY") => match allowed.as_slice() {
                [one] => ToolChoice::Named(one.clone()),
                _ => ToolChoice::Required,
            },
            Some(_) => {
                return Err(ApiError::invalid(
                    "`toolConfig.functionCallingConfig.mode` must be one of \"AUTO\", \"ANY\", \"NONE\", \"VALIDATED\"",
                )
                .with_param("toolConfig.functionCallingConfig.mode"))
            }
        };
        let allowed = match neutral {
            ToolChoice::Required => allowed,
            _ => Vec::new(),
        };
        Ok(Choice { neutral, allowed })
    }
}

/// What `generationConfig` asks of the turn.
pub(super) struct Generation {
    pub sampling: Sampling,
    pub effort: Option<Effort>,
    /// `thinkingConfig` without `includeThoughts`, for the digest.
    pub thinking_canonical: Value,
    pub thoughts: bool,
}

impl Generation {
    pub fn read(v: Option<&Value>) -> Result<Generation, ApiError> {
        let g = v.filter(|v| !v.is_null()).cloned().unwrap_or(json!({}));
        if !g.is_object() {
            return Err(ApiError::invalid("`generationConfig` must be an object")
                .with_param("generationConfig"));
        }
        let set = |camel: &str, snake: &str| member(&g, camel, snake).cloned();
        if set("candidateCount", "candidate_count").is_some_and(|n| n.as_u64() != Some(1)) {
            return Err(ApiError::invalid(
                "generationConfig.candidateCount: this gateway answers with one candidate",
            )
            .with_param("generationConfig.candidateCount"));
        }
        let thinking = set("thinkingConfig", "thinking_config").unwrap_or(Value::Null);
        let thoughts =
            member(&thinking, "includeThoughts", "include_thoughts") == Some(&json!(true));
        let mut thinking_canonical = thinking.clone();
        if let Some(o) = thinking_canonical.as_object_mut() {
            o.remove("includeThoughts");
            o.remove("include_thoughts");
        }
        Ok(Generation {
            effort: effort(&thinking)?,
            sampling: Sampling {
                max_tokens: set("maxOutputTokens", "max_output_tokens"),
                temperature: set("temperature", "temperature"),
                top_p: set("topP", "top_p"),
                stop: set("stopSequences", "stop_sequences"),
                cache_key: None,
                response_format: response_format(&g),
            },
            thinking_canonical,
            thoughts,
        })
    }
}

/// `thinkingConfig` as an effort.
fn effort(thinking: &Value) -> Result<Option<Effort>, ApiError> {
    if let Some(level) = member(thinking, "thinkingLevel", "thinking_level") {
        return Ok(Some(match level.as_str() {
            Some("MINIMAL") => Effort::Minimal,
            Some("LOW") => Effort::Low,
            Some("MEDIUM") => Effort::Medium,
            Some("HIGH") => Effort::High,
            Some("THINKING_LEVEL_UNSPECIFIED") => return Ok(None),
            _ => {
                return Err(ApiError::invalid(
                    "`thinkingConfig.thinkingLevel` must be one of \"MINIMAL\", \"LOW\", \"MEDIUM\", \"HIGH\"",
                )
                .with_param(Param::Effort))
            }
        }));
    }
    let Some(budget) = member(thinking, "thinkingBudget", "thinking_budget") else {
        return Ok(None);
    };
    let Some(b) = budget.as_i64() else {
        return Err(
            ApiError::invalid("`thinkingConfig.thinkingBudget` must be an integer")
                .with_param(Param::Effort),
        );
    };
    Ok(match b {
        ..0 => None,
        0 => Some(Effort::Minimal),
        1..4_096 => Some(Effort::Low),
        4_096..16_384 => Some(Effort::Medium),
        16_384..32_768 => Some(Effort::High),
        _ => Some(Effort::XHigh),
    })
}

/// A JSON-output request in the Chat Completions shape.
fn response_format(g: &Value) -> Option<Value> {
    let mime = member(g, "responseMimeType", "response_mime_type")?;
    if mime != "application/json" {
        return None;
    }
    let schema = match member(g, "responseJsonSchema", "response_json_schema") {
        Some(s) => Some(s.clone()),
        None => member(g, "responseSchema", "response_schema").map(json_schema),
    };
    Some(match schema {
        Some(schema) => json!({"type": "json_schema", "json_schema": {
            "name": "output", "schema": schema, "strict": true}}),
        None => json!({"type": "json_object"}),
    })
}
