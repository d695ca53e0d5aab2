//! Every surface's routes, registered from the surface ([`Surfaces::with`]): its turn POST at
//! [`Surface::PATH`], the routes it declares ([`Surface::routes`]) and a 405 on them in its
//! own shape. A path several surfaces declare (the model list) is served by the one that
//! claims the request ([`Surface::claims`]: an Anthropic client names its API version), else
//! by the first; an unknown route's 404 has the shape of the surface that claims it. A surface
//! whose clients send their credential in a form of its own ([`Surface::CREDENTIAL`]) has it
//! read on its routes as a bearer token, before anything authenticates. Nothing here knows a
//! surface or a wire field: each one says what is its.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, MethodRouter};
use axum::Router;

use super::caller::Admitted;
use super::turn::{answered, path_params, response, turn, Planner, SurfaceError};
use super::{socket, AppState};
use crate::error::{ApiError, ErrorCode};
use crate::surface::{Credential, Handler, Incoming, Reply, Serve, Surface};
use crate::turn::SurfaceId;

/// The surfaces' routes as they are registered.
#[derive(Default)]
pub(super) struct Surfaces {
    paths: BTreeMap<&'static str, Path>,
    /// Every surface, in registration order.
    wires: Vec<Wire>,
}

/// What is served at one path.
#[derive(Default)]
struct Path {
    turn: Option<MethodRouter<AppState>>,
    socket: bool,
    get: Vec<(Wire, Handler)>,
    post: Vec<(Wire, Handler)>,
    /// The surfaces serving it, in registration order (for its 405).
    wires: Vec<Wire>,
}

/// A surface, as a route needs it: whether a request is its, and an error in its shape.
#[derive(Clone, Copy)]
struct Wire {
    id: SurfaceId,
    claims: fn(&Uri, &HeaderMap) -> bool,
    refuse: fn(ApiError) -> Response,
    credential: Option<Credential>,
}

impl Wire {
    fn of<S: Surface>() -> Wire {
        Wire {
            id: S::ID,
            claims: S::claims,
            refuse: |e| SurfaceError::<S>::from(e).into_response(),
            credential: S::CREDENTIAL,
        }
    }
}

/// The first of `wires` that claims the request.
fn claimed(wires: &[Wire], uri: &Uri, headers: &HeaderMap) -> Option<Wire> {
    wires.iter().copied().find(|w| (w.claims)(uri, headers))
}

impl Surfaces {
    /// Surface `S`'s routes.
    pub fn with<S: Surface>(mut self) -> Self {
        let wire = Wire::of::<S>();
        self.wires.push(wire);
        self.at(S::PATH, wire).turn = Some(post(turn::<S>));
        for route in S::routes() {
            let path = self.at(route.path, wire);
            match route.serve {
                Serve::Get(h) => path.get.push((wire, h)),
                Serve::Post(h) => path.post.push((wire, h)),
                Serve::Socket => path.socket = true,
            }
        }
        self
    }

    fn at(&mut self, path: &'static str, wire: Wire) -> &mut Path {
        let at = self.paths.entry(path).or_default();
        if !at.wires.iter().any(|w| w.id == wire.id) {
            at.wires.push(wire);
        }
        at
    }

    /// The router of every registered route, with the 404 of an unknown one.
    pub fn router(self) -> Router<AppState> {
        let mut router = Router::new();
        for (path, at) in self.paths {
            let mut methods = at.turn.unwrap_or_default();
            if at.socket {
                methods = methods.get(socket::upgrade);
            }
            if !at.get.is_empty() {
                let routes = Arc::new(at.get);
                methods = methods.get(move |State(app), req| extra(app, routes, req, false));
            }
            if !at.post.is_empty() {
                let routes = Arc::new(at.post);
                methods = methods.post(move |State(app), req| extra(app, routes, req, true));
            }
            let wires = at.wires;
            let own = wires.iter().any(|w| w.credential.is_some());
            let refusing = wires.clone();
            methods = methods.fallback(move |uri: Uri, headers: HeaderMap| async move {
                let wire = claimed(&refusing, &uri, &headers).unwrap_or(refusing[0]);
                (wire.refuse)(ApiError::new(
                    ErrorCode::MethodNotAllowed,
                    "Method not allowed on this route.",
                ))
            });
            if own {
                let wires = Arc::new(wires);
                methods = methods.layer(axum::middleware::map_request(move |req| {
                    std::future::ready(with_bearer(&wires, req))
                }));
            }
            router = router.route(path, methods);
        }
        let wires = self.wires;
        router.fallback(move |uri: Uri, headers: HeaderMap| async move {
            let e = ApiError::new(ErrorCode::NotFound, "Unknown route.");
            match claimed(&wires, &uri, &headers) {
                Some(wire) => (wire.refuse)(e),
                None => e.into_response(),
            }
        })
    }
}

/// The request with the credential of the surface that claims it as `Authorization`, when
/// it sent none and the surface has a form of its own.
fn with_bearer(wires: &[Wire], mut req: Request) -> Request {
    if req.headers().contains_key(header::AUTHORIZATION) {
        return req;
    }
    let (uri, headers) = (req.uri(), req.headers());
    let wire = claimed(wires, uri, headers).unwrap_or(wires[0]);
    let bearer = (wire.credential.and_then(|read| read(uri, headers)))
        .and_then(|key| HeaderValue::from_str(&format!("Bearer {key}")).ok());
    if let Some(mut v) = bearer {
        v.set_sensitive(true);
        req.headers_mut().insert(header::AUTHORIZATION, v);
    }
    req
}

/// A surface's own route: authenticated (and for a POST, its body admitted as a turn's),
/// answered by the surface that claims the request, every error in that surface's shape.
async fn extra(
    app: AppState,
    routes: Arc<Vec<(Wire, Handler)>>,
    req: Request,
    body: bool,
) -> Response {
    let (wire, handler) = claimed_route(&routes, req.uri(), req.headers());
    let (mut parts, payload) = req.into_parts();
    let params: Result<RawPathParams, RawPathParamsRejection> =
        RawPathParams::from_request_parts(&mut parts, &app).await;
    let (uri, headers) = (parts.uri.clone(), parts.headers.clone());
    let admitted = match body {
        true => Admitted::from_request(Request::from_parts(parts, payload), &app).await,
        false => app.admit(&headers).await.map(|principal| Admitted {
            arrived: tokio::time::Instant::now(),
            cfg: app.engine.config(),
            bytes: Default::default(),
            principal,
        }),
    };
    let answered_by = async {
        let mut a = admitted?;
        let params = path_params(&params)?;
        let host = Planner::new(&app.engine, &a.principal);
        let req = Incoming {
            uri: &uri,
            params: &params,
            headers: &headers,
            body: std::mem::take(&mut a.bytes),
            arrived: a.arrived,
        };
        let answer = handler(req, &host).await?;
        let resp = response(Reply::Whole(answer));
        Ok::<_, ApiError>(match body {
            true => answered(&app.engine, &a, None, resp),
            false => resp,
        })
    };
    match answered_by.await {
        Ok(resp) => resp,
        Err(e) => (wire.refuse)(e),
    }
}

/// The route of the surface that claims the request, else the first one.
fn claimed_route(routes: &[(Wire, Handler)], uri: &Uri, headers: &HeaderMap) -> (Wire, Handler) {
    let claims = |(w, _): &&(Wire, Handler)| (w.claims)(uri, headers);
    *routes.iter().find(claims).unwrap_or(&routes[0])
}
