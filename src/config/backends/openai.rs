//! `kind = "openai"`: a stateless OpenAI-compatible HTTP upstream.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::super::raw::{
    DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_FIRST_BYTE_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS,
    DEFAULT_MAX_IDLE_CONNECTIONS, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_TOTAL_TIMEOUT_MS,
};
use super::super::{err, resolve, ConfigError};
use super::Kind;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::config) struct RawOpenAi {
    pub base_url: Option<String>,
    pub api_key_env: Option<String>,
    pub connect_timeout_ms: Option<u64>,
    pub first_byte_timeout_ms: Option<u64>,
    pub idle_timeout_ms: Option<u64>,
    pub total_timeout_ms: Option<u64>,
    pub max_idle_connections: Option<usize>,
    pub max_response_bytes: Option<u64>,
    pub ca_file: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// Base URL ending before `/chat/completions` (e.g. `http://127.0.0.1:8080/v1`).
    pub base_url: String,
    /// Environment variable holding the upstream key (never the key itself).
    pub api_key_env: Option<String>,
    /// PEM certificates trusted for this upstream besides the platform's roots (a private CA).
    pub ca_file: Option<PathBuf>,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
    pub total_timeout: Duration,
    pub max_idle_connections: usize,
    /// The bound of a non-streamed answer and of an error body (over it: `upstream_error`).
    pub max_response_bytes: usize,
}

impl Kind for UpstreamConfig {
    type Raw = RawOpenAi;

    fn validate(name: &str, b: RawOpenAi, base: &Path) -> Result<Self, ConfigError> {
        validate(name, b, base)
    }
}

fn validate(name: &str, b: RawOpenAi, base: &Path) -> Result<UpstreamConfig, ConfigError> {
    let at = |k: &str| format!("backends.{name}.{k}");
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
    let ca_file = match b.ca_file {
        None => None,
        Some(f) => {
            let path = resolve(base, &f);
            let pem = std::fs::read(&path).map_err(|e| {
                err(
                    at("ca_file"),
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            match reqwest::Certificate::from_pem_bundle(&pem) {
                Ok(certs) if !certs.is_empty() => {}
                _ => {
                    return Err(err(
                        at("ca_file"),
                        format!("{} holds no PEM certificate", path.display()),
                    ))
                }
            }
            Some(path)
        }
    };
    Ok(UpstreamConfig {
        base_url: base_url.trim_end_matches('/').to_string(),
        api_key_env: b.api_key_env,
        ca_file,
        connect_timeout: ms(
            b.connect_timeout_ms,
            DEFAULT_CONNECT_TIMEOUT_MS,
            "connect_timeout_ms",
        )?,
        first_byte_timeout: ms(
            b.first_byte_timeout_ms,
            DEFAULT_FIRST_BYTE_TIMEOUT_MS,
            "first_byte_timeout_ms",
        )?,
        idle_timeout: ms(
            b.idle_timeout_ms,
            DEFAULT_IDLE_TIMEOUT_MS,
            "idle_timeout_ms",
        )?,
        total_timeout: ms(
            b.total_timeout_ms,
            DEFAULT_TOTAL_TIMEOUT_MS,
            "total_timeout_ms",
        )?,
        max_idle_connections: b
            .max_idle_connections
            .unwrap_or(DEFAULT_MAX_IDLE_CONNECTIONS),
        max_response_bytes: match b.max_response_bytes {
            Some(0) => return Err(err(at("max_response_bytes"), "must be greater than 0")),
            n => n.unwrap_or(DEFAULT_MAX_RESPONSE_BYTES) as usize,
        },
    })
}
