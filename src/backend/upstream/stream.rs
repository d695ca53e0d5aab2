//! An upstream's answer as turn events. Text becomes `Delta`s; tool calls are assembled from
//! their deltas and announced once complete (at the finish chunk, or the end of the body),
//! their upstream ids recorded by invocation number for the suspension; the leg ends with
//! `Yield` when it produced calls, else `Completed`. With `native` set, each chunk (or the whole
//! body) is passed on as `Relayed`, tool calls removed, for a Chat Completions client; one
//! read without a tree carries its text there rather than in a `Delta`.

use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use serde_json::Value;
use tokio::time::Sleep;

use super::client::Client;
use super::native::{self, Plain};
use crate::backend::{BackendError, HeldCall, TurnEvent};
use crate::sse::SseEvent;
use crate::turn::Relayed;
use crate::turn::Usage;

type Ids = Arc<Mutex<Vec<String>>>;

/// A tool call being assembled from upstream deltas.
#[derive(Default)]
struct PartialCall {
    upstream_id: String,
    name: String,
    arguments: String,
}

fn arguments_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Cache writes as OpenAI-compatible upstreams report them: OpenAI's
/// `prompt_tokens_details.cache_write_tokens`, or the Anthropic-style
/// `cache_creation_input_tokens` of gateways that front Claude models.
pub(super) fn cache_writes(u: &Value) -> u64 {
    u["prompt_tokens_details"]["cache_write_tokens"]
        .as_u64()
        .or(u["cache_creation_input_tokens"].as_u64())
        .unwrap_or(0)
}

/// A message's or delta's reasoning text: `reasoning_content` (DeepSeek and others) or
/// `reasoning` (vLLM, OpenRouter).
fn reasoning(said: &Value) -> Option<&str> {
    said["reasoning_content"]
        .as_str()
        .or(said["reasoning"].as_str())
}

