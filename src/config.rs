//! Configuration: raw serde structs -> `validate()` -> frozen [`Config`].
//!
//! Parsing is strict (`deny_unknown_fields` everywhere) and every failure names the key path,
//! e.g. `clients[1].key_sha256: expected 64 hex characters`. `from_toml_str` is pure (unit
//! tests call it); `load` does the IO and resolves relative paths against the file's folder.
//! JWT key files (`auth.jwt[N].pem_file` / `jwks_file`) are read through the reader that
//! `from_toml_str_with` is given: `load` passes the file system, unit tests a map.
//! This module never touches sockets, processes or the store.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use globset::{Glob, GlobSet, GlobSetBuilder};
use jsonwebtoken::Algorithm;
use serde::Deserialize;

use crate::auth::jwt;

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

// ---------- raw, as written by the administrator ----------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    auth: RawAuth,
    #[serde(default)]
    clients: Vec<RawClient>,
    #[serde(default)]
    models: Vec<RawModel>,
    #[serde(default)]
    backends: BTreeMap<String, RawBackend>,
    #[serde(default)]
    approvals: RawApprovals,
    #[serde(default)]
    continuations: RawContinuations,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(default = "default_listen")]
    listen: String,
    #[serde(default = "default_max_body")]
    max_body_bytes: u64,
    #[serde(default = "default_keepalive")]
    keepalive_seconds: u64,
}
impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            listen: default_listen(),
            max_body_bytes: default_max_body(),
            keepalive_seconds: default_keepalive(),
        }
    }
}
fn default_listen() -> String {
    "127.0.0.1:8787".into()
}
fn default_max_body() -> u64 {
    16 * 1024 * 1024
}
fn default_keepalive() -> u64 {
    5
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    #[serde(default = "default_store_path")]
    path: String,
}
impl Default for RawStore {
    fn default() -> Self {
        RawStore {
            path: default_store_path(),
        }
    }
}
fn default_store_path() -> String {
    "data/turnstile.db".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClient {
    id: String,
    /// Exactly one of `key_sha256` and `jwt`.
    key_sha256: Option<String>,
    jwt: Option<RawClientJwt>,
    #[serde(default = "default_all_models")]
    models: Vec<String>,
    #[serde(default)]
    roles: Vec<String>,
    requests_per_minute: Option<u32>,
    burst: Option<u32>,
    concurrent_executions: Option<usize>,
    max_suspended: Option<usize>,
}

/// A JWT principal named by a client entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClientJwt {
    issuer: String,
    subject: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    #[serde(default)]
    jwt: Vec<RawJwt>,
}

/// One trusted JWT issuer. (The limit keys are spelled out rather than flattened:
/// `deny_unknown_fields` does not work with `flatten`.)
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJwt {
    issuer: String,
    audiences: Vec<String>,
    algorithms: Vec<String>,
    pem_file: Option<String>,
    jwks_file: Option<String>,
    #[serde(default = "default_leeway")]
    leeway_seconds: u64,
    #[serde(default)]
    require: Vec<String>,
    typ: Option<String>,
    #[serde(default)]
    models: Vec<String>,
    #[serde(default)]
    roles: Vec<String>,
    requests_per_minute: Option<u32>,
    burst: Option<u32>,
    concurrent_executions: Option<usize>,
    max_suspended: Option<usize>,
}
fn default_leeway() -> u64 {
    30
}
/// The most clock skew an issuer may be granted.
const MAX_LEEWAY_SECONDS: u64 = 300;
fn default_all_models() -> Vec<String> {
    vec!["*".into()]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    id: String,
    backend: String,
    backend_model: Option<String>,
    #[serde(default)]
    approvals: RawApprovalPolicy,
    approval_policy: Option<String>,
    sandbox: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApprovalPolicy {
    command: Option<Decision>,
    file_change: Option<Decision>,
    permissions: Option<Decision>,
    elicitation: Option<Decision>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    kind: String,
    // kind = "app-server"
    command: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    cwd: Option<String>,
    max_sessions: Option<usize>,
    processes: Option<usize>,
    acquire_timeout_ms: Option<u64>,
    reserved_tool_names: Option<Vec<String>>,
    // kind = "openai"
    base_url: Option<String>,
    api_key_env: Option<String>,
    connect_timeout_ms: Option<u64>,
    first_byte_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    total_timeout_ms: Option<u64>,
    max_idle_connections: Option<usize>,
}
fn default_max_sessions() -> usize {
    16
}
fn default_processes() -> usize {
    1
}
fn default_acquire_timeout_ms() -> u64 {
    3000
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApprovals {
    #[serde(default = "default_ttl")]
    ttl_seconds: u64,
}
impl Default for RawApprovals {
    fn default() -> Self {
        RawApprovals {
            ttl_seconds: default_ttl(),
        }
    }
}
fn default_ttl() -> u64 {
    900
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawContinuations {
    #[serde(default = "default_ttl")]
    execution_ttl_seconds: u64,
    #[serde(default = "default_max_pending")]
    max_pending: usize,
    #[serde(default = "default_max_pending_per_client")]
    max_pending_per_client: usize,
    #[serde(default = "default_tombstones")]
    tombstones_per_client: usize,
    #[serde(default = "default_max_rounds")]
    max_rounds: u32,
    #[serde(default = "default_max_result")]
    max_tool_result_bytes: usize,
    #[serde(default = "default_debounce")]
    batch_debounce_ms: u64,
}
impl Default for RawContinuations {
    fn default() -> Self {
        RawContinuations {
            execution_ttl_seconds: default_ttl(),
            max_pending: default_max_pending(),
            max_pending_per_client: default_max_pending_per_client(),
            tombstones_per_client: default_tombstones(),
            max_rounds: default_max_rounds(),
            max_tool_result_bytes: default_max_result(),
            batch_debounce_ms: default_debounce(),
        }
    }
}
fn default_max_pending() -> usize {
    4096
}
fn default_max_pending_per_client() -> usize {
    64
}
fn default_tombstones() -> usize {
    1024
}
fn default_max_rounds() -> u32 {
    32
}
fn default_max_result() -> usize {
    4 * 1024 * 1024
}
fn default_debounce() -> u64 {
    25
}

// ---------- frozen, as the gateway uses it ----------

/// What policy says about one kind of backend side effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allow,
    Deny,
    Ask,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalPolicy {
    pub command: Decision,
    pub file_change: Decision,
    pub permissions: Decision,
    pub elicitation: Decision,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub store_path: PathBuf,
    /// `[[auth.jwt]]`: trusted issuers. Each is an `Arc` made at load, so a reload makes new
    /// ones and the JWT cache can tell generations apart.
    pub jwt: Vec<Arc<JwtIssuer>>,
    pub clients: Vec<ClientConfig>,
    pub models: Vec<ModelConfig>,
    /// `kind = "app-server"` backends.
    pub backends: BTreeMap<String, BackendConfig>,
    /// `kind = "openai"` backends.
    pub upstreams: BTreeMap<String, UpstreamConfig>,
    pub approval_ttl: Duration,
    pub continuations: ContinuationLimits,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub max_body_bytes: usize,
    pub keepalive: Duration,
}

#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub id: String,
    pub credential: Credential,
    pub models: GlobSet,
    pub roles: Vec<String>,
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

/// A GCRA quota: `per_minute` requests, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    pub per_minute: NonZeroU32,
    pub burst: NonZeroU32,
}

/// Admission limits of a principal's fresh turns; `None` is unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientLimits {
    pub rate: Option<Rate>,
    /// Executions running or suspended at once.
    pub concurrent_executions: Option<usize>,
    /// Suspended executions at once.
    pub max_suspended: Option<usize>,
}

/// One `[[auth.jwt]]` issuer: how its tokens are verified, and what its subjects that no
/// `[[clients]]` entry names may do.
#[derive(Debug)]
pub struct JwtIssuer {
    pub issuer: String,
    pub audiences: Vec<String>,
    /// The allow-list; all of one key family, never `none` or `HS*`.
    pub algorithms: Vec<Algorithm>,
    pub keys: jwt::Keys,
    pub leeway_seconds: u64,
    /// Claims that must be present (and not null) besides `exp`, `iss`, `aud` and `sub`.
    pub require: Vec<String>,
    /// When set, the header `typ` must equal it (e.g. `at+jwt`).
    pub typ: Option<String>,
    pub models: GlobSet,
    pub roles: Vec<String>,
    pub limits: ClientLimits,
}

/// What a principal may do under one config: its models, roles and limits.
#[derive(Debug, Clone, Copy)]
pub struct Grant<'a> {
    pub models: &'a GlobSet,
    pub roles: &'a [String],
    pub limits: &'a ClientLimits,
}

