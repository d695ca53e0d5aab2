//! `[telemetry]`: where traces go. Off unless `otlp_endpoint` is set. The export headers (a
//! collector's API key) are never in the file: `headers_env` names the variable that holds
//! them, read when the gateway starts.

use serde::Deserialize;

use super::{err, ConfigError};

/// `telemetry.service_name`.
const DEFAULT_SERVICE_NAME: &str = "turnstile";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawTelemetry {
    pub otlp_endpoint: Option<String>,
    pub service_name: Option<String>,
    pub sample_ratio: Option<f64>,
    pub headers_env: Option<String>,
}

/// Traces exported over OTLP/HTTP (protobuf).
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// The collector's traces URL: as given when it has a path, else with `/v1/traces`.
    pub traces_url: String,
    pub service_name: String,
    /// Of the traces that start here, the share kept (0 to 1). A client's `traceparent`
    /// decides for the traces it starts.
    pub sample_ratio: f64,
    /// The variable holding extra export headers (`name=value,name=value`).
    pub headers_env: Option<String>,
}

pub(super) fn telemetry(raw: RawTelemetry) -> Result<Option<TelemetryConfig>, ConfigError> {
    let ratio = raw.sample_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&ratio) {
        return Err(err("telemetry.sample_ratio", "must be between 0 and 1"));
    }
    let service_name = raw
        .service_name
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.into());
    if service_name.trim().is_empty() {
        return Err(err("telemetry.service_name", "must not be empty"));
    }
    if raw.headers_env.as_deref().is_some_and(str::is_empty) {
        return Err(err("telemetry.headers_env", "must name a variable"));
    }
    let Some(endpoint) = raw.otlp_endpoint else {
        return Ok(None);
    };
    Ok(Some(TelemetryConfig {
        traces_url: traces_url(&endpoint)?,
        service_name,
        sample_ratio: ratio,
        headers_env: raw.headers_env,
    }))
}

/// `http://host:4318` becomes `http://host:4318/v1/traces`; a URL with a path is kept.
fn traces_url(endpoint: &str) -> Result<String, ConfigError> {
    let bad = |why: &str| err("telemetry.otlp_endpoint", format!("`{endpoint}` {why}"));
    let uri: ::http::Uri = endpoint.parse().map_err(|_| bad("is not a URL"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(bad("is not an http:// or https:// URL"));
    }
    if uri.query().is_some() {
        return Err(bad("must not have a query"));
    }
    Ok(match uri.path() {
        "" | "/" => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
        _ => endpoint.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(endpoint: &str) -> RawTelemetry {
        RawTelemetry {
            otlp_endpoint: Some(endpoint.into()),
            ..RawTelemetry::default()
        }
    }

    #[test]
    fn off_without_an_endpoint_and_defaults_otherwise() {
        assert_eq!(telemetry(RawTelemetry::default()).unwrap(), None);
        let t = telemetry(raw("http://127.0.0.1:6006")).unwrap().unwrap();
        assert_eq!(t.traces_url, "http://127.0.0.1:6006/v1/traces");
        assert_eq!(t.service_name, "turnstile");
        assert_eq!(t.sample_ratio, 1.0);
        let t = telemetry(raw("https://otel.example.com/otlp/v1/traces"));
        assert_eq!(
            t.unwrap().unwrap().traces_url,
            "https://otel.example.com/otlp/v1/traces"
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        for bad in ["localhost:4318", "ftp://x", "http://x/v1/traces?a=b", ""] {
            let e = telemetry(raw(bad)).unwrap_err();
            assert_eq!(e.path, "telemetry.otlp_endpoint", "{bad}");
        }
        let ratio = RawTelemetry {
            sample_ratio: Some(1.5),
            ..raw("http://x")
        };
        assert_eq!(telemetry(ratio).unwrap_err().path, "telemetry.sample_ratio");
    }

    #[test]
    fn a_config_file_turns_traces_on_and_keeps_the_headers_variable_from_backends() {
        use crate::config::tests::{base_toml, parse};
        assert_eq!(parse(&base_toml()).unwrap().telemetry, None);
        let on = format!(
            "{}\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\nheaders_env = \"OTLP_HEADERS\"\n",
            base_toml()
        );
        let t = parse(&on).unwrap().telemetry.unwrap();
        assert_eq!(t.traces_url, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(t.headers_env.as_deref(), Some("OTLP_HEADERS"));
        let leak = on.replace(
            "command = [\"./bin/demo\"]",
            "command = [\"./bin/demo\"]\nenv_passthrough = [\"OTLP_HEADERS\"]",
        );
        let e = parse(&leak).unwrap_err();
        assert_eq!(e.path, "backends.demo.env_passthrough");
        let unknown = on.replace("headers_env", "header_env");
        assert!(parse(&unknown).unwrap_err().path.starts_with("telemetry"));
    }
}
