//! `GET /v1/responses` upgraded to a WebSocket: the Responses API's WebSocket mode, as Codex
//! CLI's built-in provider speaks it. `response.create` messages come in (the HTTP body plus
//! `"type"`); the events of the SSE stream go out, one text frame each, in the same order with
//! the same `sequence_number`s. An error decided before a response's first event is an `error`
//! event carrying the status the HTTP route would answer.
//!
//! A socket remembers its last completed response (input and output items): a
//! `response.create` naming it in `previous_response_id` is expanded here into the whole
//! conversation, so it runs exactly as the stateless request Codex sends over HTTP (a held
//! turn's results included). Any other `previous_response_id` goes through as on HTTP. A
//! `generate: false` response (Codex's prewarm) runs nothing and only records its input.
//!
//! One response at a time: a `response.create` while one streams gets an `error` event and
//! changes nothing. The socket closing while a leg runs is a client disconnect (the leg is
//! interrupted); closing while the turn is held changes nothing (it may continue on another
//! socket or over HTTP). Bounded by the body limit (per message, and for an expanded
//! conversation), an idle timeout that only a response resets, pings, and for the socket's
//! lifetime a place among the listener's `max_connections` and among the principal's open
//! streams; what it remembers counts in the principal's kept bytes.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use futures::stream::BoxStream;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::turn::{run, Planner, Ran};
use super::AppState;
use crate::auth::Principal;
use crate::engine::{Engine, Kept, Slot};
use crate::error::{ApiError, ErrorCode};
use crate::server::{ConnectionPlace, Place};
use crate::sse::{SseEvent, SseSplitter};
use crate::surface::responses::framing::{finished, Framer};
use crate::surface::responses::{self, Prepared};
use axum::Extension;

/// The upgrade: a plain GET is 405 (the route is POST); credentials are checked from the
/// headers (401) and a place among the principal's open streams is taken (429) before
/// upgrading.
pub(super) async fn upgrade(
    State(app): State<AppState>,
    place: Option<Extension<ConnectionPlace>>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let Ok(ws) = ws else {
        return super::method_not_allowed().await.into_response();
    };
    let principal = match app.authenticate(&headers) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let gw = app.engine.clone();
    let slot = match gw.open_stream(&principal) {
        Ok(s) => s,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let limit = gw.config().server.max_body_bytes;
    // The connection's place among `max_connections`, kept until the socket closes (hyper's
    // connection ends at the upgrade).
    let place = place.and_then(|p| p.take());
    let socket = Socket {
        id: crate::ids::new_id("ws-"),
        kept: gw.kept(&principal.id),
        gw,
        app,
        principal,
        headers,
        last: None,
        responses: 0,
    };
    ws.max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |ws| socket.serve(ws, (slot, place)))
}

/// The socket's last completed response, for a `previous_response_id` naming it.
struct Previous {
    id: String,
    input: Vec<Value>,
    output: Vec<Value>,
    /// Its size as sent and received, counted in the principal's kept bytes.
    bytes: usize,
}

struct Socket {
    id: String,
    gw: Engine,
    /// The authenticator, for the re-checks.
    app: AppState,
    principal: Principal,
    /// The upgrade request's headers: the credential, re-checked before every response, and
    /// what a continuation relayed to its owner replica carries.
    headers: HeaderMap,
    last: Option<Previous>,
    /// What `last` and the input of the response in flight weigh, in the principal's
    /// `max_kept_bytes_per_client`.
    kept: Kept,
    responses: u64,
}

/// The events of the response in flight, and the input it will be remembered with.
struct InFlight {
    input: Vec<Value>,
    /// The input's size as received.
    bytes: usize,
    events: BoxStream<'static, Value>,
}

/// Why a socket closed, for its log line.
enum Closed {
    Client,
    Idle,
    Unresponsive,
    ShuttingDown,
    Revoked,
}

impl Closed {
    fn as_str(&self) -> &'static str {
        match self {
            Closed::Client => "client",
            Closed::Idle => "idle",
            Closed::Unresponsive => "unresponsive",
            Closed::ShuttingDown => "shutting_down",
            Closed::Revoked => "credential_revoked",
        }
    }
}

impl Socket {
    async fn serve(mut self, ws: WebSocket, places: (Slot, Option<Place>)) {
        tracing::info!(socket = %self.id, transport = "websocket", route = "/v1/responses", "socket opened");
        let why = self.exchange(ws).await;
        drop(places);
        tracing::info!(socket = %self.id, transport = "websocket", reason = why.as_str(), responses = self.responses, "socket closed");
    }

