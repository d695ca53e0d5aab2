//! Serving: bind, announce, serve until a signal, then shut down in order: stop accepting,
//! end legs and settle suspended executions, let open responses finish within
//! `server.shutdown_drain_seconds`, drain owned tasks, reap every backend child.
//!
//! The accept loop is hyper's HTTP/1 connection driver under three bounds: at most
//! `server.max_connections` open connections (more wait in the kernel's listen backlog, so a
//! flood of idle sockets cannot take the process's file descriptors), a request head must
//! arrive within `server.header_read_timeout_seconds` (a slow-loris socket is closed), and a
//! body within `server.body_read_timeout_seconds` (enforced where the body is read).

use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::config::{self, ServerConfig};
use crate::engine::{Engine, StartError};

/// How long settling held turns and reaping children may take once serving has stopped.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves `cfg`, loaded from `config_path` (which a reload reads again).
pub async fn serve(cfg: config::Config, config_path: &Path) -> Result<(), StartError> {
    for w in cfg.warnings() {
        tracing::warn!("{w}");
    }
    // A sign-in client's secret is read at each use; an unset one fails the start instead.
    let unset = (cfg.jwt.iter())
        .filter_map(|i| i.sign_in()?.1.client_secret_env.as_ref().zip(i.sign_in()))
        .find(|(_, (_, s))| s.secret().is_none());
    if let Some((var, _)) = unset {
        return Err(StartError::Environment {
            key: "auth.oidc.client_secret_env",
            var: var.clone(),
            problem: "is not set",
        });
    }
    let listen = cfg.server.listen;
    let gw = Engine::start(cfg, Some(config_path.to_path_buf())).await?;
    let listen_error = |error| StartError::Listen {
        addr: listen,
        role: "",
        error,
    };
    let listener = match TcpListener::bind(listen)
        .await
        .and_then(|l| Ok((l.local_addr()?, l)))
    {
        Ok(l) => l,
        Err(e) => {
            gw.shutdown().await;
            return Err(listen_error(e));
        }
    };
    let (addr, listener) = listener;
    if let Some(n) = gw.notifier() {
        let public = gw.config().server.public_url.clone();
        n.links_at(&public.unwrap_or_else(|| format!("http://{addr}")));
    }
    let internal = match internal_listener(&gw).await {
        Ok(l) => l,
        Err(e) => {
            gw.shutdown().await;
            return Err(e);
        }
    };

    let mut term = signal(SignalKind::terminate()).map_err(StartError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(StartError::Signals)?;
    let mut hup = signal(SignalKind::hangup()).map_err(StartError::Signals)?;
    let reloader = gw.clone();
    let stopping = gw.clone();
    let stop = async move {
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = hup.recv() => match reloader.reload() {
                    Ok(()) => tracing::info!("config reloaded"),
                    Err(e) => tracing::error!(error = %e, "config reload refused; the running config stays"),
                },
            }
        }
        tracing::info!("shutting down");
        stopping.begin_shutdown().await;
    };

    let sso = match crate::sso::Sso::load(gw.clone()).await {
        Ok(sso) => std::sync::Arc::new(sso),
        Err(e) => {
            gw.shutdown().await;
            return Err(StartError::Store(e));
        }
    };
    let state = crate::http::AppState::from(gw.clone()).with_sso(sso);
    let app = crate::http::router(state.clone());
    println!("listening on http://{addr}");
    let _ = std::io::stdout().flush();
    tracing::info!(%addr, "listening");
    // Serves until a signal has begun the shutdown and open responses have ended (bounded).
    let server_cfg = gw.config().server.clone();
    let internal = internal.map(|l| {
        let stopping = gw.stopping();
        let app = crate::http::cluster::internal_router(state);
        let bounds = Bounds::of(&server_cfg);
        tokio::spawn(async move { accept(l, app, bounds, stopping.cancelled_owned()).await })
    });
    accept(listener, app, Bounds::of(&server_cfg), stop).await;
    if let Some(task) = internal {
        let _ = task.await;
    }
    // Held turns are settled and children reaped, within a bound.
    let _ = tokio::time::timeout(DRAIN, gw.shutdown()).await;
    tracing::info!("stopped");
    Ok(())
}

