//! `[backends.NAME]`: one section per backend, its `kind` choosing which keys it takes.
//!
//! Each kind is its own `deny_unknown_fields` struct, so a key of the other kind is refused by
//! serde. An internally tagged enum is read as a whole before its tag is known, and serde then
//! reports its errors at the section (`backends.NAME`); [`section_error`] re-reads that one
//! section to name the key, and words a key of the other kind or an unknown `kind` as before.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use serde_path_to_error::{Path as KeyPath, Segment};

use super::raw::{
    DEFAULT_ACQUIRE_TIMEOUT_MS, DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_FIRST_BYTE_TIMEOUT_MS,
    DEFAULT_IDLE_TIMEOUT_MS, DEFAULT_MAX_IDLE_CONNECTIONS, DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_SESSIONS, DEFAULT_PROCESSES, DEFAULT_RECYCLE_AFTER_THREADS,
    DEFAULT_TOTAL_TIMEOUT_MS,
};
use super::{err, resolve, BackendConfig, ConfigError, UpstreamConfig};

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

#[derive(Debug, Deserialize)]
#[serde(tag = "kind")]
pub(super) enum RawBackend {
    #[serde(rename = "app-server")]
    AppServer(RawAppServer),
    #[serde(rename = "openai")]
    OpenAi(RawOpenAi),
}

/// `kind = "app-server"`: a pool of stateful agent processes speaking JSON-RPC on stdio.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAppServer {
    pub command: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub env_passthrough: Option<Vec<String>>,
    pub cwd: Option<String>,
    pub max_sessions: Option<usize>,
    pub processes: Option<usize>,
    pub acquire_timeout_ms: Option<u64>,
    pub reserved_tool_names: Option<Vec<String>>,
    pub recycle_after_threads: Option<u64>,
}

/// `kind = "openai"`: a stateless OpenAI-compatible HTTP upstream.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOpenAi {
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

/// The validated sections, by kind.
#[derive(Debug, Default)]
pub(super) struct Backends {
    /// `kind = "app-server"`, [`super::Config::backends`].
    pub app_servers: BTreeMap<String, BackendConfig>,
    /// `kind = "openai"`, [`super::Config::upstreams`].
    pub upstreams: BTreeMap<String, UpstreamConfig>,
}

impl Backends {
    pub fn contains(&self, name: &str) -> bool {
        self.app_servers.contains_key(name) || self.upstreams.contains_key(name)
    }
}

/// Validates every section, in name order.
pub(super) fn backends(
    raw: BTreeMap<String, RawBackend>,
    base: &Path,
) -> Result<Backends, ConfigError> {
    let mut out = Backends::default();
    for (name, b) in raw {
        match b {
            RawBackend::AppServer(b) => {
                let backend = app_server_backend(&name, b, base)?;
                out.app_servers.insert(name, backend);
            }
            RawBackend::OpenAi(b) => {
                let upstream = upstream_backend(&name, b, base)?;
                out.upstreams.insert(name, upstream);
            }
        }
    }
    Ok(out)
}

fn app_server_backend(
    name: &str,
    b: RawAppServer,
    base: &Path,
) -> Result<BackendConfig, ConfigError> {
    let at = |k: &str| format!("backends.{name}.{k}");
    let mut command = b
        .command
        .ok_or_else(|| err(at("command"), "missing: the program to run"))?;
    if command.is_empty() || command[0].trim().is_empty() {
        return Err(err(at("command"), "must name a program"));
    }
    let max_sessions = b.max_sessions.unwrap_or(DEFAULT_MAX_SESSIONS);
    if max_sessions == 0 {
        return Err(err(at("max_sessions"), "must be greater than 0"));
    }
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
    let mut passthrough: Vec<String> = DEFAULT_ENV_PASSTHROUGH
        .iter()
        .map(|v| v.to_string())
        .collect();
    for (i, v) in b
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
    Ok(BackendConfig {
        command,
        env,
        env_passthrough: passthrough,
        cwd: b.cwd.map(|c| resolve(base, &c)),
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

fn upstream_backend(name: &str, b: RawOpenAi, base: &Path) -> Result<UpstreamConfig, ConfigError> {
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

/// When serde failed at `backends.NAME` or `backends.NAME.kind` (`path`), the error of that
/// section read alone from `text`, with the key path it lost. None when the failure is not
/// in a backend section or the section alone shows nothing more precise (a missing `kind`, a
/// section that is not a table): the caller keeps serde's error.
pub(super) fn section_error(text: &str, path: &KeyPath) -> Option<ConfigError> {
    let name = match path.iter().collect::<Vec<_>>()[..] {
        [Segment::Map { key: b }, Segment::Map { key: name }] if b == "backends" => name,
        [Segment::Map { key: b }, Segment::Map { key: name }, Segment::Map { key: k }]
            if b == "backends" && k == "kind" =>
        {
            name
        }
        _ => return None,
    };
    let mut doc: toml::Table = text.parse().ok()?;
    let toml::Value::Table(mut sections) = doc.remove("backends")? else {
        return None;
    };
    let toml::Value::Table(mut section) = sections.remove(name.as_str())? else {
        return None;
    };
    let at = |k: &str| format!("backends.{name}.{k}");
    let kind = match String::deserialize(section.remove("kind")?) {
        Ok(kind) => kind,
        Err(e) => return Some(err(at("kind"), e.message())),
    };
    let section = toml::Value::Table(section);
    let (inner, other) = match kind.as_str() {
        "app-server" => (
            serde_path_to_error::deserialize::<_, RawAppServer>(section).err()?,
            keys_of::<RawOpenAi>(),
        ),
        "openai" => (
            serde_path_to_error::deserialize::<_, RawOpenAi>(section).err()?,
            keys_of::<RawAppServer>(),
        ),
        other => {
            return Some(err(
                at("kind"),
                format!("unknown backend kind `{other}` (expected `app-server` or `openai`)"),
            ))
        }
    };
    let segments: Vec<_> = inner.path().iter().collect();
    // A key of the other kind is worded as such rather than as an unknown field.
    if let [Segment::Map { key: k }] = segments[..] {
        if other.contains(&k.as_str()) {
            return Some(err(at(k), format!("not valid for kind `{kind}`")));
        }
    }
    let path = match segments.is_empty() {
        true => format!("backends.{name}"),
        false => at(&inner.path().to_string()),
    };
    Some(err(path, inner.into_inner().message()))
}

/// The keys the derived `Deserialize` of struct `T` accepts: it names them to the
/// deserializer, and this one only records them.
fn keys_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Keys<'a>(&'a Cell<&'static [&'static str]>);
    impl<'de> Deserializer<'de> for Keys<'_> {
        type Error = de::value::Error;
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            self.0.set(fields);
            Err(de::Error::custom("keys only"))
        }
        fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let keys = Cell::new(&[][..]);
    let _ = T::deserialize(Keys(&keys));
    keys.get()
}
