//! `kind = "acp"`: any agent that speaks the Agent Client Protocol over stdio, one process
//! per session, the client's tools served to it through the MCP bridge (`[mcp_bridge]`).

use std::net::SocketAddr;
use std::path::Path;

use super::super::raw::DEFAULT_MCP_BRIDGE_LISTEN;
use super::super::ConfigError;
use super::agent::{section, sessions, AgentConfig, ChildConfig};
use super::Kind;

section!(RawAcp {});

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcpConfig {
    /// The agent processes (`["gemini", "--acp"]`).
    pub agent: AgentConfig,
    /// `[mcp_bridge] listen`: where the agent reaches the client's tools.
    pub mcp_bridge: SocketAddr,
}

impl Kind for AcpConfig {
    type Raw = RawAcp;

    fn validate(name: &str, mut b: RawAcp, base: &Path) -> Result<Self, ConfigError> {
        Ok(AcpConfig {
            agent: sessions(name, b.child_keys(), base)?,
            mcp_bridge: DEFAULT_MCP_BRIDGE_LISTEN
                .parse()
                .expect("the default is an address"),
        })
    }

    fn child(&self) -> Option<&ChildConfig> {
        Some(&self.agent.child)
    }
}
