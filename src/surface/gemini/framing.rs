//! The `GenerateContentResponse` and its stream. Streamed, each text delta is a response of
//! its own with one text part (a `thought` part for reasoning, when `includeThoughts` asked
//! for it); the last carries the calls as `functionCall` parts (`id`: the token), the
//! `finishReason` (`STOP`, or `MAX_TOKENS` when cut) and `usageMetadata`. With `alt=sse` each
//! response is a `data:` event (`\r\n\r\n`-terminated, as Google's are); without, the stream is
//! one JSON array. Silent stretches carry an empty line (neither SDK's stream reader takes an
//! SSE comment), and an error after the first byte is an `{"error": ...}` element that ends
//! the stream.

use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

use super::{response_id, Framing};
use crate::engine::{Leg, LegEvent};
use crate::error::ApiError;
use crate::surface::messages::echo::{input_of, visible};
use crate::surface::{sse, Answer, Surface};
use crate::turn::{ExposedCall, Usage};

/// `usageMetadata`: the prompt (cached tokens included), the candidates' tokens (reasoning
/// apart, as `thoughtsTokenCount`) and their sum.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    prompt_token_count: u64,
    candidates_token_count: u64,
    total_token_count: u64,
    #[serde(skip_serializing_if = "is_zero")]
    cached_content_token_count: u64,
    #[serde(skip_serializing_if = "is_zero")]
    thoughts_token_count: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl UsageMetadata {
    fn of(u: Usage) -> UsageMetadata {
        let thoughts = u.reasoning_tokens.min(u.completion_tokens);
        UsageMetadata {
            prompt_token_count: u.prompt_tokens,
            candidates_token_count: u.completion_tokens - thoughts,
            total_token_count: u.prompt_tokens + u.completion_tokens,
            cached_content_token_count: u.cached_tokens,
            thoughts_token_count: thoughts,
        }
    }
}

/// One `GenerateContentResponse`: a candidate with `parts`, and what ends it when `end` is
/// given. Typed, so that an answer is written straight to bytes.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Response<'a> {
    candidates: [Candidate; 1],
    model_version: &'a str,
    response_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage_metadata: Option<UsageMetadata>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    content: Content,
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct Content {
    parts: Vec<Value>,
    role: &'static str,
}

fn call_part(c: &ExposedCall) -> Value {
    json!({"functionCall": {"id": c.id, "name": c.name, "args": input_of(&c.arguments)}})
}

fn finish_reason(truncated: bool) -> &'static str {
    match truncated {
        true => "MAX_TOKENS",
        false => "STOP",
    }
}

fn response<'a>(
    id: &'a str,
    model: &'a str,
    parts: Vec<Value>,
    end: Option<(&'static str, Usage)>,
) -> Response<'a> {
    Response {
        candidates: [Candidate {
            content: Content {
                parts,
                role: "model",
            },
            index: 0,
            finish_reason: end.map(|(reason, _)| reason),
        }],
        model_version: model,
        response_id: id,
        usage_metadata: end.map(|(_, usage)| UsageMetadata::of(usage)),
    }
}

struct Framer {
    id: String,
    f: Framing,
    truncated: bool,
    /// Responses written so far (the array form puts a comma before each after the first).
    written: usize,
}

impl Framer {
    /// One response of the stream: `parts`, and what ends it when `end` is given.
    fn respond(&mut self, out: &mut String, parts: Vec<Value>, end: Option<(&'static str, Usage)>) {
        // Cannot fail: strings, numbers and trees.
        let json = serde_json::to_string(&response(&self.id, &self.f.model, parts, end));
        self.element(out, &json.unwrap_or_default());
    }

    fn element(&mut self, out: &mut String, json: &str) {
        if self.f.array {
            if self.written > 0 {
                out.push_str(",\r\n");
            }
            out.push_str(json);
        } else {
            out.push_str("data: ");
            out.push_str(json);
            out.push_str("\r\n\r\n");
        }
        self.written += 1;
    }

    fn close(&self, out: &mut String) {
        if self.f.array {
            out.push(']');
        }
    }
}

impl sse::Frame for Framer {
    fn opening(&mut self) -> String {
        match self.f.array {
            true => "[".to_string(),
            false => String::new(),
        }
    }

    fn frame(&mut self, ev: LegEvent) -> (String, bool) {
        let mut out = String::new();
        match ev {
            LegEvent::Delta(d) => {
                self.respond(&mut out, vec![json!({"text": d})], None);
            }
            LegEvent::Reasoning(t) if self.f.thoughts => {
                let part = json!({"text": t, "thought": true});
                self.respond(&mut out, vec![part], None);
            }
            LegEvent::Truncated => self.truncated = true,
            LegEvent::Reasoning(_)
            | LegEvent::Relayed(_)
            | LegEvent::ToolEnded(_)
            | LegEvent::Approval(_) => {}
            LegEvent::End { calls, usage } => {
                let mut parts: Vec<Value> = calls.iter().map(call_part).collect();
                if parts.is_empty() {
                    parts.push(json!({"text": ""}));
                }
                let end = Some((finish_reason(self.truncated), usage));
                self.respond(&mut out, parts, end);
                self.close(&mut out);
                return (out, true);
            }
            LegEvent::Error(e) => {
                let body = super::errors::body(&ApiError::from(e), super::Gemini::field);
                self.element(&mut out, &body.to_string());
                self.close(&mut out);
                return (out, true);
            }
        }
        (out, false)
    }

    fn keepalive(&mut self) -> String {
        "\r\n".to_string()
    }
}

/// The framing of one leg's stream.
pub(super) fn framer(execution_id: &str, round: u32, f: Framing) -> impl sse::Frame {
    Framer {
        id: response_id(execution_id, round),
        f,
        truncated: false,
        written: 0,
    }
}

/// The streamed answer.
pub async fn stream(leg: Leg, f: Framing, keepalive: Duration) -> Result<sse::Body, ApiError> {
    let framer = framer(&leg.execution_id, leg.round, f);
    sse::stream(leg, framer, keepalive).await
}

/// Waits for the leg's end and answers one response.
pub async fn collect(mut leg: Leg, f: Framing) -> Result<Answer, ApiError> {
    let id = response_id(&leg.execution_id, leg.round);
    let (mut text, mut thought, mut truncated) = (String::new(), String::new(), false);
    while let Some(ev) = leg.events.recv().await {
        match ev {
            LegEvent::Delta(d) => text.push_str(&d),
            LegEvent::Reasoning(r) => thought.push_str(&r),
            LegEvent::Truncated => truncated = true,
            LegEvent::Relayed(_) | LegEvent::Approval(_) | LegEvent::ToolEnded(_) => {}
            LegEvent::Error(e) => return Err(e.into()),
            LegEvent::End { calls, usage } => {
                let mut parts = Vec::with_capacity(calls.len() + 2);
                if f.thoughts && !thought.is_empty() {
                    parts.push(json!({"text": thought, "thought": true}));
                }
                if !visible(&text).is_empty() || calls.is_empty() {
                    parts.push(json!({"text": text}));
                }
                parts.extend(calls.iter().map(call_part));
                let end = Some((finish_reason(truncated), usage));
                // Cannot fail: strings, numbers and trees.
                let body = serde_json::to_vec(&response(&id, &f.model, parts, end));
                return Ok(Answer::Raw(body.unwrap_or_default().into()));
            }
        }
    }
    Err(ApiError::upstream())
}
