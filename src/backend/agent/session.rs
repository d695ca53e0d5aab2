//! One session of a kind whose session is one process (`claude_code`, `acp`): the lifecycle
//! every such kind shares, written once. [`Session`] owns the child, its place in
//! `max_sessions`, the scratch folder, our requests waiting for their answer, the running
//! turn's route with its held calls, and the release and reap. A kind is a [`Protocol`]: what
//! its process is started with, its handshake, what its lines mean and how a held call is
//! answered; it keeps what it needs per turn in [`State::turn`] and per session in
//! [`Session::extra`].

use parking_lot::{Mutex, MutexGuard};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use serde_json::Value;
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::child::{Child, Output};
use super::places::AgentSession;
use super::render::Rendered;
use super::turns::Structured;
use crate::backend::{ApprovalAsk, BackendError, HeldCall, Meter, TurnEvent};
use crate::config::ModelConfig;
use crate::turn::{Effort, ToolDef, TurnInput, Usage};

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
    type Names: PartialEq + Default + Send + Sync + 'static;
    /// What the protocol keeps of a running turn.
    type Turn: Default + Send + 'static;
    /// How one held call is answered.
    type Held: Send + 'static;
    /// What the protocol keeps of a session.
    type Extra: Default + Send + Sync + 'static;

    /// Whether the agent's version, checked at gateway startup (so that a backend that cannot
    /// start is refused then), is what [`Protocol::probe`] finds in a started session rather
    /// than what `command --version` prints.
    const PROBE: bool = false;

    /// The agent's version as a session started for it alone reports it.
    fn probe(
        _session: &Arc<Session<Self>>,
    ) -> impl Future<Output = Result<String, BackendError>> + Send {
        async {
            Err(BackendError::Unavailable(
                "the agent cannot be probed".into(),
            ))
        }
    }

    /// The client's tools as the kind names them, and as its MCP server declares them.
    fn names(&self, tools: &[ToolDef]) -> Self::Names;
    fn declare(names: &Self::Names, tools: &[ToolDef]) -> Vec<Value>;

    /// The variables a session's process gets besides the configured ones and `HOME` (its
    /// scratch folder), unless the config sets them.
    fn env(scratch: &Path) -> Vec<(&'static str, String)>;

    /// The command line of a session opened for `opening`: by default the configured one.
    fn argv(&self, _command: &mut Vec<String>, _opening: &Opening<'_>) {}

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

/// How long a request to the agent (its handshake, a model choice) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What a session was started with; a kept session continues only a turn that asks the same
/// model, effort and tool names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings<N> {
    pub model: Option<String>,
    pub effort: Option<Effort>,
    /// The client's tool names as the kind keeps them.
    pub names: N,
    /// The client's tools as the session's MCP server declares them (`tools/list`).
    pub tools: Vec<Value>,
}

impl<N: PartialEq> Settings<N> {
    /// A kept session started with `self` can run a turn that asks for `asked`.
    pub fn fits(&self, asked: &Settings<N>) -> bool {
        self.model == asked.model && self.effort == asked.effort && self.names == asked.names
    }
}

/// The turn running on the session now: where its events go.
pub struct Route {
    /// The session-local number of this turn.
    pub number: u64,
    events: UnboundedSender<TurnEvent>,
    meter: Meter,
    pub finished: bool,
    pub interrupted: bool,
}

/// What the session's turn has under way, behind one lock.
pub struct State<P: Protocol> {
    pub route: Option<Route>,
    /// The client calls the agent waits on, by invocation, and how each is answered.
    held: Vec<(u64, P::Held)>,
    /// Text the client sent beside its results, for the next answer.
    beside: Vec<String>,
    /// What the protocol keeps of the running turn (reset when a turn opens).
    pub turn: P::Turn,
}

impl<P: Protocol> State<P> {
    /// A turn runs and has not ended.
    pub fn live(&self) -> bool {
        self.route.as_ref().is_some_and(|r| !r.finished)
    }

    /// The running turn was asked to stop, or none runs.
    pub fn cancelling(&self) -> bool {
        self.route
            .as_ref()
            .is_none_or(|r| r.interrupted || r.finished)
    }

    /// Hands `ev` to the turn, if one listens.
    pub fn emit(&self, ev: TurnEvent) {
        if let Some(r) = self.route.as_ref() {
            // A closed receiver means the execution is gone; the event has no one to reach.
            let _ = r.events.unbounded_send(ev);
        }
    }

    /// Meters `u` (the usage of a model call, or what a round adds) and reports it.
    pub fn meter(&self, u: Usage) {
        if let Some(r) = self.route.as_ref() {
            (r.meter)(u);
        }
        self.emit(TurnEvent::Usage(u));
    }

    /// Ends the turn once with `ev`; the calls it held are answered by nobody now.
    pub fn end(&mut self, ev: TurnEvent) {
        self.held.clear();
        let Some(r) = self.route.as_mut().filter(|r| !r.finished) else {
            return;
        };
        r.finished = true;
        let _ = r.events.unbounded_send(ev);
    }

    /// Ends the turn once: completed, else interrupted if it was asked to stop, else failed
    /// with `why`.
    pub fn finish(&mut self, outcome: Result<(), String>) {
        let interrupted = self.route.as_ref().is_some_and(|r| r.interrupted);
        self.end(match outcome {
            Ok(()) => TurnEvent::Completed,
            Err(_) if interrupted => TurnEvent::Interrupted,
            Err(why) => TurnEvent::Failed(why),
        });
    }

    /// Forgets the held calls `gone` picks (the agent gave up on them).
    pub fn forget(&mut self, gone: impl Fn(&P::Held) -> bool) {
        self.held.retain(|(_, h)| !gone(h));
    }
}

/// Where the answer to one of our requests goes.
type Answer = oneshot::Sender<Result<Value, String>>;

/// What a new session starts with, besides its process.
pub struct Opened<P: Protocol> {
    pub id: u64,
    pub child: Arc<Child>,
    pub settings: Settings<P::Names>,
    pub cwd: String,
    pub scratch: Option<PathBuf>,
    pub permit: OwnedSemaphorePermit,
    pub next_invocation: Arc<AtomicU64>,
}

pub struct Session<P: Protocol> {
    pub id: u64,
    pub child: Arc<Child>,
    pub settings: Settings<P::Names>,
    /// The agent's working folder, shown to approvers.
    pub cwd: String,
    /// What the protocol keeps of the session.
    pub extra: P::Extra,
    /// Removed once the process is gone: nothing a session wrote there outlives it.
    scratch: Option<PathBuf>,
    /// The session's place in `max_sessions`, held while the process lives.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    state: Mutex<State<P>>,
    /// Our own requests waiting for their answer.
    pending: Mutex<Vec<(u64, Answer)>>,
    next_request: AtomicU64,
    next_turn: AtomicU64,
    next_invocation: Arc<AtomicU64>,
    /// Counted out of the backend's live processes once.
    gone: AtomicBool,
    released: AtomicBool,
    alive: Weak<AtomicU64>,
    me: Weak<Session<P>>,
}

impl<P: Protocol> Session<P> {
    /// A session of a started process, counted in `alive` until the process is gone.
    pub fn new(o: Opened<P>, alive: &Arc<AtomicU64>) -> Arc<Session<P>> {
        alive.fetch_add(1, Ordering::SeqCst);
        Arc::new_cyclic(|me| Session {
            id: o.id,
            child: o.child,
            settings: o.settings,
            cwd: o.cwd,
            extra: P::Extra::default(),
            scratch: o.scratch,
            permit: Mutex::new(Some(o.permit)),
            state: Mutex::new(State {
                route: None,
                held: Vec::new(),
                beside: Vec::new(),
                turn: P::Turn::default(),
            }),
            pending: Mutex::new(Vec::new()),
            next_request: AtomicU64::new(1),
            next_turn: AtomicU64::new(1),
            next_invocation: o.next_invocation,
            gone: AtomicBool::new(false),
            released: AtomicBool::new(false),
            alive: Arc::downgrade(alive),
            me: me.clone(),
        })
    }

    pub fn state(&self) -> MutexGuard<'_, State<P>> {
        self.state.lock()
    }

    /// Writes one line to the agent.
    pub fn write(&self, line: String) {
        self.child.send(line);
    }

    /// A fresh number for one of our requests.
    pub fn next_request(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends the request `line` writes for a fresh number and waits for its answer
    /// ([`Session::answered`] with that number); `method` names it in errors.
    pub async fn request(
        &self,
        method: &str,
        line: impl FnOnce(u64) -> String,
    ) -> Result<Value, BackendError> {
        if !self.child.is_alive() {
            return Err(BackendError::Lost);
        }
        let id = self.next_request();
        let (tx, rx) = oneshot::channel();
        self.pending.lock().push((id, tx));
        self.write(line(id));
        let agent = P::AGENT;
        tokio::select! {
            answer = tokio::time::timeout(REQUEST_TIMEOUT, rx) => match answer {
                Ok(Ok(Ok(v))) => Ok(v),
                Ok(Ok(Err(e))) => Err(BackendError::Rejected(format!("{agent} refused `{method}`: {e}"))),
                Ok(Err(_)) => Err(BackendError::Lost),
                Err(_) => Err(BackendError::Unavailable(format!("{agent} did not answer `{method}` in time"))),
            },
            () = self.child.dead().cancelled() => Err(BackendError::Lost),
        }
    }

    /// The agent's answer to our request `id`; false if no request waits on it.
    pub fn answered(&self, id: u64, result: Result<Value, String>) -> bool {
        let mut pending = self.pending.lock();
        let Some(pos) = pending.iter().position(|(p, _)| *p == id) else {
            return false;
        };
        let (_, tx) = pending.swap_remove(pos);
        let _ = tx.send(result);
        true
    }

    /// Starts a turn with `prompt` (the rendered input, one part each); its events go to
    /// `events`. The protocol writes the turn's first line and sets up its state.
    pub fn open(&self, prompt: Vec<String>, events: UnboundedSender<TurnEvent>, meter: Meter) {
        let mut turn = P::Turn::default();
        let line = P::begin(self, &mut turn, prompt);
        *self.state.lock() = State {
            route: Some(Route {
                number: self.next_turn.fetch_add(1, Ordering::Relaxed),
                events,
                meter,
                finished: false,
                interrupted: false,
            }),
            held: Vec::new(),
            beside: Vec::new(),
            turn,
        };
        self.write(line);
    }

    /// Holds a call of the client's tool `name` the agent waits on, answered later by `how`:
    /// the call as the turn hands it on.
    pub fn hold(
        &self,
        state: &mut State<P>,
        how: P::Held,
        name: &str,
        arguments: String,
    ) -> HeldCall {
        let invocation = self.next_invocation.fetch_add(1, Ordering::Relaxed);
        state.held.push((invocation, how));
        HeldCall {
            invocation,
            name: name.to_string(),
            arguments,
        }
    }

    /// Hands an approval ask to the running turn; with none, the ask is dropped and its
    /// responder declines.
    pub fn ask(&self, ask: ApprovalAsk) {
        let state = self.state.lock();
        if state.live() {
            state.emit(TurnEvent::Approval(Box::new(ask)));
        }
    }

    /// `reply` for a later answer (an approver's decision), run only while the session lives.
    pub fn later<T>(
        &self,
        reply: impl FnOnce(&Session<P>, T) + Send + 'static,
    ) -> impl FnOnce(T) + Send + 'static {
        let me = self.me.clone();
        move |answer| {
            if let Some(s) = me.upgrade() {
                reply(&s, answer);
            }
        }
    }
}

