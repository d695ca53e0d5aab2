//! The Managed Agents API's routes (`/v1/agents`, `/v1/environments`, `/v1/sessions` and a
//! session's events), over [`crate::managed`]: authenticated like every route, the
//! `anthropic-beta: managed-agents-…` header required, errors in Anthropic's envelope (the
//! Messages surface's). The event stream is SSE: every event named by its type and id, a
//! reconnect with `Last-Event-ID` gets what it missed first, keep-alive comments, the
//! credential re-checked, and a place among the principal's streams held.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::FromRequestParts;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;

use super::approvals::Authority;
use super::caller::read_body;
use super::cluster::{to_owner, Hop, Replay};
use super::turn::{holding, SurfaceError};
use super::{AppState, Caller};
use crate::engine::EngineError;
use crate::error::{ApiError, ErrorCode};
use crate::managed::{agents, environments, events, sessions, wire::Paging};
use crate::managed::{Managed, Place, Published};
use crate::surface::Messages;

type Answer = Result<Response, SurfaceError<Messages>>;

/// The body of a managed route: the same limit as a turn's.
type Body16 = Caller<{ 16 << 20 }>;

pub(super) fn routes(app: &AppState) -> Router<AppState> {
    let owned = Router::new()
        .route(
            "/v1/sessions/{id}",
            get(session_get).post(session_update).delete(session_delete),
        )
        .route("/v1/sessions/{id}/archive", post(session_archive))
        .route("/v1/sessions/{id}/events", get(event_list).post(event_send))
        .route("/v1/sessions/{id}/events/stream", get(event_stream))
        .route_layer(middleware::from_fn_with_state(app.clone(), at_owner));
    Router::new()
        .route("/v1/agents", post(agent_create).get(agent_list))
        .route("/v1/agents/{id}", get(agent_get).post(agent_update))
        .route("/v1/agents/{id}/archive", post(agent_archive))
        .route("/v1/agents/{id}/versions", get(agent_versions))
        .route("/v1/environments", post(env_create).get(env_list))
        .route(
            "/v1/environments/{id}",
            get(env_get).post(env_update).delete(env_delete),
        )
        .route("/v1/environments/{id}/archive", post(env_archive))
        .route("/v1/sessions", post(session_create).get(session_list))
        .merge(owned)
}

/// A request that acts on one session (a change, an event sent, the live stream) runs on the
/// replica that runs the session. Reaching another replica, it is relayed there and the
/// answer (a stream too) comes back as the owner sends it; a replica that is gone has the
/// session taken over here. Reads of the store (the object, the history) run anywhere.
async fn at_owner(
    State(app): State<AppState>,
    Path(id): Path<String>,
    req: Request,
    next: Next,
) -> Response {
    // Traced, the request names the session as its conversation.
    crate::telemetry::record_execution(&id);
    let acts = req.method() != Method::GET || req.uri().path().ends_with("/stream");
    if !acts || app.engine.replica_id().is_none() || beta(req.headers()).is_err() {
        return next.run(req).await;
    }
    let (mut parts, body) = req.into_parts();
    let caller = Caller::<{ usize::MAX }>::from_request_parts(&mut parts, &app).await;
    let hop = parts.extensions.get::<Hop>().is_some();
    // Refusals are the handler's to give, in its order.
    let Ok(caller) = caller else {
        return next.run(Request::from_parts(parts, body)).await;
    };
    let refused = |e: ApiError| SurfaceError::<Messages>::from(e).into_response();
    let who = &caller.principal;
    let owner = match app.managed.place(who, &id, hop).await {
        Ok(Place::Here) => return next.run(Request::from_parts(parts, body)).await,
        Ok(Place::Owner(owner)) => owner,
        Err(e) => return refused(e),
    };
    let server = &app.engine.config().server;
    let bytes = match read_body(body, server.max_body_bytes, server.body_read_timeout).await {
        Ok(b) => b,
        Err(e) => return refused(e),
    };
    // A relayed stream holds a place among the principal's streams here too.
    let slot = match parts.method == Method::GET {
        true => match app.engine.open_stream(who) {
            Ok(slot) => Some(slot),
            Err(e) => return refused(e.into()),
        },
        false => None,
    };
    let replay = Replay {
        method: &parts.method,
        uri: &parts.uri,
        headers: &parts.headers,
        body: bytes.clone(),
    };
    match to_owner(&app.engine, "session", owner, &replay).await {
        Ok(resp) => holding(resp, slot),
        // Its replica is gone (its lease lapsed): taken over here, the turn it ran lost.
        Err(EngineError::Continuation(_)) => match app.managed.place(who, &id, false).await {
            Ok(Place::Here) => {
                next.run(Request::from_parts(parts, Body::from(bytes)))
                    .await
            }
            Ok(Place::Owner(_)) => refused(EngineError::ReplicaUnavailable.into()),
            Err(e) => refused(e),
        },
        Err(e) => refused(e.into()),
    }
}

