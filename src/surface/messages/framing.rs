//! The message object and its event stream, as Anthropic streams them: `message_start`, per
//! content block `content_block_start`, its deltas (`text_delta`, or one `input_json_delta`
//! with a call's whole input) and `content_block_stop`, then `message_delta` (`stop_reason`,
//! usage) and `message_stop`. Every event has an `event:` line naming its `type`. Silent
//! stretches carry `ping` events. An error decided before the first byte is a real HTTP
//! status; after it, an `error` event ends the stream.
//!
//! Reasoning the backend shows is a `thinking` block (`thinking_delta`s, then a
//! `signature_delta` before its stop) when the request enabled thinking: with its text, or
//! with none under `display: "omitted"`. The signature is opaque; a client sends the block
//! back and the gateway drops it (it is never evidence of anything).
//!
//! Each leg of an execution answers as its own message (`msg_` + the execution id's hex, then
//! `_N` after N tool rounds); a call's `tool_use.id` is its continuation token.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

use super::echo::{input_of, visible};
use super::wire::{DeltaUsage, Message};
use super::{message_id, Framing, Thinking};
use crate::engine::{Leg, LegEvent};
use crate::error::ApiError;
use crate::surface::sse;
use crate::turn::{ExposedCall, Usage};

/// A text block as Anthropic answers it (`citations` is required, and null here).
fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text, "citations": null})
}

fn stop_reason(calls: &[ExposedCall], truncated: bool) -> &'static str {
    if !calls.is_empty() {
        "tool_use"
    } else if truncated {
        "max_tokens"
    } else {
        "end_turn"
    }
}

fn tool_use(c: &ExposedCall) -> Value {
    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input_of(&c.arguments),
           "caller": {"type": "direct"}})
}

/// The signature of a thinking block the gateway shows (opaque to clients, never checked).
const SIGNATURE: &str = "dHVybnN0aWxl";

/// A thinking block, whole.
fn thinking_block(text: &str) -> Value {
    json!({"type": "thinking", "thinking": text, "signature": SIGNATURE})
}

struct Framer {
    id: String,
    model: String,
    thinking: Thinking,
    /// Content blocks started so far.
    blocks: usize,
    text_open: bool,
    thinking_open: bool,
    /// Whitespace waiting for text: a text block is opened only for visible text.
    pending: String,
    truncated: bool,
}

fn event(out: &mut String, kind: &str, mut v: Value) {
    v["type"] = json!(kind);
    out.push_str(&format!("event: {kind}\ndata: {v}\n\n"));
}

impl Framer {
    fn close_text(&mut self, out: &mut String) {
        if std::mem::take(&mut self.text_open) {
            event(out, "content_block_stop", json!({"index": self.blocks - 1}));
        }
    }

    fn close_thinking(&mut self, out: &mut String) {
        if std::mem::take(&mut self.thinking_open) {
            let index = self.blocks - 1;
            let delta = json!({"type": "signature_delta", "signature": SIGNATURE});
            event(
                out,
                "content_block_delta",
                json!({"index": index, "delta": delta}),
            );
            event(out, "content_block_stop", json!({"index": index}));
        }
    }

    fn reasoning(&mut self, out: &mut String, r: &str) {
        if self.thinking == Thinking::Hidden {
            return;
        }
        if !self.thinking_open {
            self.close_text(out);
            self.thinking_open = true;
            self.blocks += 1;
            let block = json!({"type": "thinking", "thinking": "", "signature": ""});
            event(
                out,
                "content_block_start",
                json!({"index": self.blocks - 1, "content_block": block}),
            );
        }
        if self.thinking == Thinking::Shown {
            let delta = json!({"type": "thinking_delta", "thinking": r});
            event(
                out,
                "content_block_delta",
                json!({"index": self.blocks - 1, "delta": delta}),
            );
        }
    }

