//! `kind = "openai"`: a stateless OpenAI-compatible upstream (llama.cpp, vLLM, Ollama, OpenAI
//! itself) behind the same [`Backend`] trait as an agent. Nothing is held between legs: a leg
//! is one HTTP request, its tool calls end it (`TurnEvent::Yield`), and the suspension keeps
//! only the upstream's call ids ([`Hold::Ids`], durable). A continuation is a new request with
//! those ids restored in place of the tokens.
//!
//! A request from a surface that speaks Chat Completions (`TurnInput::native`) is forwarded as
//! the client sent it with only `model` renamed, a stream's usage asked for and cache hints
//! scoped to the principal (`native.rs`), and its answer's chunks are passed back as
//! `TurnEvent::Relayed` for that surface to relay; any other surface's turn is translated
//! (`translate.rs`). Every leg is metered, from the upstream's reports or, when it sends none,
//! the gateway's estimate (`Metered`).

pub(crate) mod client;
pub(crate) mod native;
mod stream;
pub(crate) mod translate;

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::{json, Value};

use self::client::Client;
use self::native::Up;
use super::{
    Backend, BackendError, BackendInfo, Hold, Holds, LegRequest, Resume, SessionStats, Turn,
    TurnControl, TurnEvent,
};
use crate::config::UpstreamConfig;
use crate::turn::TurnInput;

pub struct Upstream {
    client: Client,
    /// The backend's name, for the log.
    name: Arc<str>,
    /// An answer without usage was logged once.
    warned_no_usage: Arc<AtomicBool>,
    /// Unix seconds of the last answered and the last failed request (0: none yet).
    last_answer: AtomicU64,
    last_failure: AtomicU64,
}

impl Upstream {
    /// Builds the client; fails when `api_key_env` names an unset variable.
    pub fn new(name: &str, cfg: &UpstreamConfig) -> Result<Upstream, String> {
        Ok(Upstream {
            client: Client::new(name, cfg)?,
            name: name.into(),
            warned_no_usage: Arc::new(AtomicBool::new(false)),
            last_answer: AtomicU64::new(0),
            last_failure: AtomicU64::new(0),
        })
    }

    /// A fresh leg's body: the client's own bytes (native) with only `model` and the usage
    /// request spliced, or a translation.
    fn fresh_body(&self, leg: &LegRequest<'_>) -> Result<Up, BackendError> {
        let Some(p) = passthrough(leg.input) else {
            return encode(self.tree(leg)?.0);
        };
        let model = leg.model.backend_model.as_deref();
        if model.is_none() && !leg.input.stream && !p.cache_hints {
            // Nothing to splice: the plain relay reads no byte of the body.
            return Ok(Up {
                body: p.body.clone(),
                strip_usage: false,
            });
        }
        native::upstream_body(&p.body, model, leg.principal).map_err(invalid)
    }

    /// The request body as a tree (a continuation's ids are restored in it), `model` renamed,
    /// cache hints scoped to the principal, a stream asked for its usage; and whether the
    /// client's own body did not ask for it.
    fn tree(&self, leg: &LegRequest<'_>) -> Result<(Value, bool), BackendError> {
        let mut strip_usage = false;
        let mut body = match passthrough(leg.input) {
            Some(p) => {
                let mut body: Value = serde_json::from_slice(&p.body).map_err(invalid)?;
                if body["stream"] == true && body["stream_options"]["include_usage"] != true {
                    if !body["stream_options"].is_object() {
                        body["stream_options"] = json!({});
                    }
                    body["stream_options"]["include_usage"] = json!(true);
                    strip_usage = true;
                }
                body
            }
            None => translate::chat_body(leg.input),
        };
        if let Some(bm) = &leg.model.backend_model {
            body["model"] = json!(bm);
        }
        if let Some(o) = body.as_object_mut() {
            for hint in native::CACHE_HINTS {
                if let Some(v) = o.get_mut(hint).filter(|v| !v.is_null()) {
                    *v = native::scoped_cache_key(leg.principal, v);
                }
            }
        }
        Ok((body, strip_usage))
    }

    async fn run(&self, up: Up, leg: &LegRequest<'_>) -> Result<Turn, BackendError> {
        let sent_bytes = up.body.len();
        let sent = self.client.send(up.body, leg.traceparent.as_deref()).await;
        let answered = matches!(sent, Ok(_) | Err(BackendError::Refused(_)));
        match answered {
            true => &self.last_answer,
            false => &self.last_failure,
        }
        .store(crate::store::now_unix(), Ordering::Relaxed);
        let resp = sent?;
        let ids = Arc::new(Mutex::new(Vec::new()));
        let native = (passthrough(leg.input).is_some(), leg.model.id.clone());
        let events = if leg.input.stream {
            stream::events(&self.client, resp, native, up.strip_usage, ids.clone())
        } else {
            stream::whole(&self.client, resp, native, ids.clone())
        };
        let native = passthrough(leg.input).is_some();
        // Accounting hears each usage report as it passes; an answer that ends without one
        // is metered from the gateway's own estimate.
        let events = Box::pin(Metered {
            events,
            then: None,
            meter: leg.meter.clone(),
            sent_bytes,
            said_bytes: 0,
            reported: false,
            warned: self.warned_no_usage.clone(),
            backend: self.name.clone(),
        });
        Ok(Turn::from_stream(events, Box::new(Ids(ids)), native))
    }
}

