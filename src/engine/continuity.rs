//! Conversation continuity: when an agent's turn completes, its backend thread is kept idle
//! under the conversation the client will send back (every message up to and including the
//! final answer, digested as its surface digests them), bound to the principal, model,
//! surface, tools and tool choice (effort included). A fresh request that is exactly that
//! conversation plus new user messages continues the same thread with only the new
//! messages; a Responses request naming the completed response (`previous_response_id`) does
//! the same by reference. Anything else gets a fresh thread.
//!
//! Bounded three ways: `idle_ttl`, `max_idle_per_client` and `max_idle` (least recently kept
//! first). Idle threads hold no backend session permit, so they never starve new work. A
//! handful of hundred entries at most: linear scans under one short lock.

use parking_lot::Mutex;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::Idle;
use crate::config::ContinuityConfig;
use crate::turn::{Fingerprint, SurfaceId};

/// What a kept thread is bound to besides its conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Binding {
    pub principal: String,
    pub model: String,
    pub surface: SurfaceId,
    pub tools: [u8; 32],
    /// The tool choice with the effort.
    pub tool_choice: [u8; 32],
}

impl Binding {
    pub fn new(
        principal: &str,
        model: &str,
        surface: SurfaceId,
        fingerprint: &Fingerprint,
    ) -> Self {
        Binding {
            principal: principal.to_string(),
            model: model.to_string(),
            surface,
            tools: fingerprint.tools,
            tool_choice: fingerprint.tool_choice,
        }
    }

    /// The first part of `other` that differs, for a reference that names this thread.
    fn first_mismatch(&self, other: &Binding) -> Option<&'static str> {
        [
            (self.model != other.model, "model"),
            (self.surface != other.surface, "API surface"),
            (self.tools != other.tools, "tool set"),
            (
                self.tool_choice != other.tool_choice,
                "tool_choice or reasoning effort",
            ),
        ]
        .into_iter()
        .find_map(|(differs, what)| differs.then_some(what))
    }
}

/// One idle thread.
pub(super) struct Entry {
    /// Digest of the digests of every message of the conversation.
    pub conversation: [u8; 32],
    pub binding: Binding,
    /// The execution whose turn completed on it (named by `previous_response_id`).
    pub execution_id: String,
    /// The digest of each message (a reference continues from here).
    pub digests: Vec<[u8; 32]>,
    pub idle: Idle,
    pub expires: Instant,
    /// When it was kept (Unix seconds), for the activity view.
    pub kept_at: u64,
    seq: u64,
}

impl Entry {
    pub fn into_idle(self) -> Idle {
        self.idle
    }

    pub fn new(
        conversation: [u8; 32],
        binding: Binding,
        execution_id: String,
        digests: Vec<[u8; 32]>,
        idle: Idle,
        expires: Instant,
    ) -> Entry {
        Entry {
            conversation,
            binding,
            execution_id,
            digests,
            idle,
            expires,
            kept_at: crate::store::now_unix(),
            seq: 0,
        }
    }
}

/// Why a follow-up request got a fresh thread (the `reason` label of the misses metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Miss {
    /// No thread is kept for this conversation (first seen, edited, released).
    Unknown,
    /// A thread is kept for this conversation under another principal, model, tool set,
    /// tool choice or effort.
    Binding,
    /// The thread's backend process died or is being recycled.
    Released,
    /// The messages after the last answer are not all user messages.
    Input,
}

impl Miss {
    pub fn as_str(self) -> &'static str {
        match self {
            Miss::Unknown => "unknown",
            Miss::Binding => "binding",
            Miss::Released => "released",
            Miss::Input => "input",
        }
    }
}

/// A reference (`previous_response_id`) that names no usable thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RefMiss {
    /// Unknown, another principal's, released or expired: indistinguishable.
    NotFound,
    /// The caller's own thread, but the request differs in this part; nothing is taken.
    Mismatch(&'static str),
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    seq: u64,
}

#[derive(Default)]
pub(super) struct Continuity {
    state: Mutex<State>,
    /// Woken when an entry is kept, so the timer recomputes its next expiry.
    changed: Notify,
}

impl Continuity {
    pub fn changed(&self) -> &Notify {
        &self.changed
    }

    pub fn len(&self) -> usize {
        self.state.lock().entries.len()
    }

