//! `[[webhooks]]`: the endpoints notifications are delivered to. The signing secrets are never
//! in the file: `secret_env` (and, while rotating, `previous_secret_env`) names the variable
//! that holds one, read when the gateway starts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use globset::GlobSet;
use serde::Deserialize;

use super::{err, ConfigError};

/// The events an endpoint may subscribe to: the gateway's, then the Managed Agents API's
/// session events (Anthropic's names and shapes).
pub const EVENTS: [&str; 13] = [
    "approval.pending",
    "approval.decided",
    "turn.requires_action",
    "execution.failed",
    "execution.ended",
    "budget.threshold",
    "session.created",
    "session.running",
    "session.idled",
    "session.requires_action",
    "session.budget_reached",
    "session.status_terminated",
    "session.deleted",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWebhook {
    pub id: String,
    pub url: String,
    pub secret_env: String,
    #[serde(default)]
    pub previous_secret_env: Option<String>,
    #[serde(default)]
    pub events: Option<Vec<String>>,
    #[serde(default)]
    pub principals: Option<Vec<String>>,
    #[serde(default)]
    pub format: Option<String>,
    #[serde(default)]
    pub ca_file: Option<String>,
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    #[serde(default)]
    pub retry_hours: Option<u64>,
}

/// How a body is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookFormat {
    /// `{"type", "timestamp", "data"}`, as the Standard Webhooks specification suggests.
    Standard,
    /// A Slack Block Kit message.
    Slack,
}

#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub id: String,
    pub url: String,
    pub secret_env: String,
    pub previous_secret_env: Option<String>,
    /// Subscribed events (all of [`EVENTS`] when the key is absent).
    pub events: Vec<&'static str>,
    /// Whose events (None: everyone's).
    pub principals: Option<GlobSet>,
    pub format: WebhookFormat,
    pub ca_file: Option<PathBuf>,
    /// One attempt's bound (connect, send, answer).
    pub timeout: Duration,
    /// How long an event is retried before it is dead-lettered.
    pub retry_for: Duration,
}

impl PartialEq for WebhookConfig {
    fn eq(&self, o: &Self) -> bool {
        (self.id == o.id) && self.url == o.url && self.events == o.events
    }
}

impl WebhookConfig {
    pub fn subscribes(&self, event: &str, principal: &str) -> bool {
        self.events.contains(&event)
            && self
                .principals
                .as_ref()
                .is_none_or(|p| p.is_match(principal))
    }

    /// The variables holding this endpoint's secrets, current first.
    pub fn secret_envs(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.secret_env.as_str()).chain(self.previous_secret_env.as_deref())
    }
}

