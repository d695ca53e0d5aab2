//! Traces, after the OpenTelemetry GenAI semantic conventions, exported over OTLP/HTTP when
//! `[telemetry] otlp_endpoint` is set, and nothing at all when it is not: every traced path
//! asks [`on`] first (one load of a static).
//!
//! One execution reads as one trace: the request that started it is its root; each leg is a
//! `chat {model}` (stateless upstream) or `invoke_agent {model}` span under that root, with
//! `gen_ai.conversation.id` the execution id; each held client call is an `execute_tool
//! {name}` span under the leg that exposed it, from the exposure to the claim; an approval is
//! an `await_approval {kind}` span from its creation to its decision. The HTTP server span of
//! each request comes through `tracing` (`tracing-opentelemetry`, target [`TARGET`]), honours
//! the client's `traceparent`, and a forward to the owner replica is a client span whose
//! `traceparent` the owner honours. An HTTP upstream gets the leg's `traceparent`.
//!
//! No attribute carries a prompt, an argument, a result, a token, a key or a digest: only
//! names, counts, ids the gateway shows anyway (execution, response, approval) and outcomes.

mod export;
mod spans;

pub use spans::{
    forward, in_request, record_execution, Held, LegInfo, LegSpan, Open, Parent, Wait,
};

use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::HeaderExtractor;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::TelemetryConfig;

/// The `tracing` target of the spans that become OpenTelemetry spans (and nothing else).
pub const TARGET: &str = "turnstile::trace";

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Whether traces are on.
#[inline]
pub fn on() -> bool {
    TRACER.get().is_some()
}

/// The running exporter. [`Telemetry::shutdown`] sends what is queued.
pub struct Telemetry {
    provider: SdkTracerProvider,
    exporting: export::Exporting,
}

/// Starts the exporter (on the current runtime) and the tracer.
pub fn start(cfg: &TelemetryConfig) -> Result<Telemetry, String> {
    let headers = match &cfg.headers_env {
        Some(var) => {
            let value = std::env::var(var)
                .map_err(|_| format!("telemetry.headers_env: `{var}` is not set"))?;
            parse_headers(&value)
                .ok_or_else(|| format!("telemetry.headers_env: `{var}` is not name=value,…"))?
        }
        None => Default::default(),
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(export::Client::new())
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(cfg.traces_url.clone())
        .with_timeout(export::EXPORT_TIMEOUT)
        .with_headers(headers)
        .build()
        .map_err(|e| format!("telemetry.otlp_endpoint: {e}"))?;
    let (queue, exporting) = export::start(exporter);
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(cfg.sample_ratio)));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(queue)
        .with_sampler(sampler)
        .with_resource(
            Resource::builder()
                .with_service_name(cfg.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("turnstile");
    if TRACER.set(tracer).is_err() {
        return Err("telemetry started twice".into());
    }
    Ok(Telemetry {
        provider,
        exporting,
    })
}

/// `name=value,name=value` (the OTLP exporters' header format; values may be %-encoded).
fn parse_headers(s: &str) -> Option<std::collections::HashMap<String, String>> {
    s.split(',')
        .filter(|kv| !kv.trim().is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=')?;
            let v = percent_decode(v.trim())?;
            Some((k.trim().to_string(), v)).filter(|(k, _)| !k.is_empty())
        })
        .collect()
}

fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

impl Telemetry {
    /// The layer that turns the server spans (target [`TARGET`]) into OpenTelemetry spans.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::Layer;
        let tracer = self.provider.tracer("turnstile");
        let only_ours =
            tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::TRACE);
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_level(false)
            .with_tracked_inactivity(false)
            .with_filter(only_ours)
    }

    /// Sends what is queued (within a bound) and stops the exporter.
    pub async fn shutdown(self) {
        let _ = self.provider.shutdown();
        self.exporting.stop().await;
    }
}

/// Spans exported, and dropped by cause (`queue_full`, `export_failed`), for `/metrics`.
pub fn counts() -> (u64, u64, u64) {
    (
        export::EXPORTED.load(Ordering::Relaxed),
        export::DROPPED_QUEUE_FULL.load(Ordering::Relaxed),
        export::DROPPED_EXPORT_FAILED.load(Ordering::Relaxed),
    )
}

/// The server span of one HTTP request (`{method} {route}`), a child of the client's
/// `traceparent` when it sent one. Disabled (and free) when traces are off, and for the
/// probes and the scrape (`/healthz`, `/readyz`, `/metrics`), which would only be noise.
pub fn server_span(method: &str, route: &str, headers: &::http::HeaderMap) -> tracing::Span {
    if !on() || matches!(route, "/healthz" | "/readyz" | "/metrics") {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "request",
        otel.name = format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = method,
        http.route = route,
        openinference.span.kind = "CHAIN",
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        gen_ai.conversation.id = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    let _ = span.set_parent(parent);
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_headers_parse_like_the_otlp_variable() {
        let h = parse_headers("api_key=abc%3D, x-team = blue ,").unwrap();
        assert_eq!(h["api_key"], "abc=");
        assert_eq!(h["x-team"], "blue");
        assert!(parse_headers("novalue").is_none());
        assert!(parse_headers("k=%zz").is_none());
    }

    #[test]
    fn off_means_no_span_and_no_context() {
        // This test binary never starts telemetry.
        assert!(!on());
        assert!(Parent::current().0.is_none());
        let leg = LegSpan::start(
            &Parent::default(),
            LegInfo {
                agent: true,
                provider: "openai",
                model: "m",
                execution_id: "exe-1",
                conversation: "exe-1",
                response_id: |_, _| "r".into(),
                round: 0,
            },
        );
        assert!(leg.traceparent().is_none());
        assert!(Held::start(&leg, ["t"].into_iter(), 0).0.is_none());
    }
}
