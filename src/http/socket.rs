//! The WebSocket transport of a surface's WebSocket mode (the Responses API's, whose wire is
//! `surface::responses::socket`): the upgrade, one response at a time, pings, an idle timeout
//! that only a response resets, the credential re-checked before every response, and for the
//! socket's lifetime a place among the listener's `max_connections` and among the principal's
//! open streams. The socket closing while a leg runs is a client disconnect (the leg is
//! interrupted); closing while the turn is held changes nothing (it may continue on another
//! socket or over HTTP). Messages are bounded by the body limit.

use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures::stream::BoxStream;
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::time::Instant;

use super::turn::{run, Planner, Ran};
use super::AppState;
use crate::auth::Principal;
use crate::engine::{Engine, Slot};
use crate::error::{ApiError, ErrorCode};
use crate::server::{ConnectionPlace, Place};
use crate::sse::{SseEvent, SseSplitter};
use crate::surface::responses::socket::{self as wire, Conversation, Sent};

/// The upgrade: a plain GET is 405 (the route is POST); credentials are checked from the
/// headers (401) and a place among the principal's open streams is taken (429) before
/// upgrading.
pub(super) async fn upgrade(
    State(app): State<AppState>,
    place: Option<Extension<ConnectionPlace>>,
    uri: Uri,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let Ok(ws) = ws else {
        return super::method_not_allowed().await.into_response();
    };
    let principal = match app.admit(&headers).await {
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
        conversation: Conversation::new(gw.kept(&principal.id)),
        gw,
        app,
        principal,
        uri,
        headers,
        responses: 0,
    };
    ws.max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |ws| socket.serve(ws, (slot, place)))
}

struct Socket {
    id: String,
    gw: Engine,
    /// The authenticator, for the re-checks.
    app: AppState,
    principal: Principal,
    /// The upgrade request's path and headers: the credential, re-checked before every
    /// response, and what a continuation relayed to its owner replica carries.
    uri: Uri,
    headers: HeaderMap,
    conversation: Conversation,
    responses: u64,
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
        let route = self.uri.path().to_string();
        tracing::info!(socket = %self.id, transport = "websocket", %route, "socket opened");
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
        // The events of the response in flight.
        let mut flight: Option<BoxStream<'static, Value>> = None;
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
                            let _ = tx.send(error_frame(wire::binary())).await;
                            continue;
                        }
                        Some(Ok(Message::Text(t))) => t,
                    };
                    // Only a response that starts keeps the socket from idling (below): junk
                    // and refused messages do not.
                    if flight.is_some() {
                        let _ = tx.send(error_frame(wire::busy())).await;
                        continue;
                    }
                    let still = self.app.authenticate(&self.headers).map(|p| p.id);
                    if still.as_ref() != Ok(&self.principal.id) {
                        let e = ApiError::new(ErrorCode::InvalidApiKey, "The credential of this socket is no longer valid.");
                        let _ = tx.send(error_frame(e)).await;
                        let _ = tx.send(close(1008, "credential revoked")).await;
                        return Closed::Revoked;
                    }
                    match self.start(text.as_bytes()) {
                        Ok(events) => flight = Some(events),
                        Err(e) => {
                            let _ = tx.send(error_frame(e)).await;
                        }
                    }
                }
                ev = next_event(&mut flight) => {
                    let Some(ev) = ev else {
                        flight = None;
                        self.conversation.ended();
                        continue;
                    };
                    let frame = ev.to_string();
                    let sent = self.conversation.sent(&ev, frame.len());
                    if !matches!(sent, Sent::Error) {
                        active = Instant::now();
                    }
                    let mut unkept = None;
                    match sent {
                        Sent::Progress => {}
                        Sent::Completed(e) => {
                            self.responses += 1;
                            unkept = e;
                            flight = None;
                        }
                        Sent::Failed | Sent::Error => flight = None,
                    }
                    if tx.send(Message::Text(frame.into())).await.is_err() {
                        return Closed::Client;
                    }
                    if let Some(e) = unkept {
                        if tx.send(error_frame(e)).await.is_err() {
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

    /// Reads one message and starts its response: its events, planned and run as the HTTP
    /// route's (here, or relayed to the replica that holds its turn). An error here is
    /// answered with an `error` event and changes nothing.
    fn start(&mut self, text: &[u8]) -> Result<BoxStream<'static, Value>, ApiError> {
        let arrived = Instant::now();
        let limit = self.gw.config().server.max_body_bytes;
        let body = self.conversation.create(text, limit)?;
        let gw = self.gw.clone();
        let principal = self.principal.clone();
        let (uri, headers) = (self.uri.clone(), self.headers.clone());
        let keepalive = gw.config().server.keepalive;
        let events = async move {
            let host = Planner::new(&gw, &principal);
            let raw = gw.replica_id().map(|_| body.clone());
            let turn = |input| async {
                let replay = (&uri, &headers, raw);
                match run(&gw, &principal, input, (None, host.admitted()), replay).await {
                    Ok(Ran::Here(leg)) => Ok(wire::Ran::Here(leg)),
                    Ok(Ran::Relayed(resp)) => Ok(wire::Ran::Relayed(relayed_events(resp).await)),
                    Err(e) => Err(e.into()),
                }
            };
            wire::respond(body, arrived, (&host, keepalive), turn).await
        };
        Ok(futures::stream::once(events).flatten().boxed())
    }
}

/// The next event of the response in flight; pending while there is none.
async fn next_event(flight: &mut Option<BoxStream<'static, Value>>) -> Option<Value> {
    match flight {
        Some(events) => events.next().await,
        None => std::future::pending().await,
    }
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
        let ev = wire::relayed_error(status.as_u16(), &bytes);
        return futures::stream::iter([ev]).boxed();
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

fn error_frame(e: ApiError) -> Message {
    Message::Text(wire::error_event(e).to_string().into())
}
