//! Store writes behind the request path. An agent turn's start and end (a replica's start
//! is written at once: its store's answer is how it learns to refuse fresh turns) are queued to a
//! writer thread of the journal's own, which commits whatever has queued since its last write
//! in one transaction (group commit): a turn costs no store transaction on an async worker,
//! and under load many turns share one commit. A single gateway's held batch, once answered,
//! has its tombstones queued too, so a continuation reaches its backend before they are
//! written (a crash before they are makes the tokens `lost` tombstones at the next start, and
//! a held turn never resumes after a crash either way). Replicas write them at once: the
//! write tells whether another replica settled the batch first.
//!
//! The queue keeps order, so an end is never written before its start. A crash loses at most
//! the rows still queued (the next start settles what it finds live as `lost`). While writing
//! fails, the journal is unhealthy: fresh agent turns then write their start themselves, and
//! are refused with `store_unavailable` when that fails too, as before; the first success
//! makes it healthy again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::store::{Lifecycle, Store, StoreError};

/// At most this many rows go into one transaction.
const MAX_BATCH: usize = 1024;

enum Queued {
    Row(Lifecycle),
    Tombstones(Tombstones),
    /// Answered once everything queued before it is written (tests).
    #[cfg(test)]
    Barrier(mpsc::SyncSender<()>),
}

/// A settled batch's tombstones (`Store::tokens_settled`).
pub(super) struct Tombstones {
    pub execution_id: String,
    pub principal: String,
    pub tokens: Vec<[u8; 32]>,
    pub reason: &'static str,
    pub evicted: Vec<[u8; 32]>,
}

pub(super) struct Journal {
    store: Arc<Store>,
    queue: Mutex<Option<mpsc::Sender<Queued>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    healthy: Arc<AtomicBool>,
}

impl Journal {
    pub fn start(store: Arc<Store>) -> Result<Journal, String> {
        let (tx, rx) = mpsc::channel();
        let healthy = Arc::new(AtomicBool::new(true));
        let writer = {
            let (store, healthy) = (store.clone(), healthy.clone());
            std::thread::Builder::new()
                .name("journal".into())
                .spawn(move || write(&store, &rx, &healthy))
                .map_err(|e| format!("cannot start the journal writer: {e}"))?
        };
        Ok(Journal {
            store,
            queue: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
            healthy,
        })
    }

    fn send(&self, q: Queued) -> bool {
        self.try_send(q).is_ok()
    }

    /// Queues `q`, or hands it back when the writer has stopped.
    fn try_send(&self, q: Queued) -> Result<(), Queued> {
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        match queue.as_ref() {
            Some(tx) => tx.send(q).map_err(|e| e.0),
            None => Err(q),
        }
    }

    /// Records a start: queued while the journal is healthy, else written at once (the
    /// caller refuses the turn when that fails).
    pub fn started(
        &self,
        execution_id: &str,
        principal: &str,
        model: &str,
    ) -> Result<(), StoreError> {
        if self.healthy.load(Ordering::Relaxed) {
            let row = Lifecycle::Started {
                execution_id: execution_id.to_string(),
                principal: principal.to_string(),
                model: model.to_string(),
                at: crate::store::now_unix(),
            };
            if self.send(Queued::Row(row)) {
                return Ok(());
            }
        }
        self.store
            .execution_started(execution_id, principal, model)?;
        self.healthy.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Writes a batch's tombstones behind the request path (after shutdown, at once).
    pub fn tombstones(&self, t: Tombstones) {
        if let Err(Queued::Tombstones(t)) = self.try_send(Queued::Tombstones(t)) {
            write_tombstones(&self.store, &t);
        }
    }

    /// Records an end (queued; after shutdown, written at once).
    pub fn ended(&self, execution_id: &str, reason: &'static str) {
        let row = Lifecycle::Ended {
            execution_id: execution_id.to_string(),
            reason,
            at: crate::store::now_unix(),
        };
        if !self.send(Queued::Row(row)) {
            if let Err(e) = self.store.execution_ended(execution_id, reason) {
                tracing::error!(execution = %execution_id, error = %e, "could not journal execution end");
            }
        }
    }

    /// Waits until everything queued so far is written (blocking; tests).
    #[cfg(test)]
    pub fn flush(&self) {
        let (tx, rx) = mpsc::sync_channel(1);
        if self.send(Queued::Barrier(tx)) {
            let _ = rx.recv();
        }
    }

    /// Writes what is queued and stops the writer; later rows are written directly.
    /// Blocking: called off the async workers.
    pub fn close(&self) {
        drop(self.queue.lock().unwrap_or_else(|e| e.into_inner()).take());
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = writer {
            let _ = w.join();
        }
    }
}

/// The writer: waits for a row, takes everything queued behind it, commits it as one.
fn write(store: &Store, rx: &mpsc::Receiver<Queued>, healthy: &AtomicBool) {
    let mut rows = Vec::new();
    let mut settled = Vec::new();
    let mut barriers: Vec<mpsc::SyncSender<()>> = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(q) = next.take() {
            match q {
                Queued::Row(r) => rows.push(r),
                Queued::Tombstones(t) => settled.push(t),
                #[cfg(test)]
                Queued::Barrier(b) => barriers.push(b),
            }
            if rows.len() + settled.len() < MAX_BATCH {
                next = rx.try_recv().ok();
            }
        }
        if !rows.is_empty() {
            match store.executions_journaled(&rows) {
                Ok(()) => healthy.store(true, Ordering::Relaxed),
                Err(e) => {
                    healthy.store(false, Ordering::Relaxed);
                    tracing::error!(rows = rows.len(), error = %e, "could not journal execution starts and ends");
                }
            }
            rows.clear();
        }
        for t in settled.drain(..) {
            write_tombstones(store, &t);
        }
        for b in barriers.drain(..) {
            let _ = b.send(());
        }
    }
}

fn write_tombstones(store: &Store, t: &Tombstones) {
    let written = store.tokens_settled(
        &t.execution_id,
        &t.principal,
        &t.tokens,
        t.reason,
        &t.evicted,
    );
    if let Err(e) = written {
        // Recovery turns the still-pending rows into `lost` tombstones, which never resume.
        tracing::error!(execution = %t.execution_id, error = %e, "could not persist tombstones");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_written_in_order_and_flushed() {
        let store = Arc::new(Store::open_in_memory().unwrap());
        let journal = Journal::start(store.clone()).unwrap();
        for i in 0..50 {
            journal.started(&format!("exe-{i}"), "alice", "m").unwrap();
            journal.ended(&format!("exe-{i}"), "completed");
        }
        journal.flush();
        for i in [0, 49] {
            let events = store.journal_events(&format!("exe-{i}")).unwrap();
            assert_eq!(events, ["execution_started", "execution_ended"]);
        }
        journal.close();
        // After close, rows go straight to the store.
        journal.started("exe-late", "alice", "m").unwrap();
        journal.ended("exe-late", "failed");
        let events = store.journal_events("exe-late").unwrap();
        assert_eq!(events, ["execution_started", "execution_ended"]);
    }
}