    /// Keeps a thread; returns what had to be released to stay within the bounds, with the
    /// reason (`client_bound`, `bound`). The caller drops them outside the lock.
    pub fn keep(&self, mut e: Entry, limits: &ContinuityConfig) -> Vec<(Entry, &'static str)> {
        let mut released = Vec::new();
        let mut st = self.state.lock();
        st.seq += 1;
        e.seq = st.seq;
        let principal = e.binding.principal.clone();
        loop {
            let own = st
                .entries
                .iter()
                .filter(|x| x.binding.principal == principal);
            if own.count() < limits.max_idle_per_client {
                break;
            }
            let oldest = oldest(&st.entries, |x| x.binding.principal == principal);
            released.push((st.entries.swap_remove(oldest), "client_bound"));
        }
        while !st.entries.is_empty() && st.entries.len() >= limits.max_idle {
            let oldest = oldest(&st.entries, |_| true);
            released.push((st.entries.swap_remove(oldest), "bound"));
        }
        if limits.max_idle > 0 && limits.max_idle_per_client > 0 {
            st.entries.push(e);
        } else {
            released.push((e, "bound"));
        }
        drop(st);
        self.changed.notify_one();
        released
    }

    /// Takes the newest thread kept for this conversation under this binding.
    pub fn take(&self, conversation: &[u8; 32], binding: &Binding) -> Result<Entry, Miss> {
        let mut st = self.state.lock();
        let same = |e: &Entry| e.conversation == *conversation;
        let found = st
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| same(e) && e.binding == *binding)
            .max_by_key(|(_, e)| e.seq)
            .map(|(i, _)| i);
        let Some(i) = found else {
            return Err(match st.entries.iter().any(same) {
                true => Miss::Binding,
                false => Miss::Unknown,
            });
        };
        let e = st.entries.swap_remove(i);
        drop(st);
        if !e.idle.usable() {
            return Err(Miss::Released);
        }
        Ok(e)
    }

    /// Takes the thread an execution of this principal completed on, if the request matches
    /// its binding (a mismatch takes nothing).
    pub fn take_execution(&self, execution_id: &str, binding: &Binding) -> Result<Entry, RefMiss> {
        let mut st = self.state.lock();
        let i = st
            .entries
            .iter()
            .position(|e| {
                e.execution_id == execution_id && e.binding.principal == binding.principal
            })
            .ok_or(RefMiss::NotFound)?;
        if let Some(what) = st.entries[i].binding.first_mismatch(binding) {
            return Err(RefMiss::Mismatch(what));
        }
        let e = st.entries.swap_remove(i);
        drop(st);
        if !e.idle.usable() {
            return Err(RefMiss::NotFound);
        }
        Ok(e)
    }

    /// Removes the thread this principal's execution completed on, whatever the binding.
    pub fn remove_execution(&self, execution_id: &str, principal: &str) -> Option<Entry> {
        let mut st = self.state.lock();
        let i = st
            .entries
            .iter()
            .position(|e| e.execution_id == execution_id && e.binding.principal == principal)?;
        Some(st.entries.swap_remove(i))
    }

    /// Removes every thread idle past its deadline.
    pub fn expire(&self, now: Instant) -> Vec<Entry> {
        let mut st = self.state.lock();
        let (due, keep): (Vec<Entry>, Vec<Entry>) = std::mem::take(&mut st.entries)
            .into_iter()
            .partition(|e| e.expires <= now);
        st.entries = keep;
        due
    }

    /// What `view` makes of each kept thread it selects, most recently kept first.
    pub fn snapshot<T>(&self, view: impl FnMut(&Entry) -> Option<T>) -> Vec<T> {
        let st = self.state.lock();
        let mut entries: Vec<&Entry> = st.entries.iter().collect();
        entries.sort_by_key(|e| std::cmp::Reverse(e.seq));
        entries.into_iter().filter_map(view).collect()
    }

    pub fn next_expiry(&self) -> Option<Instant> {
        self.state.lock().entries.iter().map(|e| e.expires).min()
    }

    /// Removes everything (shutdown).
    pub fn clear(&self) -> Vec<Entry> {
        std::mem::take(&mut self.state.lock().entries)
    }
}

