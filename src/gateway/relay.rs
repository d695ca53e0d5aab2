//! Legs on a stateless OpenAI-compatible upstream (spec section 6).
//!
//! The client's body is forwarded with only `model` renamed; every field the gateway does not
//! interpret passes through. Answers are relayed as they come. The one rewrite is tool calls:
//! each upstream `tool_call.id` is replaced by a fresh `srct-` token whose pending record
//! (digests plus the upstream id, no content) is registered durably before the token is
//! written. In streams, tool-call deltas are therefore held back until the call list is
//! complete (the finish chunk), then emitted in OpenAI's delta form: per call one delta with
//! `index`, `id`, `type`, `function.name`, then its arguments; content deltas are never held.
//! A continuation is validated exactly like a held turn's, then forwarded with the upstream
//! ids restored. Nothing lives in memory only, so such continuations survive a restart.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::{Gateway, LegContext, Reply, Suspended};
use crate::auth::Principal;
use crate::backend::upstream::{SseEvent, Upstream};
use crate::config::ModelConfig;
use crate::continuation::canonical::echo_digest;
use crate::continuation::detect::Continuation;
use crate::continuation::{token, Digests, NewBatch, RegisterError, Registry};
use crate::error::{ApiError, ErrorCode};
use crate::openai::ChatRequest;
use crate::store::{now_unix, now_unix_ms, Store, StoreError};

/// The pending part of a stateless execution: the upstream's ids, in token order.
pub struct UpstreamSuspension {
    pub execution_id: String,
    pub principal: String,
    pub model: String,
    pub created: u64,
    pub rounds: u32,
    pub upstream_ids: Vec<String>,
    /// Token digests in the same order, to restore ids on resume.
    pub tokens: Vec<[u8; 32]>,
}

pub enum RelayBody {
    Json(Value),
    Sse(BoxStream<'static, Result<Bytes, Infallible>>),
}

/// One leg's identity and the digests its suspension would record.
struct RelayLeg {
    /// The execution has a row in the journal (it suspended at least once).
    journaled: bool,
    execution_id: String,
    principal: String,
    model: String,
    created: u64,
    rounds: u32,
    deadline: std::time::Instant,
    ctx: LegContext,
    /// Counts the leg among the principal's live executions while it runs (a suspended
    /// upstream execution is counted from the registry instead).
    _slot: super::limits::Slot,
}

/// A tool call being assembled from upstream deltas.
#[derive(Default, Clone)]
struct PartialCall {
    upstream_id: String,
    name: String,
    arguments: String,
}

/// The client's body as a JSON value, to forward with only `model` renamed.
fn parse_body(raw: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(raw).map_err(|e| ApiError::invalid(format!("Invalid request body: {e}")))
}

/// Loads the stateless upstream records a previous process left pending.
pub fn restore_pending(registry: &Registry<Suspended>, store: &Store) -> Result<(), StoreError> {
    let rows = store.upstream_pending()?;
    let mut batches: BTreeMap<String, Vec<crate::store::UpstreamPending>> = BTreeMap::new();
    for r in rows {
        batches.entry(r.execution_id.clone()).or_default().push(r);
    }
    let now_ms = now_unix_ms();
    for (execution_id, rows) in batches {
        let first = &rows[0];
        let left = std::time::Duration::from_millis(first.deadline_ms.saturating_sub(now_ms));
        let part = |i: usize| -> [u8; 32] {
            let mut d = [0u8; 32];
            d.copy_from_slice(&first.digests[i * 32..(i + 1) * 32]);
            d
        };
        let digests = Digests {
            tools: part(0),
            tool_choice: part(1),
            prefix: part(2),
            echo: part(3),
        };
        let tokens: Vec<[u8; 32]> = rows.iter().map(|r| r.digest).collect();
        registry.restore(NewBatch {
            principal: first.principal.clone(),
            execution_id: execution_id.clone(),
            model: first.model.clone(),
            deadline: std::time::Instant::now() + left,
            tokens: tokens.clone(),
            digests,
            parked: Suspended::Upstream(UpstreamSuspension {
                execution_id,
                principal: first.principal.clone(),
                model: first.model.clone(),
                created: first.created_at,
                rounds: first.rounds,
                upstream_ids: rows.iter().map(|r| r.upstream_id.clone()).collect(),
                tokens,
            }),
        });
    }
    Ok(())
}

impl Gateway {
    // The fresh-turn inputs, one parameter each (the slot is the admission's).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn relay_fresh(
        &self,
        up: Arc<Upstream>,
        principal: &Principal,
        model: &ModelConfig,
        req: &ChatRequest,
        raw: Bytes,
        started: std::time::Instant,
        slot: super::limits::Slot,
    ) -> Result<Reply, ApiError> {
        let raw = parse_body(&raw)?;
        // Journaled only if it suspends: a stateless leg that just answers leaves nothing to
        // recover, and two store transactions per relayed request would cap the plain path.
        let leg = RelayLeg {
            journaled: false,
            execution_id: token::new_id("exe-"),
            principal: principal.id.clone(),
            model: model.id.clone(),
            created: now_unix(),
            rounds: 0,
            deadline: std::time::Instant::now() + self.config().continuations.execution_ttl,
            ctx: LegContext::of(req),
            _slot: slot,
        };
        self.relay(up, leg, raw, req.stream, started).await
    }

