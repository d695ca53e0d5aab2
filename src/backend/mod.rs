//! Backends: what runs turns. One [`Backend`] trait covers every kind: stateful agents, which
//! hold the turn open while the client runs its tools, on the substrate every agent kind
//! shares in `agent/` (`app_server/`: `codex app-server` over JSON-RPC; `claude_code/`: Claude
//! Code over stream-json and `acp/`: any Agent Client Protocol agent, both a `Protocol` on the
//! one `agent::AgentBackend`), and a stateless upstream (`upstream/`: an OpenAI-compatible HTTP
//! endpoint, where nothing is held and a continuation is a new request with the upstream's
//! ids restored). [`build`] is the one
//! place that turns a config's kind into a running backend.
//! Only this module speaks a backend's protocol; the engine sees a [`Turn`]: a stream of
//! [`TurnEvent`]s plus a [`TurnControl`]. Backend-side ids (process, thread, turn, `callId`,
//! upstream `tool_call.id`) never leave this module except as the opaque [`Hold::Ids`] the
//! store keeps for a stateless continuation: a held call is known outside only by its
//! gateway-issued `invocation` number.

pub mod acp;
pub mod agent;
pub mod app_server;
pub mod claude_code;
pub mod upstream;

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::channel::mpsc;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::StreamExt;

use crate::config::{BackendSpec, ModelConfig};
use crate::turn::{Continuation, TurnInput, Usage};

/// What a backend says of itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendInfo {
    /// Its config `kind` (`app-server`, `openai`, `claude-code`, `acp`).
    pub kind: &'static str,
    /// Who runs its model, as traces name it (`gen_ai.provider.name`).
    pub provider: &'static str,
    pub holds: Holds,
}

/// What a suspended turn of a backend holds, as far as the engine's lifecycle cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// The live turn, open across the suspension (lost if its process dies); a completed
    /// turn's session may be kept for the conversation's next turn.
    Turn,
    /// Nothing: a suspension is a durable record, and it survives a restart.
    Nothing,
}

/// Starts the backend a `[backends.NAME]` section describes: the one place that reads its
/// kind. An agent backend is refused here, at startup, if it cannot start.
pub async fn build(name: &str, spec: &BackendSpec) -> Result<Arc<dyn Backend>, BackendError> {
    Ok(match spec {
        BackendSpec::AppServer(cfg) => app_server::AppServer::start(name, cfg.clone()).await?,
        BackendSpec::OpenAi(cfg) => {
            Arc::new(upstream::Upstream::new(name, cfg).map_err(BackendError::Unavailable)?)
        }
        BackendSpec::ClaudeCode(c) => {
            agent::AgentBackend::start(name, &c.agent, claude_code::ClaudeCode::new(c)).await?
        }
        BackendSpec::Acp(c) => {
            agent::AgentBackend::start(name, &c.agent, acp::Acp::new(c)?).await?
        }
    })
}

/// Everything a backend needs to run one leg.
pub struct LegRequest<'a> {
    pub execution_id: &'a str,
    /// The principal it runs for: a stateless upstream, shared by every principal, scopes
    /// the client's cache keys by it.
    pub principal: &'a str,
    pub model: &'a ModelConfig,
    pub input: &'a TurnInput,
    /// Where the backend reports each model request's usage as it hears it, whichever way
    /// the turn then ends (accounting; the client's report is `TurnEvent::Usage`).
    pub meter: Meter,
    /// A thread kept idle from the same conversation's last turn: the backend continues it
    /// with the messages from `Kept::from` on instead of rendering the whole conversation.
    pub kept: Option<Kept>,
    /// The W3C `traceparent` of the leg's span, for a backend that makes HTTP requests
    /// (None when traces are off).
    pub traceparent: Option<String>,
}

/// The accounting sink of one execution.
pub type Meter = Arc<dyn Fn(Usage) + Send + Sync>;

/// A backend thread whose turn completed, kept for the conversation's next turn. Dropping it
/// releases the thread in the backend.
pub struct Idle(pub Box<dyn IdleThread>);

pub trait IdleThread: std::any::Any + Send + Sync {
    /// False once the process holding it died or is being recycled.
    fn usable(&self) -> bool;
}

impl Idle {
    pub fn usable(&self) -> bool {
        self.0.usable()
    }
}

impl std::fmt::Debug for Idle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Idle")
    }
}

/// An idle thread handed to the leg that continues its conversation.
#[derive(Debug)]
pub struct Kept {
    pub thread: Idle,
    /// The first message of the input the thread has not seen.
    pub from: usize,
}

