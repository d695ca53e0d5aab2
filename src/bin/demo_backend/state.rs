//! Per-connection state shared by the request handlers and the scenario tasks.

use std::collections::HashMap;

use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

#[derive(Clone)]
pub(crate) struct ToolSpec {
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
    pub(crate) schema: Value,
}

pub(crate) struct ActiveTurn {
    pub(crate) id: String,
    /// `dynamicToolCall` items started but not yet completed (in-progress shape).
    pub(crate) open_calls: Vec<Value>,
    pub(crate) task: Option<AbortHandle>,
    /// A model request issued calls and its usage is not reported yet (as the real binary,
    /// which reports it once the calls are answered, or when the turn is interrupted).
    pub(crate) unreported: bool,
}

pub(crate) struct Thread {
    pub(crate) scenario: String,
    pub(crate) tools: Vec<ToolSpec>,
    pub(crate) usage_reports: u64,
    pub(crate) active: Option<ActiveTurn>,
    pub(crate) ephemeral: bool,
}

/// One of our server->client requests awaiting its answer.
pub(crate) struct Pending {
    pub(crate) thread: String,
    pub(crate) turn: String,
    pub(crate) method: String,
    pub(crate) call_id: Option<String>,
    pub(crate) tx: oneshot::Sender<Value>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) initialized: bool,
    pub(crate) experimental: bool,
    pub(crate) next_request_id: u64,
    pub(crate) threads: HashMap<String, Thread>,
    pub(crate) pending: HashMap<u64, Pending>,
}

impl State {
    pub(crate) fn active_mut(&mut self, thread: &str) -> Option<&mut ActiveTurn> {
        self.threads.get_mut(thread)?.active.as_mut()
    }
}
