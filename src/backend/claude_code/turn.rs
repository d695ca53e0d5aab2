//! An execution's hold on a Claude Code session ([`ClaudeTurn`], the turn's control) and a
//! session kept idle between two turns of its conversation ([`KeptSession`]). Dropping
//! either without keeping releases the session: an unfinished turn is interrupted, the
//! process and its group are killed, its place and its scratch folder go.

use parking_lot::Mutex;
use std::sync::{Arc, Weak};

use futures::future::BoxFuture;

use super::session::Session;
use crate::backend::{BackendError, Idle, IdleThread, TurnControl};

/// The backend's idle sessions, oldest first.
pub(super) type IdleList = Arc<Mutex<Vec<Weak<Session>>>>;

pub(super) struct ClaudeTurn {
    session: Arc<Session>,
    idle: IdleList,
    /// Kept: the session lives on in a [`KeptSession`].
    kept: bool,
}

impl ClaudeTurn {
    pub fn new(session: Arc<Session>, idle: IdleList) -> ClaudeTurn {
        ClaudeTurn {
            session,
            idle,
            kept: false,
        }
    }
}

impl TurnControl for ClaudeTurn {
    fn answer_tool(&self, invocation: u64, text: &str, success: bool) -> Result<(), BackendError> {
        match self.session.answer(invocation, text, !success) {
            true => Ok(()),
            false => Err(BackendError::Lost),
        }
    }

    /// Claude Code takes no input into a running turn: the text goes with the next answer.
    fn steer(&self, input: Vec<String>) -> BoxFuture<'_, Result<(), BackendError>> {
        let delivered = self.session.steer(input);
        Box::pin(async move {
            match delivered {
                true => Ok(()),
                false => Err(BackendError::Lost),
            }
        })
    }

    fn interrupt(&self) {
        self.session.interrupt();
    }

    fn is_alive(&self) -> bool {
        self.session.child.is_alive() && !self.session.finished()
    }

    /// A completed turn's live session is kept for the conversation's next turn.
    fn keep(mut self: Box<Self>) -> Option<Idle> {
        if !self.session.finished() || !self.session.usable() {
            return None;
        }
        self.session.close_route();
        self.kept = true;
        let mut idle = self.idle.lock();
        idle.retain(|s| s.strong_count() > 0);
        idle.push(Arc::downgrade(&self.session));
        drop(idle);
        Some(Idle(Box::new(KeptSession {
            session: Mutex::new(Some(self.session.clone())),
        })))
    }
}

impl Drop for ClaudeTurn {
    fn drop(&mut self) {
        if !self.kept {
            self.session.interrupt();
            self.session.release();
        }
    }
}

/// An idle session; dropping it releases the session unless a turn took it.
pub(super) struct KeptSession {
    session: Mutex<Option<Arc<Session>>>,
}

impl KeptSession {
    /// The session, still held by this handle.
    pub fn session(&self) -> Option<Arc<Session>> {
        self.session.lock().clone()
    }

    /// The session, for the conversation's next turn (this handle then releases nothing).
    pub fn take(&self) -> Option<Arc<Session>> {
        self.session.lock().take()
    }
}

impl IdleThread for KeptSession {
    fn usable(&self) -> bool {
        let session = self.session.lock();
        session.as_ref().is_some_and(|s| s.usable())
    }
}

impl Drop for KeptSession {
    fn drop(&mut self) {
        if let Some(s) = self.take() {
            s.release();
        }
    }
}