/// One client result for an exposed call.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// The call's position in the suspended batch (exposure order).
    pub call: usize,
    /// Index of the result's message in the input.
    pub message: usize,
    /// The result, verbatim.
    pub text: &'a str,
    /// The client reported the call as failed.
    pub failed: bool,
}

/// A claimed continuation, handed to the backend that suspended it.
pub struct Resume<'a> {
    pub leg: LegRequest<'a>,
    pub continuation: &'a Continuation,
    /// One answer per exposed call, in the order the client sent them.
    pub answers: Vec<Answer<'a>>,
    /// For each call of the assistant message being answered, its position in the batch.
    pub echo_calls: Vec<usize>,
}

/// What keeps a suspended execution resumable.
pub enum Hold {
    /// A live turn holding the exposed calls open; `invocations[i]` is exposed call `i`.
    Live { turn: Turn, invocations: Box<[u64]> },
    /// The upstream's own ids of the exposed calls, in exposure order: all a stateless
    /// continuation needs (stored durably, never shown to the client).
    Ids(Vec<String>),
}

impl Hold {
    pub fn is_alive(&self) -> bool {
        match self {
            Hold::Live { turn, .. } => turn.control.is_alive(),
            Hold::Ids(_) => true,
        }
    }

    pub fn is_durable(&self) -> bool {
        matches!(self, Hold::Ids(_))
    }
}

/// A tool call the backend is holding open, waiting for the client's result.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldCall {
    /// Gateway-local number of this invocation; the backend's own call id stays inside.
    pub invocation: u64,
    pub name: String,
    /// JSON text of the arguments.
    pub arguments: String,
}

/// What kind of side effect the backend asks to perform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalKind {
    Command,
    FileChange,
    Permissions,
    Elicitation,
}

impl ApprovalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalKind::Command => "command",
            ApprovalKind::FileChange => "file_change",
            ApprovalKind::Permissions => "permissions",
            ApprovalKind::Elicitation => "elicitation",
        }
    }
}

/// Answers one backend approval request exactly once. Dropping it unanswered declines
/// (fail closed), so the backend is never left hanging.
/// The decision, and the decider's reason when it is meant for the backend.
type Decided = Box<dyn FnOnce(bool, Option<String>) + Send>;

pub struct ApprovalResponder {
    answer: Option<Decided>,
}

impl ApprovalResponder {
    pub fn new(answer: impl FnOnce(bool) + Send + 'static) -> Self {
        Self::with_reason(move |approve, _| answer(approve))
    }

    /// A responder for a backend that can tell its model why a side effect was declined.
    pub fn with_reason(answer: impl FnOnce(bool, Option<String>) + Send + 'static) -> Self {
        ApprovalResponder {
            answer: Some(Box::new(answer)),
        }
    }

    /// `true` lets the side effect run; `false` declines it.
    pub fn answer(self, approve: bool) {
        self.answer_with(approve, None)
    }

    /// [`Self::answer`] with the decider's reason, which a backend that can reaches its
    /// model on a decline.
    pub fn answer_with(mut self, approve: bool, reason: Option<String>) {
        if let Some(f) = self.answer.take() {
            f(approve, reason);
        }
    }
}

impl Drop for ApprovalResponder {
    fn drop(&mut self) {
        if let Some(f) = self.answer.take() {
            f(false, None);
        }
    }
}

impl std::fmt::Debug for ApprovalResponder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApprovalResponder")
    }
}

/// A backend request to perform a side effect of its own.
#[derive(Debug)]
pub struct ApprovalAsk {
    pub kind: ApprovalKind,
    /// A short, redacted description for the approver (no backend ids).
    pub summary: serde_json::Value,
    /// SHA-256 of the canonical action (the request without its ids).
    pub action_digest: [u8; 32],
    pub responder: ApprovalResponder,
    /// The tool use asked about (Codex's item, Claude Code's and an ACP agent's tool call),
    /// which its [`ToolEnded`] names.
    pub tool_use: Option<ToolUseKey>,
}

/// A tool use of a backend's own, as it is known outside `backend/`: a digest of the
/// backend's id for it, never the id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ToolUseKey([u8; 16]);

impl ToolUseKey {
    pub fn of(backend_id: &str) -> ToolUseKey {
        let d = crate::digest::sha256(backend_id.as_bytes());
        let mut key = [0; 16];
        key.copy_from_slice(&d[..16]);
        ToolUseKey(key)
    }
}

/// A tool use of the backend's own ended: which one, its output (at most
/// [`ToolEnded::MAX_OUTPUT`] bytes, cut on a character boundary) and whether it failed or was
/// declined.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolEnded {
    pub tool_use: ToolUseKey,
    pub output: String,
    pub is_error: bool,
}