    /// Forwards a claimed continuation with the upstream's ids restored.
    pub(super) async fn relay_continue(
        &self,
        u: UpstreamSuspension,
        raw: Bytes,
        c: &Continuation,
        ctx: LegContext,
        started: std::time::Instant,
    ) -> Result<Reply, ApiError> {
        let mut raw = parse_body(&raw)?;
        let stream = raw["stream"].as_bool().unwrap_or(false);
        let cfg = self.config();
        let Some(up) = cfg
            .model(&u.model)
            .and_then(|m| self.inner.upstreams.get(&m.backend))
            .cloned()
        else {
            self.ended(&u.execution_id, "lost");
            return Err(ApiError::upstream());
        };
        let ids: HashMap<[u8; 32], &String> = u
            .tokens
            .iter()
            .copied()
            .zip(u.upstream_ids.iter())
            .collect();
        let restore = |v: &mut Value| {
            let restored = v
                .as_str()
                .and_then(token::token_digest)
                .and_then(|d| ids.get(&d));
            if let Some(original) = restored {
                *v = json!(original);
            }
        };
        if let Some(messages) = raw.get_mut("messages").and_then(Value::as_array_mut) {
            if let Some(calls) = messages[c.assistant]
                .get_mut("tool_calls")
                .and_then(Value::as_array_mut)
            {
                for call in calls {
                    if let Some(id) = call.get_mut("id") {
                        restore(id);
                    }
                }
            }
            for (_, index) in &c.results {
                if let Some(id) = messages[*index].get_mut("tool_call_id") {
                    restore(id);
                }
            }
        }
        let leg = RelayLeg {
            journaled: true,
            _slot: self.inner.limiter.hold(&u.principal),
            execution_id: u.execution_id,
            principal: u.principal,
            model: u.model,
            created: u.created,
            rounds: u.rounds,
            deadline: std::time::Instant::now() + cfg.continuations.execution_ttl,
            ctx,
        };
        tracing::debug!(execution = %leg.execution_id, "upstream continuation claimed; forwarding");
        self.relay(up, leg, raw, stream, started).await
    }