/// A leg's events, metered: each usage report as it passes, and at the end of an answer
/// that reported none, the gateway's estimate (sent before the end, as a report).
struct Metered {
    events: futures::stream::BoxStream<'static, TurnEvent>,
    /// The end event held back while its estimate goes first.
    then: Option<TurnEvent>,
    meter: super::Meter,
    sent_bytes: usize,
    said_bytes: usize,
    reported: bool,
    /// The no-usage warning was logged (once per backend).
    warned: Arc<AtomicBool>,
    backend: Arc<str>,
}

impl futures::Stream for Metered {
    type Item = TurnEvent;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<TurnEvent>> {
        if let Some(ev) = self.then.take() {
            return std::task::Poll::Ready(Some(ev));
        }
        let ev = std::task::ready!(self.events.as_mut().poll_next(cx));
        std::task::Poll::Ready(ev.map(|ev| self.pass(ev)))
    }
}

impl Metered {
    /// The event to send now: `ev`, or the estimate (then `ev` next) when `ev` ends an
    /// answer that reported no usage.
    fn pass(&mut self, ev: TurnEvent) -> TurnEvent {
        match &ev {
            TurnEvent::Usage(u) => {
                self.reported = true;
                (self.meter)(*u);
            }
            TurnEvent::Delta(t) | TurnEvent::Reasoning(t) => self.said_bytes += t.len(),
            TurnEvent::Relayed { text, .. } => self.said_bytes += text.len(),
            TurnEvent::ToolCall(c) => self.said_bytes += c.name.len() + c.arguments.len(),
            TurnEvent::Completed | TurnEvent::Yield if !self.reported => {
                self.reported = true;
                let u = crate::turn::Usage::estimate(self.sent_bytes, self.said_bytes);
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        backend = %self.backend,
                        "the upstream reported no usage for an answer; it is metered from the gateway's estimate (a token per 4 bytes sent and received)"
                    );
                }
                (self.meter)(u);
                self.then = Some(ev);
                return TurnEvent::Usage(u);
            }
            _ => {}
        }
        ev
    }
}

/// The client's own body, when it is in the wire this upstream speaks.
fn passthrough(input: &crate::turn::TurnInput) -> Option<&crate::turn::Passthrough> {
    input
        .passthrough
        .as_ref()
        .filter(|p| p.wire == crate::turn::Wire::ChatCompletions)
}

fn invalid(e: serde_json::Error) -> BackendError {
    BackendError::Invalid {
        message: format!("Invalid request body: {e}"),
        param: crate::error::Param::Conversation,
    }
}

fn encode(body: Value) -> Result<Up, BackendError> {
    let body = serde_json::to_vec(&body)
        .map(Bytes::from)
        .map_err(invalid)?;
    Ok(Up {
        body,
        strip_usage: false,
    })
}

/// A leg's upstream call ids by invocation number (a leg's calls are numbered from 0).
struct Ids(Arc<Mutex<Vec<String>>>);

impl TurnControl for Ids {
    fn answer_tool(
        &self,
        _invocation: u64,
        _text: &str,
        _success: bool,
    ) -> Result<(), BackendError> {
        // Nothing is held: results travel in the next request.
        Err(BackendError::Lost)
    }

    fn interrupt(&self) {
        // Dropping the turn drops the response body, which closes the upstream request.
    }

    fn is_alive(&self) -> bool {
        true
    }

    fn detach(&self, invocations: &[u64]) -> Option<Vec<String>> {
        let ids = self.0.lock();
        Some(
            invocations
                .iter()
                .map(|i| ids.get(*i as usize).cloned().unwrap_or_default())
                .collect(),
        )
    }
}

impl Backend for Upstream {
    fn describe(&self) -> BackendInfo {
        BackendInfo {
            kind: "openai",
            provider: "openai",
            holds: Holds::Nothing,
        }
    }

    /// The upstream enforces (or refuses) whatever the client asked for itself.
    fn validate(&self, _input: &TurnInput) -> Result<(), BackendError> {
        Ok(())
    }

    fn start<'a>(&'a self, leg: LegRequest<'a>) -> BoxFuture<'a, Result<Turn, BackendError>> {
        Box::pin(async move {
            let body = self.fresh_body(&leg)?;
            self.run(body, &leg).await
        })
    }

    /// Forwards the conversation with the upstream's ids restored in place of the tokens of
    /// the answered batch (earlier rounds' tokens stay as the client sent them).
    fn resume<'a>(
        &'a self,
        hold: Hold,
        r: Resume<'a>,
    ) -> BoxFuture<'a, Result<Turn, BackendError>> {
        Box::pin(async move {
            let Hold::Ids(ids) = hold else {
                return Err(BackendError::Lost);
            };
            let (mut body, strip_usage) = self.tree(&r.leg)?;
            translate::restore_ids(&mut body, &r, &ids);
            let mut up = encode(body)?;
            up.strip_usage = strip_usage;
            self.run(up, &r.leg).await
        })
    }

    fn stats(&self) -> SessionStats {
        let at = |a: &AtomicU64| Some(a.load(Ordering::Relaxed)).filter(|t| *t > 0);
        SessionStats {
            last_answer: at(&self.last_answer),
            last_failure: at(&self.last_failure),
            ..SessionStats::default()
        }
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}
