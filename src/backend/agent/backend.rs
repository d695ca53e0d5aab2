//! The one backend of every kind whose session is one process (Claude Code, ACP agents):
//! [`AgentBackend`] owns the lifecycle (places, spawn with a scratch folder, the handshake
//! guard, kept sessions, release, reap, shutdown) and implements [`Backend`] once; a kind is
//! a [`Protocol`]: what its process is started with, its handshake, what its lines mean and
//! how a held call is answered.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::child::Child;
use super::places::{Places, Starting};
use super::pool::Permits;
use super::render::{self, Rendered};
use super::scratch::scratch_dir;
use super::session::{Opened, Session, Settings};
use super::Structured;
use crate::backend::{
    Backend, BackendError, BackendInfo, Hold, Holds, LegRequest, Resume, SessionStats, Turn,
};
use crate::config::{ChildConfig, ModelConfig};
use crate::turn::{ToolDef, TurnInput};

/// What a new session is opened for: the turn's model and input, and the instructions the
/// conversation gives (for a protocol that takes them at the handshake).
pub struct Opening<'a> {
    pub model: &'a ModelConfig,
    pub input: &'a TurnInput,
    pub instructions: Option<&'a str>,
}

/// A one-process-per-session agent's protocol: the part of a kind that differs.
pub trait Protocol: Send + Sync + Sized + 'static {
    /// Its config `kind`, as `describe` and the 400s name it.
    const KIND: &'static str;
    /// Who runs its model, as traces name it.
    const PROVIDER: &'static str;
    /// The agent, as errors name it ("claude", "the agent").
    const AGENT: &'static str;
    /// The scratch folder's kind part, and the folders made in it (`work` is the working
    /// folder unless the config sets `cwd`).
    const SCRATCH: (&'static str, &'static [&'static str]);
    /// Whether a turn can give its answer in a client's JSON schema.
    const STRUCTURED: Structured;
    /// The client's tool names as the kind keeps them (a kept session must match them).
    type Names: PartialEq + Send + Sync + 'static;
    /// What the protocol keeps of a running turn.
    type Turn: Default + Send + 'static;
    /// How one held call is answered.
    type Held: Send + 'static;
    /// What the protocol keeps of a session.
    type Extra: Default + Send + Sync + 'static;

    /// The child process as the config describes it, and its places.
    fn child(&self) -> &ChildConfig;
    fn places(&self) -> (usize, Duration);

    /// The agent's version, checked at gateway startup (so that a backend that cannot start
    /// is refused then).
    fn version(
        backend: &AgentBackend<Self>,
    ) -> impl Future<Output = Result<String, BackendError>> + Send;

    /// The client's tools as the kind names them, and as its MCP server declares them.
    fn names(&self, tools: &[ToolDef]) -> Self::Names;
    fn declare(names: &Self::Names, tools: &[ToolDef]) -> Vec<Value>;

    /// Completes `child` (the configured one, its `cwd` set) for a session: the arguments and
    /// environment the protocol needs, `scratch` being the session's folder (its `HOME`).
    fn prepare(&self, child: &mut ChildConfig, scratch: &Path, opening: Option<&Opening<'_>>);

    /// Makes a started session ready for turns.
    fn handshake<'a>(
        &'a self,
        session: &'a Arc<Session<Self>>,
        opening: &'a Opening<'a>,
    ) -> impl Future<Output = Result<(), BackendError>> + Send + 'a;

    /// A new session's first prompt: by default the instructions, the history and the input.
    fn first_prompt(rendered: Rendered) -> Vec<String> {
        let mut parts: Vec<String> = rendered.instructions.into_iter().collect();
        parts.extend(rendered.history);
        parts.extend(rendered.input);
        parts
    }

    /// A turn opens with `prompt`: the line to write, and what the protocol keeps of it.
    fn begin(session: &Session<Self>, turn: &mut Self::Turn, prompt: Vec<String>) -> String;

    /// One line of the agent's output.
    fn line(session: &Arc<Session<Self>>, line: &[u8]);

    /// A held call is being answered with `text` (and `beside`), under the turn's lock.
    fn answering(_turn: &mut Self::Turn, _text: &str, _beside: &[String]) {}

    /// Answers a held call; false if it could not be delivered.
    fn answer(
        session: &Session<Self>,
        held: Self::Held,
        text: &str,
        failed: bool,
        beside: Vec<String>,
    ) -> bool;

    /// Asks the agent to stop the running turn (asked once per turn).
    fn interrupt(session: &Session<Self>);

    /// Ends the session's process: by default its group is killed at once.
    fn release(session: &Session<Self>) {
        session.child.close();
    }

    /// The process is gone: what the protocol kept of the session goes too.
    fn ended(_session: &Session<Self>) {}
}

pub struct AgentBackend<P: Protocol> {
    name: String,
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
    pub async fn start(name: &str, protocol: P) -> Result<Arc<AgentBackend<P>>, BackendError> {
        let (max_sessions, acquire_timeout) = protocol.places();
        let mut backend = AgentBackend {
            name: name.to_string(),
            protocol,
            version: String::new(),
            places: Places::new(Permits::new(max_sessions, acquire_timeout)),
            alive: Arc::new(AtomicU64::new(0)),
            next_session: AtomicU64::new(1),
            next_invocation: Arc::new(AtomicU64::new(1)),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            deaths: Arc::new(tokio::sync::watch::Sender::new(0)),
        };
        backend.version = P::version(&backend).await?;
        Ok(Arc::new(backend))
    }

    pub fn protocol(&self) -> &P {
        &self.protocol
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
        let mut child_cfg = self.protocol.child().clone();
        let cwd = child_cfg
            .cwd
            .clone()
            .unwrap_or_else(|| scratch.join("work"));
        child_cfg.cwd = Some(cwd.clone());
        self.protocol.prepare(&mut child_cfg, &scratch, opening);
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
        let fits = |s: &Session<P>| s.settings.fits(&settings);
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
        super::validate(input, P::KIND, P::STRUCTURED)
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
        Box::pin(super::answer(&self.name, hold, r))
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
