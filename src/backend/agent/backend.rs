//! The one backend of every kind whose session is one process (Claude Code, ACP agents):
//! [`AgentBackend`] owns the lifecycle (places, spawn with a scratch folder, the handshake
//! guard, kept sessions, release, reap, shutdown) and implements [`Backend`] once; a kind is
//! a [`Protocol`] (`session.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::child::Child;
use super::places::{Places, Starting};
use super::pool::Permits;
use super::render;
use super::scratch::scratch_dir;
use super::session::{Opened, Opening, Protocol, Session, Settings};
use crate::backend::{
    Backend, BackendError, BackendInfo, Hold, Holds, LegRequest, Resume, SessionStats, Turn,
};
use crate::config::AgentConfig;
use crate::turn::TurnInput;

pub struct AgentBackend<P: Protocol> {
    name: String,
    cfg: AgentConfig,
    protocol: P,
    version: String,
    /// The session permits and the sessions kept idle.
    places: Places<Session<P>>,
    alive: Arc<AtomicU64>,
    next_session: AtomicU64,
    next_invocation: Arc<AtomicU64>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    deaths: Arc<tokio::sync::watch::Sender<u64>>,
}

impl<P: Protocol> AgentBackend<P> {
    /// The backend, once the agent's version says it runs; sessions start on demand.
    pub async fn start(
        name: &str,
        cfg: &AgentConfig,
        protocol: P,
    ) -> Result<Arc<AgentBackend<P>>, BackendError> {
        let mut backend = AgentBackend {
            name: name.to_string(),
            cfg: cfg.clone(),
            protocol,
            version: String::new(),
            places: Places::new(Permits::new(cfg.max_sessions, cfg.acquire_timeout)),
            alive: Arc::new(AtomicU64::new(0)),
            next_session: AtomicU64::new(1),
            next_invocation: Arc::new(AtomicU64::new(1)),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            deaths: Arc::new(tokio::sync::watch::Sender::new(0)),
        };
        backend.version = match P::PROBE {
            true => {
                // Dropped unfinished, the start ends the session.
                let starting = backend.launch(Settings::default(), None).await?;
                P::probe(starting.session()).await?
            }
            false => super::child::version(&backend.cfg.child).await?,
        };
        Ok(Arc::new(backend))
    }

    /// Starts a session's process with `settings` in a place of its own: until the returned
    /// guard is done, dropping it (a failed or abandoned handshake) ends the session.
    pub async fn launch(
        &self,
        settings: Settings<P::Names>,
        opening: Option<&Opening<'_>>,
    ) -> Result<Starting<Session<P>>, BackendError> {
        if self.shutdown.is_cancelled() {
            return Err(BackendError::Unavailable("shutting down".into()));
        }
        let permit = self.places.place(&self.name).await?;
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let (kind, folders) = P::SCRATCH;
        let scratch = scratch_dir(kind, id, folders)?;
        let mut child_cfg = self.cfg.child.clone();
        let asked = opening.and_then(|o| o.input.cwd.clone());
        let cwd = (asked.or(child_cfg.cwd.clone())).unwrap_or_else(|| scratch.join("work"));
        child_cfg.cwd = Some(cwd.clone());
        if let Some(opening) = opening {
            self.protocol.argv(&mut child_cfg.command, opening);
        }
        let home = ("HOME", scratch.display().to_string());
        for (k, v) in std::iter::once(home).chain(P::env(&scratch)) {
            child_cfg.env.entry(k.into()).or_insert(v);
        }
        let (child, io) = match Child::spawn(id, &child_cfg, &self.tracker, &self.shutdown) {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&scratch);
                return Err(e);
            }
        };
        let opened = Opened {
            id,
            child: child.clone(),
            settings,
            cwd: cwd.display().to_string(),
            scratch: Some(scratch),
            permit,
            next_invocation: self.next_invocation.clone(),
        };
        let session = Session::new(opened, &self.alive);
        child.attach(io, session.clone(), self.deaths.clone());
        Ok(Starting::new(session))
    }

    /// A new session for `opening`'s turn, its handshake done.
    async fn open(
        &self,
        settings: Settings<P::Names>,
        opening: &Opening<'_>,
    ) -> Result<Arc<Session<P>>, BackendError> {
        let starting = self.launch(settings, Some(opening)).await?;
        let session = starting.session().clone();
        self.protocol.handshake(&session, opening).await?;
        session.child.handshake_done();
        tracing::debug!(backend = %self.name, session = session.id, "agent session started");
        starting.done()
    }

    async fn open_turn(&self, leg: LegRequest<'_>) -> Result<Turn, BackendError> {
        let LegRequest {
            execution_id,
            principal: _,
            model,
            input,
            meter,
            kept,
            traceparent: _,
        } = leg;
        let tools = input.tools.as_deref().unwrap_or_default();
        let names = self.protocol.names(tools);
        let settings = Settings {
            model: model.backend_model.clone(),
            effort: input.effort,
            tools: P::declare(&names, tools),
            names,
        };
        // A kept session continues only a turn that asks what it was started with.
        let fits = |s: &Session<P>| {
            let cwd = input.cwd.as_ref().map(|c| c.display().to_string());
            s.settings.fits(&settings) && cwd.is_none_or(|c| c == s.cwd)
        };
        let continued = self.places.continue_kept(kept, fits, |from| {
            render::continued(&input.messages[from..])
        })?;
        let (session, prompt) = match continued {
            Some(continued) => continued,
            None => {
                let rendered = render::render(&input.messages)?;
                let opening = Opening {
                    model,
                    input,
                    instructions: rendered.instructions.as_deref(),
                };
                let session = self.open(settings, &opening).await?;
                (session, P::first_prompt(rendered))
            }
        };
        let (tx, rx) = futures::channel::mpsc::unbounded();
        session.open(prompt, tx, meter);
        tracing::debug!(backend = %self.name, execution = %execution_id, session = session.id, "agent turn started");
        Ok(Turn::new(rx, Box::new(self.places.turn(session))))
    }
}

impl<P: Protocol> Backend for AgentBackend<P> {
    fn describe(&self) -> BackendInfo {
        BackendInfo {
            kind: P::KIND,
            provider: P::PROVIDER,
            holds: Holds::Turn,
        }
    }

    fn version(&self) -> Option<String> {
        Some(self.version.clone())
    }

    fn ready(&self) -> bool {
        !self.shutdown.is_cancelled()
    }

    fn validate(&self, input: &TurnInput) -> Result<(), BackendError> {
        super::turns::validate(input, P::KIND, P::STRUCTURED)
    }

    fn start<'a>(&'a self, leg: LegRequest<'a>) -> BoxFuture<'a, Result<Turn, BackendError>> {
        Box::pin(self.open_turn(leg))
    }

    /// Answers each held call with the client's result, verbatim, on the same turn; text the
    /// client sent beside its results goes with the first answer.
    fn resume<'a>(
        &'a self,
        hold: Hold,
        r: Resume<'a>,
    ) -> BoxFuture<'a, Result<Turn, BackendError>> {
        Box::pin(super::turns::answer(&self.name, hold, r))
    }

    fn deaths(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.deaths.subscribe())
    }

    fn stats(&self) -> SessionStats {
        SessionStats {
            busy: self.places.permits.busy(),
            capacity: self.places.permits.capacity(),
            processes_alive: self.alive.load(Ordering::SeqCst) as usize,
            ..SessionStats::default()
        }
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.places.permits.close();
            self.shutdown.cancel();
            self.tracker.close();
            self.tracker.wait().await;
        })
    }
}
