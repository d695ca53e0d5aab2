//! `kind = "claude-code"`: Claude Code (`claude -p` speaking stream-json with the host's
//! control protocol), one process per session, a [`Protocol`](super::agent::Protocol) on the
//! generic agent backend (`agent/`).
//!
//! Each execution gets a session of its own: a `claude` process started for it with the
//! client's tools served by an in-process ("sdk") MCP server the gateway answers
//! (`session.rs`), the model's instructions appended to Claude Code's system prompt, and a
//! scratch `HOME` (and working folder, unless `cwd` is set) removed with it. Its places,
//! kept sessions and release are the agent backend's.

mod approval;
mod control;
mod names;
mod session;

use serde_json::json;

use self::names::Names;
use crate::config::{ApprovalPolicy, ClaudeCodeConfig, Decision, ModelConfig};
use crate::turn::{Effort, TurnInput};

/// The Claude Code protocol of a backend, with its config.
pub struct ClaudeCode {
    cfg: ClaudeCodeConfig,
}

impl ClaudeCode {
    pub fn new(cfg: &ClaudeCodeConfig) -> ClaudeCode {
        ClaudeCode { cfg: cfg.clone() }
    }

    /// The flags the gateway needs, after the configured command (`argv`).
    fn flags(&self, argv: &mut Vec<String>, model: &ModelConfig, input: &TurnInput, names: &Names) {
        let mcp = json!({"mcpServers": {names::SERVER: {"type": "sdk", "name": names::SERVER}}});
        let (enabled, denied) = builtins(&self.cfg.builtin_tools, &model.approvals);
        for flag in [
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
            "--strict-mcp-config",
            "--no-session-persistence",
            "--permission-prompt-tool",
            "stdio",
            "--setting-sources",
            "",
        ] {
            argv.push(flag.into());
        }
        argv.extend(["--mcp-config".into(), mcp.to_string()]);
        argv.extend(["--tools".into(), enabled.join(",")]);
        let allowed: Vec<String> = names.allowed().collect();
        if !allowed.is_empty() {
            argv.extend(["--allowedTools".into(), allowed.join(",")]);
        }
        if !denied.is_empty() {
            argv.extend(["--disallowedTools".into(), denied.join(",")]);
        }
        if let Some(m) = &model.backend_model {
            argv.extend(["--model".into(), m.clone()]);
        }
        if let Some(e) = input.effort {
            argv.extend(["--effort".into(), effort(e).into()]);
        }
    }
}

/// The enabled built-ins the policy does not deny, and those it denies outright.
fn builtins(tools: &[String], policy: &ApprovalPolicy) -> (Vec<String>, Vec<String>) {
    tools.iter().cloned().partition(|t| {
        let decision = match t.as_str() {
            "Bash" => policy.command,
            "Edit" | "Write" | "MultiEdit" | "NotebookEdit" => policy.file_change,
            _ => policy.permissions,
        };
        decision != Decision::Deny
    })
}

/// Claude Code's `--effort` for a request's effort: its levels are low to max, so `none`
/// and `minimal` ask for `low`.
fn effort(e: Effort) -> &'static str {
    match e {
        Effort::None | Effort::Minimal | Effort::Low => "low",
        Effort::Medium => "medium",
        Effort::High => "high",
        Effort::XHigh => "xhigh",
    }
}
