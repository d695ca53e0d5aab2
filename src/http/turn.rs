//! The one handler every turn route runs, whatever its surface: admit (413 and 401 from the
//! headers, then the body under its limit), read the request, take a stream's place, let the
//! surface plan it, run the turn here or relay it to the replica that holds it, and frame the
//! answer. Errors render in the surface's own shape ([`SurfaceError`]).

use std::marker::PhantomData;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{RawPathParams, State};
use axum::http::{header, HeaderMap, HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures::future::BoxFuture;
use futures::StreamExt;

use super::{cluster, error, Admitted, ExecutionId};
use crate::auth::Principal;
use crate::engine::{CompactionAsk, Engine, EngineError, Leg, Outcome, Slot};
use crate::error::ApiError;
use crate::surface::{Answer, Host, Incoming, Plan, Reply, Surface};
use crate::turn::{TurnInput, Usage};
use parking_lot::Mutex;

/// `POST` on a turn route of surface `S`.
pub(super) fn turn<S: Surface>(
    gw: State<Engine>,
    hop: Option<Extension<cluster::Hop>>,
    uri: Uri,
    params: Result<RawPathParams, RawPathParamsRejection>,
    headers: HeaderMap,
    a: Result<Admitted, ApiError>,
) -> BoxFuture<'static, Result<Response, SurfaceError<S>>> {
    // Boxed here: axum moves a handler's future as it boxes it, and a pointer is cheaper to
    // move than the turn's state machine.
    Box::pin(respond::<S>(gw, hop, uri, params, headers, a))
}

async fn respond<S: Surface>(
    State(gw): State<Engine>,
    hop: Option<Extension<cluster::Hop>>,
    uri: Uri,
    params: Result<RawPathParams, RawPathParamsRejection>,
    headers: HeaderMap,
    a: Result<Admitted, ApiError>,
) -> Result<Response, SurfaceError<S>> {
    let mut a = a?;
    let raw = keep_raw(&gw, &a);
    let params = path_params(&params)?;
    // The request is read and planned in a block of its own, and what takes long is boxed,
    // so that this state machine keeps no copy of the request or the turn's input.
    let (stream, slot);
    let (input, framing, admitted) = {
        let req = S::read(Incoming {
            uri: &uri,
            params: &params,
            headers: &headers,
            body: std::mem::take(&mut a.bytes),
            arrived: a.arrived,
        })?;
        stream = S::streams(&req);
        slot = stream_place(&gw, &a, stream)?;
        let host = Planner::new(&gw, &a.principal);
        let (plan, framing) = Box::pin(S::plan(req, &host)).await?;
        match plan {
            Plan::Turn(input) => (input, framing, host.admitted()),
            Plan::Done(reply) => {
                let resp = holding(response(reply), slot);
                return Ok(answered(&gw, &a, None, resp));
            }
        }
    };
    let replay = (&uri, &headers, raw);
    let ran = Box::pin(run(&gw, &a.principal, input, (hop, admitted), replay)).await?;
    let leg = match ran {
        Ran::Here(leg) => leg,
        Ran::Relayed(resp) => return Ok(holding(resp, slot)),
    };
    let execution = leg.execution_id.clone();
    let reply = match stream {
        true => Reply::Stream(Box::pin(S::stream(leg, framing, a.cfg.server.keepalive)).await?),
        false => Reply::Whole(Box::pin(S::collect(leg, framing)).await?),
    };
    let mut resp = response(reply);
    if S::REPORTS_STANDING {
        if let Some(standing) = Box::pin(gw.standing(&a.principal.id)).await {
            S::standing_headers(&standing, resp.headers_mut());
        }
    }
    Ok(answered(&gw, &a, Some(execution), holding(resp, slot)))
}

/// A route's path parameters, percent-decoded (400 where one is not UTF-8).
pub(super) fn path_params(
    params: &Result<RawPathParams, RawPathParamsRejection>,
) -> Result<Vec<(&str, &str)>, ApiError> {
    match params {
        Ok(p) => Ok(p.iter().collect()),
        Err(_) => Err(ApiError::invalid("A path parameter is not UTF-8.")),
    }
}

/// An error on a route of surface `S`: its status, body and headers as `S`'s clients read
/// them.
pub struct SurfaceError<S>(pub ApiError, PhantomData<fn() -> S>);

impl<S> From<ApiError> for SurfaceError<S> {
    fn from(e: ApiError) -> Self {
        SurfaceError(e, PhantomData)
    }
}

impl<S> From<EngineError> for SurfaceError<S> {
    fn from(e: EngineError) -> Self {
        SurfaceError(e.into(), PhantomData)
    }
}

impl<S: Surface> IntoResponse for SurfaceError<S> {
    fn into_response(self) -> Response {
        let body = S::error_body(&self.0);
        let status = S::error_status(&self.0);
        let mut headers = HeaderMap::new();
        S::error_headers(&self.0, &mut headers);
        let mut resp = error::render(self.0, status, body);
        resp.headers_mut().extend(headers);
        resp
    }
}

