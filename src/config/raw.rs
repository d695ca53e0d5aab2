//! The file as the administrator writes it, and every default, in one place.
//!
//! Every struct is `deny_unknown_fields`, so a misspelt key is an error naming its path. A
//! section whose keys are all optional is `#[serde(default)]` with a `Default` built from the
//! `DEFAULT_*` consts below. `[backends.NAME]` sections are [`super::backends::RawBackend`].

use std::collections::BTreeMap;

use serde::Deserialize;

use super::backends::RawBackend;
use super::cluster::{RawCluster, RawStore};
use super::Decision;

// ---------- defaults ----------

/// `server.listen`.
pub(super) const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
/// `server.max_body_bytes`.
pub(super) const DEFAULT_MAX_BODY_BYTES: u64 = 16 * 1024 * 1024;
/// `server.keepalive_seconds`.
pub(super) const DEFAULT_KEEPALIVE_SECONDS: u64 = 5;
/// `server.header_read_timeout_seconds`: a request's head must arrive within this.
pub(super) const DEFAULT_HEADER_READ_TIMEOUT_SECONDS: u64 = 10;
/// `server.body_read_timeout_seconds`: a request's body must arrive within this.
pub(super) const DEFAULT_BODY_READ_TIMEOUT_SECONDS: u64 = 30;
/// `server.max_connections`: open client connections; more wait in the listen backlog.
pub(super) const DEFAULT_MAX_CONNECTIONS: u64 = 1024;
/// `server.shutdown_drain_seconds`: how long open responses may finish after a signal.
pub(super) const DEFAULT_SHUTDOWN_DRAIN_SECONDS: u64 = 10;
/// `server.websocket_idle_timeout_seconds`: a Responses WebSocket with no message either way
/// for this long is closed (a held turn is not affected).
pub(super) const DEFAULT_WEBSOCKET_IDLE_TIMEOUT_SECONDS: u64 = 300;
/// `server.websocket_ping_seconds`: a Responses WebSocket is pinged this often; one that has
/// answered nothing for two intervals is closed.
pub(super) const DEFAULT_WEBSOCKET_PING_SECONDS: u64 = 30;

/// `clients[N].models`: every model.
pub(super) const DEFAULT_CLIENT_MODELS: &[&str] = &["*"];
/// `auth.jwt[N].leeway_seconds`.
pub(super) const DEFAULT_LEEWAY_SECONDS: u64 = 30;

/// `mcp_bridge.listen`: loopback, a port of the system's choosing.
pub(super) const DEFAULT_MCP_BRIDGE_LISTEN: &str = "127.0.0.1:0";

/// `models[N].approvals.*`: a side effect policy does not mention is refused.
pub(super) const DEFAULT_DECISION: Decision = Decision::Deny;

/// `backends.NAME.max_sessions` (`kind = "app-server"`).
pub(super) const DEFAULT_MAX_SESSIONS: usize = 16;
/// `backends.NAME.processes` (`kind = "app-server"`).
pub(super) const DEFAULT_PROCESSES: usize = 1;
/// `backends.NAME.acquire_timeout_ms` (`kind = "app-server"`).
pub(super) const DEFAULT_ACQUIRE_TIMEOUT_MS: u64 = 3_000;

/// `backends.NAME.connect_timeout_ms` (`kind = "openai"`).
pub(super) const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5_000;
/// `backends.NAME.first_byte_timeout_ms` (`kind = "openai"`).
pub(super) const DEFAULT_FIRST_BYTE_TIMEOUT_MS: u64 = 120_000;
/// `backends.NAME.idle_timeout_ms` (`kind = "openai"`).
pub(super) const DEFAULT_IDLE_TIMEOUT_MS: u64 = 120_000;
/// `backends.NAME.total_timeout_ms` (`kind = "openai"`).
pub(super) const DEFAULT_TOTAL_TIMEOUT_MS: u64 = 900_000;
/// `backends.NAME.max_idle_connections` (`kind = "openai"`).
pub(super) const DEFAULT_MAX_IDLE_CONNECTIONS: usize = 64;
/// `backends.NAME.max_response_bytes` (`kind = "openai"`): the bound of a non-streamed answer
/// and of an error body.
pub(super) const DEFAULT_MAX_RESPONSE_BYTES: u64 = 64 << 20;

