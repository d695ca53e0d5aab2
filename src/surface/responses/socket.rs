//! The Responses API's WebSocket mode, as Codex CLI's built-in provider speaks it: the wire.
//! `response.create` messages come in (the HTTP body plus `"type"`); the events of the SSE
//! stream go out, one text frame each, in the same order with the same `sequence_number`s. An
//! error decided before a response's first event is an `error` event carrying the status the
//! HTTP route would answer. The transport (the upgrade, pings, idle close, the credential
//! re-check, one response at a time) is `http/socket.rs`.
//!
//! A socket remembers its last completed response (input and output items): a
//! `response.create` naming it in `previous_response_id` is expanded here into the whole
//! conversation, so it runs exactly as the stateless request Codex sends over HTTP (a held
//! turn's results included). Any other `previous_response_id` goes through as on HTTP. A
//! `generate: false` response (Codex's prewarm) runs nothing and only records its input. What
//! a socket remembers counts in the principal's kept bytes; an expanded conversation is
//! bounded by the body limit.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::framing::{finished, Framer};
use super::plan::{prepare, Prepared};
use super::Framing;
use crate::engine::{EngineError, Kept, Leg, LegEvent};
use crate::error::{ApiError, ErrorCode};
use crate::surface::Host;
use crate::turn::TurnInput;

/// What one socket remembers: its last completed response, and the input of the one in
/// flight, both weighed in the principal's `max_kept_bytes_per_client`.
pub struct Conversation {
    last: Option<Previous>,
    /// The input of the response in flight (remembered if it completes) and its size.
    flight: Option<(Vec<Value>, usize)>,
    kept: Kept,
}

/// The socket's last completed response, for a `previous_response_id` naming it.
struct Previous {
    id: String,
    input: Vec<Value>,
    output: Vec<Value>,
    /// Its size as sent and received.
    bytes: usize,
}

/// What an event sent on the socket was.
pub enum Sent {
    /// The response goes on.
    Progress,
    /// `response.completed`: remembered, unless over the kept bytes (the error to send next).
    Completed(Option<ApiError>),
    /// `response.failed`: the response ended.
    Failed,
    /// An `error` event: the response ended before it began.
    Error,
}

/// Where a turn ran: here, or on the replica that holds it (its events relayed).
pub enum Ran {
    Here(Leg),
    Relayed(BoxStream<'static, Value>),
}

impl Conversation {
    pub fn new(kept: Kept) -> Conversation {
        Conversation {
            last: None,
            flight: None,
            kept,
        }
    }

    /// Reads one `response.create` message: the request as the HTTP route takes it (the last
    /// response expanded in front of its input when it names it), bounded by `limit`. An
    /// error changes nothing.
    pub fn create(&mut self, text: &[u8], limit: usize) -> Result<Bytes, ApiError> {
        let mut body: Map<String, Value> = match serde_json::from_slice(text) {
            Ok(Value::Object(m)) => m,
            _ => return Err(ApiError::invalid("A message must be a JSON object.")),
        };
        match body.remove("type") {
            Some(t) if t == "response.create" => {}
            _ => {
                return Err(
                    ApiError::invalid("Only `response.create` messages are supported.")
                        .with_param("type"),
                )
            }
        }
        expand(&mut body, self.last.as_ref());
        body.insert("stream".into(), Value::Bool(true));
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        if bytes.len() > limit {
            return Err(ApiError::too_large(limit));
        }
        // The input is kept beside the last response until this one completes.
        if !self
            .kept
            .resize(self.remembered().saturating_add(bytes.len()))
        {
            return Err(forgotten());
        }
        let input = match body.remove("input") {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        };
        self.flight = Some((input, bytes.len()));
        Ok(Bytes::from(bytes))
    }

    /// Takes note of an event of the response in flight, `frame_bytes` long as sent.
    pub fn sent(&mut self, ev: &Value, frame_bytes: usize) -> Sent {
        match ev["type"].as_str() {
            Some("response.completed") => Sent::Completed(self.remember(ev, frame_bytes).err()),
            Some("response.failed") => {
                self.ended();
                Sent::Failed
            }
            Some("error") => {
                self.ended();
                Sent::Error
            }
            _ => Sent::Progress,
        }
    }