/// What a surface may ask of the gateway while planning, for the request's principal. A
/// request admitted while planning (before its compaction items were read) keeps its slot
/// here for its turn.
pub(super) struct Planner<'a> {
    gw: &'a Engine,
    principal: &'a Principal,
    slot: Mutex<Option<Slot>>,
}

impl<'a> Planner<'a> {
    pub fn new(gw: &'a Engine, principal: &'a Principal) -> Self {
        Planner {
            gw,
            principal,
            slot: Mutex::new(None),
        }
    }

    /// The slot of a request admitted while planning.
    pub fn admitted(&self) -> Option<Slot> {
        self.slot.lock().take()
    }
}

impl Host for Planner<'_> {
    fn compacted<'a>(
        &'a self,
        ask: CompactionAsk<'a>,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, ApiError>> {
        Box::pin(async move {
            let (summaries, slot) = self.gw.compacted(self.principal, ask).await?;
            *self.slot.lock() = slot;
            Ok(summaries)
        })
    }

    fn compact(&self, input: TurnInput) -> BoxFuture<'_, Result<(String, Usage), ApiError>> {
        Box::pin(async move {
            Ok(self
                .gw
                .compact(self.principal, input, self.admitted())
                .await?)
        })
    }

    fn models(&self) -> Vec<String> {
        self.gw.models_for(self.principal)
    }
}

/// A surface's answer as a response.
pub(super) fn response(reply: Reply) -> Response {
    match reply {
        Reply::Stream(body) => sse(body),
        Reply::Whole(Answer::Json(v)) => axum::Json(v).into_response(),
        Reply::Whole(Answer::Raw(bytes)) => {
            let json = HeaderValue::from_static("application/json");
            ([(header::CONTENT_TYPE, json)], bytes).into_response()
        }
    }
}

fn sse(stream: crate::surface::sse::Body) -> Response {
    let mut resp = Body::from_stream(stream).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// A streamed answer's place among the principal's open streams: 429 over its bound, before
/// the turn runs, so a refusal consumes nothing. `None` for an answer that is not streamed.
fn stream_place(gw: &Engine, a: &Admitted, stream: bool) -> Result<Option<Slot>, ApiError> {
    match stream {
        true => Ok(Some(gw.open_stream(&a.principal)?)),
        false => Ok(None),
    }
}

/// The response, holding `kept` (a stream's place, a trace span) until its body is done
/// (sent, or dropped with the connection).
pub(super) fn holding<T: Send + 'static>(resp: Response, kept: Option<T>) -> Response {
    let Some(kept) = kept else {
        return resp;
    };
    resp.map(|body| {
        Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _held = &kept;
            chunk
        }))
    })
}

/// Where a turn ran: here, or on the replica that holds it (its answer relayed as it came).
pub(super) enum Ran {
    Here(Leg),
    Relayed(Response),
}

/// Runs the turn, or relays the request to the replica that holds its turn. `raw` is the
/// body as received (kept only on a replica, which may have to send it on); `admitted`, the
/// slot of a request admitted while planning.
pub(super) async fn run(
    gw: &Engine,
    principal: &Principal,
    input: TurnInput,
    (hop, admitted): (Option<Extension<cluster::Hop>>, Option<Slot>),
    replay: (&Uri, &HeaderMap, Option<Bytes>),
) -> Result<Ran, EngineError> {
    match gw
        .execute_hop(principal, input, hop.is_some(), admitted)
        .await?
    {
        Outcome::Leg(leg) => Ok(Ran::Here(leg)),
        Outcome::Forward(owner) => {
            let (uri, headers, body) = replay;
            let replay = cluster::Replay {
                method: &axum::http::Method::POST,
                uri,
                headers,
                body: body.unwrap_or_default(),
            };
            let resp = Box::pin(cluster::to_owner(gw, "continuation", owner, &replay)).await?;
            Ok(Ran::Relayed(resp))
        }
    }
}

/// The body as received, on a replica (a continuation may be relayed to its owner).
fn keep_raw(gw: &Engine, a: &Admitted) -> Option<Bytes> {
    gw.replica_id().map(|_| a.bytes.clone())
}

/// What every turn answer does last: time to first byte (for streams, when headers and the
/// first bytes are ready to go) and the execution id for the log line.
pub(super) fn answered(
    gw: &Engine,
    a: &Admitted,
    execution: Option<Arc<str>>,
    mut resp: Response,
) -> Response {
    gw.metrics().ttfb.observe(a.arrived.elapsed());
    if let Some(execution) = execution {
        crate::telemetry::record_execution(&execution);
        resp.extensions_mut().insert(ExecutionId(execution));
    }
    resp
}