/// `backends.NAME.recycle_after_threads` (`kind = "app-server"`): measured on Codex 0.169.0,
/// a thread that is not unloaded costs about 1 MiB, and under concurrent load most deleted
/// threads stay loaded until the process exits; 24 keeps a process within ~30 MiB of a
/// fresh one, and two (one draining) within ~128 MiB of one.
pub(super) const DEFAULT_RECYCLE_AFTER_THREADS: u64 = 24;

/// `continuity.*`.
pub(super) const DEFAULT_CONTINUITY_ENABLED: bool = true;
pub(super) const DEFAULT_IDLE_TTL_SECONDS: u64 = 600;
pub(super) const DEFAULT_MAX_IDLE_PER_CLIENT: usize = 4;
pub(super) const DEFAULT_MAX_IDLE: usize = 256;

/// `approvals.ttl_seconds`.
pub(super) const DEFAULT_APPROVAL_TTL_SECONDS: u64 = 900;

/// `continuations.execution_ttl_seconds`.
pub(super) const DEFAULT_EXECUTION_TTL_SECONDS: u64 = 900;
/// `continuations.max_pending`.
pub(super) const DEFAULT_MAX_PENDING: usize = 4096;
/// `continuations.max_pending_per_client`.
pub(super) const DEFAULT_MAX_PENDING_PER_CLIENT: usize = 64;
/// `continuations.max_kept_bytes_per_client`: conversations a principal's suspensions keep
/// in memory (a stateless upstream's, on the Responses surface).
pub(super) const DEFAULT_MAX_KEPT_BYTES_PER_CLIENT: u64 = 64 << 20;
/// `continuations.compaction_ttl_days`: how long a remote compaction's summary answers its
/// handle.
pub(super) const DEFAULT_COMPACTION_TTL_DAYS: u64 = 30;
/// `continuations.max_compaction_items`: compaction items one request may carry (Codex
/// sends one: a compaction summarises the earlier one with everything else).
pub(super) const DEFAULT_MAX_COMPACTION_ITEMS: usize = 1;
/// `continuations.max_compactions_per_client`: stored summaries one principal keeps (its
/// oldest go first).
pub(super) const DEFAULT_MAX_COMPACTIONS_PER_CLIENT: usize = 64;
/// `continuations.max_compaction_bytes_per_client`: bytes of stored summaries one principal
/// keeps (its oldest go first).
pub(super) const DEFAULT_MAX_COMPACTION_BYTES_PER_CLIENT: u64 = 16 << 20;
/// `continuations.max_summary_bytes`: a compaction summary longer than this is cut.
pub(super) const DEFAULT_MAX_SUMMARY_BYTES: usize = 1 << 20;
/// `continuations.tombstones_per_client`.
pub(super) const DEFAULT_TOMBSTONES_PER_CLIENT: usize = 1024;
/// `continuations.max_rounds`.
pub(super) const DEFAULT_MAX_ROUNDS: u32 = 32;
/// `continuations.max_tool_result_bytes`.
pub(super) const DEFAULT_MAX_TOOL_RESULT_BYTES: usize = 4 * 1024 * 1024;
/// `continuations.batch_debounce_ms`.
pub(super) const DEFAULT_BATCH_DEBOUNCE_MS: u64 = 25;

fn default_client_models() -> Vec<String> {
    DEFAULT_CLIENT_MODELS
        .iter()
        .map(|m| m.to_string())
        .collect()
}

fn default_leeway_seconds() -> u64 {
    DEFAULT_LEEWAY_SECONDS
}

fn default_oidc_algorithms() -> Vec<String> {
    vec!["RS256".into()]
}

