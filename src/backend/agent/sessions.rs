//! The sessions of a kind whose session is one process (Claude Code, ACP agents): their
//! places ([`Places`]: `max_sessions` permits, the longest idle session ended to make room),
//! an execution's hold on one ([`AgentTurn`], the turn's control) and one kept idle between
//! two turns of its conversation ([`KeptSession`]). Dropping either without keeping releases
//! the session: an unfinished turn is interrupted, the process and its group are killed, its
//! place and its scratch folder go.

use parking_lot::Mutex;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use futures::future::BoxFuture;
use tokio::sync::OwnedSemaphorePermit;

use super::child::Child;
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

/// A fresh folder of session `id`'s own under the system's temporary folder
/// (`turnstile-<kind>-<pid>-<id>-<random>`), private to the gateway's user, with `folders`
/// made in it.
pub fn scratch_dir(kind: &str, id: u64, folders: &[&str]) -> Result<PathBuf, BackendError> {
    let dir = std::env::temp_dir().join(format!(
        "turnstile-{kind}-{}-{id}-{}",
        std::process::id(),
        crate::ids::new_id("")
    ));
    // Only the gateway's user may read what a session keeps there (its transcript, memory).
    let made = std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .and_then(|()| {
            folders
                .iter()
                .try_for_each(|f| std::fs::create_dir(dir.join(f)))
        });
    made.map_err(|e| {
        let _ = std::fs::remove_dir_all(&dir);
        BackendError::Unavailable(format!("cannot create a session folder: {e}"))
    })?;
    Ok(dir)
}

/// Removes the scratch folders that gateways no longer running left in the system's
/// temporary folder (a crash or a kill skips their own cleanup): the folders named by
/// [`scratch_dir`] whose process id is not alive. A live process's are kept, whoever it is;
/// without `/proc` nothing can be told and nothing is removed. Returns how many went.
pub fn sweep_scratch() -> usize {
    sweep_scratch_in(&std::env::temp_dir(), std::path::Path::new("/proc"))
}

fn sweep_scratch_in(tmp: &std::path::Path, proc: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return 0;
    };
    if !proc.join("self").exists() {
        return 0;
    }
    let mut swept = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(scratch_owner) else {
            continue;
        };
        // A folder, not a link to one (the type of the entry itself).
        let folder = entry.file_type().is_ok_and(|t| t.is_dir());
        if !folder || pid == std::process::id() || proc.join(pid.to_string()).exists() {
            continue;
        }
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => swept += 1,
            Err(e) => tracing::debug!(error = %e, "a stale scratch folder was not removed"),
        }
    }
    if swept > 0 {
        tracing::info!(
            folders = swept,
            "removed the scratch folders of gateways that are gone"
        );
    }
    swept
}

/// The gateway process id in a scratch folder's name
/// (`turnstile-<kind>-<pid>-<id>-<32 hex>`).
fn scratch_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("turnstile-")?;
    let mut parts = rest.rsplitn(4, '-');
    let (hex, id, pid, kind) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let hexed = hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    (hexed && digits(id) && !kind.is_empty()).then(|| pid.parse().ok())?
}

/// Once `child` is reaped and nothing of its group runs (so nothing writes there any more):
/// `gone` runs (the session gives its place back) and the scratch folder is removed.
pub fn when_reaped(child: &Child, scratch: Option<PathBuf>, gone: impl FnOnce() + Send + 'static) {
    let reaped = child.reaped().clone();
    child.spawn_task(async move {
        reaped.cancelled().await;
        gone();
        if let Some(dir) = scratch {
            if let Err(e) = tokio::fs::remove_dir_all(&dir).await {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(error = %e, "a session's scratch folder was not removed");
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_folders_of_dead_gateways_are_swept_and_live_ones_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tempfile::tempdir().unwrap();
        std::fs::create_dir(proc.path().join("self")).unwrap();
        std::fs::create_dir(proc.path().join("4242")).unwrap();
        let hex = "0123456789abcdef0123456789abcdef";
        let mine = format!("turnstile-acp-{}-1-{hex}", std::process::id());
        for name in [
            format!("turnstile-acp-999999-1-{hex}"),
            format!("turnstile-claude-999998-3-{hex}"),
            format!("turnstile-acp-4242-2-{hex}"),
            mine.clone(),
            "turnstile-acp-999999-1-short".into(),
            "other-999999".into(),
        ] {
            std::fs::create_dir(tmp.path().join(&name)).unwrap();
            std::fs::write(tmp.path().join(&name).join("f"), "x").unwrap();
        }
        // A link named like a dead gateway's folder is not followed or removed.
        let target = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(
            target.path(),
            tmp.path().join(format!("turnstile-acp-999997-1-{hex}")),
        )
        .unwrap();
        assert_eq!(sweep_scratch_in(tmp.path(), proc.path()), 2);
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want = vec![
            "other-999999".to_string(),
            format!("turnstile-acp-4242-2-{hex}"),
            format!("turnstile-acp-999997-1-{hex}"),
            "turnstile-acp-999999-1-short".into(),
            mine,
        ];
        want.sort();
        assert_eq!(left, want);
        assert!(target.path().exists());
        assert_eq!(
            scratch_owner(&format!("turnstile-claude-code-7-1-{hex}")),
            Some(7)
        );
    }
}