    async fn exchange(&mut self, ws: WebSocket) -> Closed {
        let cfg = self.gw.config();
        let (idle, ping_every) = (cfg.server.websocket_idle_timeout, cfg.server.websocket_ping);
        drop(cfg);
        let stopping = self.gw.stopping();
        let (mut tx, mut rx) = ws.split();
        let mut flight: Option<InFlight> = None;
        let mut heard = Instant::now();
        let mut active = Instant::now();
        let mut ping = tokio::time::interval_at(Instant::now() + ping_every, ping_every);
        let close = |code: u16, reason: &'static str| {
            Message::Close(Some(CloseFrame {
                code,
                reason: reason.into(),
            }))
        };
        loop {
            tokio::select! {
                biased;
                _ = stopping.cancelled(), if flight.is_none() => {
                    let _ = tx.send(close(1001, "shutting down")).await;
                    return Closed::ShuttingDown;
                }
                msg = rx.next() => {
                    heard = Instant::now();
                    let text = match msg {
                        None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return Closed::Client,
                        Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                        Some(Ok(Message::Binary(_))) => {
                            let e = ApiError::invalid("Binary frames are not supported; send `response.create` as text.");
                            let _ = tx.send(text_frame(&error_event(e))).await;
                            continue;
                        }
                        Some(Ok(Message::Text(t))) => t,
                    };
                    // Only a response that starts keeps the socket from idling (below): junk
                    // and refused messages do not.
                    if flight.is_some() {
                        let e = ApiError::new(ErrorCode::InvalidRequest, "A response is already in progress on this socket; send the next `response.create` after its `response.completed`.");
                        let _ = tx.send(text_frame(&error_event(e))).await;
                        continue;
                    }
                    let still = self.app.authenticate(&self.headers).map(|p| p.id);
                    if still.as_ref() != Ok(&self.principal.id) {
                        let e = ApiError::new(ErrorCode::InvalidApiKey, "The credential of this socket is no longer valid.");
                        let _ = tx.send(text_frame(&error_event(e))).await;
                        let _ = tx.send(close(1008, "credential revoked")).await;
                        return Closed::Revoked;
                    }
                    match self.start(text.as_bytes()) {
                        Ok(f) => flight = Some(f),
                        Err(e) => {
                            let _ = tx.send(text_frame(&error_event(e))).await;
                        }
                    }
                }
                ev = next_event(&mut flight) => {
                    let Some(ev) = ev else {
                        self.forget_flight(flight.take());
                        continue;
                    };
                    if ev["type"] != "error" {
                        active = Instant::now();
                    }
                    let frame = ev.to_string();
                    let mut unkept = None;
                    if ev["type"] == "response.completed" {
                        if let Some(f) = flight.take() {
                            self.responses += 1;
                            unkept = self.remember(f, &ev, frame.len()).err();
                        }
                    } else if ev["type"] == "response.failed" || ev["type"] == "error" {
                        self.forget_flight(flight.take());
                    }
                    if tx.send(Message::Text(frame.into())).await.is_err() {
                        return Closed::Client;
                    }
                    if let Some(e) = unkept {
                        if tx.send(text_frame(&error_event(e))).await.is_err() {
                            return Closed::Client;
                        }
                    }
                }
                _ = ping.tick() => {
                    if heard.elapsed() >= ping_every * 2 {
                        let _ = tx.send(close(1011, "no answer to pings")).await;
                        return Closed::Unresponsive;
                    }
                    if tx.send(Message::Ping(Bytes::new())).await.is_err() {
                        return Closed::Client;
                    }
                }
                _ = tokio::time::sleep_until(active + idle), if flight.is_none() => {
                    let _ = tx.send(close(1000, "idle")).await;
                    return Closed::Idle;
                }
            }
        }
    }

    /// What the socket keeps once its response in flight ended without completing: its last
    /// response alone.
    fn forget_flight(&mut self, flight: Option<InFlight>) {
        if flight.is_some() {
            self.kept.resize(self.last.as_ref().map_or(0, |p| p.bytes));
        }
    }

    /// Remembers a completed response (its input, and its output as `completed` carries it,
    /// `frame_bytes` long) in place of the last one, within the principal's kept bytes; over
    /// them the socket remembers nothing and says so.
    fn remember(
        &mut self,
        f: InFlight,
        completed: &Value,
        frame_bytes: usize,
    ) -> Result<(), ApiError> {
        let bytes = f.bytes.saturating_add(frame_bytes);
        if !self.kept.resize(bytes) {
            self.last = None;
            self.kept.resize(0);
            return Err(forgotten());
        }
        let response = &completed["response"];
        self.last = Some(Previous {
            id: response["id"].as_str().unwrap_or_default().to_string(),
            input: f.input,
            output: response["output"].as_array().cloned().unwrap_or_default(),
            bytes,
        });
        Ok(())
    }

    /// Reads one `response.create` and starts its response. An error here is answered with
    /// an `error` event and changes nothing.
    fn start(&mut self, text: &[u8]) -> Result<InFlight, ApiError> {
        let arrived = Instant::now();
        let limit = self.gw.config().server.max_body_bytes;
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
        let was = self.last.as_ref().map_or(0, |p| p.bytes);
        if !self.kept.resize(was.saturating_add(bytes.len())) {
            return Err(forgotten());
        }
        let size = bytes.len();
        // What the socket remembers if this response completes.
        let input = match body.remove("input") {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        };
        let gw = self.gw.clone();
        let principal = self.principal.clone();
        let headers = self.headers.clone();
        let keepalive = gw.config().server.keepalive;
        let events = async move {
            let uri = Uri::from_static("/v1/responses");
            let replay = (
                &uri,
                &headers,
                gw.replica_id().map(|_| Bytes::from(bytes.clone())),
            );
            let host = Planner::new(&gw, &principal);
            let planned = match responses::read(&bytes) {
                Ok(req) => responses::prepare(req, arrived, &host, false).await,
                Err(e) => Err(e),
            };
            let fail = |e: ApiError| futures::stream::iter([error_event(e)]).boxed();
            let (input, framing) = match planned {
                Ok((Prepared::Turn(input), framing)) => (input, framing),
                Ok((Prepared::Finished { id, output, usage }, framing)) => {
                    return futures::stream::iter(finished(framing, &id, output, usage)).boxed()
                }
                Err(e) => return fail(e),
            };
            match run(&gw, &principal, input, (None, host.admitted()), replay).await {
                Ok(Ran::Here(leg)) => leg_events(leg, framing, keepalive).await,
                Ok(Ran::Relayed(resp)) => relayed_events(resp).await,
                Err(e) => fail(e.into()),
            }
        };
        Ok(InFlight {
            input,
            bytes: size,
            events: futures::stream::once(events).flatten().boxed(),
        })
    }
}