    /// The response in flight ended without completing: the socket keeps its last one alone.
    pub fn ended(&mut self) {
        if self.flight.take().is_some() {
            self.kept.resize(self.remembered());
        }
    }

    fn remembered(&self) -> usize {
        self.last.as_ref().map_or(0, |p| p.bytes)
    }

    /// Remembers a completed response (its input, and its output as `completed` carries it)
    /// in place of the last one, within the principal's kept bytes; over them the socket
    /// remembers nothing and says so.
    fn remember(&mut self, completed: &Value, frame_bytes: usize) -> Result<(), ApiError> {
        let Some((input, size)) = self.flight.take() else {
            return Ok(());
        };
        let bytes = size.saturating_add(frame_bytes);
        if !self.kept.resize(bytes) {
            self.last = None;
            self.kept.resize(0);
            return Err(forgotten());
        }
        let response = &completed["response"];
        self.last = Some(Previous {
            id: response["id"].as_str().unwrap_or_default().to_string(),
            input,
            output: response["output"].as_array().cloned().unwrap_or_default(),
            bytes,
        });
        Ok(())
    }
}

/// The events of one response: the request planned through `host`, its turn run by `run`
/// (here or on the replica holding it). Every failure is an `error` event.
pub async fn respond<H, F, Fut>(
    body: Bytes,
    arrived: Instant,
    (host, keepalive): (&H, Duration),
    run: F,
) -> BoxStream<'static, Value>
where
    H: Host + ?Sized,
    F: FnOnce(TurnInput) -> Fut,
    Fut: Future<Output = Result<Ran, ApiError>>,
{
    let planned = match super::read(&body) {
        Ok(req) => prepare(req, arrived, host, false).await,
        Err(e) => Err(e),
    };
    let (input, framing) = match planned {
        Ok((Prepared::Turn(input), framing)) => (input, framing),
        Ok((Prepared::Finished { id, output, usage }, framing)) => {
            return futures::stream::iter(finished(framing, &id, output, usage)).boxed()
        }
        Err(e) => return failed(e),
    };
    match run(input).await {
        Ok(Ran::Here(leg)) => leg_events(leg, framing, keepalive).await,
        Ok(Ran::Relayed(events)) => events,
        Err(e) => failed(e),
    }
}

fn failed(e: ApiError) -> BoxStream<'static, Value> {
    futures::stream::iter([error_event(e)]).boxed()
}

/// The request's input as items, with the socket's last response (its input, then its
/// output) in front when `previous_response_id` names it; that id is then dropped, so the
/// request runs as a whole conversation.
fn expand(body: &mut Map<String, Value>, last: Option<&Previous>) {
    let mut items = match body.remove("input") {
        Some(Value::Array(items)) => items,
        Some(Value::String(s)) => vec![json!({"type": "message", "role": "user", "content": s})],
        Some(other) => {
            // Not an input: put back for the parser to refuse.
            body.insert("input".into(), other);
            return;
        }
        None => Vec::new(),
    };
    let named = body.get("previous_response_id").and_then(Value::as_str);
    if let Some(prev) = last.filter(|p| named == Some(p.id.as_str())) {
        body.remove("previous_response_id");
        let mut all = Vec::with_capacity(prev.input.len() + prev.output.len() + items.len());
        all.extend(prev.input.iter().cloned());
        all.extend(prev.output.iter().cloned());
        all.append(&mut items);
        items = all;
    }
    body.insert("input".into(), Value::Array(items));
}

