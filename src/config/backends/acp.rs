//! `kind = "acp"`: any agent that speaks the Agent Client Protocol over stdio, one process
//! per session, the client's tools served to it through the MCP bridge (`[mcp_bridge]`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::super::raw::DEFAULT_ACQUIRE_TIMEOUT_MS;
use super::super::ConfigError;
use super::agent::{child, max_sessions, ChildConfig, RawChild};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::config) struct RawAcp {
    pub command: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub env_passthrough: Option<Vec<String>>,
    pub cwd: Option<String>,
    pub max_sessions: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcpConfig {
    /// The program and its arguments (`["gemini", "--acp"]`). No `cwd` here: each session
    /// gets the configured folder or a scratch one of its own.
    pub child: ChildConfig,
    /// Every agent process (live, held and idle) takes one.
    pub max_sessions: usize,
    pub acquire_timeout: Duration,
    /// `[mcp_bridge] listen`: where the agent reaches the client's tools.
    pub mcp_bridge: SocketAddr,
}

pub(super) fn validate(name: &str, b: RawAcp, base: &Path) -> Result<AcpConfig, ConfigError> {
    let raw_child = RawChild {
        command: b.command,
        env: b.env,
        env_passthrough: b.env_passthrough,
        cwd: b.cwd,
    };
    let child = child(name, raw_child, base, &[])?;
    let max_sessions = max_sessions(name, b.max_sessions)?;
    Ok(AcpConfig {
        child,
        max_sessions,
        acquire_timeout: Duration::from_millis(DEFAULT_ACQUIRE_TIMEOUT_MS),
        mcp_bridge: super::super::raw::DEFAULT_MCP_BRIDGE_LISTEN
            .parse()
            .expect("the default is an address"),
    })
}