impl Grant<'_> {
    pub fn may_use(&self, model: &str) -> bool {
        self.models.is_match(model)
    }

    pub fn approver(&self) -> bool {
        self.roles.iter().any(|r| r == "approver")
    }
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub id: String,
    pub backend: String,
    pub backend_model: Option<String>,
    pub approvals: ApprovalPolicy,
    /// Codex `approvalPolicy` for threads of this model (`untrusted`, `on-request`, `never`).
    pub approval_policy: Option<String>,
    /// Codex `sandbox` for threads of this model.
    pub sandbox: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    pub max_sessions: usize,
    pub processes: usize,
    pub acquire_timeout: Duration,
    /// Client tool names the backend would shadow with a built-in of its own (Codex runs its
    /// `view_image` or `request_user_input` instead of calling the client's tool of that
    /// name). A request declaring one is refused rather than silently rerouted.
    pub reserved_tool_names: Vec<String>,
}

/// `kind = "openai"`: a stateless OpenAI-compatible HTTP upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// Base URL ending before `/chat/completions` (e.g. `http://127.0.0.1:8080/v1`).
    pub base_url: String,
    /// Environment variable holding the upstream key (never the key itself).
    pub api_key_env: Option<String>,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
    pub total_timeout: Duration,
    pub max_idle_connections: usize,
}

#[derive(Debug, Clone)]
pub struct ContinuationLimits {
    pub execution_ttl: Duration,
    pub max_pending: usize,
    pub max_pending_per_client: usize,
    pub tombstones_per_client: usize,
    pub max_rounds: u32,
    pub max_tool_result_bytes: usize,
    pub batch_debounce: Duration,
}

impl Config {
    pub fn model(&self, id: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.id == id)
    }

    pub fn client(&self, id: &str) -> Option<&ClientConfig> {
        self.clients.iter().find(|c| c.id == id)
    }

    /// The client entry naming the JWT principal (`iss`, `sub`), if any.
    pub fn jwt_client(&self, issuer: &str, subject: &str) -> Option<&ClientConfig> {
        self.clients.iter().find(|c| {
            matches!(&c.credential, Credential::Jwt { issuer: i, subject: s }
                if i == issuer && s == subject)
        })
    }

    /// What the principal `id` may do under this config: its client entry, or for a JWT
    /// subject no entry names (`jwt:<iss>#<sub>`), its issuer's defaults. None when neither
    /// exists (any more).
    pub fn grant(&self, id: &str) -> Option<Grant<'_>> {
        if let Some(c) = self.client(id) {
            return Some(Grant {
                models: &c.models,
                roles: &c.roles,
                limits: &c.limits,
            });
        }
        let (issuer, _) = jwt::split_principal(id)?;
        let i = self.jwt.iter().find(|i| i.issuer == issuer)?;
        Some(Grant {
            models: &i.models,
            roles: &i.roles,
            limits: &i.limits,
        })
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
    let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        err(path, inner.message().to_string())
    })?;
    validate(raw, base, read)
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
    check_store_path(&cfg.store_path)?;
    Ok(cfg)
}

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