/// The beta this API is: requests must name it, as Anthropic's do.
fn beta(headers: &HeaderMap) -> Result<(), ApiError> {
    let named = headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|b| b.trim().starts_with("managed-agents-"));
    match named {
        true => Ok(()),
        false => Err(ApiError::invalid(
            "This API is in beta: send `anthropic-beta: managed-agents-2026-04-01`.",
        )),
    }
}

/// A JSON body, read under the route's limit.
async fn json_body(app: &AppState, body: Body) -> Result<Value, ApiError> {
    let server = &app.engine.config().server;
    let bytes =
        super::caller::read_body(body, server.max_body_bytes, server.body_read_timeout).await?;
    if bytes.is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    crate::surface::read_json(&bytes)
}

fn ok(v: Value) -> Answer {
    Ok(Json(v).into_response())
}

fn managed(app: &AppState) -> &Managed {
    &app.managed
}

macro_rules! handlers {
    ($($name:ident($($arg:ident: $ty:ty),*) => $call:expr;)*) => {$(
        async fn $name(
            State(app): State<AppState>,
            caller: Result<Body16, ApiError>,
            headers: HeaderMap,
            $($arg: $ty,)*
        ) -> Answer {
            let caller = caller?;
            beta(&headers)?;
            let m = managed(&app);
            let who = &caller.principal;
            let _ = (&m, &who);
            ok($call(&app, m, who).await?)
        }
    )*};
}

handlers! {
    agent_create(body: Body) => async |app: &AppState, m, who| agents::create(m, who, &json_body(app, body).await?).await;
    agent_list(uri: Uri) => async |_: &AppState, m, who| agents::list(m, who, &Paging::read(uri.query())?).await;
    agent_get(id: Path<String>, uri: Uri) => async |_: &AppState, m, who| agents::retrieve(m, who, &id, version(&uri)?).await;
    agent_update(id: Path<String>, body: Body) => async |app: &AppState, m, who| agents::update(m, who, &id, &json_body(app, body).await?).await;
    agent_archive(id: Path<String>) => async |_: &AppState, m, who| agents::archive(m, who, &id).await;
    agent_versions(id: Path<String>, uri: Uri) => async |_: &AppState, m, who| agents::versions(m, who, &id, &Paging::read(uri.query())?).await;
    env_create(body: Body) => async |app: &AppState, m, who| environments::create(m, who, &json_body(app, body).await?).await;
    env_list(uri: Uri) => async |_: &AppState, m, who| environments::list(m, who, &Paging::read(uri.query())?).await;
    env_get(id: Path<String>) => async |_: &AppState, m, who| environments::retrieve(m, who, &id).await;
    env_update(id: Path<String>, body: Body) => async |app: &AppState, m, who| environments::update(m, who, &id, &json_body(app, body).await?).await;
    env_delete(id: Path<String>) => async |_: &AppState, m, who| environments::delete(m, who, &id).await;
    env_archive(id: Path<String>) => async |_: &AppState, m, who| environments::archive(m, who, &id).await;
    session_create(body: Body) => async |app: &AppState, m, who| sessions::create(m, who, &json_body(app, body).await?).await;
    session_list(uri: Uri) => async |_: &AppState, m, who| sessions::list(m, who, &Paging::read(uri.query())?).await;
    session_get(id: Path<String>) => async |_: &AppState, m, who| sessions::retrieve(m, who, &id).await;
    session_update(id: Path<String>, body: Body) => async |app: &AppState, m, who| sessions::update(m, who, &id, &json_body(app, body).await?).await;
    session_delete(id: Path<String>) => async |_: &AppState, m, who| sessions::delete(m, who, &id).await;
    session_archive(id: Path<String>) => async |_: &AppState, m, who| sessions::archive(m, who, &id).await;
    event_list(id: Path<String>, uri: Uri) => async |_: &AppState, m, who| events::list(m, who, &id, uri.query()).await;
    event_send(id: Path<String>, body: Body) => async |app: &AppState, m, who| crate::managed::send(m, who, &id, &json_body(app, body).await?).await;
}