pub(super) fn webhooks(
    raw: Vec<RawWebhook>,
    base: &Path,
) -> Result<Vec<WebhookConfig>, ConfigError> {
    let mut out: Vec<WebhookConfig> = Vec::with_capacity(raw.len());
    for (i, w) in raw.into_iter().enumerate() {
        let at = |k: &str| format!("webhooks[{i}].{k}");
        let valid_id = !w.id.is_empty()
            && w.id.len() <= 64
            && w.id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid_id {
            return Err(err(at("id"), "must be 1 to 64 letters, digits, `-` or `_`"));
        }
        if out.iter().any(|o| o.id == w.id) {
            return Err(err(at("id"), format!("`{}` is used twice", w.id)));
        }
        let uri: ::http::Uri = w.url.parse().map_err(|_| err(at("url"), "is not a URL"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(err(at("url"), "must be an http:// or https:// URL"));
        }
        for (k, v) in [
            ("secret_env", Some(&w.secret_env)),
            ("previous_secret_env", w.previous_secret_env.as_ref()),
        ] {
            if v.is_some_and(|v| v.is_empty()) {
                return Err(err(at(k), "must name a variable"));
            }
        }
        let events = match w.events {
            None => EVENTS.to_vec(),
            Some(names) => {
                let mut events = Vec::new();
                for (j, name) in names.iter().enumerate() {
                    let Some(known) = EVENTS.iter().find(|e| **e == name) else {
                        return Err(err(
                            format!("webhooks[{i}].events[{j}]"),
                            format!("unknown event `{name}` (known: {})", EVENTS.join(", ")),
                        ));
                    };
                    events.push(*known);
                }
                if events.is_empty() {
                    return Err(err(at("events"), "must name at least one event"));
                }
                events
            }
        };
        let principals = w
            .principals
            .map(|p| super::validate::globs(&p, &at("principals")))
            .transpose()?;
        let format = match w.format.as_deref() {
            None | Some("standard") => WebhookFormat::Standard,
            Some("slack") => WebhookFormat::Slack,
            Some(other) => {
                return Err(err(
                    at("format"),
                    format!("unknown format `{other}` (known: standard, slack)"),
                ))
            }
        };
        let ca_file = match w.ca_file {
            None => None,
            Some(f) => {
                let path = super::resolve(base, &f);
                let pem = std::fs::read(&path).map_err(|e| {
                    err(
                        at("ca_file"),
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                if !matches!(reqwest::Certificate::from_pem_bundle(&pem), Ok(c) if !c.is_empty()) {
                    return Err(err(
                        at("ca_file"),
                        format!("{} holds no PEM certificate", path.display()),
                    ));
                }
                Some(path)
            }
        };
        let timeout = match w.timeout_seconds.unwrap_or(10) {
            0 => return Err(err(at("timeout_seconds"), "must be greater than 0")),
            n => Duration::from_secs(n.min(300)),
        };
        let retry_for = match w.retry_hours.unwrap_or(24) {
            0 => return Err(err(at("retry_hours"), "must be greater than 0")),
            n => Duration::from_secs(n.min(24 * 30) * 3600),
        };
        out.push(WebhookConfig {
            id: w.id,
            url: w.url,
            secret_env: w.secret_env,
            previous_secret_env: w.previous_secret_env,
            events,
            principals,
            format,
            ca_file,
            timeout,
            retry_for,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{base_toml, parse};

    fn with(extra: &str) -> String {
        format!("{}\n{extra}", base_toml())
    }

    #[test]
    fn an_endpoint_defaults_to_every_event_of_everyone_in_the_standard_format() {
        let cfg = parse(&with(
            "[[webhooks]]\nid = \"ops\"\nurl = \"https://hooks.example.com/t\"\nsecret_env = \"OPS_SECRET\"\n",
        ))
        .unwrap();
        let w = &cfg.webhooks[0];
        assert_eq!(w.events.len(), super::EVENTS.len());
        assert!(w.subscribes("approval.pending", "anyone"));
        assert_eq!(w.format, super::WebhookFormat::Standard);
        assert_eq!(w.retry_for.as_secs(), 24 * 3600);
    }

    #[test]
    fn events_and_principals_filter_and_bad_values_name_their_key() {
        let cfg = parse(&with(
            "[[webhooks]]\nid = \"ops\"\nurl = \"http://127.0.0.1:9/t\"\nsecret_env = \"S\"\nevents = [\"approval.pending\"]\nprincipals = [\"alice\", \"jwt:https://idp.example.com#*\"]\nformat = \"slack\"\n",
        ))
        .unwrap();
        let w = &cfg.webhooks[0];
        assert!(w.subscribes("approval.pending", "jwt:https://idp.example.com#u1"));
        assert!(!w.subscribes("approval.pending", "bob"));
        assert!(!w.subscribes("approval.decided", "alice"));
        let bad = [
            ("id = \"o p\"", "webhooks[0].id"),
            ("url = \"ftp://x\"", "webhooks[0].url"),
            ("events = [\"nope\"]", "webhooks[0].events[0]"),
            ("format = \"teams\"", "webhooks[0].format"),
            ("secret_env = \"\"", "webhooks[0].secret_env"),
        ];
        for (line, path) in bad {
            let key = line.split(' ').next().unwrap_or_default();
            let mut fields = vec![
                "id = \"ops\"".to_string(),
                "url = \"http://127.0.0.1:9/t\"".into(),
                "secret_env = \"S\"".into(),
            ];
            fields.retain(|f| !f.starts_with(&format!("{key} ")));
            fields.push(line.into());
            let e = parse(&with(&format!("[[webhooks]]\n{}\n", fields.join("\n")))).unwrap_err();
            assert_eq!(e.path, path, "{line}");
        }
    }

    #[test]
    fn a_signing_secret_is_never_passed_to_a_backend() {
        let toml = with("[[webhooks]]\nid = \"ops\"\nurl = \"http://127.0.0.1:9/t\"\nsecret_env = \"OPS_SECRET\"\n")
            .replace(
                "command = [\"./bin/demo\"]",
                "command = [\"./bin/demo\"]\nenv_passthrough = [\"OPS_SECRET\"]",
            );
        assert_eq!(
            parse(&toml).unwrap_err().path,
            "backends.demo.env_passthrough"
        );
    }
}