fn validate(
    raw: RawConfig,
    base: &Path,
    read: &dyn Fn(&Path) -> std::io::Result<Vec<u8>>,
) -> Result<Config, ConfigError> {
    let listen: SocketAddr = raw.server.listen.parse().map_err(|_| {
        err(
            "server.listen",
            format!("`{}` is not an IP:PORT address", raw.server.listen),
        )
    })?;
    if raw.server.max_body_bytes == 0 {
        return Err(err("server.max_body_bytes", "must be greater than 0"));
    }
    if raw.server.keepalive_seconds == 0 {
        return Err(err("server.keepalive_seconds", "must be greater than 0"));
    }
    if raw.store.path.trim().is_empty() {
        return Err(err("store.path", "must not be empty"));
    }

    let mut backends = BTreeMap::new();
    let mut upstreams = BTreeMap::new();
    for (name, b) in raw.backends {
        let at = |k: &str| format!("backends.{name}.{k}");
        match b.kind.as_str() {
            "app-server" => {
                backends.insert(name.clone(), app_server_backend(&name, b, base)?);
            }
            "openai" => {
                upstreams.insert(name.clone(), upstream_backend(&name, b)?);
            }
            other => {
                return Err(err(
                    at("kind"),
                    format!("unknown backend kind `{other}` (expected `app-server` or `openai`)"),
                ))
            }
        }
    }

    let mut seen = HashSet::new();
    let mut models = Vec::new();
    for (i, m) in raw.models.into_iter().enumerate() {
        let at = |k: &str| format!("models[{i}].{k}");
        if m.id.trim().is_empty() {
            return Err(err(at("id"), "must not be empty"));
        }
        if !seen.insert(m.id.clone()) {
            return Err(err(at("id"), format!("duplicate model id `{}`", m.id)));
        }
        if !backends.contains_key(&m.backend) && !upstreams.contains_key(&m.backend) {
            return Err(err(
                at("backend"),
                format!("no backend named `{}` in [backends]", m.backend),
            ));
        }
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
        let a = m.approvals;
        models.push(ModelConfig {
            id: m.id,
            backend: m.backend,
            backend_model: m.backend_model,
            approvals: ApprovalPolicy {
                command: a.command.unwrap_or(Decision::Deny),
                file_change: a.file_change.unwrap_or(Decision::Deny),
                permissions: a.permissions.unwrap_or(Decision::Deny),
                elicitation: a.elicitation.unwrap_or(Decision::Deny),
            },
            approval_policy: m.approval_policy,
            sandbox: m.sandbox,
        });
    }

    let jwt_issuers = jwt_issuers(raw.auth.jwt, base, read)?;

    let mut ids = HashSet::new();
    let mut digests = HashSet::new();
    let mut subjects = HashSet::new();
    let mut clients = Vec::new();
    for (i, c) in raw.clients.into_iter().enumerate() {
        let at = |k: &str| format!("clients[{i}].{k}");
        if c.id.trim().is_empty() {
            return Err(err(at("id"), "must not be empty"));
        }
        if c.id.starts_with(jwt::PRINCIPAL_PREFIX) {
            return Err(err(
                at("id"),
                format!(
                    "`{}` ids are reserved for JWT subjects",
                    jwt::PRINCIPAL_PREFIX
                ),
            ));
        }
        if !ids.insert(c.id.clone()) {
            return Err(err(at("id"), format!("duplicate client id `{}`", c.id)));
        }
        let credential =
            match (c.key_sha256, c.jwt) {
                (Some(_), Some(_)) => {
                    return Err(err(at("jwt"), "set either key_sha256 or jwt, not both"))
                }
                (None, None) => return Err(err(
                    at("key_sha256"),
                    "missing: set key_sha256 (an API key's digest) or jwt = { issuer, subject }",
                )),
                (Some(hex_text), None) => {
                    let key_digest = parse_digest(&hex_text).ok_or_else(|| {
                        err(at("key_sha256"), "expected 64 hex characters (a SHA-256)")
                    })?;
                    if !digests.insert(key_digest) {
                        return Err(err(
                            at("key_sha256"),
                            "the same key digest is already used by another client",
                        ));
                    }
                    Credential::Key(key_digest)
                }
                (None, Some(j)) => {
                    if !jwt_issuers.iter().any(|x| x.issuer == j.issuer) {
                        return Err(err(
                            at("jwt.issuer"),
                            format!("no [[auth.jwt]] entry has issuer `{}`", j.issuer),
                        ));
                    }
                    if j.subject.is_empty()
                        || j.subject.len() > jwt::MAX_SUBJECT_BYTES
                        || j.subject.chars().any(char::is_control)
                    {
                        return Err(err(
                            at("jwt.subject"),
                            format!(
                                "must be 1 to {} bytes without control characters",
                                jwt::MAX_SUBJECT_BYTES
                            ),
                        ));
                    }
                    if !subjects.insert((j.issuer.clone(), j.subject.clone())) {
                        return Err(err(
                            at("jwt"),
                            "the same issuer and subject are already named by another client",
                        ));
                    }
                    Credential::Jwt {
                        issuer: j.issuer,
                        subject: j.subject,
                    }
                }
            };
        let models = globs(&c.models, &format!("clients[{i}].models"))?;
        roles(&c.roles, &format!("clients[{i}].roles"))?;
        let limits = limits(
            &format!("clients[{i}]"),
            c.requests_per_minute,
            c.burst,
            c.concurrent_executions,
            c.max_suspended,
        )?;
        clients.push(ClientConfig {
            id: c.id,
            credential,
            models,
            roles: c.roles,
            limits,
        });
    }

    let c = raw.continuations;
    let positive = |v: u64, k: &str| {
        if v == 0 {
            Err(err(format!("continuations.{k}"), "must be greater than 0"))
        } else {
            Ok(())
        }
    };
    positive(c.execution_ttl_seconds, "execution_ttl_seconds")?;
    positive(c.max_pending as u64, "max_pending")?;
    positive(c.max_pending_per_client as u64, "max_pending_per_client")?;
    positive(c.tombstones_per_client as u64, "tombstones_per_client")?;
    positive(c.max_rounds as u64, "max_rounds")?;
    positive(c.max_tool_result_bytes as u64, "max_tool_result_bytes")?;
    if raw.approvals.ttl_seconds == 0 {
        return Err(err("approvals.ttl_seconds", "must be greater than 0"));
    }

    Ok(Config {
        server: ServerConfig {
            listen,
            max_body_bytes: usize::try_from(raw.server.max_body_bytes).unwrap_or(usize::MAX),
            keepalive: Duration::from_secs(raw.server.keepalive_seconds),
        },
        store_path: resolve(base, &raw.store.path),
        jwt: jwt_issuers,
        clients,
        models,
        backends,
        upstreams,
        approval_ttl: Duration::from_secs(raw.approvals.ttl_seconds),
        continuations: ContinuationLimits {
            execution_ttl: Duration::from_secs(c.execution_ttl_seconds),
            max_pending: c.max_pending,
            max_pending_per_client: c.max_pending_per_client,
            tombstones_per_client: c.tombstones_per_client,
            max_rounds: c.max_rounds,
            max_tool_result_bytes: c.max_tool_result_bytes,
            batch_debounce: Duration::from_millis(c.batch_debounce_ms),
        },
    })
}