/// The next event of the response in flight; pending while there is none.
async fn next_event(flight: &mut Option<InFlight>) -> Option<Value> {
    match flight {
        Some(f) => f.events.next().await,
        None => std::future::pending().await,
    }
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
    mut leg: crate::engine::Leg,
    framing: responses::Framing,
    keepalive: Duration,
) -> BoxStream<'static, Value> {
    use crate::engine::{EngineError, LegEvent};
    let first = match crate::surface::sse::first_event(&mut leg, keepalive).await {
        Ok(first) => first,
        Err(e) => return futures::stream::iter([error_event(e)]).boxed(),
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

/// A continuation relayed to the replica holding its turn: its SSE events, or its error as
/// an `error` event.
async fn relayed_events(resp: Response) -> BoxStream<'static, Value> {
    let status = resp.status();
    let body = resp.into_body();
    if !status.is_success() {
        let bytes = axum::body::to_bytes(body, 1 << 20)
            .await
            .unwrap_or_default();
        let mut v: Value = serde_json::from_slice(&bytes).unwrap_or_else(|_| json!({}));
        v["type"] = json!("error");
        v["status"] = json!(status.as_u16());
        return futures::stream::iter([v]).boxed();
    }
    // The upstream client's bounded splitter: an owner's stream is read like any other.
    let events = futures::stream::unfold(
        (body.into_data_stream(), SseSplitter::default()),
        |(mut chunks, mut sse)| async move {
            loop {
                match sse.next_event() {
                    Some(SseEvent::Data(d)) => match serde_json::from_str::<Value>(&d) {
                        Ok(v) => return Some((v, (chunks, sse))),
                        Err(_) => continue,
                    },
                    Some(SseEvent::Done) => return None,
                    None => {}
                }
                match chunks.next().await {
                    Some(Ok(b)) if sse.push(&b).is_ok() => {}
                    _ => return None,
                }
            }
        },
    );
    events.boxed()
}

/// The `error` event of the WebSocket mode: the OpenAI error body, the status the HTTP route
/// would have answered.
/// The principal keeps its maximum of conversations in memory (`max_kept_bytes_per_client`).
fn forgotten() -> ApiError {
    ApiError::new(
        ErrorCode::CapacityExhausted,
        "This conversation is over what one client may keep in memory (max_kept_bytes_per_client); the socket remembers no response: send the whole input.",
    )
}

fn error_event(e: ApiError) -> Value {
    let status = e.status();
    let mut v = responses::error_body(&e);
    v["type"] = json!("error");
    v["status"] = json!(status);
    v
}

fn text_frame(v: &Value) -> Message {
    Message::Text(v.to_string().into())
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
