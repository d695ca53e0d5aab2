//! What a session runs of an agent version: its model and effort, its instructions, the
//! client's custom tools, and the agent toolset's permission policies as a narrowing of the
//! model's approval policy (never wider: the stricter decision wins, kind by kind).

use serde_json::Value;

use super::agents::{effort, UNGATED};
use crate::config::{ApprovalPolicy, Decision};
use crate::turn::{Effort, ToolDef};

/// What a session runs of an agent version: its model, instructions and tools.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    pub model: String,
    pub effort: Option<Effort>,
    pub system: Option<String>,
    /// The custom tools, as the backend receives them and as the wire has them.
    pub tools: Vec<ToolDef>,
    pub tools_json: Vec<Value>,
    /// The agent toolset's permission policies as a narrowing of the model's approval
    /// policy (none without a toolset: the model's policy alone).
    pub approvals: Option<ApprovalPolicy>,
}

impl AgentSpec {
    /// Reads a session's agent snapshot (the stored shape).
    pub fn of(agent: &Value) -> AgentSpec {
        let model = agent["model"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let effort = agent["model"]["effort"]["type"].as_str().and_then(effort);
        let mut spec = AgentSpec {
            model,
            effort,
            system: agent["system"].as_str().map(str::to_string),
            tools: Vec::new(),
            tools_json: Vec::new(),
            approvals: None,
        };
        for t in agent["tools"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            match t["type"].as_str() {
                Some("custom") => {
                    spec.tools.push(ToolDef {
                        name: t["name"].as_str().unwrap_or_default().to_string(),
                        description: t["description"].as_str().unwrap_or_default().to_string(),
                        parameters: t["input_schema"].clone(),
                    });
                    spec.tools_json.push(t.clone());
                }
                Some("agent_toolset_20260401") => spec.approvals = Some(narrowing(t)),
                _ => {}
            }
        }
        spec
    }
}

/// The toolset's permission policies as a narrowing of the approval policy, by the kind of
/// side effect each tool is: `bash` a command; `edit` and `write` a file change; the others
/// `permissions`; an elicitation by the default. `always_ask` asks, a disabled tool denies.
fn narrowing(toolset: &Value) -> ApprovalPolicy {
    let default = &toolset["default_config"];
    let decision = |c: &Value| match (
        c["enabled"] == false,
        c["permission_policy"]["type"].as_str(),
    ) {
        (true, _) => Decision::Deny,
        (false, Some("always_ask")) => Decision::Ask,
        _ => Decision::Allow,
    };
    let of = |names: &[&str]| {
        let configs = toolset["configs"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        names.iter().fold(Decision::Allow, |d, name| {
            let c = configs
                .iter()
                .find(|c| c["name"] == *name)
                .unwrap_or(default);
            d.stricter(decision(c))
        })
    };
    ApprovalPolicy {
        command: of(&["bash"]),
        file_change: of(&["edit", "write"]),
        permissions: of(UNGATED),
        elicitation: decision(default),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn toolset(v: Value) -> Option<ApprovalPolicy> {
        AgentSpec::of(&json!({"model": {"id": "m"}, "tools": [v]})).approvals
    }

    #[test]
    fn permission_policies_narrow_by_the_kind_of_side_effect() {
        let allow = json!({"type": "always_allow"});
        let ask = json!({"type": "always_ask"});
        let all = toolset(json!({"type": "agent_toolset_20260401",
            "default_config": {"enabled": true, "permission_policy": allow}, "configs": []}));
        assert_eq!(all, Some(ApprovalPolicy::ALLOW_ALL));
        let mixed = toolset(json!({"type": "agent_toolset_20260401",
        "default_config": {"enabled": true, "permission_policy": allow},
        "configs": [
            {"name": "bash", "enabled": true, "permission_policy": ask},
            {"name": "write", "enabled": false, "permission_policy": allow},
            {"name": "grep", "enabled": true, "permission_policy": ask},
        ]}))
        .unwrap();
        assert_eq!(mixed.command, Decision::Ask);
        assert_eq!(
            mixed.file_change,
            Decision::Deny,
            "a disabled write denies edits too"
        );
        assert_eq!(mixed.permissions, Decision::Ask);
        assert_eq!(mixed.elicitation, Decision::Allow);
        let none = AgentSpec::of(&json!({"model": {"id": "m"}, "tools": []}));
        assert_eq!(none.approvals, None, "no toolset: the model's policy alone");
    }

    #[test]
    fn a_narrowing_never_widens_the_models_policy() {
        let model = ApprovalPolicy {
            command: Decision::Deny,
            file_change: Decision::Ask,
            permissions: Decision::Allow,
            elicitation: Decision::Allow,
        };
        let own = ApprovalPolicy {
            command: Decision::Allow,
            file_change: Decision::Allow,
            permissions: Decision::Ask,
            elicitation: Decision::Deny,
        };
        let n = model.narrowed(&own);
        assert_eq!(
            (n.command, n.file_change, n.permissions, n.elicitation),
            (Decision::Deny, Decision::Ask, Decision::Ask, Decision::Deny)
        );
    }
}
