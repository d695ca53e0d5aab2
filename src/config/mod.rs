//! Configuration: raw serde structs -> `validate()` -> frozen [`Config`].
//!
//! What it owns: the file format (every key, its default and its rules) and the frozen types
//! the rest of the gateway reads. Parsing is strict (`deny_unknown_fields` everywhere) and
//! every failure names the key path, e.g. `clients[1].key_sha256: expected 64 hex characters`.
//! `from_toml_str` is pure (unit tests call it); `load` does the IO and resolves relative paths
//! against the file's folder. JWT key files (`auth.jwt[N].pem_file` / `jwks_file`) are read
//! through the reader that `from_toml_str_with` is given: `load` passes the file system, unit
//! tests a map.
//!
//! What it must not do: touch sockets, processes or the store, or hold state; a reload is
//! just another `load`.
//!
//! Layout: [`raw`] is the file as written (and every default), [`validate`] turns it into a
//! [`Config`], with the `[backends]` sections in [`backends`] and `[[auth.jwt]]` in [`jwt`].
//! The roles and limits a client or issuer grants are [`crate::auth::grant`]'s, and the issuer
//! type is [`crate::auth::jwt::JwtIssuer`]: both are re-exported here.

mod backends;
mod cluster;
mod jwt;
mod managed;
mod raw;
mod telemetry;
#[cfg(test)]
mod tests;
mod validate;
mod webhooks;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

pub use crate::auth::grant::{ClientLimits, Entry, Grant, GroupConfig, Groups, Models, Rate, Role};
pub use crate::auth::jwt::JwtIssuer;
pub use backends::*;
pub use cluster::{ClusterConfig, StoreConfig};
pub use managed::ManagedAgentsConfig;
pub use telemetry::TelemetryConfig;
pub use webhooks::{WebhookConfig, WebhookFormat, EVENTS as WEBHOOK_EVENTS};

#[derive(Debug, thiserror::Error)]
#[error("config {path}: {message}")]
pub struct ConfigError {
    /// Key path of the bad value (`clients[0].models[2]`), or the file for IO failures.
    pub path: String,
    pub message: String,
}

fn err(path: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.into(),
        message: message.into(),
    }
}

/// What policy says about one kind of backend side effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allow,
    Deny,
    Ask,
}