/// A leg's events: its first event is awaited (up to one keep-alive interval) so that an
/// early failure is an `error` event with its status, as on HTTP.
async fn leg_events(
    mut leg: Leg,
    framing: Framing,
    keepalive: Duration,
) -> BoxStream<'static, Value> {
    let first = match crate::surface::sse::first_event(&mut leg, keepalive).await {
        Ok(first) => first,
        Err(e) => return failed(e),
    };
    let mut framer = Framer::new(&leg, framing);
    let mut head = framer.opening();
    let mut done = false;
    if let Some(ev) = first {
        let (evs, end) = framer.frame(ev);
        head.extend(evs);
        done = end;
    }
    let rest = futures::stream::unfold(
        (leg, framer, done),
        |(mut leg, mut framer, done)| async move {
            if done {
                return None;
            }
            let ev = leg
                .events
                .recv()
                .await
                .unwrap_or(LegEvent::Error(EngineError::TurnFailed));
            let (evs, end) = framer.frame(ev);
            Some((futures::stream::iter(evs), (leg, framer, end)))
        },
    )
    .flatten();
    futures::stream::iter(head).chain(rest).boxed()
}

/// The `error` event of the WebSocket mode: the OpenAI error body, the status the HTTP route
/// would have answered.
pub fn error_event(e: ApiError) -> Value {
    let status = e.status();
    let mut v = super::error_body(&e);
    v["type"] = json!("error");
    v["status"] = json!(status);
    v
}

/// The `error` event of a continuation the replica holding its turn refused: its body as it
/// answered (the OpenAI error body), with its status.
pub fn relayed_error(status: u16, body: &[u8]) -> Value {
    let mut v: Value = serde_json::from_slice(body).unwrap_or_else(|_| json!({}));
    v["type"] = json!("error");
    v["status"] = json!(status);
    v
}

/// A binary frame: the mode is JSON text.
pub fn binary() -> ApiError {
    ApiError::invalid("Binary frames are not supported; send `response.create` as text.")
}

/// A message while a response streams: one response at a time.
pub fn busy() -> ApiError {
    ApiError::new(
        ErrorCode::InvalidRequest,
        "A response is already in progress on this socket; send the next `response.create` after its `response.completed`.",
    )
}

/// The principal keeps its maximum of conversations in memory (`max_kept_bytes_per_client`).
fn forgotten() -> ApiError {
    ApiError::new(
        ErrorCode::CapacityExhausted,
        "This conversation is over what one client may keep in memory (max_kept_bytes_per_client); the socket remembers no response: send the whole input.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn previous() -> Previous {
        Previous {
            id: "resp_1".into(),
            input: vec![json!({"role": "developer", "content": "be brief"})],
            output: vec![
                json!({"type": "function_call", "call_id": "srct-x", "name": "f", "arguments": "{}"}),
            ],
            bytes: 0,
        }
    }

    #[test]
    fn a_reference_to_the_last_response_expands_to_the_whole_conversation() {
        let mut body = json!({"previous_response_id": "resp_1", "input": [
            {"type": "function_call_output", "call_id": "srct-x", "output": "ok"}]});
        let body = body.as_object_mut().unwrap();
        expand(body, Some(&previous()));
        let items = body["input"].as_array().unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(items[1]["type"], "function_call");
        assert!(!body.contains_key("previous_response_id"));
    }

    #[test]
    fn another_reference_goes_through_and_a_string_input_is_one_user_message() {
        let mut body = json!({"previous_response_id": "resp_2", "input": "hi"});
        let body = body.as_object_mut().unwrap();
        expand(body, Some(&previous()));
        assert_eq!(
            body["input"],
            json!([{"type": "message", "role": "user", "content": "hi"}])
        );
        assert_eq!(body["previous_response_id"], "resp_2");
        let mut bad = json!({"input": 7});
        expand(bad.as_object_mut().unwrap(), None);
        assert_eq!(bad["input"], 7);
    }

    #[test]
    fn an_error_event_carries_the_status_and_the_openai_body() {
        let e = error_event(
            ApiError::new(ErrorCode::ContinuationNotFound, "gone")
                .with_param(crate::error::Param::Conversation),
        );
        assert_eq!(e["type"], "error");
        assert_eq!(e["status"], 404);
        assert_eq!(e["error"]["param"], "input");
        assert_eq!(e["error"]["code"], "continuation_not_found");
    }
}
