//! `kind = "claude-code"`: Claude Code (`claude -p` over its stream-json control protocol),
//! one process per session.

use std::path::Path;

use super::super::{err, ConfigError};
use super::agent::{section, sessions, AgentConfig, ChildConfig};
use super::Kind;

section!(RawClaudeCode {
    builtin_tools: Option<Vec<String>>,
});

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaudeCodeConfig {
    /// The `claude` processes; the flags the gateway needs are added to the command.
    pub agent: AgentConfig,
    /// Claude Code's own tools the model may use (each use goes through the approval
    /// policy); empty: none.
    pub builtin_tools: Vec<String>,
}

impl Kind for ClaudeCodeConfig {
    type Raw = RawClaudeCode;

    fn validate(name: &str, mut b: RawClaudeCode, base: &Path) -> Result<Self, ConfigError> {
        let at = |k: &str| format!("backends.{name}.{k}");
        let agent = sessions(name, b.child_keys(), base)?;
        let builtin_tools = b.builtin_tools.unwrap_or_default();
        for (i, t) in builtin_tools.iter().enumerate() {
            let ok = !t.is_empty() && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return Err(err(
                    at(&format!("builtin_tools[{i}]")),
                    "must name one of Claude Code's tools (e.g. \"Bash\", \"Edit\")",
                ));
            }
            if t.starts_with("mcp__") {
                return Err(err(
                    at(&format!("builtin_tools[{i}]")),
                    "must name a built-in tool, not an MCP one",
                ));
            }
        }
        Ok(ClaudeCodeConfig {
            agent,
            builtin_tools,
        })
    }

    fn child(&self) -> Option<&ChildConfig> {
        Some(&self.agent.child)
    }
}