impl Decision {
    /// The stricter of two decisions (`allow` < `ask` < `deny`).
    pub fn stricter(self, other: Decision) -> Decision {
        let rank = |d: Decision| match d {
            Decision::Allow => 0,
            Decision::Ask => 1,
            Decision::Deny => 2,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApprovalPolicy {
    pub command: Decision,
    pub file_change: Decision,
    pub permissions: Decision,
    pub elicitation: Decision,
}

impl ApprovalPolicy {
    /// Every kind allowed (what a narrowing that narrows nothing says).
    pub const ALLOW_ALL: ApprovalPolicy = ApprovalPolicy {
        command: Decision::Allow,
        file_change: Decision::Allow,
        permissions: Decision::Allow,
        elicitation: Decision::Allow,
    };

    /// This policy narrowed by `other`, kind by kind: never wider than either.
    pub fn narrowed(self, other: &ApprovalPolicy) -> ApprovalPolicy {
        ApprovalPolicy {
            command: self.command.stricter(other.command),
            file_change: self.file_change.stricter(other.file_change),
            permissions: self.permissions.stricter(other.permissions),
            elicitation: self.elicitation.stricter(other.elicitation),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub store: StoreConfig,
    /// `[cluster]`: None for a single gateway.
    pub cluster: Option<ClusterConfig>,
    /// `[[auth.jwt]]`: trusted issuers. Each is an `Arc` made at load, so a reload makes new
    /// ones and the JWT cache can tell generations apart.
    pub jwt: Vec<Arc<JwtIssuer>>,
    pub clients: Vec<ClientConfig>,
    /// `[[groups]]`: what the members of an identity provider's group get.
    pub groups: Vec<GroupConfig>,
    pub models: Vec<ModelConfig>,
    /// `[backends.NAME]`, each of its kind.
    pub backends: BTreeMap<String, BackendSpec>,
    pub approval_ttl: Duration,
    pub continuations: ContinuationLimits,
    pub continuity: ContinuityConfig,
    pub managed_agents: ManagedAgentsConfig,
    /// `[telemetry]`: None when traces are off. Fixed at start: a reload keeps it.
    pub telemetry: Option<TelemetryConfig>,
    /// `[[webhooks]]`: where notifications go. Fixed at start: a reload keeps them.
    pub webhooks: Vec<WebhookConfig>,
    /// `[console] api_key_sign_in`: the console offers a pasted key or JWT.
    pub console_api_key_sign_in: bool,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub max_body_bytes: usize,
    pub keepalive: Duration,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub max_connections: usize,
    /// Open event streams and streamed legs of one principal, unless its entry sets
    /// `max_streams`.
    pub max_streams_per_client: usize,
    pub shutdown_drain: Duration,
    /// A Responses WebSocket idle this long (no message either way) is closed.
    pub websocket_idle_timeout: Duration,
    /// How often a Responses WebSocket is pinged.
    pub websocket_ping: Duration,
    /// The gateway's URL as people reach it (decision links); None: the address it listens on.
    pub public_url: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub id: std::sync::Arc<str>,
    pub credential: Credential,
    pub models: Models,
    pub roles: Vec<Role>,
    pub limits: ClientLimits,
}

impl ClientConfig {
    pub fn may_use(&self, model: &str) -> bool {
        self.models.is_match(model)
    }
}

/// How a client proves who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// `key_sha256`: the SHA-256 of its API key.
    Key([u8; 32]),
    /// `jwt = { issuer, subject }`: tokens of a configured issuer with this `sub`.
    Jwt { issuer: String, subject: String },
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub id: std::sync::Arc<str>,
    pub backend: String,
    pub backend_model: Option<String>,
    pub approvals: ApprovalPolicy,
    /// `approval_policy` and `sandbox`: set only on a model of a `kind = "app-server"`
    /// backend, which validates them and passes them to its threads.
    pub codex: CodexThread,
    /// USD per million tokens; None: the model's usage costs nothing.
    pub price: Option<crate::budget::Price>,
}

/// `[continuity]`: keeping an agent's thread idle for the conversation's next turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContinuityConfig {
    pub enabled: bool,
    pub idle_ttl: Duration,
    pub max_idle_per_client: usize,
    pub max_idle: usize,
}

#[derive(Debug, Clone)]
pub struct ContinuationLimits {
    pub execution_ttl: Duration,
    pub max_pending: usize,
    pub max_pending_per_client: usize,
    /// Bytes of conversation one principal's suspensions may keep in memory.
    pub max_kept_bytes_per_client: usize,
    /// How long a remote compaction's summary answers its handle.
    pub compaction_ttl: Duration,
    pub compactions: CompactionLimits,
    pub tombstones_per_client: usize,
    pub max_rounds: u32,
    pub max_tool_result_bytes: usize,
    pub batch_debounce: Duration,
}

/// The bounds of remote compaction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompactionLimits {
    /// Compaction items one request may carry.
    pub max_items: usize,
    /// Stored summaries one principal keeps, and their bytes (its oldest go first).
    pub max_per_client: usize,
    pub max_bytes_per_client: u64,
    /// A summary's length (a longer one is cut).
    pub max_summary_bytes: usize,
}

impl Config {
    pub fn model(&self, id: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| *m.id == *id)
    }

    pub fn client(&self, id: &str) -> Option<&ClientConfig> {
        self.clients.iter().find(|c| *c.id == *id)
    }

    /// The client entry naming the JWT principal (`iss`, `sub`), if any.
    pub fn jwt_client(&self, issuer: &str, subject: &str) -> Option<&ClientConfig> {
        self.clients.iter().find(|c| {
            matches!(&c.credential, Credential::Jwt { issuer: i, subject: s }
                if i == issuer && s == subject)
        })
    }

    /// Whether principal `id`, a member of `groups`, may use `model` under this config.
    pub fn may_use(&self, id: &str, groups: &[String], model: &str) -> bool {
        self.grant(id, groups).is_some_and(|g| g.may_use(model))
    }

    /// The model `model` names, if it exists and principal `id` (a member of `groups`) may
    /// use it (else the two are indistinguishable: 404 `model_not_found`).
    pub fn usable_model(&self, id: &str, groups: &[String], model: &str) -> Option<&ModelConfig> {
        self.model(model)
            .filter(|m| self.may_use(id, groups, &m.id))
    }

    /// What `turnstile check` and the start warn about, without refusing the config: a USD
    /// cap on a principal that may use a model with no price (its usage counts $0).
    pub fn warnings(&self) -> Vec<String> {
        let entries = (self.clients.iter())
            .map(|c| (format!("clients `{}`", c.id), &c.models, &c.limits))
            .chain(
                (self.jwt.iter())
                    .map(|i| (format!("auth.jwt `{}`", i.issuer), &i.models, &i.limits)),
            )
            .chain(
                (self.groups.iter())
                    .map(|g| (format!("groups `{}`", g.name), &g.models, &g.limits)),
            );
        let mut out = Vec::new();
        for (who, models, limits) in entries {
            if !limits.budget.has_usd() {
                continue;
            }
            for m in self.models.iter().filter(|m| m.price.is_none()) {
                if models.is_match(&m.id) {
                    out.push(format!(
                        "{who} has a USD budget but may use model `{}`, which has no price: its usage counts as $0 against the cap",
                        m.id
                    ));
                }
            }
        }
        out
    }

    /// What the principal `id`, a member of `groups`, may do under this config: its client
    /// entry, or for a JWT subject no entry names (`jwt:<iss>#<sub>`) its issuer's defaults,
    /// with the configured groups among `groups` added. None when neither exists (any more).
    pub fn grant(&self, id: &str, groups: &[String]) -> Option<Grant<'_>> {
        let own = match self.client(id) {
            Some(c) => Entry {
                models: &c.models,
                roles: &c.roles,
                limits: &c.limits,
            },
            None => {
                let (issuer, _) = crate::auth::jwt::split_principal(id)?;
                let i = self.jwt.iter().find(|i| i.issuer == issuer)?;
                Entry {
                    models: &i.models,
                    roles: &i.roles,
                    limits: &i.limits,
                }
            }
        };
        let groups = match groups.is_empty() {
            true => Vec::new(),
            false => (self.groups.iter())
                .filter(|g| groups.contains(&g.name))
                .collect(),
        };
        Some(Grant { own, groups })
    }