/// Fails when a key that belongs to the other backend kind is set.
fn reject_keys(name: &str, kind: &str, keys: &[(&str, bool)]) -> Result<(), ConfigError> {
    match keys.iter().find(|(_, set)| *set) {
        Some((k, _)) => Err(err(
            format!("backends.{name}.{k}"),
            format!("not valid for kind `{kind}`"),
        )),
        None => Ok(()),
    }
}

fn app_server_backend(
    name: &str,
    b: RawBackend,
    base: &Path,
) -> Result<BackendConfig, ConfigError> {
    let at = |k: &str| format!("backends.{name}.{k}");
    reject_keys(
        name,
        "app-server",
        &[
            ("base_url", b.base_url.is_some()),
            ("api_key_env", b.api_key_env.is_some()),
            ("connect_timeout_ms", b.connect_timeout_ms.is_some()),
            ("first_byte_timeout_ms", b.first_byte_timeout_ms.is_some()),
            ("idle_timeout_ms", b.idle_timeout_ms.is_some()),
            ("total_timeout_ms", b.total_timeout_ms.is_some()),
            ("max_idle_connections", b.max_idle_connections.is_some()),
        ],
    )?;
    let mut command = b
        .command
        .ok_or_else(|| err(at("command"), "missing: the program to run"))?;
    if command.is_empty() || command[0].trim().is_empty() {
        return Err(err(at("command"), "must name a program"));
    }
    let max_sessions = b.max_sessions.unwrap_or_else(default_max_sessions);
    if max_sessions == 0 {
        return Err(err(at("max_sessions"), "must be greater than 0"));
    }
    let processes = b.processes.unwrap_or_else(default_processes);
    if processes == 0 {
        return Err(err(at("processes"), "must be greater than 0"));
    }
    // A program given as a relative path with a slash is relative to the config's folder;
    // a bare name is looked up on PATH as usual.
    if command[0].contains('/') && !Path::new(&command[0]).is_absolute() {
        command[0] = resolve(base, &command[0]).display().to_string();
    }
    let env = b
        .env
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            if k == "CODEX_HOME" {
                (k, resolve(base, &v).display().to_string())
            } else {
                (k, v)
            }
        })
        .collect();
    Ok(BackendConfig {
        command,
        env,
        cwd: b.cwd.map(|c| resolve(base, &c)),
        max_sessions,
        processes,
        acquire_timeout: Duration::from_millis(
            b.acquire_timeout_ms
                .unwrap_or_else(default_acquire_timeout_ms),
        ),
        reserved_tool_names: b.reserved_tool_names.unwrap_or_default(),
    })
}

