//! SSE framing of a leg, exactly as OpenAI streams: a role-only opening delta, content deltas,
//! per tool call a first delta with `index`, `id`, `type` and `function.name` then the
//! arguments, one chunk with `finish_reason`, an optional usage chunk, and one `[DONE]`.
//! An error decided before the first byte is a real HTTP status; after that it is one
//! `data: {"error":…}` event followed by `[DONE]`. Silent stretches carry `: keep-alive`.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::gateway::{Leg, LegEvent};
use crate::openai::{chunk, usage_chunk, ResponseMeta};

struct Framer {
    meta: ResponseMeta,
    include_usage: bool,
}

fn event(v: &Value) -> String {
    format!("data: {v}\n\n")
}

impl Framer {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> String {
        event(&chunk(&self.meta, delta, finish, self.include_usage))
    }

    fn opening(&self) -> String {
        self.chunk(json!({"role": "assistant"}), None)
    }

    /// Frames one leg event; returns the text and whether the stream is finished.
    fn frame(&self, ev: LegEvent) -> (String, bool) {
        match ev {
            LegEvent::Delta(d) => (self.chunk(json!({"content": d}), None), false),
            LegEvent::Notice(n) => (format!(": {}\n\n", n.replace(['\n', '\r'], " ")), false),
            LegEvent::End { calls, usage } => {
                let mut out = String::new();
                for (i, c) in calls.iter().enumerate() {
                    out.push_str(&self.chunk(
                        json!({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                                               "function": {"name": c.name, "arguments": ""}}]}),
                        None,
                    ));
                    out.push_str(&self.chunk(
                        json!({"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]}),
                        None,
                    ));
                }
                let finish = if calls.is_empty() {
                    "stop"
                } else {
                    "tool_calls"
                };
                out.push_str(&self.chunk(json!({}), Some(finish)));
                if self.include_usage {
                    out.push_str(&event(&usage_chunk(&self.meta, usage)));
                }
                out.push_str("data: [DONE]\n\n");
                (out, true)
            }
            LegEvent::Error(e) => (format!("{}data: [DONE]\n\n", event(&e.body())), true),
        }
    }
}

/// Builds the streaming response. Waits briefly for the first event so that an early failure
/// is still a real status.
pub async fn respond(
    mut leg: Leg,
    include_usage: bool,
    keepalive: Duration,
) -> Result<Response, ApiError> {
    let first = match tokio::time::timeout(keepalive, leg.events.recv()).await {
        Ok(Some(LegEvent::Error(e))) => return Err(e),
        Ok(None) => return Err(ApiError::upstream()),
        Ok(Some(ev)) => Some(ev),
        Err(_) => None,
    };
    let framer = Framer {
        meta: leg.meta.clone(),
        include_usage,
    };
    let mut opening = framer.opening();
    let mut done = false;
    if let Some(ev) = first {
        let (text, end) = framer.frame(ev);
        opening.push_str(&text);
        done = end;
    }
    let state = (leg, framer, done);
    let rest = futures::stream::unfold(state, move |(mut leg, framer, done)| async move {
        if done {
            return None;
        }
        let (text, end) = match tokio::time::timeout(keepalive, leg.events.recv()).await {
            Err(_) => (": keep-alive\n\n".to_string(), false),
            Ok(Some(ev)) => framer.frame(ev),
            Ok(None) => framer.frame(LegEvent::Error(ApiError::upstream())),
        };
        Some((
            Ok::<_, std::convert::Infallible>(Bytes::from(text)),
            (leg, framer, end),
        ))
    });
    let head = futures::stream::once(async move { Ok(Bytes::from(opening)) });
    let body = Body::from_stream(futures::StreamExt::chain(head, rest));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(body)
        .map_err(|_| ApiError::new(crate::error::ErrorCode::Internal, "response build failed"))
}

/// A stateless upstream's already-framed stream.
pub fn relay(
    stream: futures::stream::BoxStream<'static, Result<Bytes, std::convert::Infallible>>,
) -> Result<Response, ApiError> {
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(stream))
        .map_err(|_| ApiError::new(crate::error::ErrorCode::Internal, "response build failed"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::{ExposedCall, Usage};

    fn framer(include_usage: bool) -> Framer {
        Framer {
            meta: ResponseMeta {
                id: "chatcmpl-x".into(),
                created: 1,
                model: "m".into(),
            },
            include_usage,
        }
    }

    fn events(text: &str) -> Vec<Value> {
        text.split("\n\n")
            .filter(|e| e.starts_with("data: ") && !e.ends_with("[DONE]"))
            .map(|e| serde_json::from_str(&e[6..]).unwrap())
            .collect()
    }

    #[test]
    fn tool_call_deltas_follow_openai() {
        let f = framer(true);
        let (text, end) = f.frame(LegEvent::End {
            calls: vec![
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
            ],
            usage: Usage {
                prompt_tokens: 1,
                completion_tokens: 2,
                total_tokens: 3,
                cached_tokens: 0,
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
    fn error_after_headers_is_one_event_then_done() {
        let (text, end) = framer(false).frame(LegEvent::Error(ApiError::upstream()));
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
