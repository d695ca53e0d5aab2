//! Framing of a leg in the Chat Completions wire, exactly as OpenAI streams: a role-only
//! opening delta, content deltas, per tool call a first delta with `index`, `id`, `type` and
//! `function.name` then the arguments, one chunk with `finish_reason`, an optional usage chunk,
//! and one `[DONE]`. An error decided before the first byte is a real HTTP status; after that it
//! is one `data: {"error":…}` event followed by `[DONE]`. Silent stretches carry `: keep-alive`.
//!
//! A leg of a stateless upstream that speaks this wire (`Leg::native`) carries the upstream's
//! own chunks: they are relayed as sent (only `model` renamed), and the gateway adds just the
//! tool-call deltas with their tokens. Chunks from the first one with a `finish_reason` on are
//! held until the leg ends, because the tokens exist only once the calls are registered.

use std::time::Duration;

use serde_json::{json, Value};

use super::error_body;
use super::wire::{chunk, completion, usage_chunk, ResponseMeta};
use crate::engine::{Leg, LegEvent};
use crate::error::ApiError;
use crate::surface::{sse, Answer};
use crate::turn::ExposedCall;
use crate::turn::Relayed;

fn event(v: &Value) -> String {
    format!("data: {v}\n\n")
}

const DONE: &str = "data: [DONE]\n\n";

/// The completion id of an execution: every leg of it answers with the same one.
pub fn completion_id(execution_id: &str, _round: u32) -> String {
    // Written by hand: `format!` and a pattern search cost ten times this on every request.
    let hex = execution_id.strip_prefix("exe-").unwrap_or(execution_id);
    let mut id = String::with_capacity("chatcmpl-".len() + hex.len());
    id.push_str("chatcmpl-");
    id.push_str(hex);
    id
}

fn meta(leg: &Leg) -> ResponseMeta {
    ResponseMeta {
        id: completion_id(&leg.execution_id, 0),
        created: leg.created,
        model: leg.model.clone(),
    }
}

fn finish_reason(calls: &[ExposedCall]) -> &'static str {
    if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