/// `auth.oidc[N].refresh_seconds`: the provider's keys are fetched again this often.
pub(super) const DEFAULT_OIDC_REFRESH_SECONDS: u64 = 3600;
/// `auth.oidc[N].max_key_age_seconds`: keys not refreshed for this long verify nothing.
pub(super) const DEFAULT_OIDC_MAX_KEY_AGE_SECONDS: u64 = 86_400;

fn default_oidc_scopes() -> Vec<String> {
    vec!["openid".into(), "offline_access".into()]
}

fn default_token_ttl_seconds() -> u64 {
    900
}

fn default_session_ttl_seconds() -> u64 {
    7 * 86_400
}

fn default_oidc_refresh_seconds() -> u64 {
    DEFAULT_OIDC_REFRESH_SECONDS
}

fn default_oidc_max_key_age_seconds() -> u64 {
    DEFAULT_OIDC_MAX_KEY_AGE_SECONDS
}

// ---------- sections ----------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub cluster: Option<RawCluster>,
    #[serde(default)]
    pub auth: RawAuth,
    #[serde(default)]
    pub clients: Vec<RawClient>,
    #[serde(default)]
    pub groups: Vec<RawGroup>,
    #[serde(default)]
    pub models: Vec<RawModel>,
    #[serde(default)]
    pub backends: BTreeMap<String, RawBackend>,
    #[serde(default)]
    pub approvals: RawApprovals,
    #[serde(default)]
    pub continuations: RawContinuations,
    #[serde(default)]
    pub continuity: RawContinuity,
    #[serde(default)]
    pub managed_agents: super::managed::RawManagedAgents,
    #[serde(default)]
    pub mcp_bridge: RawMcpBridge,
    #[serde(default)]
    pub telemetry: super::telemetry::RawTelemetry,
    #[serde(default)]
    pub webhooks: Vec<super::webhooks::RawWebhook>,
    #[serde(default)]
    pub console: RawConsole,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawServer {
    pub listen: String,
    pub max_body_bytes: u64,
    pub keepalive_seconds: u64,
    pub header_read_timeout_seconds: u64,
    pub body_read_timeout_seconds: u64,
    pub max_connections: u64,
    /// Default: a quarter of `max_connections` (at least 1).
    pub max_streams_per_client: Option<u64>,
    pub shutdown_drain_seconds: u64,
    pub websocket_idle_timeout_seconds: u64,
    pub websocket_ping_seconds: u64,
    /// The gateway's URL as people reach it (decision links point there).
    pub public_url: Option<String>,
}

impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            listen: DEFAULT_LISTEN.into(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            keepalive_seconds: DEFAULT_KEEPALIVE_SECONDS,
            header_read_timeout_seconds: DEFAULT_HEADER_READ_TIMEOUT_SECONDS,
            body_read_timeout_seconds: DEFAULT_BODY_READ_TIMEOUT_SECONDS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_streams_per_client: None,
            shutdown_drain_seconds: DEFAULT_SHUTDOWN_DRAIN_SECONDS,
            websocket_idle_timeout_seconds: DEFAULT_WEBSOCKET_IDLE_TIMEOUT_SECONDS,
            websocket_ping_seconds: DEFAULT_WEBSOCKET_PING_SECONDS,
            public_url: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClient {
    pub id: String,
    /// Exactly one of `key_sha256` and `jwt`.
    pub key_sha256: Option<String>,
    pub jwt: Option<RawClientJwt>,
    #[serde(default = "default_client_models")]
    pub models: Vec<String>,
    #[serde(default)]
    pub roles: Vec<String>,
    pub requests_per_minute: Option<u32>,
    pub burst: Option<u32>,
    pub concurrent_executions: Option<usize>,
    pub max_suspended: Option<usize>,
    pub max_streams: Option<usize>,
    pub budget: Option<RawBudget>,
}

/// One `[[groups]]` entry: what members of an identity provider's group get, on top of their
/// own entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGroup {
    pub name: String,
    #[serde(default)]
    pub models: Vec<String>,
    #[serde(default)]
    pub roles: Vec<String>,
    pub requests_per_minute: Option<u32>,
    pub burst: Option<u32>,
    pub concurrent_executions: Option<usize>,
    pub max_suspended: Option<usize>,
    pub max_streams: Option<usize>,
    pub budget: Option<RawBudget>,
}