    /// The caps of an execution of `id`, a member of `groups`: its own, with the tightest
    /// per-execution cap of its groups.
    pub fn execution_budget(&self, id: &str, groups: &[String]) -> crate::budget::Budget {
        (self.grant(id, groups))
            .map(|g| g.limits().budget)
            .unwrap_or_default()
    }

    /// The budget counted under `id` in the usage ledger: a principal's own caps, or a
    /// group's pooled ones ([`crate::auth::grant::pool_id`]).
    pub fn budget_of(&self, id: &str) -> crate::budget::Budget {
        if let Some(name) = id.strip_prefix(crate::auth::grant::GROUP_PREFIX) {
            return (self.groups.iter())
                .find(|g| g.name == name)
                .map(|g| g.limits.budget)
                .unwrap_or_default();
        }
        (self.grant(id, &[]))
            .map(|g| g.own.limits.budget)
            .unwrap_or_default()
    }
}

/// Parses and validates config text. `base` resolves relative paths (the file's folder).
/// Pure: a config whose `[[auth.jwt]]` names key files needs [`from_toml_str_with`].
pub fn from_toml_str(text: &str, base: &Path) -> Result<Config, ConfigError> {
    from_toml_str_with(text, base, &|_| {
        Err(std::io::Error::other(
            "key files are read by `config::load` only",
        ))
    })
}

/// [`from_toml_str`] with a reader for the JWT key files (absolute paths).
pub fn from_toml_str_with(
    text: &str,
    base: &Path,
    read: &dyn Fn(&Path) -> std::io::Result<Vec<u8>>,
) -> Result<Config, ConfigError> {
    let de = toml::Deserializer::parse(text).map_err(|e| err("(syntax)", e.to_string()))?;
    let raw: raw::RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
        // A `[backends.NAME]` section is read as a whole before its kind is known, so serde
        // reports its errors at the section; re-reading that section alone names the key.
        if let Some(precise) = backends::section_error(text, e.path()) {
            return precise;
        }
        let path = e.path().to_string();
        let inner = e.into_inner();
        err(path, inner.message().to_string())
    })?;
    validate::validate(raw, base, read)
}

/// Reads, parses and validates the file at `path`, including the store path's usability.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| err(path.display().to_string(), format!("cannot read: {e}")))?;
    let base = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let base = if base.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        base
    };
    // Absolute, so that paths handed to children (command, CODEX_HOME) do not depend on
    // the child's own working folder.
    let base = std::path::absolute(&base).unwrap_or(base);
    let cfg = from_toml_str_with(&text, &base, &|p| std::fs::read(p))?;
    if let StoreConfig::Sqlite { path } = &cfg.store {
        check_store_path(path)?;
    }
    Ok(cfg)
}

/// A configured path: absolute as written, else relative to `base` (the config's folder).
fn resolve(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// The store file must be creatable (nearest existing ancestor is a writable folder) or, if it
/// exists, a readable and writable file.
fn check_store_path(path: &Path) -> Result<(), ConfigError> {
    let bad = |m: String| err("store.path", m);
    if path.exists() {
        if !path.is_file() {
            return Err(bad(format!("{} is not a file", path.display())));
        }
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| bad(format!("cannot open {}: {e}", path.display())))?;
        return Ok(());
    }
    let mut dir = path.parent();
    while let Some(d) = dir {
        let d = if d.as_os_str().is_empty() {
            Path::new(".")
        } else {
            d
        };
        if d.exists() {
            let meta = std::fs::metadata(d)
                .map_err(|e| bad(format!("cannot read {}: {e}", d.display())))?;
            if !meta.is_dir() {
                return Err(bad(format!("{} is not a folder", d.display())));
            }
            if meta.permissions().readonly() {
                return Err(bad(format!("{} is not writable", d.display())));
            }
            return Ok(());
        }
        dir = d.parent();
    }
    Ok(())
}
