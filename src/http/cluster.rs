//! Replicas over HTTP: the internal listener (the public routes behind the cluster's shared
//! key, each request marked as forwarded so it is never forwarded again) and relaying a
//! request to the replica that owns its held turn or approval. The owner's answer (status,
//! headers, body, a stream as it comes) goes back to the client byte for byte; a client that
//! leaves drops the relay, which closes the owner's connection, which the owner sees as its
//! client leaving.

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::continuation::Reason;
use crate::engine::Engine;
use crate::engine::{ContinuationError, EngineError, Owner, OwnerFate};
use crate::error::{ApiError, ErrorCode};

/// The header that carries the shared key between replicas.
pub const KEY_HEADER: &str = "x-turnstile-cluster-key";

/// A request that came through the internal listener (from another replica).
#[derive(Debug, Clone, Copy)]
pub struct Hop;

/// The internal listener's router: every public route, behind the shared key.
pub fn internal_router(app: super::AppState) -> Router {
    let gw = app.engine.clone();
    super::router(app).layer(middleware::from_fn_with_state(gw, require_key))
}

async fn require_key(State(gw): State<Engine>, mut req: Request, next: Next) -> Response {
    let presented = req.headers().get(KEY_HEADER).map(|v| v.as_bytes());
    if !presented.is_some_and(|k| gw.cluster_key_matches(k)) {
        return ApiError::new(
            ErrorCode::InvalidApiKey,
            "This listener serves the gateway's replicas only.",
        )
        .into_response();
    }
    req.extensions_mut().insert(Hop);
    next.run(req).await
}

/// What a request needs to be sent again elsewhere.
pub(super) struct Replay<'a> {
    pub method: &'a Method,
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
}

/// The client that relays to an owner replica. It carries the cluster key and the client's
/// credential, so it goes straight to the URL the owner's lease names: no proxy from the
/// environment (`HTTP_PROXY`, `ALL_PROXY`) and no redirect is ever followed.
fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .http1_only()
            .build()
            .unwrap_or_default()
    })
}

/// Headers that describe one connection, not the message.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authorization"
            | "proxy-connection"
            | "host"
            | "content-length"
    ) || name.as_str() == KEY_HEADER
}

/// One attempt: the owner's answer, or None when it could not be reached.
async fn send(gw: &Engine, what: &'static str, owner: &Owner, r: &Replay<'_>) -> Option<Response> {
    let path = r.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = client()
        .request(r.method.clone(), format!("{}{path}", owner.url))
        .body(r.body.clone());
    // Traced, the owner's server span is a child of this client span.
    let span = crate::telemetry::forward(&owner.replica_id);
    let traceparent = span.traceparent();
    for (name, value) in r.headers {
        let replaced = traceparent.is_some() && name.as_str() == "traceparent";
        if !hop_by_hop(name) && !replaced {
            req = req.header(name, value);
        }
    }
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    req = req.header(KEY_HEADER, gw.cluster_key().unwrap_or_default());
    let started = tokio::time::Instant::now();
    let resp = match req.send().await {
        Ok(resp) => resp,
        Err(e) => {
            span.answered(0);
            gw.metrics().cluster.forwarded(what, 0, started.elapsed());
            tracing::warn!(replica = %owner.replica_id, error = %e, "owner replica unreachable");
            return None;
        }
    };
    let status = resp.status();
    span.answered(status.as_u16());
    gw.metrics()
        .cluster
        .forwarded(what, status.as_u16(), started.elapsed());
    let mut out = Response::builder().status(status.as_u16());
    for (name, value) in resp.headers() {
        if name != header::TRANSFER_ENCODING && name != header::CONNECTION {
            out = out.header(name.as_str(), value.as_bytes());
        }
    }
    out.body(Body::from_stream(resp.bytes_stream())).ok()
}

/// Relays the request to the owner. An owner that cannot be reached is waited for (at most a
/// lease): renewed, it is tried once more; lapsed, its held turn is `continuation_lost`.
pub(super) async fn to_owner(
    gw: &Engine,
    what: &'static str,
    owner: Owner,
    r: &Replay<'_>,
) -> Result<Response, EngineError> {
    let mut owner = owner;
    for attempt in 0..2 {
        if let Some(resp) = send(gw, what, &owner, r).await {
            return Ok(resp);
        }
        match gw.await_owner(&owner.replica_id).await {
            OwnerFate::Alive(o) if attempt == 0 => owner = o,
            OwnerFate::Alive(_) => break,
            OwnerFate::Gone => {
                return Err(EngineError::Continuation(ContinuationError::Settled(
                    Reason::Lost,
                )))
            }
        }
    }
    Err(EngineError::ReplicaUnavailable)
}