/// `budget = { … }` of a client entry or an issuer: USD and tokens, every key optional.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBudget {
    pub usd_per_day: Option<f64>,
    pub usd_per_month: Option<f64>,
    pub tokens_per_day: Option<u64>,
    pub usd_per_execution: Option<f64>,
}

/// `price = { … }` of a model: USD per million tokens, every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPrice {
    pub input_per_mtok: Option<f64>,
    pub cached_input_per_mtok: Option<f64>,
    pub cache_write_per_mtok: Option<f64>,
    pub output_per_mtok: Option<f64>,
}

/// A JWT principal named by a client entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClientJwt {
    pub issuer: String,
    pub subject: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAuth {
    #[serde(default)]
    pub jwt: Vec<RawJwt>,
    #[serde(default)]
    pub oidc: Vec<RawOidc>,
}

/// One OpenID provider whose keys are found by discovery: what `[[auth.jwt]]` takes, with the
/// key files replaced by where and how often to fetch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOidc {
    pub issuer: String,
    pub audiences: Vec<String>,
    #[serde(default = "default_oidc_algorithms")]
    pub algorithms: Vec<String>,
    pub ca_file: Option<String>,
    #[serde(default = "default_oidc_refresh_seconds")]
    pub refresh_seconds: u64,
    #[serde(default = "default_oidc_max_key_age_seconds")]
    pub max_key_age_seconds: u64,
    /// Sign-in through the provider (the gateway as its OAuth client): none without it.
    pub client_id: Option<String>,
    pub client_secret_env: Option<String>,
    #[serde(default = "default_oidc_scopes")]
    pub scopes: Vec<String>,
    #[serde(default = "default_token_ttl_seconds")]
    pub token_ttl_seconds: u64,
    #[serde(default = "default_session_ttl_seconds")]
    pub session_ttl_seconds: u64,
    #[serde(default = "default_leeway_seconds")]
    pub leeway_seconds: u64,
    #[serde(default)]
    pub require: Vec<String>,
    pub typ: Option<String>,
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    #[serde(default)]
    pub models: Vec<String>,
    #[serde(default)]
    pub roles: Vec<String>,
    pub requests_per_minute: Option<u32>,
    pub burst: Option<u32>,
    pub concurrent_executions: Option<usize>,
    pub max_suspended: Option<usize>,
    pub max_streams: Option<usize>,
    pub budget: Option<RawBudget>,
}

impl RawOidc {
    /// The `[[auth.jwt]]` rules it shares, without key files.
    pub fn rules(&self) -> RawJwt {
        RawJwt {
            issuer: self.issuer.clone(),
            audiences: self.audiences.clone(),
            algorithms: self.algorithms.clone(),
            pem_file: None,
            jwks_file: None,
            leeway_seconds: self.leeway_seconds,
            require: self.require.clone(),
            typ: self.typ.clone(),
            groups_claim: self.groups_claim.clone(),
            models: self.models.clone(),
            roles: self.roles.clone(),
            requests_per_minute: self.requests_per_minute,
            burst: self.burst,
            concurrent_executions: self.concurrent_executions,
            max_suspended: self.max_suspended,
            max_streams: self.max_streams,
            budget: self.budget.clone(),
        }
    }
}

/// One trusted JWT issuer. (The limit keys are spelled out rather than flattened:
/// `deny_unknown_fields` does not work with `flatten`.)
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJwt {
    pub issuer: String,
    pub audiences: Vec<String>,
    pub algorithms: Vec<String>,
    pub pem_file: Option<String>,
    pub jwks_file: Option<String>,
    #[serde(default = "default_leeway_seconds")]
    pub leeway_seconds: u64,
    #[serde(default)]
    pub require: Vec<String>,
    pub typ: Option<String>,
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    #[serde(default)]
    pub models: Vec<String>,
    #[serde(default)]
    pub roles: Vec<String>,
    pub requests_per_minute: Option<u32>,
    pub burst: Option<u32>,
    pub concurrent_executions: Option<usize>,
    pub max_suspended: Option<usize>,
    pub max_streams: Option<usize>,
    pub budget: Option<RawBudget>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    pub id: String,
    pub backend: String,
    pub backend_model: Option<String>,
    #[serde(default)]
    pub approvals: RawApprovalPolicy,
    pub approval_policy: Option<String>,
    pub sandbox: Option<String>,
    pub price: Option<RawPrice>,
}