    async fn relay(
        &self,
        up: Arc<Upstream>,
        leg: RelayLeg,
        mut body: Value,
        stream: bool,
        started: std::time::Instant,
    ) -> Result<Reply, ApiError> {
        let cfg = self.config();
        if let Some(bm) = cfg.model(&leg.model).and_then(|m| m.backend_model.clone()) {
            body["model"] = json!(bm);
        }
        self.inner.metrics.overhead.observe(started.elapsed());
        let resp = match up.send(&body).await {
            Ok(r) => r,
            Err(e) => {
                self.leg_ended(&leg, "failed");
                return Err(e);
            }
        };
        let execution_id = leg.execution_id.clone();
        if !stream {
            let mut v = match up.json(resp).await {
                Ok(v) => v,
                Err(e) => {
                    self.leg_ended(&leg, "failed");
                    return Err(e);
                }
            };
            v["model"] = json!(leg.model);
            let message = &v["choices"][0]["message"];
            let calls: Vec<PartialCall> = message["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| PartialCall {
                    upstream_id: c["id"].as_str().unwrap_or_default().to_string(),
                    name: c["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    arguments: match &c["function"]["arguments"] {
                        Value::String(s) => s.clone(),
                        Value::Null => String::new(),
                        other => other.to_string(),
                    },
                })
                .collect();
            if calls.is_empty() {
                self.leg_ended(&leg, "completed");
                return Ok(Reply::Relay {
                    execution_id,
                    body: RelayBody::Json(v),
                });
            }
            let content = message["content"].as_str().unwrap_or_default().to_string();
            let tokens = self.suspend_upstream(&leg, &content, &calls)?;
            if let Some(list) = v["choices"][0]["message"]["tool_calls"].as_array_mut() {
                for (call, tok) in list.iter_mut().zip(&tokens) {
                    call["id"] = json!(tok);
                    call["type"] = json!("function");
                }
            }
            return Ok(Reply::Relay {
                execution_id,
                body: RelayBody::Json(v),
            });
        }
        let events = up.events(resp);
        let state = StreamState {
            total: Instant::now() + up.total_timeout,
            gw: self.clone(),
            leg,
            events,
            calls: BTreeMap::new(),
            content: String::new(),
            finished: false,
            done: false,
        };
        let body = futures::stream::unfold(state, |mut st| async move {
            let out = st.next().await?;
            Some((Ok::<_, Infallible>(Bytes::from(out)), st))
        })
        .boxed();
        Ok(Reply::Relay {
            execution_id,
            body: RelayBody::Sse(body),
        })
    }

    /// Registers the calls of a finished upstream answer under fresh tokens (durably, before
    /// any of them is written). Returns the tokens in call order.
    fn leg_ended(&self, leg: &RelayLeg, reason: &str) {
        if leg.journaled {
            self.ended(&leg.execution_id, reason);
        }
    }

    fn suspend_upstream(
        &self,
        leg: &RelayLeg,
        content: &str,
        calls: &[PartialCall],
    ) -> Result<Vec<String>, ApiError> {
        let cfg = self.config();
        if leg.rounds >= cfg.continuations.max_rounds {
            self.leg_ended(leg, "max_rounds");
            return Err(ApiError::new(
                ErrorCode::CapacityExhausted,
                format!(
                    "The turn exceeded {} tool rounds and was stopped.",
                    cfg.continuations.max_rounds
                ),
            ));
        }
        let minted: Vec<(String, [u8; 32])> = calls.iter().map(|_| token::new_token()).collect();
        let echo: Vec<(String, String, String)> = calls
            .iter()
            .zip(&minted)
            .map(|(c, (t, _))| (t.clone(), c.name.clone(), c.arguments.clone()))
            .collect();
        let tokens: Vec<[u8; 32]> = minted.iter().map(|(_, d)| *d).collect();
        let batch = NewBatch {
            principal: leg.principal.clone(),
            execution_id: leg.execution_id.clone(),
            model: leg.model.clone(),
            deadline: leg.deadline,
            tokens: tokens.clone(),
            digests: Digests {
                tools: leg.ctx.tools,
                tool_choice: leg.ctx.tool_choice,
                prefix: leg.ctx.prefix,
                echo: echo_digest(content, &echo),
            },
            parked: Suspended::Upstream(UpstreamSuspension {
                execution_id: leg.execution_id.clone(),
                principal: leg.principal.clone(),
                model: leg.model.clone(),
                created: leg.created,
                rounds: leg.rounds + 1,
                upstream_ids: calls.iter().map(|c| c.upstream_id.clone()).collect(),
                tokens,
            }),
        };
        if !leg.journaled {
            if let Err(e) =
                self.inner
                    .store
                    .execution_started(&leg.execution_id, &leg.principal, &leg.model)
            {
                tracing::error!(error = %e, "store unavailable; no token exposed");
                return Err(ApiError::new(
                    ErrorCode::CapacityExhausted,
                    "The gateway could not record the suspension; retry later.",
                ));
            }
        }
        match self.inner.registry.register(batch) {
            Ok(()) => Ok(minted.into_iter().map(|(t, _)| t).collect()),
            Err(e) => {
                // Journaled by now (just above, or at an earlier suspension).
                self.ended(&leg.execution_id, "capacity");
                let why = match e {
                    RegisterError::Capacity(_) => "Too many suspended tool calls; retry later.",
                    RegisterError::Store(_) => {
                        "The gateway could not record the suspension; retry later."
                    }
                };
                Err(ApiError::new(ErrorCode::CapacityExhausted, why))
            }
        }
    }
}

/// The streaming relay: reads upstream events, writes SSE text.
struct StreamState {
    /// The leg's total deadline (`total_timeout_ms`).
    total: Instant,
    gw: Gateway,
    leg: RelayLeg,
    events: BoxStream<'static, Result<SseEvent, ApiError>>,
    calls: BTreeMap<u64, PartialCall>,
    content: String,
    /// A finish chunk (or the end) has been handled.
    finished: bool,
    /// `[DONE]` was written.
    done: bool,
}