fn usage(v: &Value) -> Option<Usage> {
    let u = v.get("usage").filter(|u| u.is_object())?;
    let n = |k: &str| u[k].as_u64().unwrap_or(0);
    Some(Usage {
        prompt_tokens: n("prompt_tokens"),
        completion_tokens: n("completion_tokens"),
        total_tokens: n("total_tokens"),
        cached_tokens: u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        cache_write_tokens: cache_writes(u),
        reasoning_tokens: u["completion_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .unwrap_or(0),
    })
}

fn failure(e: BackendError) -> TurnEvent {
    match e {
        BackendError::Timeout => TurnEvent::TimedOut,
        other => TurnEvent::Failed(other.to_string()),
    }
}

/// Announces the assembled calls in index order and records their upstream ids.
fn announce(calls: Vec<PartialCall>, ids: &Ids, out: &mut VecDeque<TurnEvent>) {
    let mut ids = ids.lock();
    for c in calls {
        out.push_back(TurnEvent::ToolCall(HeldCall {
            invocation: ids.len() as u64,
            name: c.name,
            arguments: c.arguments,
        }));
        ids.push(c.upstream_id);
    }
}

/// The events of an answer (or chunk) with no tool calls: relayed, one `Relayed` that carries
/// its text too; else a `Delta`.
fn plain(p: Plain, native: bool, out: &mut VecDeque<TurnEvent>) {
    if let Some(u) = p.usage {
        out.push_back(TurnEvent::Usage(u));
    }
    if p.finish.as_deref() == Some("length") {
        out.push_back(TurnEvent::Truncated);
    }
    if !p.reasoning.is_empty() {
        out.push_back(TurnEvent::Reasoning(p.reasoning));
    }
    if native && p.relay {
        // One event for both: the text rides with the chunk that says it.
        let finish = p.finish.is_some();
        let chunk = Relayed::Raw {
            json: p.json,
            finish,
        };
        out.push_back(TurnEvent::Relayed {
            chunk,
            text: p.text,
        });
    } else if !p.text.is_empty() {
        out.push_back(TurnEvent::Delta(p.text));
    }
}

/// A non-streamed answer: one JSON body, read within the total timeout. One without tool
/// calls is read without a tree and relayed as it came (`model` renamed to `model`).
pub fn whole(
    client: &Client,
    resp: super::client::Response,
    (native, model): (bool, Arc<str>),
    ids: Ids,
) -> BoxStream<'static, TurnEvent> {
    let total = client.total_timeout;
    let limit = client.max_response_bytes;
    futures::stream::once(async move {
        let mut out = VecDeque::new();
        let bytes = match tokio::time::timeout(total, super::client::bounded(resp, limit)).await {
            Err(_) => {
                out.push_back(TurnEvent::TimedOut);
                return out;
            }
            Ok(Err(e)) => {
                tracing::warn!(why = ?e, "upstream answer unreadable");
                out.push_back(TurnEvent::Failed("unreadable upstream body".into()));
                return out;
            }
            Ok(Ok(b)) => b,
        };
        let text = std::str::from_utf8(&bytes).ok();
        let relayed = native.then_some(&*model);
        if let Some(p) = text.and_then(|t| native::plain(t, relayed, false)) {
            plain(p, native, &mut out);
            out.push_back(TurnEvent::Completed);
            return out;
        }
        let Ok(mut body) = serde_json::from_slice::<Value>(&bytes) else {
            out.push_back(TurnEvent::Failed("unreadable upstream body".into()));
            return out;
        };
        let message = &mut body["choices"][0]["message"];
        let text = message["content"].as_str().unwrap_or_default().to_string();
        if let Some(r) = reasoning(message).filter(|r| !r.is_empty()) {
            out.push_back(TurnEvent::Reasoning(r.to_string()));
        }
        let calls: Vec<PartialCall> =
            match message.as_object_mut().and_then(|m| m.remove("tool_calls")) {
                Some(Value::Array(list)) => list
                    .iter()
                    .map(|c| PartialCall {
                        upstream_id: c["id"].as_str().unwrap_or_default().to_string(),
                        name: c["function"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        arguments: arguments_text(&c["function"]["arguments"]),
                    })
                    .collect(),
                _ => Vec::new(),
            };
        if !text.is_empty() {
            out.push_back(TurnEvent::Delta(text));
        }
        if let Some(u) = usage(&body) {
            out.push_back(TurnEvent::Usage(u));
        }
        if body["choices"][0]["finish_reason"] == "length" {
            out.push_back(TurnEvent::Truncated);
        }
        if native {
            body["model"] = Value::String(model.to_string());
            let chunk = Relayed::Tree(body);
            out.push_back(TurnEvent::Relayed {
                chunk,
                text: String::new(),
            });
        }
        let yielded = !calls.is_empty();
        announce(calls, &ids, &mut out);
        out.push_back(if yielded {
            TurnEvent::Yield
        } else {
            TurnEvent::Completed
        });
        out
    })
    .flat_map(futures::stream::iter)
    .boxed()
}

struct Relay {
    events: BoxStream<'static, Result<SseEvent, BackendError>>,
    /// The leg's total deadline (`total_timeout_ms`): one timer for the whole answer.
    total: Pin<Box<Sleep>>,
    native: bool,
    /// Cut the usage the client did not ask for from the relayed chunks.
    strip_usage: bool,
    /// The name the client knows the model by, for the relayed chunks.
    model: Arc<str>,
    ids: Ids,
    calls: BTreeMap<u64, PartialCall>,
    /// The calls were announced (a finish chunk was seen).
    announced: bool,
    out: VecDeque<TurnEvent>,
    over: bool,
}

/// A streamed answer, event by event; each waits at most the idle timeout, the whole at most
/// the total timeout. With `strip_usage`, usage is metered but not relayed (the gateway asked
/// for it, the client did not).
pub fn events(
    client: &Client,
    resp: super::client::Response,
    (native, model): (bool, Arc<str>),
    strip_usage: bool,
    ids: Ids,
) -> BoxStream<'static, TurnEvent> {
    let relay = Relay {
        events: client.events(resp),
        total: Box::pin(tokio::time::sleep(client.total_timeout)),
        native,
        strip_usage,
        model,
        ids,
        calls: BTreeMap::new(),
        announced: false,
        // A chunk's events: its usage, text and relayed chunk (at most a few more).
        out: VecDeque::with_capacity(4),
        over: false,
    };
    relay.boxed()
}

impl Stream for Relay {
    type Item = TurnEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<TurnEvent>> {
        let this = self.get_mut();
        loop {
            if let Some(ev) = this.out.pop_front() {
                return Poll::Ready(Some(ev));
            }
            if this.over {
                return Poll::Ready(None);
            }
            let Poll::Ready(ev) = this.events.poll_next_unpin(cx) else {
                std::task::ready!(this.total.as_mut().poll(cx));
                this.over = true;
                return Poll::Ready(Some(TurnEvent::TimedOut));
            };
            this.read(ev);
        }
    }
}

