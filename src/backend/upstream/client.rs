//! The HTTP client of a stateless upstream: sends a Chat Completions body over HTTP or TLS
//! (rustls with the platform's roots plus the backend's `ca_file`; HTTP/2 when the upstream
//! offers it by ALPN), applies the connect / first-byte / idle / total timeouts, maps upstream
//! failures to [`BackendError`]s (an upstream 4xx keeps its status and message, but a refusal
//! of the gateway's own credentials is a gateway failure; the upstream URL and key never
//! appear), reads whole bodies under `max_response_bytes`, and splits an SSE body into events.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde_json::Value;
use tokio::time::Instant;

use crate::backend::{BackendError, UpstreamRefusal};
use crate::config::UpstreamConfig;
use crate::sse::{Silence, SseEvent, SseSplitter, MAX_EVENT_BYTES};

/// An upstream's answer, its body still to be read.
pub type Response = hyper::Response<hyper::body::Incoming>;

type Https =
    hyper_util::client::legacy::Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

pub struct Client {
    name: String,
    /// Parsed once, at start.
    uri: hyper::Uri,
    /// `Bearer <key>`, marked sensitive (kept out of any header dump).
    auth: Option<HeaderValue>,
    client: Https,
    pub idle_timeout: Duration,
    pub total_timeout: Duration,
    first_byte_timeout: Duration,
    /// The bound of a non-streamed answer and of an error body.
    pub max_response_bytes: usize,
}

/// Why a whole body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unread {
    /// Longer than the bound.
    Over,
    /// The connection broke off.
    Broken,
}

impl From<Unread> for BackendError {
    fn from(u: Unread) -> Self {
        BackendError::Unavailable(match u {
            Unread::Over => "body over max_response_bytes".into(),
            Unread::Broken => "body broke off".into(),
        })
    }
}

/// A body read whole under `limit` bytes: refused from its `Content-Length` when that is over,
/// else broken off at the first chunk that crosses it (nothing past the bound is kept).
pub(super) async fn bounded(resp: Response, limit: usize) -> Result<Bytes, Unread> {
    let declared = resp
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Unread::Over);
    }
    let mut body = resp.into_body();
    let mut out = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| Unread::Broken)?;
        let Ok(chunk) = frame.into_data() else {
            continue;
        };
        if out.len() + chunk.len() > limit {
            return Err(Unread::Over);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

/// The TLS roots of an upstream: the platform's, and the PEM certificates of `ca_file`.
fn roots(name: &str, ca_file: Option<&std::path::Path>) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    // A platform certificate rustls cannot read is skipped, as browsers do.
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca_file {
        let pem = std::fs::read(path).map_err(|e| {
            format!(
                "backends.{name}.ca_file: cannot read {}: {e}",
                path.display()
            )
        })?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| format!("backends.{name}.ca_file: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("backends.{name}.ca_file: {e}"))?;
        }
    }
    Ok(roots)
}

