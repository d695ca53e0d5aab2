//! `validate()`: the raw file -> the frozen [`Config`], checking what serde cannot (ranges,
//! references between sections, duplicates) and naming the key path of the first failure.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use globset::{Glob, GlobSet, GlobSetBuilder};

use super::raw::{
    RawClient, RawConfig, RawContinuations, RawContinuity, RawGroup, RawModel, DEFAULT_DECISION,
};
use super::{
    backends, err, jwt, ApprovalPolicy, ClientConfig, ClientLimits, CompactionLimits, Config,
    ConfigError, ContinuationLimits, ContinuityConfig, Credential, GroupConfig, JwtIssuer,
    ModelConfig, Rate, Role, ServerConfig,
};
use crate::auth::grant::{Models, GROUP_PREFIX, MAX_GROUP_NAME_BYTES};
use crate::auth::jwt::{MAX_SUBJECT_BYTES, PRINCIPAL_PREFIX};
use crate::budget::{Budget, Price};

pub(super) fn validate(
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
    for (key, value) in [
        ("server.keepalive_seconds", raw.server.keepalive_seconds),
        (
            "server.header_read_timeout_seconds",
            raw.server.header_read_timeout_seconds,
        ),
        (
            "server.body_read_timeout_seconds",
            raw.server.body_read_timeout_seconds,
        ),
        ("server.max_connections", raw.server.max_connections),
        (
            "server.shutdown_drain_seconds",
            raw.server.shutdown_drain_seconds,
        ),
        (
            "server.websocket_idle_timeout_seconds",
            raw.server.websocket_idle_timeout_seconds,
        ),
        (
            "server.websocket_ping_seconds",
            raw.server.websocket_ping_seconds,
        ),
    ] {
        if value == 0 {
            return Err(err(key, "must be greater than 0"));
        }
    }
    let max_streams_per_client = match raw.server.max_streams_per_client {
        Some(0) => {
            return Err(err(
                "server.max_streams_per_client",
                "must be greater than 0",
            ))
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => usize::try_from(raw.server.max_connections / 4)
            .unwrap_or(usize::MAX)
            .max(1),
    };
    let store = super::cluster::store(raw.store, base)?;
    let cluster = super::cluster::cluster(raw.cluster, &store)?;

    let mcp_bridge: SocketAddr = raw.mcp_bridge.listen.parse().map_err(|_| {
        err(
            "mcp_bridge.listen",
            format!("`{}` is not an address (host:port)", raw.mcp_bridge.listen),
        )
    })?;
    if !mcp_bridge.ip().is_loopback() {
        return Err(err(
            "mcp_bridge.listen",
            "must be a loopback address: only the gateway's own agents reach the bridge",
        ));
    }
    let mut backends = backends::backends(raw.backends, base)?;
    for spec in backends.values_mut() {
        spec.set_mcp_bridge(mcp_bridge);
    }
    let webhooks = super::webhooks::webhooks(raw.webhooks, base)?;
    let public_url = match raw.server.public_url.clone() {
        None => None,
        Some(u) => {
            let uri: ::http::Uri = u
                .parse()
                .map_err(|_| err("server.public_url", "is not a URL"))?;
            let plain = uri.query().is_none() && matches!(uri.path(), "" | "/");
            if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() || !plain
            {
                return Err(err(
                    "server.public_url",
                    "must be an http:// or https:// URL without a path or query",
                ));
            }
            Some(u.trim_end_matches('/').to_string())
        }
    };
    // The store password, the cluster key and the signing secrets are the gateway's alone.
    let mut secrets = vec![
        match &store {
            super::StoreConfig::Postgres { password_env, .. } => password_env.clone(),
            _ => None,
        },
        cluster.as_ref().map(|c| c.key_env.clone()),
        raw.telemetry.headers_env.clone(),
    ];
    secrets.extend(
        webhooks
            .iter()
            .flat_map(|w| w.secret_envs().map(|e| Some(e.to_string()))),
    );
    secrets.extend((raw.auth.oidc.iter()).map(|o| o.client_secret_env.clone()));
    for (name, child) in backends.iter().filter_map(|(n, b)| Some((n, b.child()?))) {
        for secret in secrets.iter().flatten() {
            if child.env_passthrough.contains(secret) {
                return Err(err(
                    format!("backends.{name}.env_passthrough"),
                    format!("must not pass `{secret}` (the gateway's own secret) to a backend"),
                ));
            }
        }
    }
    let models = models(raw.models, &backends)?;
    let jwt_issuers = jwt::jwt_issuers(raw.auth.jwt, raw.auth.oidc, base, read)?;
    let clients = clients(raw.clients, &jwt_issuers)?;
    let groups = groups(raw.groups)?;
    let continuations = continuations(raw.continuations)?;
    let continuity = continuity(raw.continuity)?;
    let managed_agents = super::managed::managed_agents(raw.managed_agents, base)?;
    let telemetry = super::telemetry::telemetry(raw.telemetry)?;
    if raw.approvals.ttl_seconds == 0 {
        return Err(err("approvals.ttl_seconds", "must be greater than 0"));
    }

    Ok(Config {
        server: ServerConfig {
            listen,
            max_body_bytes: usize::try_from(raw.server.max_body_bytes).unwrap_or(usize::MAX),
            keepalive: Duration::from_secs(raw.server.keepalive_seconds),
            header_read_timeout: Duration::from_secs(raw.server.header_read_timeout_seconds),
            body_read_timeout: Duration::from_secs(raw.server.body_read_timeout_seconds),
            max_connections: usize::try_from(raw.server.max_connections).unwrap_or(usize::MAX),
            max_streams_per_client,
            shutdown_drain: Duration::from_secs(raw.server.shutdown_drain_seconds),
            websocket_idle_timeout: Duration::from_secs(raw.server.websocket_idle_timeout_seconds),
            websocket_ping: Duration::from_secs(raw.server.websocket_ping_seconds),
            public_url,
        },
        store,
        cluster,
        jwt: jwt_issuers,
        clients,
        groups,
        models,
        backends,
        approval_ttl: Duration::from_secs(raw.approvals.ttl_seconds),
        continuations,
        continuity,
        managed_agents,
        webhooks,
        console_api_key_sign_in: raw.console.api_key_sign_in,
        telemetry,
    })
}

fn continuity(c: RawContinuity) -> Result<ContinuityConfig, ConfigError> {
    if c.idle_ttl_seconds == 0 {
        return Err(err("continuity.idle_ttl_seconds", "must be greater than 0"));
    }
    // A bound of 0 keeps nothing: the same as `enabled = false`.
    Ok(ContinuityConfig {
        enabled: c.enabled && c.max_idle > 0 && c.max_idle_per_client > 0,
        idle_ttl: Duration::from_secs(c.idle_ttl_seconds),
        max_idle_per_client: c.max_idle_per_client,
        max_idle: c.max_idle,
    })
}

/// `[[models]]`, each on one of `backends`, which validates the settings only it reads.
fn models(
    raw: Vec<RawModel>,
    backends: &BTreeMap<String, super::BackendSpec>,
) -> Result<Vec<ModelConfig>, ConfigError> {
    let mut seen = HashSet::new();
    let mut models = Vec::new();
    for (i, m) in raw.into_iter().enumerate() {
        let at = |k: &str| format!("models[{i}].{k}");
        if m.id.trim().is_empty() {
            return Err(err(at("id"), "must not be empty"));
        }
        if !seen.insert(m.id.clone()) {
            return Err(err(at("id"), format!("duplicate model id `{}`", m.id)));
        }
        let Some(backend) = backends.get(&m.backend) else {
            return Err(err(
                at("backend"),
                format!("no backend named `{}` in [backends]", m.backend),
            ));
        };
        let codex = backend.codex_thread(&at, &m)?;
        let price = m
            .price
            .as_ref()
            .map(|p| price(&at("price"), p))
            .transpose()?;
        let a = m.approvals;
        models.push(ModelConfig {
            id: m.id.into(),
            backend: m.backend,
            backend_model: m.backend_model,
            approvals: ApprovalPolicy {
                command: a.command.unwrap_or(DEFAULT_DECISION),
                file_change: a.file_change.unwrap_or(DEFAULT_DECISION),
                permissions: a.permissions.unwrap_or(DEFAULT_DECISION),
                elicitation: a.elicitation.unwrap_or(DEFAULT_DECISION),
            },
            codex,
            price,
        });
    }
    Ok(models)
}

/// A USD amount at `at.key`: finite and not negative.
fn dollars(at: &str, key: &str, v: Option<f64>) -> Result<Option<u64>, ConfigError> {
    match v {
        Some(v) if !(0.0..=1e9).contains(&v) => Err(err(
            format!("{at}.{key}"),
            "must be a number of USD from 0 to 1e9",
        )),
        v => Ok(v.map(crate::budget::nanos)),
    }
}

/// A model's `price`. Cached reads and cache writes cost the uncached input price unless
/// priced themselves.
fn price(at: &str, p: &super::raw::RawPrice) -> Result<Price, ConfigError> {
    let input = dollars(at, "input_per_mtok", p.input_per_mtok)?.unwrap_or(0);
    Ok(Price {
        input,
        cached_input: dollars(at, "cached_input_per_mtok", p.cached_input_per_mtok)?
            .unwrap_or(input),
        cache_write: dollars(at, "cache_write_per_mtok", p.cache_write_per_mtok)?.unwrap_or(input),
        output: dollars(at, "output_per_mtok", p.output_per_mtok)?.unwrap_or(0),
    })
}

/// A client's or issuer's `budget`: each cap greater than 0.
fn budget(at: &str, b: &super::raw::RawBudget) -> Result<Budget, ConfigError> {
    let cap = |key: &str, v: Option<u64>| match v {
        Some(0) => Err(err(
            format!("{at}.{key}"),
            "must be greater than 0 (leave it out for no cap)",
        )),
        v => Ok(v),
    };
    Ok(Budget {
        usd_per_day: cap("usd_per_day", dollars(at, "usd_per_day", b.usd_per_day)?)?,
        usd_per_month: cap(
            "usd_per_month",
            dollars(at, "usd_per_month", b.usd_per_month)?,
        )?,
        tokens_per_day: cap("tokens_per_day", b.tokens_per_day)?,
        usd_per_execution: cap(
            "usd_per_execution",
            dollars(at, "usd_per_execution", b.usd_per_execution)?,
        )?,
    })
}

/// `[[clients]]`, after the issuers their `jwt` credentials name.
fn clients(
    raw: Vec<RawClient>,
    jwt_issuers: &[std::sync::Arc<JwtIssuer>],
) -> Result<Vec<ClientConfig>, ConfigError> {
    let mut ids = HashSet::new();
    let mut digests = HashSet::new();
    let mut subjects = HashSet::new();
    let mut clients = Vec::new();
    for (i, c) in raw.into_iter().enumerate() {
        let at = |k: &str| format!("clients[{i}].{k}");
        if c.id.trim().is_empty() {
            return Err(err(at("id"), "must not be empty"));
        }
        if c.id.starts_with(PRINCIPAL_PREFIX) {
            return Err(err(
                at("id"),
                format!("`{PRINCIPAL_PREFIX}` ids are reserved for JWT subjects"),
            ));
        }
        if c.id.starts_with(GROUP_PREFIX) {
            return Err(err(
                at("id"),
                format!("`{GROUP_PREFIX}` ids are reserved for group budgets"),
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
                        || j.subject.len() > MAX_SUBJECT_BYTES
                        || j.subject.chars().any(char::is_control)
                    {
                        return Err(err(
                            at("jwt.subject"),
                            format!(
                                "must be 1 to {MAX_SUBJECT_BYTES} bytes without control characters"
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
        let models = models_allowed(&c.models, &format!("clients[{i}].models"))?;
        let roles = roles(&c.roles, &format!("clients[{i}].roles"))?;
        let limits = limits(
            &format!("clients[{i}]"),
            c.requests_per_minute,
            c.burst,
            c.concurrent_executions,
            c.max_suspended,
            c.max_streams,
            c.budget.as_ref(),
        )?;
        clients.push(ClientConfig {
            id: c.id.into(),
            credential,
            models,
            roles,
            limits,
        });
    }
    Ok(clients)
}

/// `[[groups]]`: each name once, 1 to [`MAX_GROUP_NAME_BYTES`] bytes without control
/// characters (what a token's groups claim is matched against, exactly).
fn groups(raw: Vec<RawGroup>) -> Result<Vec<GroupConfig>, ConfigError> {
    let mut out: Vec<GroupConfig> = Vec::new();
    for (i, g) in raw.into_iter().enumerate() {
        let at = format!("groups[{i}]");
        if g.name.is_empty()
            || g.name.len() > MAX_GROUP_NAME_BYTES
            || g.name.chars().any(char::is_control)
        {
            return Err(err(
                format!("{at}.name"),
                format!("must be 1 to {MAX_GROUP_NAME_BYTES} bytes without control characters"),
            ));
        }
        if out.iter().any(|o| o.name == g.name) {
            return Err(err(
                format!("{at}.name"),
                format!("duplicate group `{}`", g.name),
            ));
        }
        let limits = limits(
            &at,
            g.requests_per_minute,
            g.burst,
            g.concurrent_executions,
            g.max_suspended,
            g.max_streams,
            g.budget.as_ref(),
        )?;
        out.push(GroupConfig {
            models: models_allowed(&g.models, &format!("{at}.models"))?,
            roles: roles(&g.roles, &format!("{at}.roles"))?,
            name: g.name,
            limits,
        });
    }
    Ok(out)
}

fn continuations(c: RawContinuations) -> Result<ContinuationLimits, ConfigError> {
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
    positive(c.max_kept_bytes_per_client, "max_kept_bytes_per_client")?;
    positive(c.compaction_ttl_days, "compaction_ttl_days")?;
    positive(c.max_compaction_items as u64, "max_compaction_items")?;
    positive(
        c.max_compactions_per_client as u64,
        "max_compactions_per_client",
    )?;
    positive(
        c.max_compaction_bytes_per_client,
        "max_compaction_bytes_per_client",
    )?;
    positive(c.max_summary_bytes as u64, "max_summary_bytes")?;
    positive(c.tombstones_per_client as u64, "tombstones_per_client")?;
    positive(c.max_rounds as u64, "max_rounds")?;
    positive(c.max_tool_result_bytes as u64, "max_tool_result_bytes")?;
    Ok(ContinuationLimits {
        execution_ttl: Duration::from_secs(c.execution_ttl_seconds),
        max_pending: c.max_pending,
        max_pending_per_client: c.max_pending_per_client,
        max_kept_bytes_per_client: usize::try_from(c.max_kept_bytes_per_client)
            .unwrap_or(usize::MAX),
        compaction_ttl: Duration::from_secs(c.compaction_ttl_days.saturating_mul(86_400)),
        compactions: CompactionLimits {
            max_items: c.max_compaction_items,
            max_per_client: c.max_compactions_per_client,
            max_bytes_per_client: c.max_compaction_bytes_per_client,
            max_summary_bytes: c.max_summary_bytes,
        },
        tombstones_per_client: c.tombstones_per_client,
        max_rounds: c.max_rounds,
        max_tool_result_bytes: c.max_tool_result_bytes,
        batch_debounce: Duration::from_millis(c.batch_debounce_ms),
    })
}

/// A glob allowlist; errors name `at[j]`.
pub(super) fn globs(patterns: &[String], at: &str) -> Result<GlobSet, ConfigError> {
    let mut set = GlobSetBuilder::new();
    for (j, pattern) in patterns.iter().enumerate() {
        let glob = Glob::new(pattern)
            .map_err(|e| err(format!("{at}[{j}]"), format!("bad glob `{pattern}`: {e}")))?;
        set.add(glob);
    }
    set.build().map_err(|e| err(at, format!("bad globs: {e}")))
}

/// A model allowlist; errors name `at[j]`.
pub(super) fn models_allowed(patterns: &[String], at: &str) -> Result<Models, ConfigError> {
    Ok(Models::new(globs(patterns, at)?, patterns))
}

/// A roles list; errors name `at[j]`.
pub(super) fn roles(names: &[String], at: &str) -> Result<Vec<Role>, ConfigError> {
    names
        .iter()
        .enumerate()
        .map(|(j, name)| {
            Role::from_name(name).ok_or_else(|| {
                err(
                    format!("{at}[{j}]"),
                    format!("unknown role `{name}` (known: approver)"),
                )
            })
        })
        .collect()
}

/// The limit keys of a client or issuer entry at `at`.
pub(super) fn limits(
    at: &str,
    requests_per_minute: Option<u32>,
    burst: Option<u32>,
    concurrent_executions: Option<usize>,
    max_suspended: Option<usize>,
    max_streams: Option<usize>,
    raw_budget: Option<&super::raw::RawBudget>,
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
    if max_streams == Some(0) {
        return Err(err(
            format!("{at}.max_streams"),
            "must be greater than 0 (leave it out for server.max_streams_per_client)",
        ));
    }
    let budget = match raw_budget {
        Some(b) => budget(&format!("{at}.budget"), b)?,
        None => Budget::default(),
    };
    Ok(ClientLimits {
        rate,
        concurrent_executions,
        max_suspended,
        max_streams,
        budget,
    })
}

fn parse_digest(hex_text: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(hex_text.trim()).ok()?;
    bytes.try_into().ok()
}
