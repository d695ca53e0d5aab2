//! `[store]` and `[cluster]`: where the durable store lives, and how a replica finds and
//! trusts the others. Secrets (the database password, the cluster key) are never in the file:
//! it names the environment variables that hold them, read when the gateway starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{err, resolve, ConfigError};

/// `store.path`, relative to the config's folder.
pub(super) const DEFAULT_STORE_PATH: &str = "data/turnstile.db";
/// `cluster.lease_seconds`.
const DEFAULT_LEASE_SECONDS: u64 = 10;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawStore {
    pub path: Option<String>,
    pub url: Option<String>,
    pub password_env: Option<String>,
    pub pool_size: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCluster {
    pub replica_id: String,
    pub internal_listen: String,
    pub advertise_url: Option<String>,
    pub key_env: String,
    #[serde(default = "default_lease")]
    pub lease_seconds: u64,
}

fn default_lease() -> u64 {
    DEFAULT_LEASE_SECONDS
}

/// Where the store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// Embedded SQLite (the default): one gateway.
    Sqlite { path: PathBuf },
    /// PostgreSQL, which replicas share. The URL holds no password. `pool_size`: the most
    /// connections one process opens (default: four per CPU).
    Postgres {
        url: String,
        password_env: Option<String>,
        pool_size: usize,
    },
}

/// `[cluster]`: this replica among others on one PostgreSQL store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    pub replica_id: String,
    pub internal_listen: SocketAddr,
    /// Where the others reach this replica's internal listener; None: its bound address.
    pub advertise_url: Option<String>,
    pub key_env: String,
    pub lease: Duration,
}

fn env_name(key: &str, v: &str) -> Result<(), ConfigError> {
    let ok = !v.is_empty()
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !v.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(err(key, "must name an environment variable"))
    }
}

pub(super) fn store(raw: RawStore, base: &Path) -> Result<StoreConfig, ConfigError> {
    match (raw.path, raw.url) {
        (Some(_), Some(_)) => Err(err(
            "store",
            "set `path` (SQLite) or `url` (PostgreSQL), not both",
        )),
        (path, None) => {
            if raw.password_env.is_some() {
                return Err(err("store.password_env", "only applies with `store.url`"));
            }
            if raw.pool_size.is_some() {
                return Err(err(
                    "store.pool_size",
                    "only applies with `store.url` (SQLite is one connection)",
                ));
            }
            let path = path.unwrap_or_else(|| DEFAULT_STORE_PATH.into());
            if path.trim().is_empty() {
                return Err(err("store.path", "must not be empty"));
            }
            Ok(StoreConfig::Sqlite {
                path: resolve(base, &path),
            })
        }
        (None, Some(url)) => {
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return Err(err("store.url", "must be a postgres:// URL"));
            }
            let parsed: tokio_postgres::Config = url
                .parse()
                .map_err(|e| err("store.url", format!("is not a PostgreSQL URL: {e}")))?;
            if parsed.get_password().is_some() {
                return Err(err(
                    "store.url",
                    "must not hold a password; name the environment variable that holds it in `store.password_env`",
                ));
            }
            if let Some(v) = &raw.password_env {
                env_name("store.password_env", v)?;
            }
            let pool_size = match raw.pool_size {
                Some(n) if !(1..=1024).contains(&n) => {
                    return Err(err("store.pool_size", "must be between 1 and 1024"))
                }
                Some(n) => n,
                None => crate::store::default_pool_size(),
            };
            Ok(StoreConfig::Postgres {
                url,
                password_env: raw.password_env,
                pool_size,
            })
        }
    }
}

pub(super) fn cluster(
    raw: Option<RawCluster>,
    store: &StoreConfig,
) -> Result<Option<ClusterConfig>, ConfigError> {
    let Some(c) = raw else { return Ok(None) };
    if !matches!(store, StoreConfig::Postgres { .. }) {
        return Err(err(
            "cluster",
            "replicas share their state in PostgreSQL: set `store.url`",
        ));
    }
    let id_ok = (1..=64).contains(&c.replica_id.len())
        && c.replica_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !id_ok {
        return Err(err(
            "cluster.replica_id",
            "must be 1 to 64 letters, digits, `-` or `_`",
        ));
    }
    let internal_listen: SocketAddr = c.internal_listen.parse().map_err(|_| {
        err(
            "cluster.internal_listen",
            format!("`{}` is not an IP:PORT address", c.internal_listen),
        )
    })?;
    if let Some(u) = &c.advertise_url {
        let ok = u
            .strip_prefix("http://")
            .or_else(|| u.strip_prefix("https://"))
            .is_some_and(|rest| !rest.is_empty() && !rest.contains(['?', '#']));
        if !ok {
            return Err(err(
                "cluster.advertise_url",
                "must be an http:// or https:// URL",
            ));
        }
    }
    env_name("cluster.key_env", &c.key_env)?;
    if c.lease_seconds == 0 {
        return Err(err("cluster.lease_seconds", "must be greater than 0"));
    }
    Ok(Some(ClusterConfig {
        replica_id: c.replica_id,
        internal_listen,
        advertise_url: c.advertise_url.map(|u| u.trim_end_matches('/').to_string()),
        key_env: c.key_env,
        lease: Duration::from_secs(c.lease_seconds),
    }))
}