impl<P: Protocol> AgentSession for Session<P> {
    fn id(&self) -> u64 {
        self.id
    }

    /// Answers a held client call with the client's result and any text sent beside it.
    fn answer(&self, invocation: u64, text: &str, failed: bool) -> bool {
        let mut state = self.state.lock();
        let Some(pos) = state.held.iter().position(|(i, _)| *i == invocation) else {
            return false;
        };
        if !state.live() || !self.child.is_alive() {
            return false;
        }
        let (_, held) = state.held.swap_remove(pos);
        let beside = std::mem::take(&mut state.beside);
        P::answering(&mut state.turn, text, &beside);
        drop(state);
        P::answer(self, held, text, failed, beside)
    }

    /// Text the client sent beside its results: it goes with the next answer.
    fn steer(&self, input: Vec<String>) -> bool {
        let mut state = self.state.lock();
        let running = state.live();
        if running {
            state.beside.extend(input);
        }
        running
    }

    /// Asks the agent once to stop the running turn; its end follows.
    fn interrupt(&self) {
        let mut state = self.state.lock();
        let Some(route) = state.route.as_mut().filter(|r| !r.finished) else {
            return;
        };
        if std::mem::replace(&mut route.interrupted, true) || !self.child.is_alive() {
            return;
        }
        drop(state);
        P::interrupt(self);
    }