/// With `[cluster]`: binds the internal listener and takes the replica's lease with its
/// address (before anything is served, so a forwarded request always finds the listener).
async fn internal_listener(gw: &Engine) -> Result<Option<TcpListener>, StartError> {
    let Some(c) = gw.config().cluster.clone() else {
        return Ok(None);
    };
    let listen_error = |error| StartError::Listen {
        addr: c.internal_listen,
        role: " (cluster.internal_listen)",
        error,
    };
    let l = TcpListener::bind(c.internal_listen)
        .await
        .map_err(listen_error)?;
    let addr = l.local_addr().map_err(listen_error)?;
    gw.join_cluster(addr).await?;
    tracing::info!(%addr, replica = %c.replica_id, "internal listener for replicas");
    Ok(Some(l))
}

/// The bounds of one listener.
pub struct Bounds {
    /// Open connections at most (an upgraded one counts until its socket closes); shared, so
    /// a listener serving more can be given more places.
    pub places: Arc<Semaphore>,
    /// A request head must arrive within this (an idle keep-alive connection is closed too).
    pub header_read_timeout: Duration,
    /// How long open connections may finish once `stop` resolved.
    pub drain: Duration,
}

impl Bounds {
    fn of(cfg: &ServerConfig) -> Bounds {
        Bounds {
            places: Arc::new(Semaphore::new(cfg.max_connections)),
            header_read_timeout: cfg.header_read_timeout,
            drain: cfg.shutdown_drain,
        }
    }
}

/// Accepts connections until `stop` resolves, then lets open ones finish for at most
/// `bounds.drain`. Used by every listener of the gateway (the public one, the replicas'
/// internal one and the MCP bridge).
pub async fn accept(
    listener: TcpListener,
    app: axum::Router,
    bounds: Bounds,
    stop: impl Future<Output = ()>,
) {
    // The graceful drain by hand: hyper-util's `GracefulShutdown` does not take HTTP/1
    // connections with upgrades (the Responses WebSocket), and its auto builder would wait
    // for a first byte without the header-read timeout.
    let (draining, drain) = tokio::sync::watch::channel(false);
    let connections = tokio_util::task::TaskTracker::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(bounds.header_read_timeout)
        .keep_alive(true);
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = bounds.places.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        let tcp = tokio::select! {
            r = listener.accept() => match r {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Small SSE writes must not wait for delayed ACKs.
        let _ = tcp.set_nodelay(true);
        let place = ConnectionPlace::new(permit, connections.token());
        let service = Placed {
            inner: TowerToHyperService::new(app.clone()),
            place: place.clone(),
        };
        let conn = http
            .serve_connection(TokioIo::new(tcp), service)
            .with_upgrades();
        let mut drain = drain.clone();
        connections.spawn(async move {
            tokio::pin!(conn);
            let served = tokio::select! {
                r = conn.as_mut() => r,
                _ = drain.changed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = served {
                // A peer that went away or was too slow: the client's problem, not ours.
                tracing::debug!(error = %e, "connection ended");
            }
            // Freed here unless an upgraded socket took it over.
            drop(place.take());
        });
    }
    drop(listener);
    let _ = draining.send(true);
    connections.close();
    if tokio::time::timeout(bounds.drain, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            seconds = bounds.drain.as_secs(),
            "open connections outlived the shutdown drain; closing them"
        );
    }
}

/// A connection's place among the listener's connections and in its drain. hyper's
/// connection ends as soon as it hands an upgraded socket over, so a request asking for an
/// upgrade carries the place (an extension) for its handler to keep for the socket's life.
#[derive(Clone)]
pub struct ConnectionPlace(Arc<Mutex<Option<Place>>>);

/// A taken [`ConnectionPlace`]: the connection counts while it lives.
pub struct Place {
    _permit: OwnedSemaphorePermit,
    _tracked: TaskTrackerToken,
}

impl ConnectionPlace {
    fn new(permit: OwnedSemaphorePermit, tracked: TaskTrackerToken) -> Self {
        ConnectionPlace(Arc::new(Mutex::new(Some(Place {
            _permit: permit,
            _tracked: tracked,
        }))))
    }

    /// The place, once (the connection's own, or its upgraded socket's).
    pub fn take(&self) -> Option<Place> {
        self.0.lock().take()
    }
}

/// A connection's service: requests asking for an upgrade carry its place.
#[derive(Clone)]
struct Placed<S> {
    inner: S,
    place: ConnectionPlace,
}

impl<S, B> hyper::service::Service<hyper::Request<B>> for Placed<S>
where
    S: hyper::service::Service<hyper::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, mut req: hyper::Request<B>) -> Self::Future {
        if req.headers().contains_key(hyper::header::UPGRADE) {
            req.extensions_mut().insert(self.place.clone());
        }
        self.inner.call(req)
    }
}
