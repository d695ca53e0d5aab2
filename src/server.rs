//! Serving: bind, announce, serve until a signal, then shut down in order: stop accepting,
//! end legs and settle suspended executions, drain owned tasks, reap every backend child.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

use crate::config;
use crate::engine::Engine;

/// How long settling held turns and reaping children may take once serving has stopped.
const DRAIN: Duration = Duration::from_secs(10);

pub async fn serve(config_path: &Path) -> Result<(), String> {
    let cfg = config::load(config_path).map_err(|e| e.to_string())?;
    let listen = cfg.server.listen;
    let gw = Engine::start(cfg, Some(config_path.to_path_buf())).await?;
    let listener = match TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            gw.shutdown().await;
            return Err(format!("cannot listen on {listen}: {e}"));
        }
    };
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let listener = listener.tap_io(|tcp| {
        // Small SSE writes must not wait for delayed ACKs.
        let _ = tcp.set_nodelay(true);
    });

    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
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
        stopping.begin_shutdown();
    };

    let app = crate::http::router(gw.clone());
    println!("listening on http://{addr}");
    let _ = std::io::stdout().flush();
    tracing::info!(%addr, "listening");
    let server = axum::serve(listener, app).with_graceful_shutdown(stop);
    // Serves until a signal has begun the shutdown and open responses have ended.
    let result = server.await.map_err(|e| e.to_string());
    // Held turns are settled and children reaped, within a bound.
    let _ = tokio::time::timeout(DRAIN, gw.shutdown()).await;
    tracing::info!("stopped");
    result
}