fn upstream_backend(name: &str, b: RawBackend) -> Result<UpstreamConfig, ConfigError> {
    let at = |k: &str| format!("backends.{name}.{k}");
    reject_keys(
        name,
        "openai",
        &[
            ("command", b.command.is_some()),
            ("env", b.env.is_some()),
            ("cwd", b.cwd.is_some()),
            ("max_sessions", b.max_sessions.is_some()),
            ("processes", b.processes.is_some()),
            ("acquire_timeout_ms", b.acquire_timeout_ms.is_some()),
            ("reserved_tool_names", b.reserved_tool_names.is_some()),
        ],
    )?;
    let base_url = b
        .base_url
        .ok_or_else(|| err(at("base_url"), "missing: e.g. http://127.0.0.1:8080/v1"))?;
    let parsed = reqwest::Url::parse(&base_url)
        .map_err(|e| err(at("base_url"), format!("not a URL: {e}")))?;
    if !["http", "https"].contains(&parsed.scheme()) {
        return Err(err(at("base_url"), "must be an http or https URL"));
    }
    if let Some(var) = &b.api_key_env {
        if var.is_empty() || var.contains('=') {
            return Err(err(at("api_key_env"), "must name an environment variable"));
        }
    }
    let ms = |v: Option<u64>, default: u64, k: &str| -> Result<Duration, ConfigError> {
        match v.unwrap_or(default) {
            0 => Err(err(at(k), "must be greater than 0")),
            n => Ok(Duration::from_millis(n)),
        }
    };
    Ok(UpstreamConfig {
        base_url: base_url.trim_end_matches('/').to_string(),
        api_key_env: b.api_key_env,
        connect_timeout: ms(b.connect_timeout_ms, 5_000, "connect_timeout_ms")?,
        first_byte_timeout: ms(b.first_byte_timeout_ms, 120_000, "first_byte_timeout_ms")?,
        idle_timeout: ms(b.idle_timeout_ms, 120_000, "idle_timeout_ms")?,
        total_timeout: ms(b.total_timeout_ms, 900_000, "total_timeout_ms")?,
        max_idle_connections: b.max_idle_connections.unwrap_or(64),
    })
}

/// A glob allowlist; errors name `at[j]`.
fn globs(patterns: &[String], at: &str) -> Result<GlobSet, ConfigError> {
    let mut set = GlobSetBuilder::new();
    for (j, pattern) in patterns.iter().enumerate() {
        let glob = Glob::new(pattern)
            .map_err(|e| err(format!("{at}[{j}]"), format!("bad glob `{pattern}`: {e}")))?;
        set.add(glob);
    }
    set.build().map_err(|e| err(at, format!("bad globs: {e}")))
}

fn roles(roles: &[String], at: &str) -> Result<(), ConfigError> {
    for (j, role) in roles.iter().enumerate() {
        if role != "approver" {
            return Err(err(
                format!("{at}[{j}]"),
                format!("unknown role `{role}` (known: approver)"),
            ));
        }
    }
    Ok(())
}

/// The limit keys of a client or issuer entry at `at`.
fn limits(
    at: &str,
    requests_per_minute: Option<u32>,
    burst: Option<u32>,
    concurrent_executions: Option<usize>,
    max_suspended: Option<usize>,
) -> Result<ClientLimits, ConfigError> {
    let positive = "must be greater than 0 (leave it out for no limit)";
    let rate = match (requests_per_minute, burst) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(err(
                format!("{at}.burst"),
                "needs requests_per_minute beside it",
            ))
        }
        (Some(rpm), burst) => {
            let per_minute = NonZeroU32::new(rpm)
                .ok_or_else(|| err(format!("{at}.requests_per_minute"), positive))?;
            let burst = match burst {
                None => per_minute,
                Some(b) => NonZeroU32::new(b)
                    .ok_or_else(|| err(format!("{at}.burst"), "must be greater than 0"))?,
            };
            Some(Rate { per_minute, burst })
        }
    };
    if concurrent_executions == Some(0) {
        return Err(err(format!("{at}.concurrent_executions"), positive));
    }
    if max_suspended == Some(0) {
        return Err(err(format!("{at}.max_suspended"), positive));
    }
    Ok(ClientLimits {
        rate,
        concurrent_executions,
        max_suspended,
    })
}

/// `[[auth.jwt]]`: validates each issuer and reads its key material through `read`.
fn jwt_issuers(
    raw: Vec<RawJwt>,
    base: &Path,
    read: &dyn Fn(&Path) -> std::io::Result<Vec<u8>>,
) -> Result<Vec<Arc<JwtIssuer>>, ConfigError> {
    let mut out: Vec<Arc<JwtIssuer>> = Vec::new();
    for (i, j) in raw.into_iter().enumerate() {
        let at = |k: &str| format!("auth.jwt[{i}].{k}");
        if j.issuer.is_empty() || j.issuer.contains('#') || j.issuer.chars().any(char::is_control) {
            return Err(err(
                at("issuer"),
                "must be non-empty, without `#` or control characters",
            ));
        }
        if out.iter().any(|o| o.issuer == j.issuer) {
            return Err(err(
                at("issuer"),
                format!("duplicate issuer `{}`", j.issuer),
            ));
        }
        if j.audiences.is_empty() {
            return Err(err(at("audiences"), "must name at least one audience"));
        }
        if let Some(k) = j.audiences.iter().position(String::is_empty) {
            return Err(err(
                format!("auth.jwt[{i}].audiences[{k}]"),
                "must not be empty",
            ));
        }
        if j.algorithms.is_empty() {
            return Err(err(
                at("algorithms"),
                "must name at least one algorithm, e.g. [\"RS256\"]",
            ));
        }
        let mut algorithms: Vec<Algorithm> = Vec::new();
        for (k, name) in j.algorithms.iter().enumerate() {
            let alg = jwt::parse_algorithm(name)
                .map_err(|m| err(format!("auth.jwt[{i}].algorithms[{k}]"), m))?;
            if let Some(first) = algorithms.first() {
                if first.family() != alg.family() {
                    return Err(err(
                        format!("auth.jwt[{i}].algorithms[{k}]"),
                        format!(
                            "`{name}` is {} but `{}` is {}: one issuer's algorithms share one key family",
                            jwt::family_name(alg.family()),
                            j.algorithms[0],
                            jwt::family_name(first.family())
                        ),
                    ));
                }
            }
            if !algorithms.contains(&alg) {
                algorithms.push(alg);
            }
        }
        let family = algorithms[0].family();
        let load = |key: &str, file: &str| -> Result<Vec<u8>, ConfigError> {
            let path = resolve(base, file);
            read(&path).map_err(|e| err(at(key), format!("cannot read {}: {e}", path.display())))
        };
        let keys = match (&j.pem_file, &j.jwks_file) {
            (Some(_), Some(_)) => {
                return Err(err(
                    at("jwks_file"),
                    "set either pem_file or jwks_file, not both",
                ))
            }
            (None, None) => {
                return Err(err(
                    at("pem_file"),
                    "missing: set pem_file (a public key PEM) or jwks_file (a JWKS file)",
                ))
            }
            (Some(f), None) => {
                jwt::pem_keys(&load("pem_file", f)?, family).map_err(|m| err(at("pem_file"), m))?
            }
            (None, Some(f)) => jwt::jwks_keys(&load("jwks_file", f)?, family, &algorithms)
                .map_err(|m| err(at("jwks_file"), m))?,
        };
        if j.leeway_seconds > MAX_LEEWAY_SECONDS {
            return Err(err(
                at("leeway_seconds"),
                format!("must be at most {MAX_LEEWAY_SECONDS}"),
            ));
        }
        if let Some(k) = j.require.iter().position(String::is_empty) {
            return Err(err(
                format!("auth.jwt[{i}].require[{k}]"),
                "must not be empty",
            ));
        }
        if j.typ.as_deref() == Some("") {
            return Err(err(
                at("typ"),
                "must not be empty (leave it out to accept any)",
            ));
        }
        let models = globs(&j.models, &format!("auth.jwt[{i}].models"))?;
        roles(&j.roles, &format!("auth.jwt[{i}].roles"))?;
        let limits = limits(
            &format!("auth.jwt[{i}]"),
            j.requests_per_minute,
            j.burst,
            j.concurrent_executions,
            j.max_suspended,
        )?;
        out.push(Arc::new(JwtIssuer {
            issuer: j.issuer,
            audiences: j.audiences,
            algorithms,
            keys,
            leeway_seconds: j.leeway_seconds,
            require: j.require,
            typ: j.typ,
            models,
            roles: j.roles,
            limits,
        }));
    }
    Ok(out)
}