/// The two deltas of each call: `index`, `id`, `type`, `function.name`, then the arguments.
fn call_deltas(calls: &[ExposedCall]) -> impl Iterator<Item = Value> + '_ {
    calls.iter().enumerate().flat_map(|(i, c)| {
        [
            json!({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": ""}}]}),
            json!({"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]}),
        ]
    })
}

struct Framer {
    meta: ResponseMeta,
    include_usage: bool,
    native: bool,
    /// Native chunks held from the finish chunk on (see the module doc).
    held: Vec<Relayed>,
}

impl sse::Frame for Framer {
    fn opening(&mut self) -> String {
        if self.native {
            return String::new();
        }
        self.chunk(json!({"role": "assistant"}), None)
    }

    fn frame(&mut self, ev: LegEvent) -> (String, bool) {
        Framer::frame(self, ev)
    }
}

impl Framer {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> String {
        event(&chunk(&self.meta, delta, finish, self.include_usage))
    }

    /// Frames one leg event; returns the text and whether the stream is finished.
    fn frame(&mut self, ev: LegEvent) -> (String, bool) {
        match ev {
            // A Chat answer's own chunks carry its `finish_reason`.
            LegEvent::Delta(_) | LegEvent::Reasoning(_) if self.native => (String::new(), false),
            LegEvent::Truncated | LegEvent::ToolEnded(_) => (String::new(), false),
            LegEvent::Delta(d) => (self.chunk(json!({"content": d}), None), false),
            LegEvent::Reasoning(r) => (self.chunk(json!({"reasoning_content": r}), None), false),
            // Relayed as the upstream sent them, `model` already renamed.
            LegEvent::Relayed(c) => {
                if !self.held.is_empty() || c.finishes() {
                    self.held.push(c);
                    return (String::new(), false);
                }
                (c.into_event(), false)
            }
            LegEvent::Approval(n) => {
                let text = n.text().map(|t| crate::surface::sse::notice_comment(&t));
                (text.unwrap_or_default(), false)
            }
            LegEvent::End { calls, usage } => {
                let mut out = String::new();
                if self.native {
                    self.native_end(&calls, &mut out);
                } else {
                    for delta in call_deltas(&calls) {
                        out.push_str(&self.chunk(delta, None));
                    }
                    out.push_str(&self.chunk(json!({}), Some(finish_reason(&calls))));
                    if self.include_usage {
                        out.push_str(&event(&usage_chunk(&self.meta, usage)));
                    }
                }
                out.push_str(DONE);
                (out, true)
            }
            LegEvent::Error(e) => {
                let e = ApiError::from(e);
                (format!("{}{DONE}", event(&error_body(&e))), true)
            }
        }
    }

    /// The end of a relayed leg: the call deltas in the envelope of the upstream's finish
    /// chunk, then the held chunks (or a finish chunk of our own if the upstream sent none).
    fn native_end(&mut self, calls: &[ExposedCall], out: &mut String) {
        let held = std::mem::take(&mut self.held);
        if !calls.is_empty() {
            let like = held
                .first()
                .map(Relayed::to_value)
                .unwrap_or_else(|| json!({"object": "chat.completion.chunk"}));
            let envelope = |delta: Value, finish: Option<&str>| {
                let mut c = like.clone();
                c["model"] = json!(&*self.meta.model);
                c["choices"] = json!([{"index": 0, "delta": delta, "logprobs": null,
                                       "finish_reason": finish}]);
                if let Some(o) = c.as_object_mut() {
                    if o.get("usage").is_some_and(|u| !u.is_null()) {
                        o.insert("usage".into(), Value::Null);
                    }
                }
                event(&c)
            };
            for delta in call_deltas(calls) {
                out.push_str(&envelope(delta, None));
            }
            if held.is_empty() {
                out.push_str(&envelope(json!({}), Some("tool_calls")));
            }
        }
        for c in held {
            out.push_str(&c.into_event());
        }
    }
}

/// The streaming body.
pub async fn stream(
    leg: Leg,
    include_usage: bool,
    keepalive: Duration,
) -> Result<sse::Body, ApiError> {
    let framer = Framer {
        meta: meta(&leg),
        include_usage,
        native: leg.native,
        held: Vec::new(),
    };
    sse::stream(leg, framer, keepalive).await
}

/// Non-streaming: waits for the leg's end and answers one `chat.completion`.
pub async fn collect(mut leg: Leg) -> Result<Answer, ApiError> {
    let meta = meta(&leg);
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut native = None;
    while let Some(ev) = leg.events.recv().await {
        match ev {
            LegEvent::Delta(d) => text.push_str(&d),
            LegEvent::Reasoning(r) => reasoning.push_str(&r),
            LegEvent::Relayed(body) => native = Some(body),
            LegEvent::Approval(_) | LegEvent::Truncated | LegEvent::ToolEnded(_) => {}
            LegEvent::Error(e) => return Err(e.into()),
            LegEvent::End { calls, usage } => {
                if let Some(body) = native {
                    let mut body = match (body, calls.is_empty()) {
                        (Relayed::Raw { json, .. }, true) => return Ok(Answer::Raw(json.into())),
                        (body, _) => body.into_value(),
                    };
                    body["model"] = json!(&*meta.model);
                    if !calls.is_empty() {
                        let list: Vec<Value> = calls
                            .iter()
                            .map(|c| {
                                json!({"id": c.id, "type": "function",
                                       "function": {"name": c.name, "arguments": c.arguments}})
                            })
                            .collect();
                        body["choices"][0]["message"]["tool_calls"] = Value::Array(list);
                    }
                    super::wire::conform(&mut body);
                    return Ok(Answer::Json(body));
                }
                let content = if text.is_empty() && !calls.is_empty() {
                    None
                } else {
                    Some(text.as_str())
                };
                let reasoning = (!reasoning.is_empty()).then_some(reasoning.as_str());
                let finish = finish_reason(&calls);
                let body = completion(&meta, content, reasoning, &calls, finish, usage);
                return Ok(Answer::Raw(body.into()));
            }
        }
    }
    Err(ApiError::upstream())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::surface::sse::Frame as _;
    use crate::turn::Usage;

    fn framer(include_usage: bool) -> Framer {
        Framer {
            meta: ResponseMeta {
                id: "chatcmpl-x".into(),
                created: 1,
                model: "m".into(),
            },
            include_usage,
            native: false,
            held: Vec::new(),
        }
    }

    fn events(text: &str) -> Vec<Value> {
        text.split("\n\n")
            .filter(|e| e.starts_with("data: ") && !e.ends_with("[DONE]"))
            .map(|e| serde_json::from_str(&e[6..]).unwrap())
            .collect()
    }

    fn calls() -> Vec<ExposedCall> {
        vec![
            ExposedCall {
                id: "srct-a".into(),
                name: "read".into(),
                arguments: "{\"p\":1}".into(),
            },
            ExposedCall {
                id: "srct-b".into(),
                name: "ls".into(),
                arguments: "{}".into(),
            },
        ]
    }

    #[test]
    fn tool_call_deltas_follow_openai() {
        let mut f = framer(true);
        let (text, end) = f.frame(LegEvent::End {
            calls: calls(),
            usage: Usage {
                prompt_tokens: 1,
                completion_tokens: 2,
                total_tokens: 3,
                ..Usage::default()
            },
        });
        assert!(end);
        assert!(text.ends_with("data: [DONE]\n\n"));
        assert_eq!(text.matches("[DONE]").count(), 1);
        let ev = events(&text);
        assert_eq!(ev.len(), 6);
        let first = &ev[0]["choices"][0]["delta"]["tool_calls"][0];
        assert_eq!(first["index"], 0);
        assert_eq!(first["id"], "srct-a");
        assert_eq!(first["type"], "function");
        assert_eq!(first["function"]["name"], "read");
        let args = &ev[1]["choices"][0]["delta"]["tool_calls"][0];
        assert!(args.get("id").is_none() && args["function"].get("name").is_none());
        assert_eq!(args["function"]["arguments"], "{\"p\":1}");
        assert_eq!(ev[2]["choices"][0]["delta"]["tool_calls"][0]["index"], 1);
        assert_eq!(ev[4]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(ev[4]["choices"][0]["delta"], json!({}));
        assert!(ev[4]["usage"].is_null());
        assert_eq!(ev[5]["choices"], json!([]));
        assert_eq!(ev[5]["usage"]["total_tokens"], 3);
    }

    #[test]
    fn relayed_chunks_pass_through_and_calls_precede_the_finish_chunk() {
        let mut f = framer(false);
        f.native = true;
        assert_eq!(f.opening(), "");
        let up = json!({"id": "up", "model": "x", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": null}], "extra": 1});
        let raw =
            crate::backend::upstream::native::plain(&up.to_string(), Some("m"), false).unwrap();
        let (text, _) = f.frame(LegEvent::Relayed(Relayed::Raw {
            json: raw.json,
            finish: false,
        }));
        let ev = events(&text);
        assert_eq!(
            (ev[0]["model"].as_str(), ev[0]["extra"].as_i64()),
            (Some("m"), Some(1))
        );
        assert_eq!(f.frame(LegEvent::Delta("hi".into())).0, "");
        let fin = json!({"id": "up", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}], "usage": {"total_tokens": 3}});
        assert_eq!(f.frame(LegEvent::Relayed(Relayed::Tree(fin))).0, "");
        let (text, end) = f.frame(LegEvent::End {
            calls: calls(),
            usage: Usage::default(),
        });
        assert!(end);
        let ev = events(&text);
        assert_eq!(ev.len(), 5);
        assert_eq!(ev[0]["id"], "up");
        assert!(ev[0]["usage"].is_null());
        assert_eq!(
            ev[0]["choices"][0]["delta"]["tool_calls"][0]["id"],
            "srct-a"
        );
        assert_eq!(ev[4]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(ev[4]["usage"]["total_tokens"], 3);
    }

    #[test]
    fn error_after_headers_is_one_event_then_done() {
        let (text, end) =
            framer(false).frame(LegEvent::Error(crate::engine::EngineError::TurnFailed));
        assert!(end);
        let ev = events(&text);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0]["error"]["code"], "upstream_error");
        assert!(text.ends_with("data: [DONE]\n\n"));
    }

    #[test]
    fn opening_delta_is_role_only() {
        let ev = events(&framer(false).opening());
        assert_eq!(ev[0]["choices"][0]["delta"], json!({"role": "assistant"}));
        assert!(ev[0].get("usage").is_none());
    }
}
