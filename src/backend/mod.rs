//! Backends: the agents that run turns. Only this module speaks a backend's wire protocol
//! (JSON-RPC to `codex app-server` lives in `app_server/`); the rest of the gateway sees a
//! [`Turn`]: a stream of [`TurnEvent`]s plus a [`TurnControl`] to answer held tool calls and to
//! interrupt. Backend-side ids (process, thread, turn, `callId`) never leave this module: a held
//! tool call is known outside only by its gateway-issued `invocation` number.

pub mod app_server;
pub mod render;
pub mod upstream;

use futures::channel::mpsc;
use futures::future::BoxFuture;

use crate::error::{ApiError, ErrorCode};
use crate::openai::{ToolDef, Usage};

/// Everything a backend needs to start one execution's turn.
#[derive(Debug, Clone, Default)]
pub struct TurnRequest {
    pub execution_id: String,
    pub backend_model: Option<String>,
    /// System and developer messages, joined.
    pub instructions: Option<String>,
    /// A faithful transcript of the conversation before the last user message, if any.
    pub history: Option<String>,
    /// The last user message: the turn's input.
    pub input: String,
    /// The client's tools, declared to the backend as dynamic tools.
    pub tools: Vec<ToolDef>,
    pub approval_policy: Option<String>,
    pub sandbox: Option<String>,
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
pub struct ApprovalResponder {
    answer: Option<Box<dyn FnOnce(bool) + Send>>,
}

impl ApprovalResponder {
    pub fn new(answer: impl FnOnce(bool) + Send + 'static) -> Self {
        ApprovalResponder {
            answer: Some(Box::new(answer)),
        }
    }

    /// `true` lets the side effect run; `false` declines it.
    pub fn answer(mut self, approve: bool) {
        if let Some(f) = self.answer.take() {
            f(approve);
        }
    }
}

impl Drop for ApprovalResponder {
    fn drop(&mut self) {
        if let Some(f) = self.answer.take() {
            f(false);
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
}

#[derive(Debug)]
pub enum TurnEvent {
    Delta(String),
    ToolCall(HeldCall),
    /// Boxed: rare, and it would otherwise size every event.
    Approval(Box<ApprovalAsk>),
    Usage(Usage),
    Completed,
    /// The turn failed in the backend (model error). The detail is for logs only.
    Failed(String),
    Interrupted,
    /// The backend process died or stopped answering. The detail is for logs only.
    Lost(String),
}

/// Control of a running turn. Dropping it releases the backend session, interrupting the
/// turn first if it has not ended.
pub trait TurnControl: Send + Sync {
    /// Answers a held tool call with the client's result text, verbatim.
    fn answer_tool(&self, invocation: u64, text: &str) -> Result<(), BackendError>;
    /// Asks the backend to stop the turn; a `TurnEvent::Interrupted` (or `Lost`) follows.
    fn interrupt(&self);
    /// False once the backend incarnation holding the turn is gone (process died).
    fn is_alive(&self) -> bool;
}

pub struct Turn {
    /// A futures channel: it allocates per queued event, not a block up front, which keeps
    /// a suspended execution small.
    events: mpsc::UnboundedReceiver<TurnEvent>,
    /// Events taken out of the channel by `park`, delivered first by `next_event`.
    stash: std::collections::VecDeque<TurnEvent>,
    pub control: Box<dyn TurnControl>,
}

impl Turn {
    pub fn new(events: mpsc::UnboundedReceiver<TurnEvent>, control: Box<dyn TurnControl>) -> Turn {
        Turn {
            events,
            stash: std::collections::VecDeque::new(),
            control,
        }
    }

    /// The next event; `None` once the backend side is gone.
    pub async fn next_event(&mut self) -> Option<TurnEvent> {
        if let Some(ev) = self.stash.pop_front() {
            return Some(ev);
        }
        futures::StreamExt::next(&mut self.events).await
    }

    /// Called when the turn is parked: the channel still holds the waker of the task that
    /// last waited on it, which would keep that finished task's memory alive for as long as
    /// the turn stays suspended. Polling once with a no-op waker replaces it; anything
    /// already queued is kept for the next leg.
    pub fn park(&mut self) {
        let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
        while let std::task::Poll::Ready(Some(ev)) =
            futures::StreamExt::poll_next_unpin(&mut self.events, &mut cx)
        {
            self.stash.push_back(ev);
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    #[error("all backend sessions are busy")]
    Capacity,
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    #[error("backend rejected the request: {0}")]
    Rejected(String),
    #[error("the backend turn is gone")]
    Lost,
}

impl From<BackendError> for ApiError {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::Capacity => ApiError::new(
                ErrorCode::CapacityExhausted,
                "All backend sessions are busy; retry later.",
            ),
            BackendError::Lost => ApiError::new(
                ErrorCode::ContinuationLost,
                "The held turn is gone (backend restart); start a new turn.",
            ),
            BackendError::Unavailable(_) | BackendError::Rejected(_) => ApiError::upstream(),
        }
    }
}

/// Sessions in use and idle, for metrics and readiness.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    pub busy: usize,
    pub capacity: usize,
    pub processes_alive: usize,
}

pub trait Backend: Send + Sync {
    fn start_turn(&self, req: TurnRequest) -> BoxFuture<'_, Result<Turn, BackendError>>;
    fn stats(&self) -> SessionStats;
    /// Stops every child and waits for it to be reaped.
    fn shutdown(&self) -> BoxFuture<'_, ()>;
}
