//! A replica follows the other replicas' approval writes: the store's change feed (LISTEN on
//! a connection of its own, on a blocking thread) hands each change to a task that
//! republishes the record on this replica's event stream, so every console sees an approval
//! appear and settle at once, whichever replica it is connected to. What this replica wrote
//! it published itself and skips here.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::approvals::Approvals;
use crate::store::Store;

/// How long one wait on the feed lasts before the thread looks at shutdown again.
const WAIT: Duration = Duration::from_millis(500);
/// Logged once each time the feed goes down.
const DOWN: &str = "the approvals feed is down; other replicas' approvals show up on the next list";
/// The pause before connecting again after the feed failed: this many fifths of `WAIT`.
const RETRY_STEPS: u32 = 10;

/// Starts following (a replica on PostgreSQL only). Both halves end at `stop`.
pub(super) fn follow_approvals(
    store: &Store,
    approvals: &Arc<Approvals>,
    me: &str,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) {
    let Some(mut feed) = store.approval_feed() else {
        return;
    };
    // Listening before the replica serves: no approval a console here could miss.
    if let Err(e) = feed.listen() {
        tracing::warn!(error = %e, DOWN);
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let halt = stop.clone();
    tracker.spawn_blocking(move || {
        let mut failing = false;
        while !halt.is_cancelled() {
            match feed.wait(WAIT) {
                Ok(changes) => {
                    failing = false;
                    if changes.into_iter().any(|c| tx.send(c).is_err()) {
                        return;
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, DOWN);
                    }
                    failing = true;
                    // A pause, cut short by shutdown.
                    for _ in 0..RETRY_STEPS {
                        if halt.is_cancelled() {
                            break;
                        }
                        std::thread::sleep(WAIT / 5);
                    }
                }
            }
        }
    });
    let approvals = approvals.clone();
    let me = me.to_string();
    let stop = stop.clone();
    tracker.spawn(async move {
        loop {
            let change = tokio::select! {
                _ = stop.cancelled() => return,
                c = rx.recv() => c,
            };
            match change {
                Some(c) if c.writer != me => approvals.republish(&c.approval_id),
                Some(_) => {}
                None => return,
            }
        }
    });
}