impl ToolEnded {
    pub const MAX_OUTPUT: usize = 16 * 1024;

    /// The end of the use the backend calls `backend_id`.
    pub fn new(backend_id: &str, output: &str, is_error: bool) -> ToolEnded {
        let mut end = output.len().min(Self::MAX_OUTPUT);
        while !output.is_char_boundary(end) {
            end -= 1;
        }
        ToolEnded {
            tool_use: ToolUseKey::of(backend_id),
            output: output[..end].to_string(),
            is_error,
        }
    }
}

#[derive(Debug)]
pub enum TurnEvent {
    Delta(String),
    /// Reasoning the backend shows (Codex's reasoning summaries, an upstream's
    /// `reasoning_content`), for the surfaces to carry in their own form.
    Reasoning(String),
    /// A Chat Completions chunk (or whole body) as a stateless upstream sent it, tool calls
    /// removed and `model` renamed; only on turns whose `native` flag is set. `text` is what
    /// it says that no `Delta` carried (a chunk read without a tree says it only here).
    Relayed {
        chunk: crate::turn::Relayed,
        text: String,
    },
    ToolCall(HeldCall),
    /// Boxed: rare, and it would otherwise size every event.
    Approval(Box<ApprovalAsk>),
    ToolEnded(ToolEnded),
    Usage(Usage),
    /// The answer was cut at the output token limit (an upstream's `finish_reason:"length"`);
    /// the end follows.
    Truncated,
    Completed,
    /// The leg is over and the backend waits for the calls it issued (a stateless upstream's
    /// answer ended with tool calls): suspend now.
    Yield,
    /// The turn failed in the backend (model error). The detail is for logs only.
    Failed(String),
    /// The backend did not answer in time (504).
    TimedOut,
    Interrupted,
    /// The backend process died or stopped answering. The detail is for logs only.
    Lost(String),
}

/// Control of a running turn. Dropping it releases the backend session, interrupting the
/// turn first if it has not ended.
pub trait TurnControl: Send + Sync {
    /// Answers a held tool call with the client's result text, verbatim; `success` is false
    /// when the client reported the call as failed.
    fn answer_tool(&self, invocation: u64, text: &str, success: bool) -> Result<(), BackendError>;
    /// Adds user input to the held turn, delivered after the pending tool results (text a
    /// client sent beside its results). A stateless backend has it in its next request.
    fn steer(&self, _input: Vec<String>) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async { Ok(()) })
    }
    /// Asks the backend to stop the turn; a `TurnEvent::Interrupted` (or `Lost`) follows.
    fn interrupt(&self);
    /// False once the backend incarnation holding the turn is gone (process died).
    fn is_alive(&self) -> bool;
    /// At a suspension: a stateless backend's leg is over, and it returns the provider ids of
    /// the exposed calls (all a continuation needs); a stateful one returns None and the live
    /// turn itself is parked.
    fn detach(&self, _invocations: &[u64]) -> Option<Vec<String>> {
        None
    }
    /// After the turn completed: the thread, kept idle for the conversation's next turn
    /// (None: nothing to keep, and dropping the control releases it).
    fn keep(self: Box<Self>) -> Option<Idle> {
        None
    }
}

enum Events {
    /// A futures channel: it allocates per queued event, not a block up front, which keeps a
    /// suspended execution small.
    Channel(mpsc::UnboundedReceiver<TurnEvent>),
    Stream(BoxStream<'static, TurnEvent>),
}

pub struct Turn {
    events: Events,
    /// Events taken out of the channel by `park`, delivered first by `next_event`.
    /// In reverse order (the next one last).
    stash: Vec<TurnEvent>,
    pub control: Box<dyn TurnControl>,
    /// The events include the backend's own Chat Completions chunks (`TurnEvent::Relayed`).
    pub native: bool,
}

impl Turn {
    pub fn new(events: mpsc::UnboundedReceiver<TurnEvent>, control: Box<dyn TurnControl>) -> Turn {
        Turn {
            events: Events::Channel(events),
            stash: Vec::new(),
            control,
            native: false,
        }
    }

    pub fn from_stream(
        events: BoxStream<'static, TurnEvent>,
        control: Box<dyn TurnControl>,
        native: bool,
    ) -> Turn {
        Turn {
            events: Events::Stream(events),
            stash: Vec::new(),
            control,
            native,
        }
    }

