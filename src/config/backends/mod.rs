//! `[backends.NAME]`: one section per backend, its `kind` choosing which keys it takes. Each
//! kind is a file here: its raw section (a `deny_unknown_fields` struct, so a key of another
//! kind is refused by serde), its validated config and its validator ([`Kind`]).
//! [`BackendSpec`] is the frozen result, one variant per kind; `crate::backend::build` turns
//! it into a running backend. A new kind is a file here, a row of [`kinds!`] and its arm in
//! `backend::build`.
//!
//! An internally tagged enum is read as a whole before its tag is known, and serde then
//! reports its errors at the section (`backends.NAME`); [`section_error`] re-reads that one
//! section to name the key, and words a key of another kind or an unknown `kind` as such.

mod agent;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::Path;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use serde_path_to_error::{Path as KeyPath, Segment};

use super::raw::RawModel;
use super::{err, ConfigError};

pub use agent::{AgentConfig, ChildConfig, DEFAULT_ENV_PASSTHROUGH};
pub use app_server::CodexThread;

/// What a kind's file gives: its raw section and how it is validated, and its child process
/// (an agent kind's).
pub(in crate::config) trait Kind: Sized {
    type Raw: serde::de::DeserializeOwned;
    fn validate(name: &str, raw: Self::Raw, base: &Path) -> Result<Self, ConfigError>;
    fn child(&self) -> Option<&ChildConfig> {
        None
    }
}

/// Declares the kinds, one row each (the variant, the file and its validated config, the
/// `kind` value): the raw section enum, [`BackendSpec`], [`KINDS`], `kind()`, `child()`
/// and the validation are generated from these rows alone.
macro_rules! kinds {
    ($($(#[$doc:meta])* $variant:ident($file:ident::$config:ident) = $kind:literal,)*) => {
        $(mod $file;)*
        $(pub use $file::$config;)*

        #[derive(Debug, Deserialize)]
        #[serde(tag = "kind")]
        pub(super) enum RawBackend {
            $(#[serde(rename = $kind)] $variant(<$config as Kind>::Raw),)*
        }

        /// One validated `[backends.NAME]` section.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum BackendSpec {
            $($(#[$doc])* $variant($config),)*
        }

        /// Every `kind` value, in declaration order.
        pub const KIND_NAMES: &[&str] = &[$($kind,)*];

        const KINDS: &[KindRow] = &[$(KindRow {
            name: $kind,
            keys: keys_of::<<$config as Kind>::Raw>,
            read: read_as::<<$config as Kind>::Raw>,
        },)*];

        impl BackendSpec {
            /// Its `kind` value.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(BackendSpec::$variant(_) => $kind,)*
                }
            }

            /// The child process of an agent kind (None for an HTTP upstream).
            pub fn child(&self) -> Option<&ChildConfig> {
                match self {
                    $(BackendSpec::$variant(c) => c.child(),)*
                }
            }
        }

        /// Validates every section, in name order.
        pub(super) fn backends(
            raw: BTreeMap<String, RawBackend>,
            base: &Path,
        ) -> Result<BTreeMap<String, BackendSpec>, ConfigError> {
            raw.into_iter()
                .map(|(name, b)| {
                    let spec = match b {
                        $(RawBackend::$variant(b) => {
                            BackendSpec::$variant(<$config as Kind>::validate(&name, b, base)?)
                        })*
                    };
                    Ok((name, spec))
                })
                .collect()
        }
    };
}

kinds! {
    /// `kind = "app-server"`: `codex app-server` processes holding turns.
    AppServer(app_server::AppServerConfig) = "app-server",
    /// `kind = "openai"`: a stateless OpenAI-compatible HTTP upstream.
    OpenAi(openai::UpstreamConfig) = "openai",
    /// `kind = "claude-code"`: Claude Code processes holding turns, one per session.
    ClaudeCode(claude_code::ClaudeCodeConfig) = "claude-code",
    /// `kind = "acp"`: Agent Client Protocol agents holding turns, one process per session.
    Acp(acp::AcpConfig) = "acp",
}

/// A kind as [`section_error`] reads it: its `kind` value, the keys its section takes, and
/// its section read alone.
struct KindRow {
    name: &'static str,
    keys: fn() -> &'static [&'static str],
    read: fn(toml::Value) -> Option<serde_path_to_error::Error<toml::de::Error>>,
}

/// The error of reading `section` as a `T`, with its key path.
fn read_as<T: serde::de::DeserializeOwned>(
    section: toml::Value,
) -> Option<serde_path_to_error::Error<toml::de::Error>> {
    serde_path_to_error::deserialize::<_, T>(section).err()
}

impl BackendSpec {
    /// `[mcp_bridge] listen`, for the kinds that serve the client's tools through it.
    pub(super) fn set_mcp_bridge(&mut self, listen: std::net::SocketAddr) {
        if let BackendSpec::Acp(c) = self {
            c.mcp_bridge = listen;
        }
    }

    /// The settings model `models[i]` (`at` builds its key paths) has for this backend: the
    /// Codex thread settings on an app-server backend; elsewhere they are refused.
    pub(super) fn codex_thread(
        &self,
        at: &dyn Fn(&str) -> String,
        m: &RawModel,
    ) -> Result<CodexThread, ConfigError> {
        match self {
            BackendSpec::AppServer(_) => app_server::thread(at, m),
            _ => {
                let set = [
                    ("approval_policy", &m.approval_policy),
                    ("sandbox", &m.sandbox),
                ];
                match set.into_iter().find(|(_, v)| v.is_some()) {
                    Some((key, _)) => Err(err(
                        at(key),
                        format!(
                            "only for a model of a `kind = \"app-server\"` backend (`{}` is `{}`)",
                            m.backend,
                            self.kind()
                        ),
                    )),
                    None => Ok(CodexThread::default()),
                }
            }
        }
    }
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
    let Some(this) = KINDS.iter().find(|k| k.name == kind) else {
        let names: Vec<String> = KINDS.iter().map(|k| format!("`{}`", k.name)).collect();
        let expected = match names.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        return Some(err(
            at("kind"),
            format!("unknown backend kind `{kind}` (expected {expected})"),
        ));
    };
    let inner = (this.read)(toml::Value::Table(section))?;
    let segments: Vec<_> = inner.path().iter().collect();
    // A key of another kind is worded as such rather than as an unknown field.
    if let [Segment::Map { key: k }] = segments[..] {
        let other = KINDS.iter().filter(|o| o.name != this.name);
        if other.flat_map(|o| (o.keys)()).any(|o| o == k) && !(this.keys)().contains(&k.as_str()) {
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
