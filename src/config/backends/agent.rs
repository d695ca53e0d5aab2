//! What every agent kind's section says about its child process: the program, its
//! environment (built from an allowlist, never the gateway's own) and its working folder.
//! The keys are listed in each kind's raw struct (serde cannot flatten into a
//! `deny_unknown_fields` struct); [`child`] validates them the same way for every kind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::super::{err, resolve, ConfigError};

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

/// `backends.NAME.max_sessions` of an agent kind: at least 1, default `DEFAULT_MAX_SESSIONS`.
pub(super) fn max_sessions(name: &str, raw: Option<usize>) -> Result<usize, ConfigError> {
    match raw.unwrap_or(super::super::raw::DEFAULT_MAX_SESSIONS) {
        0 => Err(err(
            format!("backends.{name}.max_sessions"),
            "must be greater than 0",
        )),
        n => Ok(n),
    }
}