fn parse_digest(hex_text: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(hex_text.trim()).ok()?;
    bytes.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b";

    fn base_toml() -> String {
        format!(
            r#"
[server]
listen = "127.0.0.1:0"
[store]
path = "data/t.db"
[[clients]]
id = "alice"
key_sha256 = "{KEY}"
models = ["demo*"]
[[models]]
id = "demo"
backend = "demo"
approvals = {{ command = "ask" }}
[backends.demo]
kind = "app-server"
command = ["./bin/demo"]
"#
        )
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        from_toml_str(text, Path::new("/etc/turnstile"))
    }

    #[test]
    fn valid_config_resolves_paths_and_defaults() {
        let cfg = parse(&base_toml()).unwrap();
        assert_eq!(cfg.store_path, PathBuf::from("/etc/turnstile/data/t.db"));
        assert_eq!(cfg.backends["demo"].command[0], "/etc/turnstile/./bin/demo");
        assert_eq!(cfg.backends["demo"].max_sessions, 16);
        assert_eq!(cfg.continuations.max_rounds, 32);
        assert_eq!(cfg.models[0].approvals.command, Decision::Ask);
        assert_eq!(cfg.models[0].approvals.file_change, Decision::Deny);
        assert!(cfg.clients[0].may_use("demo-tool"));
        assert!(!cfg.clients[0].may_use("codex"));
    }

    #[test]
    fn unknown_key_names_its_path() {
        let text = base_toml().replace("max_sessions", "x").replace(
            "kind = \"app-server\"",
            "kind = \"app-server\"\nmax_sesions = 3",
        );
        let e = parse(&text).unwrap_err();
        assert!(
            e.path.contains("backends") && e.path.contains("demo"),
            "{e}"
        );
        assert!(e.message.contains("max_sesions"), "{e}");
    }

    #[test]
    fn unknown_nested_key_in_client() {
        let text = base_toml().replace("models = [\"demo*\"]", "models = [\"demo*\"]\nrole = []");
        let e = parse(&text).unwrap_err();
        assert_eq!(e.path, "clients[0].role", "{e}");
    }

    #[test]
    fn missing_backend_is_an_error() {
        let text = base_toml().replace("backend = \"demo\"", "backend = \"nope\"");
        let e = parse(&text).unwrap_err();
        assert_eq!(e.path, "models[0].backend");
    }

    #[test]
    fn duplicate_ids_are_errors() {
        let mut text = base_toml();
        text.push_str("[[models]]\nid = \"demo\"\nbackend = \"demo\"\n");
        assert_eq!(parse(&text).unwrap_err().path, "models[1].id");

        let mut text = base_toml();
        text.push_str(&format!(
            "[[clients]]\nid = \"alice\"\nkey_sha256 = \"{}\"\n",
            "a".repeat(64)
        ));
        assert_eq!(parse(&text).unwrap_err().path, "clients[1].id");
    }

    #[test]
    fn bad_glob_and_bad_digest() {
        let text = base_toml().replace("[\"demo*\"]", "[\"demo\", \"[oops\"]");
        assert_eq!(parse(&text).unwrap_err().path, "clients[0].models[1]");
        let text = base_toml().replace(KEY, "xyz");
        assert_eq!(parse(&text).unwrap_err().path, "clients[0].key_sha256");
    }

    #[test]
    fn bad_enum_value_names_path() {
        let text = base_toml().replace("command = \"ask\"", "command = \"maybe\"");
        let e = parse(&text).unwrap_err();
        assert_eq!(e.path, "models[0].approvals.command", "{e}");
    }

    #[test]
    fn openai_backend_and_kind_specific_keys() {
        let text = base_toml().replace(
            "[backends.demo]",
            "[backends.up]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1/\"\napi_key_env = \"UP_KEY\"\nidle_timeout_ms = 50\n[backends.demo]",
        );
        let cfg = parse(&text).unwrap();
        let up = &cfg.upstreams["up"];
        assert_eq!(up.base_url, "http://127.0.0.1:9/v1");
        assert_eq!(up.idle_timeout, Duration::from_millis(50));
        assert_eq!(up.api_key_env.as_deref(), Some("UP_KEY"));
        let bad = text.replace("idle_timeout_ms = 50", "command = [\"x\"]");
        assert_eq!(parse(&bad).unwrap_err().path, "backends.up.command");
        let bad = base_toml().replace(
            "command = [\"./bin/demo\"]",
            "command = [\"./bin/demo\"]\nbase_url = \"http://x\"",
        );
        assert_eq!(parse(&bad).unwrap_err().path, "backends.demo.base_url");
        let bad = text.replace("http://127.0.0.1:9/v1/", "ftp://x");
        assert_eq!(parse(&bad).unwrap_err().path, "backends.up.base_url");
    }

    #[test]
    fn store_path_that_is_a_folder_fails_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let cfg_path = dir.path().join("t.toml");
        std::fs::create_dir(dir.path().join("data")).unwrap();
        std::fs::create_dir(dir.path().join("data/t.db")).unwrap();
        std::fs::write(&cfg_path, base_toml()).unwrap();
        let e = load(&cfg_path).unwrap_err();
        assert_eq!(e.path, "store.path");
    }

    const PUBLIC: &str = include_str!("../fixtures/jwt/issuer-public.pem");
    const PRIVATE: &str = include_str!("../fixtures/jwt/issuer-private.pem");
    const JWKS: &str = include_str!("../fixtures/jwt/other-jwks.json");

    /// Key files by absolute path, as `load` would read them under `/etc/turnstile`.
    fn files(p: &Path) -> std::io::Result<Vec<u8>> {
        match p.to_str().unwrap_or_default() {
            "/etc/turnstile/keys/idp.pem" => Ok(PUBLIC.into()),
            "/etc/turnstile/keys/private.pem" => Ok(PRIVATE.into()),
            "/keys/jwks.json" => Ok(JWKS.into()),
            _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
        }
    }

    const ISSUER: &str = r#"