impl Client {
    /// Builds the client; fails when `api_key_env` names an unset variable.
    pub fn new(name: &str, cfg: &UpstreamConfig) -> Result<Client, String> {
        let auth = match &cfg.api_key_env {
            Some(var) => {
                let key = std::env::var(var).map_err(|_| {
                    format!("backends.{name}.api_key_env: environment variable {var} is not set")
                })?;
                let mut v = HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| format!("backends.{name}.api_key_env: not a header value"))?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("backends.{name}: TLS: {e}"))?
            .with_root_certificates(roots(name, cfg.ca_file.as_deref())?)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(cfg.connect_timeout));
        http.set_nodelay(true);
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        // No redirect is followed (a redirect would carry the key elsewhere) and no proxy
        // variable is read: this client has neither.
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(cfg.max_idle_connections)
            .build(https);
        // The configured URL was checked at load (`reqwest::Url`, which normalises it).
        let url = reqwest::Url::parse(&format!("{}/chat/completions", cfg.base_url))
            .map_err(|e| format!("backends.{name}.base_url: {e}"))?;
        let uri = url
            .as_str()
            .parse::<hyper::Uri>()
            .map_err(|e| format!("backends.{name}.base_url: {e}"))?;
        Ok(Client {
            name: name.to_string(),
            uri,
            auth,
            client,
            idle_timeout: cfg.idle_timeout,
            total_timeout: cfg.total_timeout,
            first_byte_timeout: cfg.first_byte_timeout,
            max_response_bytes: cfg.max_response_bytes,
        })
    }

    /// Sends a JSON body (with the leg's `traceparent`, when traced); resolves when the
    /// upstream's headers arrived with a 2xx status.
    pub async fn send(
        &self,
        body: Bytes,
        traceparent: Option<&str>,
    ) -> Result<Response, BackendError> {
        let mut req = hyper::Request::post(self.uri.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(auth) = &self.auth {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        if let Some(tp) = traceparent {
            req = req.header("traceparent", tp);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|_| BackendError::Unavailable("request failed".into()))?;
        let resp = match tokio::time::timeout(self.first_byte_timeout, self.client.request(req))
            .await
        {
            Err(_) => {
                tracing::warn!(backend = %self.name, "upstream first-byte timeout");
                return Err(BackendError::Timeout);
            }
            Ok(Err(e)) => {
                // The reason is the error's cause chain (a refused connection, a TLS handshake
                // failure naming the certificate problem); never the URL or the key.
                let timeout = timed_out(&e);
                tracing::warn!(backend = %self.name, connect = e.is_connect(), timeout, reason = %cause(&e), "upstream request failed");
                return Err(if timeout {
                    BackendError::Timeout
                } else {
                    BackendError::Unavailable("request failed".into())
                });
            }
            Ok(Ok(r)) => r,
        };
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        tracing::warn!(backend = %self.name, status = status.as_u16(), "upstream answered an error");
        // A refusal of the gateway's own credentials (or of its account) is not the client's
        // to see: its text may name the key, and the client's key was fine.
        if matches!(status.as_u16(), 401 | 403 | 407) {
            return Err(BackendError::Unavailable("credentials refused".into()));
        }
        // An error body over the bound is the upstream failing, not a refusal to relay.
        let text =
            match tokio::time::timeout(self.idle_timeout, bounded(resp, self.max_response_bytes))
                .await
            {
                Ok(Err(Unread::Over)) => return Err(Unread::Over.into()),
                Ok(Ok(text)) => text,
                _ => Bytes::new(),
            };
        if status.is_client_error() {
            let upstream: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
            let e = &upstream["error"];
            let message = e["message"]
                .as_str()
                .or_else(|| upstream["message"].as_str())
                .unwrap_or("The upstream rejected the request.");
            return Err(BackendError::Refused(Box::new(UpstreamRefusal {
                status: status.as_u16(),
                message: message.to_string(),
                kind: e["type"].as_str().map(str::to_owned),
                code: e["code"].as_str().map(str::to_owned),
                param: e["param"].as_str().map(str::to_owned),
            })));
        }
        Err(BackendError::Unavailable(format!(
            "status {}",
            status.as_u16()
        )))
    }

    /// The SSE events of a streaming body. Each item waits at most `idle_timeout`.
    pub fn events(&self, resp: Response) -> BoxStream<'static, Result<SseEvent, BackendError>> {
        Events {
            body: resp.into_body().into_data_stream(),
            split: SseSplitter::default(),
            ended: false,
            idle: Silence::new(self.idle_timeout),
            waiting: None,
        }
        .boxed()
    }
}

/// An SSE body split into events, each waited for at most the idle timeout.
struct Events {
    body: http_body_util::BodyDataStream<hyper::body::Incoming>,
    split: SseSplitter,
    ended: bool,
    idle: Silence,
    /// Since when the body has sent nothing.
    waiting: Option<Instant>,
}

impl Stream for Events {
    type Item = Result<SseEvent, BackendError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(ev) = this.split.next_event() {
                this.waiting = None;
                return Poll::Ready(Some(Ok(ev)));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            let failed = |this: &mut Events, e: BackendError| {
                this.ended = true;
                Poll::Ready(Some(Err(e)))
            };
            match this.body.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(bytes))) => {
                    this.waiting = None;
                    if this.split.push(&bytes).is_err() {
                        tracing::warn!(
                            max_bytes = MAX_EVENT_BYTES,
                            "upstream sent an SSE event over the bound"
                        );
                        let e = BackendError::Unavailable("event over the bound".into());
                        return failed(this, e);
                    }
                }
                Poll::Ready(Some(Err(_))) => {
                    let e = BackendError::Unavailable("body broke off".into());
                    return failed(this, e);
                }
                Poll::Ready(None) => {
                    this.split.finish();
                    this.ended = true;
                }
                Poll::Pending => {
                    let since = *this.waiting.get_or_insert_with(Instant::now);
                    std::task::ready!(this.idle.poll_since(cx, since));
                    return failed(this, BackendError::Timeout);
                }
            }
        }
    }
}

/// Whether a failed request timed out (connecting, or on the connection).
fn timed_out(e: &hyper_util::client::legacy::Error) -> bool {
    let mut next = std::error::Error::source(e);
    while let Some(err) = next {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        next = err.source();
    }
    false
}

/// The causes under a client error, outermost first, joined by `: `. The error's own text is
/// left out (it says only that the request failed).
fn cause(e: &hyper_util::client::legacy::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = std::error::Error::source(e);
    while let Some(err) = next {
        let text = err.to_string();
        // Wrappers often repeat their source's text; keep each message once.
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    if parts.is_empty() {
        return "unknown".into();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests;
