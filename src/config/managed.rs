//! `[managed_agents]`: the Managed Agents API (`/v1/agents`, `/v1/environments`,
//! `/v1/sessions`): where sessions' working folders live, and each principal's bounds on
//! what it keeps.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{err, resolve, ConfigError};

/// `managed_agents.workspace_root`, relative to the config's folder.
const DEFAULT_WORKSPACE_ROOT: &str = "data/workspaces";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawManagedAgents {
    pub workspace_root: Option<String>,
    pub max_agents_per_client: usize,
    pub max_environments_per_client: usize,
    pub max_sessions_per_client: usize,
    pub max_running_sessions_per_client: usize,
    pub max_event_bytes_per_client: u64,
    pub max_events_per_send: usize,
}

impl Default for RawManagedAgents {
    fn default() -> Self {
        RawManagedAgents {
            workspace_root: None,
            max_agents_per_client: 100,
            max_environments_per_client: 20,
            max_sessions_per_client: 100,
            max_running_sessions_per_client: 4,
            max_event_bytes_per_client: 64 << 20,
            max_events_per_send: 50,
        }
    }
}

/// `[managed_agents]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedAgentsConfig {
    /// Each session's working folder is made under here, and removed with the session.
    pub workspace_root: PathBuf,
    pub max_agents_per_client: usize,
    pub max_environments_per_client: usize,
    pub max_sessions_per_client: usize,
    /// Sessions of one principal whose turn runs at once (a held one waits, not counted).
    pub max_running_sessions_per_client: usize,
    /// The bytes of one principal's stored session events.
    pub max_event_bytes_per_client: u64,
    /// Events one `POST /v1/sessions/{id}/events` (or `initial_events`) may carry.
    pub max_events_per_send: usize,
}

pub(super) fn managed_agents(
    raw: RawManagedAgents,
    base: &Path,
) -> Result<ManagedAgentsConfig, ConfigError> {
    let positive = [
        ("max_agents_per_client", raw.max_agents_per_client as u64),
        (
            "max_environments_per_client",
            raw.max_environments_per_client as u64,
        ),
        (
            "max_sessions_per_client",
            raw.max_sessions_per_client as u64,
        ),
        (
            "max_running_sessions_per_client",
            raw.max_running_sessions_per_client as u64,
        ),
        ("max_event_bytes_per_client", raw.max_event_bytes_per_client),
        ("max_events_per_send", raw.max_events_per_send as u64),
    ];
    if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(err(
            format!("managed_agents.{key}"),
            "must be greater than 0",
        ));
    }
    let root = raw
        .workspace_root
        .as_deref()
        .unwrap_or(DEFAULT_WORKSPACE_ROOT);
    Ok(ManagedAgentsConfig {
        workspace_root: resolve(base, root),
        max_agents_per_client: raw.max_agents_per_client,
        max_environments_per_client: raw.max_environments_per_client,
        max_sessions_per_client: raw.max_sessions_per_client,
        max_running_sessions_per_client: raw.max_running_sessions_per_client,
        max_event_bytes_per_client: raw.max_event_bytes_per_client,
        max_events_per_send: raw.max_events_per_send,
    })
}
