//! The sessions of a kind whose session is one process (Claude Code, ACP agents): their
//! places ([`Places`]: `max_sessions` permits, the longest idle session ended to make room),
//! an execution's hold on one ([`AgentTurn`], the turn's control) and one kept idle between
//! two turns of its conversation ([`KeptSession`]). Dropping either without keeping releases
//! the session: an unfinished turn is interrupted, the process and its group are killed, its
//! place and its scratch folder go.

use parking_lot::Mutex;
use std::sync::{Arc, Weak};

use futures::future::BoxFuture;
use tokio::sync::OwnedSemaphorePermit;

use super::pool::Permits;
use crate::backend::{BackendError, Idle, IdleThread, Kept, TurnControl};

/// What a kind's session offers its turn and its places.
pub trait AgentSession: Send + Sync + 'static {
    /// The session's number, for logs.
    fn id(&self) -> u64;
    /// Answers a held client call; false if it is no longer held or nothing runs.
    fn answer(&self, invocation: u64, text: &str, failed: bool) -> bool;
    /// Text the client sent beside its results; false if no turn runs.
    fn steer(&self, input: Vec<String>) -> bool;
    /// Asks the agent to stop the running turn.
    fn interrupt(&self);
    /// The process lives.
    fn is_alive(&self) -> bool;
    /// The running turn has ended (or none runs).
    fn finished(&self) -> bool;
    /// Alive and still holding its place (not evicted).
    fn usable(&self) -> bool;
    /// The turn completed: nothing listens until the next one.
    fn close_route(&self);
    /// Ends the session: the process and its group are killed, its place is given back.
    fn release(&self);
}

/// The backend's places: its permits and its idle sessions, oldest first.
pub struct Places<S> {
    pub permits: Permits,
    idle: Arc<Mutex<Vec<Weak<S>>>>,
}

impl<S: AgentSession> Places<S> {
    pub fn new(permits: Permits) -> Places<S> {
        Places {
            permits,
            idle: Arc::default(),
        }
    }

    /// A place for a new session: a free one, else the longest idle session's.
    pub async fn place(&self, backend: &str) -> Result<OwnedSemaphorePermit, BackendError> {
        if let Some(p) = self.permits.try_acquire() {
            return Ok(p);
        }
        {
            // Released under the list's lock: a turn claims a kept session under it too.
            let mut idle = self.idle.lock();
            idle.retain(|s| s.upgrade().is_some_and(|s| s.usable()));
            if let Some(s) = (!idle.is_empty()).then(|| idle.remove(0)) {
                if let Some(s) = s.upgrade() {
                    tracing::info!(backend, session = s.id(), "idle session ended to make room");
                    s.release();
                }
            }
        }
        self.permits.acquire().await
    }

    /// Takes a kept session off the idle list for a turn: false if it was ended meanwhile
    /// (to make room) or is no longer usable.
    pub fn claim(&self, session: &Arc<S>) -> bool {
        let mut idle = self.idle.lock();
        let before = idle.len();
        idle.retain(|s| !std::ptr::eq(s.as_ptr(), Arc::as_ptr(session)));
        idle.len() < before && session.usable()
    }

    /// The kept session a turn continues, claimed off the idle list, with what `prepare` made
    /// of the index of the turn's first new message (its input, rendered). Only a session
    /// that `fits` (the turn asks what it was started with) is continued; one that does not,
    /// or that was ended meanwhile, is released, and so is the kept one if `prepare` fails.
    pub fn continue_kept<T>(
        &self,
        kept: Option<Kept>,
        fits: impl FnOnce(&S) -> bool,
        prepare: impl FnOnce(usize) -> Result<T, BackendError>,
    ) -> Result<Option<(Arc<S>, T)>, BackendError> {
        let Some(k) = kept else { return Ok(None) };
        let any: Box<dyn std::any::Any + Send + Sync> = k.thread.0;
        let Ok(kept) = any.downcast::<KeptSession<S>>() else {
            return Ok(None);
        };
        if !kept.session().is_some_and(|s| fits(&s)) {
            return Ok(None);
        }
        let prepared = prepare(k.from)?;
        let session = kept.take().filter(|s| {
            let claimed = self.claim(s);
            if !claimed {
                s.release();
            }
            claimed
        });
        Ok(session.map(|s| (s, prepared)))
    }

    /// The control of a turn running on `session`.
    pub fn turn(&self, session: Arc<S>) -> AgentTurn<S> {
        AgentTurn {
            session,
            idle: self.idle.clone(),
            kept: false,
        }
    }
}

pub struct AgentTurn<S: AgentSession> {
    session: Arc<S>,
    idle: Arc<Mutex<Vec<Weak<S>>>>,
    /// Kept: the session lives on in a [`KeptSession`].
    kept: bool,
}

impl<S: AgentSession> TurnControl for AgentTurn<S> {
    fn answer_tool(&self, invocation: u64, text: &str, success: bool) -> Result<(), BackendError> {
        match self.session.answer(invocation, text, !success) {
            true => Ok(()),
            false => Err(BackendError::Lost),
        }
    }

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
        self.session.is_alive() && !self.session.finished()
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

impl<S: AgentSession> Drop for AgentTurn<S> {
    fn drop(&mut self) {
        if !self.kept {
            self.session.interrupt();
            self.session.release();
        }
    }
}

/// An idle session; dropping it releases the session unless a turn took it.
pub struct KeptSession<S: AgentSession> {
    session: Mutex<Option<Arc<S>>>,
}

impl<S: AgentSession> KeptSession<S> {
    /// The session, still held by this handle.
    fn session(&self) -> Option<Arc<S>> {
        self.session.lock().clone()
    }

    /// The session, for the conversation's next turn (this handle then releases nothing).
    fn take(&self) -> Option<Arc<S>> {
        self.session.lock().take()
    }
}

impl<S: AgentSession> IdleThread for KeptSession<S> {
    fn usable(&self) -> bool {
        let session = self.session.lock();
        session.as_ref().is_some_and(|s| s.usable())
    }
}

impl<S: AgentSession> Drop for KeptSession<S> {
    fn drop(&mut self) {
        if let Some(s) = self.take() {
            s.release();
        }
    }
}

/// A session whose handshake is not done: dropped (the start was abandoned or failed), it
/// ends the session.
pub struct Starting<S: AgentSession>(Option<Arc<S>>);

impl<S: AgentSession> Starting<S> {
    pub fn new(session: Arc<S>) -> Starting<S> {
        Starting(Some(session))
    }

    /// The session being started.
    pub fn session(&self) -> &Arc<S> {
        self.0.as_ref().expect("a started session until it is done")
    }

    /// The handshake is done: the session is the caller's.
    pub fn done(mut self) -> Result<Arc<S>, BackendError> {
        self.0.take().ok_or(BackendError::Lost)
    }
}

impl<S: AgentSession> Drop for Starting<S> {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.release();
        }
    }
}