/// `?version=N` of an agent retrieve.
fn version(uri: &Uri) -> Result<Option<i64>, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(uri.query().unwrap_or_default())
        .map_err(|_| ApiError::invalid("The query string could not be read."))?;
    match pairs.iter().find(|(k, _)| k == "version") {
        None => Ok(None),
        Some((_, v)) => match v.parse::<i64>() {
            Ok(n) if n >= 1 => Ok(Some(n)),
            _ => Err(ApiError::invalid("`version` must be a positive integer")),
        },
    }
}

/// `GET /v1/sessions/{id}/events/stream`.
async fn event_stream(
    State(app): State<AppState>,
    caller: Result<Caller, ApiError>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Answer {
    let caller = caller?;
    beta(&headers)?;
    let m = app.managed.clone();
    let live = m.session(&caller.principal, &id).await?;
    let slot = app.engine.open_stream(&caller.principal)?;
    // Subscribed before the missed events are read: what is logged in between comes twice
    // and is sent once (by position).
    let rx = live.subscribe();
    let last = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let backlog = match last {
        Some(last) => events::missed(&m, &live, last).await?,
        None => Vec::new(),
    };
    drop(live);
    let keepalive = app
        .engine
        .config()
        .server
        .keepalive
        .max(Duration::from_millis(100));
    let stop = app.engine.stopping();
    let who = Authority {
        app,
        credential: caller.credential,
        opened: caller.principal,
    };
    let sent = backlog.last().map_or(0, |p| p.seq);
    // A first comment, so the head goes out before any event is logged.
    let hello = Bytes::from_static(b": session events\n\n");
    let chunks: Vec<Bytes> = std::iter::once(hello)
        .chain(backlog.iter().map(frame))
        .collect();
    let first = futures::stream::iter(chunks.into_iter().map(Ok::<_, std::convert::Infallible>));
    let live = futures::stream::unfold(
        (rx, who, stop, sent),
        move |(mut rx, who, stop, mut sent)| async move {
            loop {
                let next = tokio::select! {
                    _ = stop.cancelled() => return None,
                    r = tokio::time::timeout(keepalive, rx.recv()) => r,
                };
                who.current().await?;
                let chunk = match next {
                    Err(_) => Bytes::from_static(b": keep-alive\n\n"),
                    Ok(Ok(p)) if p.seq <= sent => continue,
                    Ok(Ok(p)) => {
                        sent = p.seq;
                        frame(&p)
                    }
                    // Behind: the stream ends; a reconnect with Last-Event-ID loses nothing.
                    Ok(Err(RecvError::Lagged(_))) | Ok(Err(RecvError::Closed)) => return None,
                };
                return Some((Ok(chunk), (rx, who, stop, sent)));
            }
        },
    );
    let resp = Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(futures::StreamExt::chain(first, live)))
        .map_err(|_| ApiError::new(ErrorCode::Internal, "response build failed"))?;
    Ok(holding(resp, Some(slot)))
}

/// One event as SSE: named by its type (the SDK drops a message without `event:`), with its
/// id for `Last-Event-ID`.
fn frame(p: &Published) -> Bytes {
    Bytes::from(format!(
        "event: {}\nid: {}\ndata: {}\n\n",
        p.kind, p.id, p.json
    ))
}
