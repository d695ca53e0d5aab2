//! `kind = "claude-code"`: Claude Code (`claude -p` over its stream-json control protocol),
//! one process per session.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::super::raw::DEFAULT_ACQUIRE_TIMEOUT_MS;
use super::super::{err, ConfigError};
use super::agent::{child, max_sessions, ChildConfig, RawChild};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::config) struct RawClaudeCode {
    pub command: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub env_passthrough: Option<Vec<String>>,
    pub cwd: Option<String>,
    pub max_sessions: Option<usize>,
    pub builtin_tools: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaudeCodeConfig {
    /// The program and its arguments; the flags the gateway needs are added to them. No
    /// `cwd` here: each session gets the configured folder or a scratch one of its own.
    pub child: ChildConfig,
    /// Every `claude` process (live, held and idle) takes one.
    pub max_sessions: usize,
    pub acquire_timeout: Duration,
    /// Claude Code's own tools the model may use (each use goes through the approval
    /// policy); empty: none.
    pub builtin_tools: Vec<String>,
}

pub(super) fn validate(
    name: &str,
    b: RawClaudeCode,
    base: &Path,
) -> Result<ClaudeCodeConfig, ConfigError> {
    let at = |k: &str| format!("backends.{name}.{k}");
    let raw_child = RawChild {
        command: b.command,
        env: b.env,
        env_passthrough: b.env_passthrough,
        cwd: b.cwd,
    };
    let child = child(name, raw_child, base, &[])?;
    let max_sessions = max_sessions(name, b.max_sessions)?;
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
        child,
        max_sessions,
        acquire_timeout: Duration::from_millis(DEFAULT_ACQUIRE_TIMEOUT_MS),
        builtin_tools,
    })
}
