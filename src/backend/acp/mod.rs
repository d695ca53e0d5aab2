//! `kind = "acp"`: any agent that speaks the Agent Client Protocol (JSON-RPC 2.0 over stdio:
//! Gemini CLI's `--acp`, Claude's ACP adapter, …), one process per session, a
//! [`Protocol`](super::agent::Protocol) on the generic agent backend (`agent/`).
//!
//! The framing is our own on the substrate's bounded lines rather than the
//! `agent-client-protocol` crate: the gateway needs a dozen fields of five messages, and the
//! crate's own runtime (its connection futures, `!Send` handlers) would sit beside the
//! substrate's child supervision rather than on it.
//!
//! Each execution gets a session of its own (`session.rs`): an agent process started for it,
//! `initialize`d with no `fs` or `terminal` capability (the agent uses its own tools, gated by
//! the approval policy), and `session/new` with the client's tools as an HTTP MCP server on
//! the bridge (`agent::bridge`: one endpoint per session, a random bearer handed over only
//! there) and a scratch folder as its working folder and `HOME`, removed with it. The
//! conversation is rendered into the first `session/prompt`; a kept session gets only the new
//! input. Its places, kept sessions and release are the agent backend's.

mod metering;
mod permission;
mod session;

use std::sync::Arc;

use serde_json::Value;

use super::agent::bridge::Bridge;
use super::BackendError;
use crate::config::AcpConfig;

/// The ACP protocol of a backend, with its config and the bridge its sessions' agents reach
/// the client's tools through.
pub struct Acp {
    cfg: AcpConfig,
    bridge: Arc<Bridge>,
}

impl Acp {
    /// The protocol, its bridge listening.
    pub fn new(cfg: &AcpConfig) -> Result<Acp, BackendError> {
        let bridge = Bridge::shared(cfg.mcp_bridge, cfg.agent.max_sessions)?;
        Ok(Acp {
            cfg: cfg.clone(),
            bridge,
        })
    }
}

/// The agent's sign-in by environment variable whose variables the child has (`authMethods`
/// of type `env_var`, as codex-acp's `OPENAI_API_KEY`), if it offers one.
fn env_auth(init: &Value, has: impl Fn(&str) -> bool) -> Option<String> {
    init["authMethods"]
        .as_array()?
        .iter()
        .filter(|m| m["type"] == "env_var")
        .find(|m| {
            let vars = m["vars"].as_array();
            vars.is_some_and(|v| {
                !v.is_empty() && v.iter().all(|v| v["name"].as_str().is_some_and(&has))
            })
        })
        .and_then(|m| m["id"].as_str())
        .map(str::to_string)
}

/// The id of the session config option of `category`, if the agent has one.
fn config_option(opened: &Value, category: &str) -> Option<String> {
    opened["configOptions"]
        .as_array()?
        .iter()
        .find(|o| o["category"] == category)
        .and_then(|o| o["id"].as_str())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sign_in_by_a_variable_the_child_has() {
        let init = json!({"authMethods": [
            {"id": "chatgpt", "name": "Login"},
            {"type": "env_var", "id": "codex-api-key", "vars": [{"name": "CODEX_API_KEY"}]},
            {"type": "env_var", "id": "openai-api-key", "vars": [{"name": "OPENAI_API_KEY"}]},
        ]});
        assert_eq!(
            env_auth(&init, |v| v == "OPENAI_API_KEY").as_deref(),
            Some("openai-api-key")
        );
        assert_eq!(env_auth(&init, |_| false), None);
        assert_eq!(env_auth(&json!({"authMethods": []}), |_| true), None);
    }

    #[test]
    fn model_and_effort_options_by_category() {
        let opened = json!({"configOptions": [
            {"id": "mode", "category": "mode"},
            {"id": "model", "category": "model"},
            {"id": "reasoning_effort", "category": "thought_level"},
        ]});
        assert_eq!(config_option(&opened, "model").as_deref(), Some("model"));
        assert_eq!(
            config_option(&opened, "thought_level").as_deref(),
            Some("reasoning_effort")
        );
        assert_eq!(config_option(&json!({}), "model"), None);
    }
}