impl StreamState {
    /// The next piece of output, or None when the stream is over.
    async fn next(&mut self) -> Option<String> {
        loop {
            if self.done {
                return None;
            }
            let Ok(ev) = tokio::time::timeout_at(self.total, self.events.next()).await else {
                self.done = true;
                return Some(self.error(ApiError::new(
                    ErrorCode::UpstreamTimeout,
                    "The upstream did not finish in time.",
                )));
            };
            let Some(ev) = ev else {
                // Upstream ended without [DONE]: close properly (an error if nothing finished).
                self.done = true;
                if self.finished {
                    return Some("data: [DONE]\n\n".into());
                }
                let tail = self.flush_calls(None);
                return Some(match tail {
                    Ok(text) if !text.is_empty() => format!("{text}data: [DONE]\n\n"),
                    _ => self.error(ApiError::upstream()),
                });
            };
            match ev {
                Err(e) => {
                    self.done = true;
                    return Some(self.error(e));
                }
                Ok(SseEvent::Done) => {
                    self.done = true;
                    let mut out = String::new();
                    if !self.finished {
                        match self.flush_calls(None) {
                            Ok(text) => out.push_str(&text),
                            Err(e) => return Some(self.error(e)),
                        }
                    }
                    out.push_str("data: [DONE]\n\n");
                    return Some(out);
                }
                Ok(SseEvent::Data(data)) => {
                    let Ok(mut chunk) = serde_json::from_str::<Value>(&data) else {
                        continue;
                    };
                    match self.rewrite(&mut chunk) {
                        Ok(Some(text)) => return Some(text),
                        Ok(None) => continue,
                        Err(e) => {
                            self.done = true;
                            return Some(self.error(e));
                        }
                    }
                }
            }
        }
    }

    fn error(&self, e: ApiError) -> String {
        if !self.finished {
            self.gw.leg_ended(&self.leg, "failed");
        }
        format!("data: {}\n\ndata: [DONE]\n\n", e.body())
    }

    /// Rewrites one chunk; tool-call deltas are absorbed until the finish chunk.
    fn rewrite(&mut self, chunk: &mut Value) -> Result<Option<String>, ApiError> {
        chunk["model"] = json!(self.leg.model);
        let mut finish = None;
        if let Some(choice) = chunk.get_mut("choices").and_then(|c| c.get_mut(0)) {
            if let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut) {
                if let Some(text) = delta.get("content").and_then(Value::as_str) {
                    self.content.push_str(text);
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
                    // Nothing else in this delta: nothing to send now.
                    let meaningful = delta.iter().any(|(k, v)| k != "content" && !v.is_null())
                        || delta
                            .get("content")
                            .is_some_and(|c| c.as_str().is_some_and(|s| !s.is_empty()));
                    if !meaningful && choice["finish_reason"].is_null() {
                        return Ok(None);
                    }
                }
            }
            finish = choice["finish_reason"].as_str().map(str::to_owned);
        }
        let mut out = String::new();
        if finish.is_some() && !self.finished {
            out.push_str(&self.flush_calls(Some(chunk))?);
        }
        out.push_str(&format!("data: {chunk}\n\n"));
        Ok(Some(out))
    }

    /// Registers the assembled calls and writes their deltas (using `like`'s envelope), or
    /// ends the execution when there are none.
    fn flush_calls(&mut self, like: Option<&Value>) -> Result<String, ApiError> {
        self.finished = true;
        if self.calls.is_empty() {
            self.gw.leg_ended(&self.leg, "completed");
            return Ok(String::new());
        }
        let calls: Vec<PartialCall> = self.calls.values().cloned().collect();
        let tokens = self.gw.suspend_upstream(&self.leg, &self.content, &calls)?;
        let envelope = |delta: Value| {
            let mut c = like
                .cloned()
                .unwrap_or_else(|| json!({"object": "chat.completion.chunk"}));
            c["model"] = json!(self.leg.model);
            c["choices"] =
                json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}]);
            if let Some(o) = c.as_object_mut() {
                if o.get("usage").is_some_and(|u| !u.is_null()) {
                    o.insert("usage".into(), Value::Null);
                }
            }
            format!("data: {c}\n\n")
        };
        let mut out = String::new();
        for (i, (call, tok)) in calls.iter().zip(&tokens).enumerate() {
            out.push_str(&envelope(
                json!({"tool_calls": [{"index": i, "id": tok, "type": "function",
                "function": {"name": call.name, "arguments": ""}}]}),
            ));
            out.push_str(&envelope(
                json!({"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]}),
            ));
        }
        if like.is_none() {
            let mut fin = envelope(json!({}));
            fin = fin.replace("\"finish_reason\":null", "\"finish_reason\":\"tool_calls\"");
            out.push_str(&fin);
        }
        Ok(out)
    }
}
