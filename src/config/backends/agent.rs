//! What every agent kind's section says about its child process: the program, its
//! environment (built from an allowlist, never the gateway's own), its working folder and how
//! many sessions may live. The keys are declared once, by [`section!`] in each kind's raw
//! struct (serde cannot flatten into a `deny_unknown_fields` struct); [`child`] and
//! [`sessions`] validate them the same way for every kind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::super::raw::{DEFAULT_ACQUIRE_TIMEOUT_MS, DEFAULT_MAX_SESSIONS};
use super::super::{err, resolve, ConfigError};

/// An agent kind's raw section: the child keys every agent kind takes (`command`, `env`,
/// `env_passthrough`, `cwd`, `max_sessions`), then the kind's own keys. A
/// `deny_unknown_fields` struct, so a key of another kind is refused by serde.
macro_rules! section {
    ($raw:ident { $($key:ident: $ty:ty),* $(,)? }) => {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub(in crate::config) struct $raw {
            pub command: Option<Vec<String>>,
            pub env: Option<std::collections::BTreeMap<String, String>>,
            pub env_passthrough: Option<Vec<String>>,
            pub cwd: Option<String>,
            pub max_sessions: Option<usize>,
            $(pub $key: $ty,)*
        }

        impl $raw {
            /// The child keys as written (taken out of the section).
            fn child_keys(&mut self) -> super::agent::RawChild {
                super::agent::RawChild {
                    command: self.command.take(),
                    env: self.env.take(),
                    env_passthrough: self.env_passthrough.take(),
                    cwd: self.cwd.take(),
                    max_sessions: self.max_sessions.take(),
                }
            }
        }
    };
}
pub(super) use section;

/// What a one-process-per-session kind's section says of its sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// The program and its arguments. No `cwd` here: each session gets the configured folder
    /// or a scratch one of its own.
    pub child: ChildConfig,
    /// Every agent process (live, held and idle) takes one.
    pub max_sessions: usize,
    pub acquire_timeout: Duration,
}

/// An agent backend's child process, as the config describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildConfig {
    pub command: Vec<String>,
    /// Variables set for the child, besides what `env_passthrough` lets through.
    pub env: BTreeMap<String, String>,
    /// The names of the gateway's environment variables the child also gets (the default
    /// list, the config's `env_passthrough`, and any `env_key` its command names); the child's
    /// environment is built from these and `env` alone.
    pub env_passthrough: Vec<String>,
    pub cwd: Option<PathBuf>,
}

/// The child keys of one section, as written.
pub(super) struct RawChild {
    pub command: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub env_passthrough: Option<Vec<String>>,
    pub cwd: Option<String>,
    pub max_sessions: Option<usize>,
}

/// What an agent backend's child gets of the gateway's environment without asking: enough to
/// run a program (no credentials). Everything else comes from `env` or `env_passthrough`.
pub const DEFAULT_ENV_PASSTHROUGH: &[&str] = &[
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "LOGNAME",
    "PATH",
    "SSL_CERT_DIR",
    "SSL_CERT_FILE",
    "TMPDIR",
    "TZ",
    "USER",
];

/// Validates the child keys of `backends.NAME`. `paths` names the `env` variables that hold
/// a path (resolved against the config's folder like `command`).
pub(super) fn child(
    name: &str,
    raw: RawChild,
    base: &Path,
    paths: &[&str],
) -> Result<ChildConfig, ConfigError> {
    let at = |k: &str| format!("backends.{name}.{k}");
    let mut command = raw
        .command
        .ok_or_else(|| err(at("command"), "missing: the program to run"))?;
    if command.is_empty() || command[0].trim().is_empty() {
        return Err(err(at("command"), "must name a program"));
    }
    // A program given as a relative path with a slash is relative to the config's folder;
    // a bare name is looked up on PATH as usual.
    if command[0].contains('/') && !Path::new(&command[0]).is_absolute() {
        command[0] = resolve(base, &command[0]).display().to_string();
    }
    let env = raw
        .env
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| match paths.contains(&k.as_str()) {
            true => {
                let v = resolve(base, &v).display().to_string();
                (k, v)
            }
            false => (k, v),
        })
        .collect();
    let mut passthrough: Vec<String> = DEFAULT_ENV_PASSTHROUGH
        .iter()
        .map(|v| v.to_string())
        .collect();
    for (i, v) in raw
        .env_passthrough
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        if v.is_empty() || v.contains('=') || v.contains('\0') {
            return Err(err(
                at(&format!("env_passthrough[{i}]")),
                "must name an environment variable",
            ));
        }
        passthrough.push(v);
    }
    // The variable a Codex provider's `env_key` names in the command is the one it needs.
    passthrough.extend(command.iter().flat_map(|a| env_keys(a)));
    passthrough.sort();
    passthrough.dedup();
    Ok(ChildConfig {
        command,
        env,
        env_passthrough: passthrough,
        cwd: raw.cwd.map(|c| resolve(base, &c)),
    })
}

/// The variables `env_key="NAME"` names in one command argument (Codex's provider setting).
fn env_keys(arg: &str) -> Vec<String> {
    arg.match_indices("env_key")
        .filter_map(|(at, _)| {
            let rest = arg[at + "env_key".len()..].trim_start().strip_prefix('=')?;
            let rest = rest.trim_start();
            let quote = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
            let name = rest[1..].split(quote).next()?;
            let ok =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            ok.then(|| name.to_string())
        })
        .collect()
}

/// The sessions of a one-process-per-session kind: its child and `max_sessions`, validated.
pub(super) fn sessions(name: &str, raw: RawChild, base: &Path) -> Result<AgentConfig, ConfigError> {
    let raw_max = raw.max_sessions;
    let child = child(name, raw, base, &[])?;
    Ok(AgentConfig {
        child,
        max_sessions: max_sessions(name, raw_max)?,
        acquire_timeout: Duration::from_millis(DEFAULT_ACQUIRE_TIMEOUT_MS),
    })
}

/// `backends.NAME.max_sessions` of an agent kind: at least 1, default `DEFAULT_MAX_SESSIONS`.
pub(super) fn max_sessions(name: &str, raw: Option<usize>) -> Result<usize, ConfigError> {
    match raw.unwrap_or(DEFAULT_MAX_SESSIONS) {
        0 => Err(err(
            format!("backends.{name}.max_sessions"),
            "must be greater than 0",
        )),
        n => Ok(n),
    }
}
