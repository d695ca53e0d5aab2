//! `kind = "app-server"`: a pool of `codex app-server` processes speaking JSON-RPC on stdio,
//! and the Codex thread settings a model may carry (`approval_policy`, `sandbox`).

use std::path::Path;
use std::time::Duration;

use super::super::raw::{
    RawModel, DEFAULT_ACQUIRE_TIMEOUT_MS, DEFAULT_PROCESSES, DEFAULT_RECYCLE_AFTER_THREADS,
};
use super::super::{err, ConfigError};
use super::agent::{child, max_sessions, section, ChildConfig};
use super::Kind;

/// The names of `codex app-server`'s own tools (0.169.0). Its tool router claims them even
/// when the feature behind one is switched off (a dynamic tool of that name is dropped, or its
/// call fails as `unsupported call`), so a client tool of the same name is declared under
/// another name and restored on the way out. Codex CLI's own tool set uses most of them.
pub const DEFAULT_RESERVED_TOOL_NAMES: &[&str] = &[
    "exec_command",
    "write_stdin",
    "shell",
    "apply_patch",
    "update_plan",
    "request_user_input",
    "view_image",
    "get_goal",
    "create_goal",
    "update_goal",
    "web_search",
];

section!(RawAppServer {
    processes: Option<usize>,
    acquire_timeout_ms: Option<u64>,
    reserved_tool_names: Option<Vec<String>>,
    recycle_after_threads: Option<u64>,
});

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppServerConfig {
    pub child: ChildConfig,
    pub max_sessions: usize,
    pub processes: usize,
    pub acquire_timeout: Duration,
    /// Client tool names the backend would shadow with a built-in of its own (Codex runs its
    /// `view_image` or `request_user_input` instead of calling the client's tool of that
    /// name). Such a tool is declared under another name and its calls renamed back.
    pub reserved_tool_names: Vec<String>,
    /// A process that has started this many threads is replaced by a fresh one; it takes
    /// no new work, drains its live and held turns, then exits.
    pub recycle_after_threads: u64,
}

/// A model's Codex thread settings (`thread/start`), read by this kind only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodexThread {
    /// `approvalPolicy` (`untrusted`, `on-request`, `never`).
    pub approval_policy: Option<String>,
    /// `sandbox` (`read-only`, `workspace-write`, `danger-full-access`).
    pub sandbox: Option<String>,
}

impl Kind for AppServerConfig {
    type Raw = RawAppServer;

    fn validate(name: &str, b: RawAppServer, base: &Path) -> Result<Self, ConfigError> {
        validate(name, b, base)
    }

    fn child(&self) -> Option<&ChildConfig> {
        Some(&self.child)
    }
}

fn validate(name: &str, mut b: RawAppServer, base: &Path) -> Result<AppServerConfig, ConfigError> {
    let at = |k: &str| format!("backends.{name}.{k}");
    let keys = b.child_keys();
    let raw_max = keys.max_sessions;
    let child = child(name, keys, base, &["CODEX_HOME"])?;
    let max_sessions = max_sessions(name, raw_max)?;
    let recycle_after_threads = b
        .recycle_after_threads
        .unwrap_or(DEFAULT_RECYCLE_AFTER_THREADS);
    if recycle_after_threads == 0 {
        return Err(err(at("recycle_after_threads"), "must be greater than 0"));
    }
    let processes = b.processes.unwrap_or(DEFAULT_PROCESSES);
    if processes == 0 {
        return Err(err(at("processes"), "must be greater than 0"));
    }
    Ok(AppServerConfig {
        child,
        max_sessions,
        processes,
        acquire_timeout: Duration::from_millis(
            b.acquire_timeout_ms.unwrap_or(DEFAULT_ACQUIRE_TIMEOUT_MS),
        ),
        reserved_tool_names: b.reserved_tool_names.unwrap_or_else(|| {
            DEFAULT_RESERVED_TOOL_NAMES
                .iter()
                .map(|s| s.to_string())
                .collect()
        }),
        recycle_after_threads,
    })
}

/// The Codex settings of model `models[i]` (`at` builds its key paths).
pub(super) fn thread(
    at: &dyn Fn(&str) -> String,
    m: &RawModel,
) -> Result<CodexThread, ConfigError> {
    if let Some(p) = &m.approval_policy {
        if !["untrusted", "on-request", "never"].contains(&p.as_str()) {
            return Err(err(
                at("approval_policy"),
                format!("`{p}` is not one of untrusted, on-request, never"),
            ));
        }
    }
    if let Some(s) = &m.sandbox {
        if !["read-only", "workspace-write", "danger-full-access"].contains(&s.as_str()) {
            return Err(err(
                at("sandbox"),
                format!("`{s}` is not one of read-only, workspace-write, danger-full-access"),
            ));
        }
    }
    Ok(CodexThread {
        approval_policy: m.approval_policy.clone(),
        sandbox: m.sandbox.clone(),
    })
}