impl Relay {
    /// What the next SSE event (None: the body ended) makes of the answer.
    fn read(&mut self, ev: Option<Result<SseEvent, BackendError>>) {
        match ev {
            None => {
                // Ended without [DONE]: fine once something finished, else a failure.
                self.over = true;
                if self.announced || !self.calls.is_empty() {
                    self.end();
                } else {
                    let failed = TurnEvent::Failed("upstream ended early".into());
                    self.out.push_back(failed);
                }
            }
            Some(Err(e)) => {
                self.over = true;
                self.out.push_back(failure(e));
            }
            Some(Ok(SseEvent::Done)) => {
                self.over = true;
                self.end();
            }
            Some(Ok(SseEvent::Data(data))) => {
                let relayed = self.native.then_some(&*self.model);
                if let Some(p) = native::plain(&data, relayed, self.strip_usage) {
                    let finish = p.finish.is_some();
                    plain(p, self.native, &mut self.out);
                    self.finished(finish);
                } else if let Ok(chunk) = serde_json::from_str::<Value>(&data) {
                    self.chunk(chunk);
                }
            }
        }
    }

    fn end(&mut self) {
        let calls = std::mem::take(&mut self.calls);
        announce(calls.into_values().collect(), &self.ids, &mut self.out);
        let yielded = !self.ids.lock().is_empty();
        self.out.push_back(if yielded {
            TurnEvent::Yield
        } else {
            TurnEvent::Completed
        });
    }

    /// Absorbs tool-call deltas; passes everything else on.
    fn chunk(&mut self, mut chunk: Value) {
        if let Some(u) = usage(&chunk) {
            self.out.push_back(TurnEvent::Usage(u));
        }
        let mut finish = false;
        let mut forward = true;
        if self.strip_usage {
            if let Some(o) = chunk.as_object_mut() {
                if o.remove("usage").is_some() {
                    // The usage-only chunk goes whole; elsewhere only the member.
                    forward = o
                        .get("choices")
                        .and_then(Value::as_array)
                        .is_some_and(|c| !c.is_empty());
                }
            }
        }
        if let Some(choice) = chunk.get_mut("choices").and_then(|c| c.get_mut(0)) {
            finish = choice["finish_reason"].as_str().is_some();
            if choice["finish_reason"] == "length" {
                self.out.push_back(TurnEvent::Truncated);
            }
            if let Some(r) = reasoning(&choice["delta"]).filter(|r| !r.is_empty()) {
                self.out.push_back(TurnEvent::Reasoning(r.to_string()));
            }
            if let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut) {
                if let Some(text) = delta.get("content").and_then(Value::as_str) {
                    if !text.is_empty() {
                        self.out.push_back(TurnEvent::Delta(text.to_string()));
                    }
                }
                if let Some(Value::Array(calls)) = delta.remove("tool_calls") {
                    for (pos, tc) in calls.iter().enumerate() {
                        let index = tc["index"].as_u64().unwrap_or(pos as u64);
                        let entry = self.calls.entry(index).or_default();
                        if let Some(id) = tc["id"].as_str().filter(|s| !s.is_empty()) {
                            if entry.upstream_id.is_empty() {
                                entry.upstream_id = id.to_string();
                            }
                        }
                        if let Some(name) = tc["function"]["name"].as_str() {
                            if entry.name.is_empty() {
                                entry.name = name.to_string();
                            }
                        }
                        if let Some(args) = tc["function"]["arguments"].as_str() {
                            entry.arguments.push_str(args);
                        }
                    }
                    // Nothing else in this delta: nothing to pass on.
                    let meaningful = delta.iter().any(|(k, v)| k != "content" && !v.is_null())
                        || delta
                            .get("content")
                            .is_some_and(|c| c.as_str().is_some_and(|s| !s.is_empty()));
                    forward = meaningful || finish;
                }
            }
        }
        if self.native && forward {
            chunk["model"] = Value::String(self.model.to_string());
            let chunk = Relayed::Tree(chunk);
            let text = String::new();
            self.out.push_back(TurnEvent::Relayed { chunk, text });
        }
        self.finished(finish);
    }

    /// At the first finish chunk, the calls assembled so far are complete.
    fn finished(&mut self, finish: bool) {
        if finish && !self.announced {
            self.announced = true;
            let calls = std::mem::take(&mut self.calls);
            announce(calls.into_values().collect(), &self.ids, &mut self.out);
        }
    }
}