fn oldest(entries: &[Entry], pick: impl Fn(&Entry) -> bool) -> usize {
    entries
        .iter()
        .enumerate()
        .filter(|(_, e)| pick(e))
        .min_by_key(|(_, e)| e.seq)
        .map(|(i, _)| i)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::backend::IdleThread;

    struct Thread {
        released: Arc<AtomicUsize>,
        usable: Arc<AtomicBool>,
    }
    impl IdleThread for Thread {
        fn usable(&self) -> bool {
            self.usable.load(Ordering::SeqCst)
        }
    }
    impl Drop for Thread {
        fn drop(&mut self) {
            self.released.fetch_add(1, Ordering::SeqCst);
        }
    }

    struct Rig {
        c: Continuity,
        released: Arc<AtomicUsize>,
        usable: Arc<AtomicBool>,
        limits: ContinuityConfig,
    }

    fn rig(per_client: usize, max: usize) -> Rig {
        Rig {
            c: Continuity::default(),
            released: Arc::default(),
            usable: Arc::new(AtomicBool::new(true)),
            limits: ContinuityConfig {
                enabled: true,
                idle_ttl: Duration::from_secs(600),
                max_idle_per_client: per_client,
                max_idle: max,
            },
        }
    }

    fn binding(principal: &str) -> Binding {
        Binding {
            principal: principal.into(),
            model: "codex".into(),
            surface: SurfaceId::Chat,
            tools: [1; 32],
            tool_choice: [2; 32],
        }
    }

    impl Rig {
        fn keep(&self, conversation: u8, principal: &str, exe: &str) -> usize {
            let idle = Idle(Box::new(Thread {
                released: self.released.clone(),
                usable: self.usable.clone(),
            }));
            let e = Entry::new(
                [conversation; 32],
                binding(principal),
                exe.into(),
                vec![[conversation; 32]],
                idle,
                Instant::now() + self.limits.idle_ttl,
            );
            self.c.keep(e, &self.limits).len()
        }
        fn released(&self) -> usize {
            self.released.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn the_same_conversation_and_binding_continue_anything_else_misses() {
        let r = rig(4, 16);
        r.keep(7, "alice", "exe-1");
        assert_eq!(
            r.c.take(&[7; 32], &binding("bob")).err(),
            Some(Miss::Binding)
        );
        assert_eq!(
            r.c.take(&[8; 32], &binding("alice")).err(),
            Some(Miss::Unknown)
        );
        let other_tools = Binding {
            tools: [9; 32],
            ..binding("alice")
        };
        assert_eq!(r.c.take(&[7; 32], &other_tools).err(), Some(Miss::Binding));
        let e = r.c.take(&[7; 32], &binding("alice")).unwrap();
        assert_eq!(e.execution_id, "exe-1");
        assert_eq!(
            r.c.take(&[7; 32], &binding("alice")).err(),
            Some(Miss::Unknown)
        );
        drop(e);
        assert_eq!((r.released(), r.c.len()), (1, 0));
    }

    #[test]
    fn a_reference_is_principal_bound_and_a_mismatch_takes_nothing() {
        let r = rig(4, 16);
        r.keep(7, "alice", "exe-1");
        assert_eq!(
            r.c.take_execution("exe-1", &binding("bob")).err(),
            Some(RefMiss::NotFound)
        );
        let other = Binding {
            tool_choice: [3; 32],
            ..binding("alice")
        };
        assert_eq!(
            r.c.take_execution("exe-1", &other).err(),
            Some(RefMiss::Mismatch("tool_choice or reasoning effort"))
        );
        assert!(r.c.take_execution("exe-1", &binding("alice")).is_ok());
    }

    #[test]
    fn bounds_release_the_least_recently_kept_first() {
        let r = rig(2, 3);
        assert_eq!(r.keep(1, "alice", "a1"), 0);
        assert_eq!(r.keep(2, "alice", "a2"), 0);
        // alice's third releases her oldest.
        assert_eq!(r.keep(3, "alice", "a3"), 1);
        assert_eq!(
            r.c.take(&[1; 32], &binding("alice")).err(),
            Some(Miss::Unknown)
        );
        assert_eq!(r.keep(4, "bob", "b1"), 0);
        // The global bound releases the oldest overall (alice's a2).
        assert_eq!(r.keep(5, "bob", "b2"), 1);
        assert_eq!(
            r.c.take(&[2; 32], &binding("alice")).err(),
            Some(Miss::Unknown)
        );
        assert_eq!((r.c.len(), r.released()), (3, 2));
    }

    #[test]
    fn a_thread_of_a_recycled_process_is_released_not_continued() {
        let r = rig(4, 16);
        r.keep(7, "alice", "exe-1");
        r.usable.store(false, Ordering::SeqCst);
        assert_eq!(
            r.c.take(&[7; 32], &binding("alice")).err(),
            Some(Miss::Released)
        );
        assert_eq!((r.c.len(), r.released()), (0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_threads_expire_after_the_ttl() {
        let r = rig(4, 16);
        r.keep(1, "alice", "a1");
        tokio::time::advance(Duration::from_secs(300)).await;
        r.keep(2, "alice", "a2");
        let first = r.c.next_expiry().unwrap();
        tokio::time::sleep_until(first).await;
        assert_eq!(r.c.expire(Instant::now()).len(), 1);
        assert_eq!(r.c.len(), 1);
        tokio::time::advance(Duration::from_secs(300)).await;
        assert_eq!(r.c.expire(Instant::now()).len(), 1);
        assert_eq!((r.c.len(), r.released(), r.c.next_expiry()), (0, 2, None));
    }
}
