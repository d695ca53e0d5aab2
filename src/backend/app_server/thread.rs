//! One execution's hold on a backend thread ([`AppServerTurn`], the turn's control) and a
//! thread kept idle between two turns of its conversation ([`KeptThread`]). Both release the
//! thread when dropped: the turn interrupts an unfinished turn first, and returns its session
//! permit.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::json;
use tokio::sync::OwnedSemaphorePermit;

use super::process::{Proc, Route};
use super::rpc;
use crate::backend::{BackendError, Idle, IdleThread, TurnControl};

pub(super) struct AppServerTurn {
    pub proc: Arc<Proc>,
    pub route: Option<Arc<Route>>,
    /// Empty until `thread/start` answered (and after the thread was kept). Shared with
    /// the process's route map.
    pub thread: Arc<str>,
    pub turn: String,
    pub _permit: OwnedSemaphorePermit,
}

impl AppServerTurn {
    /// Counts the turn on its process from here on (the guard gives it back).
    pub fn new(proc: Arc<Proc>, permit: OwnedSemaphorePermit) -> AppServerTurn {
        proc.active.fetch_add(1, Ordering::SeqCst);
        AppServerTurn {
            proc,
            route: None,
            thread: Arc::default(),
            turn: String::new(),
            _permit: permit,
        }
    }

    fn route_alive(&self) -> bool {
        self.proc.is_alive()
            && self
                .route
                .as_ref()
                .is_some_and(|r| !r.finished.load(Ordering::SeqCst))
    }
}

impl TurnControl for AppServerTurn {
    fn answer_tool(&self, invocation: u64, text: &str, success: bool) -> Result<(), BackendError> {
        let route = self.route.as_ref().ok_or(BackendError::Lost)?;
        if !self.proc.is_alive() || route.finished.load(Ordering::SeqCst) {
            return Err(BackendError::Lost);
        }
        let id = route.take_held(invocation).ok_or(BackendError::Lost)?;
        self.proc.send(rpc::response(
            &id,
            json!({"success": success, "contentItems": [{"type": "inputText", "text": text}]}),
        ));
        Ok(())
    }

    /// `turn/steer` with the held turn as the expected one: the input reaches the model after
    /// the pending tool output. Awaited, so it is queued before the held calls are answered.
    fn steer(&self, input: Vec<String>) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            if !self.route_alive() {
                return Err(BackendError::Lost);
            }
            let items: Vec<_> = input
                .iter()
                .map(|t| json!({"type": "text", "text": t, "text_elements": []}))
                .collect();
            let params =
                json!({"threadId": &*self.thread, "input": items, "expectedTurnId": self.turn});
            self.proc.call("turn/steer", params).await.map(|_| ())
        })
    }

    fn is_alive(&self) -> bool {
        self.route_alive()
    }

    fn interrupt(&self) {
        if self.route_alive() && !self.turn.is_empty() {
            self.proc.cast(
                "turn/interrupt",
                json!({"threadId": &*self.thread, "turnId": self.turn}),
            );
        }
    }

    /// A completed turn's thread on a process that still takes work is kept; its route goes
    /// (nothing listens until the next turn opens a new one).
    fn keep(mut self: Box<Self>) -> Option<Idle> {
        let route = self.route.as_ref()?;
        if !route.finished.load(Ordering::SeqCst) || !self.proc.takes_work() {
            return None;
        }
        let renames = route.renames.clone();
        let thread = std::mem::take(&mut self.thread);
        self.proc.remove_route(&thread);
        Some(Idle(Box::new(KeptThread {
            proc: self.proc.clone(),
            thread,
            renames,
        })))
    }
}

impl Drop for AppServerTurn {
    fn drop(&mut self) {
        self.interrupt();
        if let (false, Some(route)) = (self.thread.is_empty(), &self.route) {
            self.proc.release_thread(&self.thread, route);
        }
        self.proc.active.fetch_sub(1, Ordering::SeqCst);
        self.proc.exit_if_drained();
    }
}

/// An idle thread: its process, its id and the tool renames its `dynamicTools` were declared
/// with.
pub(super) struct KeptThread {
    pub proc: Arc<Proc>,
    /// Empty once handed to a new turn.
    pub thread: Arc<str>,
    pub renames: Vec<(String, String)>,
}

impl KeptThread {
    /// The thread, for a new turn (this handle then releases nothing).
    pub fn take(mut self) -> (Arc<Proc>, Arc<str>, Vec<(String, String)>) {
        let thread = std::mem::take(&mut self.thread);
        let renames = std::mem::take(&mut self.renames);
        (self.proc.clone(), thread, renames)
    }
}

impl IdleThread for KeptThread {
    fn usable(&self) -> bool {
        self.proc.takes_work()
    }
}

impl Drop for KeptThread {
    fn drop(&mut self) {
        if !self.thread.is_empty() {
            self.proc.delete_thread(&self.thread);
        }
    }
}