/// `None` is [`DEFAULT_DECISION`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawApprovalPolicy {
    pub command: Option<Decision>,
    pub file_change: Option<Decision>,
    pub permissions: Option<Decision>,
    pub elicitation: Option<Decision>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawApprovals {
    pub ttl_seconds: u64,
}

impl Default for RawApprovals {
    fn default() -> Self {
        RawApprovals {
            ttl_seconds: DEFAULT_APPROVAL_TTL_SECONDS,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawContinuations {
    pub execution_ttl_seconds: u64,
    pub max_pending: usize,
    pub max_pending_per_client: usize,
    pub max_kept_bytes_per_client: u64,
    pub compaction_ttl_days: u64,
    pub max_compaction_items: usize,
    pub max_compactions_per_client: usize,
    pub max_compaction_bytes_per_client: u64,
    pub max_summary_bytes: usize,
    pub tombstones_per_client: usize,
    pub max_rounds: u32,
    pub max_tool_result_bytes: usize,
    pub batch_debounce_ms: u64,
}

impl Default for RawContinuations {
    fn default() -> Self {
        RawContinuations {
            execution_ttl_seconds: DEFAULT_EXECUTION_TTL_SECONDS,
            max_pending: DEFAULT_MAX_PENDING,
            max_pending_per_client: DEFAULT_MAX_PENDING_PER_CLIENT,
            max_kept_bytes_per_client: DEFAULT_MAX_KEPT_BYTES_PER_CLIENT,
            compaction_ttl_days: DEFAULT_COMPACTION_TTL_DAYS,
            max_compaction_items: DEFAULT_MAX_COMPACTION_ITEMS,
            max_compactions_per_client: DEFAULT_MAX_COMPACTIONS_PER_CLIENT,
            max_compaction_bytes_per_client: DEFAULT_MAX_COMPACTION_BYTES_PER_CLIENT,
            max_summary_bytes: DEFAULT_MAX_SUMMARY_BYTES,
            tombstones_per_client: DEFAULT_TOMBSTONES_PER_CLIENT,
            max_rounds: DEFAULT_MAX_ROUNDS,
            max_tool_result_bytes: DEFAULT_MAX_TOOL_RESULT_BYTES,
            batch_debounce_ms: DEFAULT_BATCH_DEBOUNCE_MS,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawContinuity {
    pub enabled: bool,
    pub idle_ttl_seconds: u64,
    pub max_idle_per_client: usize,
    pub max_idle: usize,
}

impl Default for RawContinuity {
    fn default() -> Self {
        RawContinuity {
            enabled: DEFAULT_CONTINUITY_ENABLED,
            idle_ttl_seconds: DEFAULT_IDLE_TTL_SECONDS,
            max_idle_per_client: DEFAULT_MAX_IDLE_PER_CLIENT,
            max_idle: DEFAULT_MAX_IDLE,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawMcpBridge {
    pub listen: String,
}

impl Default for RawMcpBridge {
    fn default() -> Self {
        RawMcpBridge {
            listen: DEFAULT_MCP_BRIDGE_LISTEN.into(),
        }
    }
}

fn default_groups_claim() -> String {
    "groups".into()
}

/// `[console]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConsole {
    /// The console offers signing in with a pasted API key or JWT (besides any provider).
    #[serde(default = "yes")]
    pub api_key_sign_in: bool,
}

impl Default for RawConsole {
    fn default() -> Self {
        RawConsole {
            api_key_sign_in: true,
        }
    }
}

fn yes() -> bool {
    true
}