    /// The next event; `None` once the backend side is gone.
    pub async fn next_event(&mut self) -> Option<TurnEvent> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// The next event if the backend has one ready (`Some(None)`: the backend side is gone);
    /// None, with the task's waker registered, when it has not.
    pub async fn ready_event(&mut self) -> Option<Option<TurnEvent>> {
        std::future::poll_fn(|cx| match self.poll_event(cx) {
            Poll::Ready(ev) => Poll::Ready(Some(ev)),
            Poll::Pending => Poll::Ready(None),
        })
        .await
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<TurnEvent>> {
        if let Some(ev) = self.stash.pop() {
            return Poll::Ready(Some(ev));
        }
        match &mut self.events {
            Events::Channel(rx) => rx.poll_next_unpin(cx),
            Events::Stream(s) => s.poll_next_unpin(cx),
        }
    }

    /// The completed turn's thread, kept idle (see [`TurnControl::keep`]).
    pub fn keep(self) -> Option<Idle> {
        self.control.keep()
    }

    /// Suspends the turn behind the exposed calls. A stateless backend's turn ends here (its
    /// provider ids are kept); a live one is parked: its channel still holds the waker of the
    /// task that last waited on it, which would keep that finished task's memory alive for as
    /// long as the turn stays suspended, so it is polled once with a no-op waker (anything
    /// already queued is kept for the next leg).
    pub fn suspend(mut self, invocations: Vec<u64>) -> Hold {
        if let Some(ids) = self.control.detach(&invocations) {
            return Hold::Ids(ids);
        }
        let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
        if let Events::Channel(rx) = &mut self.events {
            while let std::task::Poll::Ready(Some(ev)) =
                futures::StreamExt::poll_next_unpin(rx, &mut cx)
            {
                self.stash.push(ev);
            }
            self.stash.reverse();
        }
        Hold::Live {
            turn: self,
            invocations: invocations.into_boxed_slice(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    #[error("all backend sessions are busy")]
    Capacity,
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    #[error("backend rejected the request: {0}")]
    Rejected(String),
    #[error("the backend turn is gone")]
    Lost,
    #[error("the backend did not answer in time")]
    Timeout,
    /// An upstream's own 4xx, relayed to the client with its status and message.
    #[error("upstream refused the request ({})", .0.status)]
    Refused(Box<UpstreamRefusal>),
    /// The request cannot run on this backend (400 on `param`).
    #[error("invalid request: {message}")]
    Invalid {
        message: String,
        param: crate::error::Param,
    },
    /// A forced `tool_choice` on an agent of this kind, which decides for itself.
    #[error("unsupported tool_choice")]
    UnsupportedToolChoice { kind: &'static str },
    /// A structured-output request this backend cannot honour, and why.
    #[error("unsupported response_format")]
    UnsupportedResponseFormat(&'static str),
}

/// An upstream's rejection: its status, message, type, code and param (never its URL or key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamRefusal {
    pub status: u16,
    pub message: String,
    pub kind: Option<String>,
    pub code: Option<String>,
    pub param: Option<String>,
}

/// Sessions in use and idle, for metrics and readiness; a stateless upstream's last
/// answer and last failure, for the activity view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    pub busy: usize,
    pub capacity: usize,
    pub processes_alive: usize,
    /// Unix seconds of the last request the backend answered (a refusal is an answer).
    pub last_answer: Option<u64>,
    /// Unix seconds of the last request it did not answer (unreachable, timed out, 5xx).
    pub last_failure: Option<u64>,
}

pub trait Backend: Send + Sync {
    fn describe(&self) -> BackendInfo;
    /// What the backend reported of itself at startup (an agent's version), for the log.
    fn version(&self) -> Option<String> {
        None
    }
    /// Whether it can take a turn now (readiness; an agent's processes are up).
    fn ready(&self) -> bool {
        true
    }
    /// Refuses what this backend cannot run, before anything is journaled or started.
    fn validate(&self, input: &TurnInput) -> Result<(), BackendError>;
    /// Starts a fresh leg; resolves once the backend has accepted it (a stateless upstream:
    /// once its response headers arrived with a 2xx).
    fn start<'a>(&'a self, leg: LegRequest<'a>) -> BoxFuture<'a, Result<Turn, BackendError>>;
    /// Continues a claimed suspension with the client's answers.
    fn resume<'a>(&'a self, hold: Hold, r: Resume<'a>)
        -> BoxFuture<'a, Result<Turn, BackendError>>;
    fn stats(&self) -> SessionStats;
    /// Changes each time one of the backend's processes dies (its held turns are then lost).
    fn deaths(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
    /// Stops every child and waits for it to be reaped.
    fn shutdown(&self) -> BoxFuture<'_, ()>;
}
