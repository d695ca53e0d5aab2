//! Store writes behind the request path. An agent turn's start and end are queued to a
//! writer task of the journal's own, which commits whatever has queued since its last write
//! in one transaction (group commit): a turn costs no store transaction of its own, and
//! under load many turns share one commit. Queueing never wakes the writer: it drains the
//! queue on its own clock (every [`INTERVAL`]), because a wake-up per row costs a request
//! more than the write itself on a virtual machine (a cross-CPU wake-up measured 200-270 µs
//! here). A single gateway's held batch, once answered,
//! has its tombstones queued too, so a continuation reaches its backend before they are
//! written (a crash before they are makes the tokens `lost` tombstones at the next start, and
//! a held turn never resumes after a crash either way).
//!
//! Only a single gateway writes behind ([`Journal::behind`]). A replica writes at once: its
//! store's answer to a start is how a replica that lost its database learns to refuse fresh
//! turns, and its tombstone write tells whether another replica settled the batch first.
//!
//! The queue keeps order (an end is never written before its start, nor a batch's tombstones
//! before the rows queued ahead of them). A crash loses at most the rows still queued (the
//! next start settles what it finds live as `lost`). While writing
//! fails, the journal is unhealthy: fresh agent turns then write their start themselves, and
//! are refused with `store_unavailable` when that fails too, as before; the first success
//! makes it healthy again.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;

use crate::store::{Lifecycle, Settlement, Store, StoreError};

/// At most this many rows go into one transaction.
const MAX_BATCH: usize = 1024;

/// How often the writer drains the queue: the most a queued row waits.
const INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

enum Queued {
    Row(Lifecycle),
    /// Answered once everything queued before it is written (tests).
    #[cfg(test)]
    Barrier(oneshot::Sender<()>),
}

/// What the writer drains: the queue, and whether the journal is closed (then nothing more
/// is queued, and the writer ends once the queue is empty).
#[derive(Default)]
struct Queue {
    items: Vec<Queued>,
    closed: bool,
}

pub(super) struct Journal {
    store: Arc<Store>,
    queue: Arc<Mutex<Queue>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Wakes the writer before its clock (a flush, the close).
    wake: Arc<Notify>,
    healthy: Arc<AtomicBool>,
    /// Writes may go behind the request path (a single gateway).
    behind: bool,
}

impl Journal {
    /// Starts the writer (on the current runtime).
    pub fn start(store: Arc<Store>, behind: bool) -> Journal {
        let queue = Arc::new(Mutex::new(Queue::default()));
        let healthy = Arc::new(AtomicBool::new(true));
        let wake = Arc::new(Notify::new());
        let writer = {
            let (store, queue, healthy, wake) =
                (store.clone(), queue.clone(), healthy.clone(), wake.clone());
            tokio::spawn(async move { write(&store, &queue, &healthy, &wake).await })
        };
        Journal {
            store,
            queue,
            writer: Mutex::new(Some(writer)),
            wake,
            healthy,
            behind,
        }
    }

    /// Whether writes go behind the request path (a single gateway) or at once (a replica).
    pub fn behind(&self) -> bool {
        self.behind
    }

    fn send(&self, q: Queued) -> bool {
        self.try_send(q).is_ok()
    }

    /// Queues `q` (the writer is not woken), or hands it back once the journal is closed.
    fn try_send(&self, q: Queued) -> Result<(), Queued> {
        let mut queue = self.queue.lock();
        if queue.closed {
            return Err(q);
        }
        queue.items.push(q);
        Ok(())
    }

