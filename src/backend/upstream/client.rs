//! The HTTP client of a stateless upstream: sends a Chat Completions body over HTTP or TLS
//! (rustls with the platform's roots plus the backend's `ca_file`; HTTP/2 when the upstream
//! offers it by ALPN), applies the connect / first-byte / idle / total timeouts, maps upstream
//! failures to [`BackendError`]s (an upstream 4xx keeps its status and message, but a refusal
//! of the gateway's own credentials is a gateway failure; the upstream URL and key never
//! appear), reads whole bodies under `max_response_bytes`, and splits an SSE body into events.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::Value;

use crate::backend::{BackendError, UpstreamRefusal};
use crate::config::UpstreamConfig;

pub struct Client {
    name: String,
    /// Parsed once: parsing (IDNA included) per request showed in profiles.
    url: reqwest::Url,
    key: Option<String>,
    client: reqwest::Client,
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
pub(super) async fn bounded(mut resp: reqwest::Response, limit: usize) -> Result<Bytes, Unread> {
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(Unread::Over);
    }
    let mut out = BytesMut::new();
    while let Some(chunk) = resp.chunk().await.map_err(|_| Unread::Broken)? {
        if out.len() + chunk.len() > limit {
            return Err(Unread::Over);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

/// One event of an upstream SSE body.
#[derive(Debug, Clone, PartialEq)]
pub enum SseEvent {
    /// A `data:` payload other than `[DONE]`.
    Data(String),
    Done,
}

impl Client {
    /// Builds the client; fails when `api_key_env` names an unset variable.
    pub fn new(name: &str, cfg: &UpstreamConfig) -> Result<Client, String> {
        let key = match &cfg.api_key_env {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                format!("backends.{name}.api_key_env: environment variable {var} is not set")
            })?),
            None => None,
        };
        let mut builder = reqwest::Client::builder()
            .connect_timeout(cfg.connect_timeout)
            .pool_max_idle_per_host(cfg.max_idle_connections)
            // An upstream API is not redirected: a redirect would carry the key elsewhere,
            // and checking each answer for one showed in profiles.
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true);
        if let Some(path) = &cfg.ca_file {
            let pem = std::fs::read(path).map_err(|e| {
                format!(
                    "backends.{name}.ca_file: cannot read {}: {e}",
                    path.display()
                )
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("backends.{name}.ca_file: {e}"))?;
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder
            .build()
            .map_err(|e| format!("backends.{name}: cannot build HTTP client: {e}"))?;
        let url = reqwest::Url::parse(&format!("{}/chat/completions", cfg.base_url))
            .map_err(|e| format!("backends.{name}.base_url: {e}"))?;
        Ok(Client {
            name: name.to_string(),
            url,
            key,
            client,
            idle_timeout: cfg.idle_timeout,
            total_timeout: cfg.total_timeout,
            first_byte_timeout: cfg.first_byte_timeout,
            max_response_bytes: cfg.max_response_bytes,
        })
    }

    /// Sends a JSON body; resolves when the upstream's headers arrived with a 2xx status.
    pub async fn send(&self, body: Bytes) -> Result<reqwest::Response, BackendError> {
        let mut req = self
            .client
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(k) = &self.key {
            req = req.bearer_auth(k);
        }
        let resp = match tokio::time::timeout(self.first_byte_timeout, req.send()).await {
            Err(_) => {
                tracing::warn!(backend = %self.name, "upstream first-byte timeout");
                return Err(BackendError::Timeout);
            }
            Ok(Err(e)) => {
                // The reason is the error's cause chain (a refused connection, a TLS handshake
                // failure naming the certificate problem); never the URL or the key.
                tracing::warn!(backend = %self.name, connect = e.is_connect(), timeout = e.is_timeout(), reason = %cause(&e), "upstream request failed");
                return Err(if e.is_timeout() {
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
    pub fn events(
        &self,
        resp: reqwest::Response,
    ) -> BoxStream<'static, Result<SseEvent, BackendError>> {
        let idle = self.idle_timeout;
        let state = (resp.bytes_stream().boxed(), SseSplitter::default(), false);
        futures::stream::unfold(state, move |(mut body, mut split, mut ended)| async move {
            loop {
                if let Some(ev) = split.next_event() {
                    return Some((Ok(ev), (body, split, ended)));
                }
                if ended {
                    return None;
                }
                match tokio::time::timeout(idle, body.next()).await {
                    Err(_) => return Some((Err(BackendError::Timeout), (body, split, true))),
                    Ok(Some(Ok(bytes))) => {
                        if split.push(&bytes).is_err() {
                            tracing::warn!(
                                max_bytes = MAX_EVENT_BYTES,
                                "upstream sent an SSE event over the bound"
                            );
                            let e = BackendError::Unavailable("event over the bound".into());
                            return Some((Err(e), (body, split, true)));
                        }
                    }
                    Ok(Some(Err(_))) => {
                        let e = BackendError::Unavailable("body broke off".into());
                        return Some((Err(e), (body, split, true)));
                    }
                    Ok(None) => {
                        split.finish();
                        ended = true;
                    }
                }
            }
        })
        .boxed()
    }
}

/// The causes under a reqwest error, outermost first, joined by `: `. The reqwest error's own
/// text (which names the URL) is left out.
fn cause(e: &reqwest::Error) -> String {
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

/// The largest SSE event (its unfinished line plus its `data:` lines) the splitter holds.
pub const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// Splits a byte stream into SSE events (`data:` lines joined per event; comments and other
/// fields ignored). Handles `\n` and `\r\n` line ends and events split across chunks.
#[derive(Default)]
pub struct SseSplitter {
    buf: BytesMut,
    data: Vec<String>,
    /// Bytes in `data`.
    held: usize,
    ready: std::collections::VecDeque<SseEvent>,
}

/// An event grew past [`MAX_EVENT_BYTES`]: the stream is broken off.
#[derive(Debug, PartialEq, Eq)]
pub struct Overflow;

impl SseSplitter {
    pub fn push(&mut self, bytes: &Bytes) -> Result<(), Overflow> {
        self.buf.extend_from_slice(bytes);
        while let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
            let line = self.buf.split_to(pos + 1);
            let line = String::from_utf8_lossy(&line);
            self.line(line.trim_end_matches(['\n', '\r']));
            if self.held > MAX_EVENT_BYTES {
                return Err(Overflow);
            }
        }
        if self.buf.len() + self.held > MAX_EVENT_BYTES {
            return Err(Overflow);
        }
        Ok(())
    }

    /// The body ended: a last event without its blank line still counts.
    pub fn finish(&mut self) {
        if !self.buf.is_empty() {
            let rest = String::from_utf8_lossy(&self.buf).to_string();
            self.buf.clear();
            self.line(rest.trim_end_matches(['\n', '\r']));
        }
        self.line("");
    }

    fn line(&mut self, line: &str) {
        if line.is_empty() {
            if !self.data.is_empty() {
                let data = self.data.join("\n");
                self.data.clear();
                self.held = 0;
                self.ready.push_back(if data.trim() == "[DONE]" {
                    SseEvent::Done
                } else {
                    SseEvent::Data(data)
                });
            }
        } else if let Some(d) = line.strip_prefix("data:") {
            let d = d.strip_prefix(' ').unwrap_or(d);
            self.held += d.len() + 1;
            self.data.push(d.to_string());
        }
    }

    pub fn next_event(&mut self) -> Option<SseEvent> {
        self.ready.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_events_across_chunks_and_line_ends() {
        let mut s = SseSplitter::default();
        s.push(&Bytes::from("data: {\"a\":1}\n\nda")).unwrap();
        assert_eq!(s.next_event(), Some(SseEvent::Data("{\"a\":1}".into())));
        assert_eq!(s.next_event(), None);
        s.push(&Bytes::from(
            "ta: {\"b\":2}\r\n\r\n: comment\n\nevent: x\ndata: [DONE]\n\n",
        ))
        .unwrap();
        assert_eq!(s.next_event(), Some(SseEvent::Data("{\"b\":2}".into())));
        assert_eq!(s.next_event(), Some(SseEvent::Done));
        s.push(&Bytes::from("data: {\"c\":3}")).unwrap();
        s.finish();
        assert_eq!(s.next_event(), Some(SseEvent::Data("{\"c\":3}".into())));
    }

    #[test]
    fn an_event_over_the_bound_is_refused() {
        let mut s = SseSplitter::default();
        let line = Bytes::from(format!("data: {}\n", "x".repeat(MAX_EVENT_BYTES / 4)));
        for _ in 0..3 {
            s.push(&line).unwrap();
        }
        assert_eq!(s.push(&line), Err(Overflow));
        let mut s = SseSplitter::default();
        assert_eq!(
            s.push(&Bytes::from(vec![b'a'; MAX_EVENT_BYTES + 1])),
            Err(Overflow)
        );
    }
}