    fn call(&mut self, out: &mut String, c: &ExposedCall) {
        let index = self.blocks;
        self.blocks += 1;
        let mut block = tool_use(c);
        let input = std::mem::replace(&mut block["input"], json!({}));
        event(
            out,
            "content_block_start",
            json!({"index": index, "content_block": block}),
        );
        event(
            out,
            "content_block_delta",
            json!({"index": index, "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
        );
        event(out, "content_block_stop", json!({"index": index}));
    }
}

impl sse::Frame for Framer {
    fn opening(&mut self) -> String {
        let mut out = String::new();
        let m = Message::new(&self.id, &self.model, &[], None, Usage::default());
        let start = json!({"type": "message_start", "message": m});
        out.push_str(&format!("event: message_start\ndata: {start}\n\n"));
        out
    }

    fn frame(&mut self, ev: LegEvent) -> (String, bool) {
        let mut out = String::new();
        match ev {
            LegEvent::Reasoning(r) => self.reasoning(&mut out, &r),
            LegEvent::Delta(mut d) => {
                if !self.text_open {
                    self.pending.push_str(&d);
                    if visible(&self.pending).is_empty() {
                        return (out, false);
                    }
                    d = std::mem::take(&mut self.pending);
                    self.close_thinking(&mut out);
                    self.text_open = true;
                    self.blocks += 1;
                    event(
                        &mut out,
                        "content_block_start",
                        json!({"index": self.blocks - 1, "content_block": text_block("")}),
                    );
                }
                event(
                    &mut out,
                    "content_block_delta",
                    json!({"index": self.blocks - 1, "delta": {"type": "text_delta", "text": d}}),
                );
            }
            LegEvent::Relayed(_) | LegEvent::ToolEnded(_) => {}
            LegEvent::Truncated => self.truncated = true,
            LegEvent::Approval(n) => {
                if let Some(t) = n.text() {
                    out.push_str(&sse::notice_comment(&t));
                }
            }
            LegEvent::End { calls, usage } => {
                self.close_thinking(&mut out);
                self.close_text(&mut out);
                for c in &calls {
                    self.call(&mut out, c);
                }
                event(
                    &mut out,
                    "message_delta",
                    json!({"delta": {"stop_reason": stop_reason(&calls, self.truncated), "stop_sequence": null,
                                     "stop_details": null, "container": null},
                           "usage": DeltaUsage::from(usage)}),
                );
                event(&mut out, "message_stop", json!({}));
                return (out, true);
            }
            LegEvent::Error(e) => {
                event(&mut out, "error", error_body(&ApiError::from(e)));
                return (out, true);
            }
        }
        (out, false)
    }

    fn keepalive(&mut self) -> String {
        "event: ping\ndata: {\"type\":\"ping\"}\n\n".to_string()
    }
}

/// The streaming body.
pub async fn stream(
    leg: Leg,
    framing: Framing,
    keepalive: Duration,
) -> Result<sse::Body, ApiError> {
    let framer = Framer {
        id: message_id(&leg.execution_id, leg.round),
        model: framing.model,
        thinking: framing.thinking,
        blocks: 0,
        text_open: false,
        thinking_open: false,
        pending: String::new(),
        truncated: false,
    };
    // Claude Code's gateway protocol: a `ping` in every 10 s of silence at the latest.
    sse::stream(leg, framer, keepalive.min(MAX_SILENCE)).await
}

/// The longest silence a stream keeps before a `ping`.
const MAX_SILENCE: Duration = Duration::from_secs(10);

/// Non-streaming: waits for the leg's end and answers one message object.
pub async fn collect(mut leg: Leg, framing: Framing) -> Result<Bytes, ApiError> {
    let id = message_id(&leg.execution_id, leg.round);
    let mut text = String::new();
    let mut thought: Option<String> = None;
    let mut truncated = false;
    while let Some(ev) = leg.events.recv().await {
        match ev {
            LegEvent::Delta(d) => text.push_str(&d),
            LegEvent::Reasoning(r) => thought.get_or_insert_default().push_str(&r),
            LegEvent::Truncated => truncated = true,
            LegEvent::Relayed(_) | LegEvent::Approval(_) | LegEvent::ToolEnded(_) => {}
            LegEvent::Error(e) => return Err(e.into()),
            LegEvent::End { calls, usage } => {
                let mut content = Vec::new();
                match (framing.thinking, thought) {
                    (Thinking::Shown, Some(t)) => content.push(thinking_block(&t)),
                    (Thinking::Omitted, Some(_)) => content.push(thinking_block("")),
                    _ => {}
                }
                if !visible(&text).is_empty() {
                    content.push(text_block(&text));
                }
                content.extend(calls.iter().map(tool_use));
                let stop = stop_reason(&calls, truncated);
                let m = Message::new(&id, &framing.model, &content, Some(stop), usage);
                return serde_json::to_vec(&m)
                    .map(Bytes::from)
                    .map_err(|_| ApiError::upstream());
            }
        }
    }
    Err(ApiError::upstream())
}

/// The Anthropic error body: `{"type":"error","error":{"type","message"}}`, the message led
/// by Turnstile's stable code (`continuation_not_found: ...`). An upstream's own rejection is
/// relayed with its text alone: Claude Code's recovery keys on it (`prompt is too long`
/// starts its compaction), and an OpenAI-style context-length refusal is worded that way.
pub fn error_body(e: &ApiError) -> Value {
    let kind = super::headers::error_type(e, super::headers::status(e));
    let message = match &e.upstream {
        Some(u) => upstream_message(&e.message, u.code.as_deref()),
        None => format!("{}: {}", e.code.as_str(), e.message),
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// An upstream's refusal as Anthropic's clients match it.
fn upstream_message(text: &str, code: Option<&str>) -> String {
    let lower = text.to_ascii_lowercase();
    let too_long = code == Some("context_length_exceeded")
        || lower.contains("maximum context length")
        || lower.contains("context window");
    match too_long && !lower.contains("prompt is too long") {
        true => format!("prompt is too long: {text}"),
        false => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineError;
    use crate::surface::sse::Frame;

    fn framer() -> Framer {
        Framer {
            id: "msg_1".into(),
            model: "m".into(),
            thinking: Thinking::Hidden,
            blocks: 0,
            text_open: false,
            thinking_open: false,
            pending: String::new(),
            truncated: false,
        }
    }

    /// The kinds of block each `content_block_start` opened, and the thinking text.
    fn thinking_run(thinking: Thinking) -> (Vec<String>, String) {
        let mut f = framer();
        f.thinking = thinking;
        let mut text = f.opening();
        for ev in [
            LegEvent::Reasoning("Pondering ".into()),
            LegEvent::Reasoning("deeply.".into()),
            LegEvent::Delta("Done.".into()),
            LegEvent::End {
                calls: Vec::new(),
                usage: Usage::default(),
            },
        ] {
            text.push_str(&f.frame(ev).0);
        }
        let ev = events(&text);
        let blocks = ev
            .iter()
            .filter(|(k, _)| k == "content_block_start")
            .map(|(_, v)| v["content_block"]["type"].as_str().unwrap().to_string())
            .collect();
        let thought = ev
            .iter()
            .filter_map(|(_, v)| v["delta"]["thinking"].as_str())
            .collect();
        for (i, (k, v)) in ev.iter().enumerate() {
            if k == "content_block_stop" && v["index"] == 0 && blocks_of(&ev) > 1 {
                assert_eq!(ev[i - 1].1["delta"]["type"], "signature_delta");
            }
        }
        (blocks, thought)
    }

    fn blocks_of(ev: &[(String, Value)]) -> usize {
        ev.iter()
            .filter(|(k, _)| k == "content_block_start")
            .count()
    }

    #[test]
    fn reasoning_is_a_thinking_block_shown_omitted_or_hidden_as_asked() {
        let (blocks, thought) = thinking_run(Thinking::Shown);
        assert_eq!(blocks, ["thinking", "text"]);
        assert_eq!(thought, "Pondering deeply.");
        let (blocks, thought) = thinking_run(Thinking::Omitted);
        assert_eq!(blocks, ["thinking", "text"]);
        assert_eq!(thought, "");
        let (blocks, _) = thinking_run(Thinking::Hidden);
        assert_eq!(blocks, ["text"]);
    }

    fn events(text: &str) -> Vec<(String, Value)> {
        text.split("\n\n")
            .filter(|e| !e.trim().is_empty() && !e.starts_with(':'))
            .map(|e| {
                let kind = e.lines().find_map(|l| l.strip_prefix("event: ")).unwrap();
                let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
                (kind.to_string(), serde_json::from_str(data).unwrap())
            })
            .collect()
    }

    #[test]
    fn event_grammar_of_text_then_calls() {
        let mut f = framer();
        let mut text = f.opening();
        assert_eq!(f.frame(LegEvent::Delta("\n".into())).0, "");
        text.push_str(&f.frame(LegEvent::Delta("he".into())).0);
        text.push_str(&f.keepalive());
        text.push_str(&f.frame(LegEvent::Delta("y".into())).0);
        let calls = vec![
            ExposedCall {
                id: "srct-a".into(),
                name: "Read".into(),
                arguments: r#"{"file_path":"/x"}"#.into(),
            },
            ExposedCall {
                id: "srct-b".into(),
                name: "Bash".into(),
                arguments: String::new(),
            },
        ];
        let usage = Usage {
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 5,
            ..Usage::default()
        };
        let (end, done) = f.frame(LegEvent::End { calls, usage });
        assert!(done);
        text.push_str(&end);
        let ev = events(&text);
        let kinds: Vec<&str> = ev.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "ping",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        for (kind, v) in &ev {
            assert_eq!(v["type"], kind.as_str());
        }
        assert_eq!(ev[0].1["message"]["id"], "msg_1");
        assert_eq!(ev[6].1["content_block"]["id"], "srct-a");
        assert_eq!(ev[6].1["content_block"]["input"], json!({}));
        assert_eq!(ev[7].1["delta"]["partial_json"], r#"{"file_path":"/x"}"#);
        assert_eq!(ev[10].1["delta"]["partial_json"], "{}");
        assert_eq!(ev[11].1["index"], 2);
        assert_eq!(ev[12].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(ev[12].1["usage"]["input_tokens"], 6);
        assert_eq!(ev[12].1["usage"]["cache_read_input_tokens"], 4);
    }

    #[test]
    fn whitespace_alone_is_no_text_block() {
        let mut f = framer();
        f.opening();
        assert_eq!(f.frame(LegEvent::Delta("\n\n".into())).0, "");
        let call = ExposedCall {
            id: "srct-a".into(),
            name: "Read".into(),
            arguments: "{}".into(),
        };
        let (text, _) = f.frame(LegEvent::End {
            calls: vec![call],
            usage: Usage::default(),
        });
        let ev = events(&text);
        assert_eq!(ev[0].1["content_block"]["type"], "tool_use");
        assert_eq!(ev[0].1["index"], 0);
    }

    #[test]
    fn truncation_and_errors() {
        let mut f = framer();
        f.opening();
        f.frame(LegEvent::Truncated);
        let (text, _) = f.frame(LegEvent::End {
            calls: Vec::new(),
            usage: Usage::default(),
        });
        assert_eq!(events(&text)[0].1["delta"]["stop_reason"], "max_tokens");
        let mut f = framer();
        f.opening();
        let (text, done) = f.frame(LegEvent::Error(EngineError::TurnFailed));
        assert!(done);
        let ev = events(&text);
        assert_eq!(ev[0].0, "error");
        assert_eq!(ev[0].1["error"]["type"], "api_error");
    }

    /// A silent stream (a held approval, a long pause) pings at least every 10 s, even with
    /// a longer configured keep-alive.
    #[tokio::test(start_paused = true)]
    async fn silence_is_broken_by_a_ping_every_ten_seconds() {
        use futures::StreamExt;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let leg = crate::surface::sse::tests::leg(rx);
        let framing = Framing {
            stream: true,
            model: "m".into(),
            thinking: Thinking::Hidden,
        };
        let started = tokio::time::Instant::now();
        let mut body = stream(leg, framing, Duration::from_secs(60)).await.unwrap();
        let opening = body.next().await.unwrap().unwrap();
        assert!(String::from_utf8_lossy(&opening).contains("message_start"));
        let ping = body.next().await.unwrap().unwrap();
        assert_eq!(&ping[..], b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
        assert_eq!(started.elapsed(), Duration::from_secs(20));
        drop(tx);
    }
}