[[auth.jwt]]
issuer = "https://idp.test"
audiences = ["turnstile"]
algorithms = ["RS256"]
pem_file = "keys/idp.pem"
"#;

    fn jwt_toml(issuer: &str, client: &str) -> String {
        format!("{}{issuer}{client}", base_toml())
    }

    fn parse_jwt(text: &str) -> Result<Config, ConfigError> {
        from_toml_str_with(text, Path::new("/etc/turnstile"), &files)
    }

    #[test]
    fn jwt_issuer_defaults_and_relative_key_path() {
        let cfg = parse_jwt(&jwt_toml(ISSUER, "")).unwrap();
        let i = &cfg.jwt[0];
        assert_eq!(i.issuer, "https://idp.test");
        assert_eq!(i.leeway_seconds, 30);
        assert_eq!(i.algorithms, vec![Algorithm::RS256]);
        assert!(matches!(i.keys, jwt::Keys::Pem(_)));
        assert!(i.roles.is_empty() && i.require.is_empty() && i.typ.is_none());
        assert_eq!(i.limits, ClientLimits::default());
        // Unnamed subjects get the issuer's defaults: no models unless granted.
        let g = cfg.grant("jwt:https://idp.test#sam").unwrap();
        assert!(!g.may_use("demo") && !g.approver());
        assert!(cfg.grant("jwt:https://other.test#sam").is_none());
        assert!(cfg.grant("alice").unwrap().may_use("demo"));

        let jwks = ISSUER
            .replace("pem_file = \"keys/idp.pem\"", "jwks_file = \"/keys/jwks.json\"")
            .replace("audiences", "models = [\"demo*\"]\nroles = [\"approver\"]\nrequests_per_minute = 60\nburst = 2\nconcurrent_executions = 3\nmax_suspended = 1\naudiences");
        let cfg = parse_jwt(&jwt_toml(&jwks, "")).unwrap();
        let i = &cfg.jwt[0];
        assert!(matches!(&i.keys, jwt::Keys::Jwks(k) if k.len() == 1 && k[0].kid == "other-1"));
        let g = cfg.grant("jwt:https://idp.test#sam").unwrap();
        assert!(g.may_use("demo") && g.approver());
        assert_eq!(g.limits.rate.unwrap().burst.get(), 2);
        assert_eq!(g.limits.rate.unwrap().per_minute.get(), 60);
        assert_eq!(
            (g.limits.concurrent_executions, g.limits.max_suspended),
            (Some(3), Some(1))
        );
        // `from_toml_str` reads no files: the error names the key that needed one.
        let e = from_toml_str(&jwt_toml(ISSUER, ""), Path::new("/etc/turnstile")).unwrap_err();
        assert_eq!(e.path, "auth.jwt[0].pem_file", "{e}");
    }

    #[test]
    fn jwt_issuer_errors_name_their_key_path() {
        const RS: &str = "algorithms = [\"RS256\"]";
        const PEM: &str = "pem_file = \"keys/idp.pem\"";
        const AUD: &str = "audiences = [\"turnstile\"]";
        // Each case: replacements applied to ISSUER, and the key path the error must name.
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[(RS, "algorithms = [\"none\"]")],
                "auth.jwt[0].algorithms[0]",
            ),
            (
                &[(RS, "algorithms = [\"RS256\", \"HS256\"]")],
                "auth.jwt[0].algorithms[1]",
            ),
            (
                &[(RS, "algorithms = [\"RS256\", \"ES256\"]")],
                "auth.jwt[0].algorithms[1]",
            ),
            (
                &[(RS, "algorithms = [\"XX1\"]")],
                "auth.jwt[0].algorithms[0]",
            ),
            (&[(RS, "algorithms = []")], "auth.jwt[0].algorithms"),
            // EC algorithms cannot use an RSA key.
            (&[(RS, "algorithms = [\"ES256\"]")], "auth.jwt[0].pem_file"),
            (&[(AUD, "audiences = []")], "auth.jwt[0].audiences"),
            (&[("idp.test\"", "idp.test#x\"")], "auth.jwt[0].issuer"),
            (&[(PEM, "")], "auth.jwt[0].pem_file"),
            (
                &[(
                    PEM,
                    "pem_file = \"keys/idp.pem\"\njwks_file = \"/keys/jwks.json\"",
                )],
                "auth.jwt[0].jwks_file",
            ),
            (
                &[(PEM, "pem_file = \"keys/missing.pem\"")],
                "auth.jwt[0].pem_file",
            ),
            (
                &[(PEM, "pem_file = \"keys/private.pem\"")],
                "auth.jwt[0].pem_file",
            ),
            (
                &[(PEM, "jwks_file = \"keys/idp.pem\"")],
                "auth.jwt[0].jwks_file",
            ),
            // The JWK says RS256; the issuer allows only PS256.
            (
                &[
                    (PEM, "jwks_file = \"/keys/jwks.json\""),
                    (RS, "algorithms = [\"PS256\"]"),
                ],
                "auth.jwt[0].jwks_file",
            ),
            (
                &[(AUD, "audiences = [\"t\"]\nleeway_seconds = 301")],
                "auth.jwt[0].leeway_seconds",
            ),
            (
                &[(AUD, "audiences = [\"t\"]\nrequire = [\"\"]")],
                "auth.jwt[0].require[0]",
            ),
            (
                &[(AUD, "audiences = [\"t\"]\nleway_seconds = 3")],
                "auth.jwt[0].leway_seconds",
            ),
            (
                &[(AUD, "audiences = [\"t\"]\nroles = [\"admin\"]")],
                "auth.jwt[0].roles[0]",
            ),
            (
                &[(AUD, "audiences = [\"t\"]\nmodels = [\"[x\"]")],
                "auth.jwt[0].models[0]",
            ),
            (
                &[(AUD, "audiences = [\"t\"]\nmax_suspended = 0")],
                "auth.jwt[0].max_suspended",
            ),
        ];
        for (edits, path) in cases {
            let mut issuer = ISSUER.to_string();
            for (from, to) in edits.iter() {
                assert!(issuer.contains(from), "{from}");
                issuer = issuer.replace(from, to);
            }
            let e = parse_jwt(&jwt_toml(&issuer, "")).expect_err(path);
            assert_eq!(e.path, *path, "{edits:?}: {e}");
        }
        let twice = format!("{ISSUER}{ISSUER}");
        assert_eq!(
            parse_jwt(&jwt_toml(&twice, "")).unwrap_err().path,
            "auth.jwt[1].issuer"
        );
    }

    #[test]
    fn clients_name_a_key_or_a_jwt_subject() {
        let jwt_client = "[[clients]]\nid = \"sam\"\njwt = { issuer = \"https://idp.test\", subject = \"sam-1\" }\nrequests_per_minute = 10\n";
        let cfg = parse_jwt(&jwt_toml(ISSUER, jwt_client)).unwrap();
        let sam = cfg.jwt_client("https://idp.test", "sam-1").unwrap();
        assert_eq!(sam.id, "sam");
        assert_eq!(
            sam.credential,
            Credential::Jwt {
                issuer: "https://idp.test".into(),
                subject: "sam-1".into()
            }
        );
        assert_eq!(
            sam.limits.rate.unwrap().burst.get(),
            10,
            "burst defaults to the rate"
        );
        assert!(cfg.grant("sam").unwrap().may_use("demo"));

        let key = format!("key_sha256 = \"{KEY}\"\n");
        let cases: Vec<(String, &str)> = vec![
            (
                jwt_client.replace("jwt =", &format!("{key}jwt =")),
                "clients[1].jwt",
            ),
            (
                jwt_client.replace(
                    "jwt = { issuer = \"https://idp.test\", subject = \"sam-1\" }\n",
                    "",
                ),
                "clients[1].key_sha256",
            ),
            (
                jwt_client.replace("idp.test\"", "nope.test\""),
                "clients[1].jwt.issuer",
            ),
            (
                jwt_client.replace("\"sam-1\"", "\"\""),
                "clients[1].jwt.subject",
            ),
            (
                jwt_client.replace(" }", ", tenant = \"x\" }"),
                "clients[1].jwt.tenant",
            ),
            (
                jwt_client.replace("id = \"sam\"", "id = \"jwt:sam\""),
                "clients[1].id",
            ),
            (
                format!("{jwt_client}{}", jwt_client.replace("\"sam\"", "\"sam2\"")),
                "clients[2].jwt",
            ),
            (
                jwt_client.replace("= 10", "= 0"),
                "clients[1].requests_per_minute",
            ),
            (
                jwt_client.replace("requests_per_minute", "burst"),
                "clients[1].burst",
            ),
            (
                jwt_client.replace("requests_per_minute = 10", "concurrent_executions = 0"),
                "clients[1].concurrent_executions",
            ),
        ];
        for (client, path) in cases {
            let e = parse_jwt(&jwt_toml(ISSUER, &client)).expect_err(path);
            assert_eq!(e.path, path, "{client}: {e}");
        }
    }
}