    /// Records a start: queued while the journal is behind and healthy, else written at once
    /// (the caller refuses the turn when that fails).
    pub async fn started(
        &self,
        execution_id: &str,
        principal: &str,
        model: &str,
    ) -> Result<(), StoreError> {
        if self.behind && self.healthy.load(Ordering::Relaxed) {
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
            .execution_started(execution_id, principal, model)
            .await?;
        self.healthy.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Writes a batch's tombstones behind the request path (after shutdown, at once).
    pub async fn tombstones(&self, s: Settlement) {
        if let Err(Queued::Row(Lifecycle::Settled(s))) =
            self.try_send(Queued::Row(Lifecycle::Settled(s)))
        {
            write_tombstones(&self.store, &s).await;
        }
    }

    /// Records an end (queued; after shutdown, written at once).
    pub async fn ended(&self, execution_id: &str, reason: &'static str) {
        let row = Lifecycle::Ended {
            execution_id: execution_id.to_string(),
            reason,
            at: crate::store::now_unix(),
        };
        if !self.send(Queued::Row(row)) {
            if let Err(e) = self.store.execution_ended(execution_id, reason).await {
                tracing::error!(execution = %execution_id, error = %e, "could not journal execution end");
            }
        }
    }

    /// Waits until everything queued so far is written (tests).
    #[cfg(test)]
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.send(Queued::Barrier(tx)) {
            self.wake.notify_one();
            let _ = rx.await;
        }
    }

    /// Writes what is queued and stops the writer; later rows are written directly.
    pub async fn close(&self) {
        self.queue.lock().closed = true;
        self.wake.notify_one();
        let writer = self.writer.lock().take();
        if let Some(w) = writer {
            let _ = w.await;
        }
    }
}

/// The writer: every [`INTERVAL`] (or when woken by a flush or the close), takes what has
/// queued and commits its rows as one transaction; ends once closed and drained.
async fn write(store: &Store, queue: &Mutex<Queue>, healthy: &AtomicBool, wake: &Notify) {
    let mut rows = Vec::new();
    let mut barriers: Vec<oneshot::Sender<()>> = Vec::new();
    loop {
        let (items, closed) = {
            let mut q = queue.lock();
            let n = q.items.len().min(MAX_BATCH);
            (q.items.drain(..n).collect::<Vec<_>>(), q.closed)
        };
        if items.is_empty() {
            if closed {
                return;
            }
            let _ = tokio::time::timeout(INTERVAL, wake.notified()).await;
            continue;
        }
        // In queue order, in one transaction: starts, ends and settled batches.
        for q in items {
            match q {
                Queued::Row(r) => rows.push(r),
                #[cfg(test)]
                Queued::Barrier(b) => barriers.push(b),
            }
        }
        write_rows(store, &mut rows, healthy).await;
        for b in barriers.drain(..) {
            let _ = b.send(());
        }
    }
}

/// Commits the queued lifecycle rows in one transaction (none: nothing) and empties `rows`.
async fn write_rows(store: &Store, rows: &mut Vec<Lifecycle>, healthy: &AtomicBool) {
    if rows.is_empty() {
        return;
    }
    match store.executions_journaled(rows).await {
        Ok(()) => healthy.store(true, Ordering::Relaxed),
        Err(e) => {
            healthy.store(false, Ordering::Relaxed);
            // A settled batch's tokens lost here become `lost` tombstones at the next start.
            tracing::error!(rows = rows.len(), error = %e, "could not journal execution starts, ends and settled tokens");
        }
    }
    rows.clear();
}

async fn write_tombstones(store: &Store, s: &Settlement) {
    let written = store
        .tokens_settled(
            &s.execution_id,
            &s.principal,
            &s.tokens,
            s.reason,
            &s.evicted,
        )
        .await;
    if let Err(e) = written {
        // Recovery turns the still-pending rows into `lost` tombstones, which never resume.
        tracing::error!(execution = %s.execution_id, error = %e, "could not persist tombstones");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rows_are_written_in_order_and_flushed() {
        let store = Arc::new(Store::open_in_memory().await.unwrap());
        let journal = Journal::start(store.clone(), true);
        for i in 0..50 {
            let id = format!("exe-{i}");
            journal.started(&id, "alice", "m").await.unwrap();
            journal.ended(&id, "completed").await;
        }
        journal.flush().await;
        for i in [0, 49] {
            let events = store.journal_events(&format!("exe-{i}")).await.unwrap();
            assert_eq!(events, ["execution_started", "execution_ended"]);
        }
        // A batch's tombstones queued between an execution's start and end are written
        // between them.
        journal.started("exe-t", "alice", "m").await.unwrap();
        journal
            .tombstones(Settlement {
                execution_id: "exe-t".into(),
                principal: "alice".into(),
                tokens: vec![[7; 32]],
                reason: "resolved",
                evicted: Vec::new(),
            })
            .await;
        journal.ended("exe-t", "completed").await;
        journal.flush().await;
        let events = store.journal_events("exe-t").await.unwrap();
        assert_eq!(
            events,
            ["execution_started", "tokens_settled", "execution_ended"]
        );
        journal.close().await;
        // After close, rows go straight to the store.
        journal.started("exe-late", "alice", "m").await.unwrap();
        journal.ended("exe-late", "failed").await;
        let events = store.journal_events("exe-late").await.unwrap();
        assert_eq!(events, ["execution_started", "execution_ended"]);
    }
}