    fn is_alive(&self) -> bool {
        self.child.is_alive()
    }

    fn finished(&self) -> bool {
        self.state.lock().route.as_ref().is_none_or(|r| r.finished)
    }

    fn usable(&self) -> bool {
        self.child.is_alive()
            && !self.released.load(Ordering::SeqCst)
            && self.permit.lock().is_some()
    }

    fn close_route(&self) {
        self.state.lock().route = None;
    }

    /// Ends the session the protocol's way (the process asked to exit, or killed with its
    /// group); the place and the scratch folder go once the process is reaped.
    fn release(&self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        P::release(self);
        let me = self.me.clone();
        super::scratch::when_reaped(&self.child, self.scratch.clone(), move || {
            if let Some(s) = me.upgrade() {
                s.permit.lock().take();
            }
        });
    }
}

impl<P: Protocol> Output for Session<P> {
    fn line(self: &Arc<Self>, line: &[u8]) {
        P::line(self, line);
    }

    fn ended(&self, why: &str) {
        self.child.mark_dead();
        self.pending.lock().clear();
        P::ended(self);
        if self.child.reaped().is_cancelled() {
            self.permit.lock().take();
        }
        self.state.lock().end(TurnEvent::Lost(why.to_string()));
        if !self.gone.swap(true, Ordering::SeqCst) {
            if let Some(alive) = self.alive.upgrade() {
                alive.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}
