//! A replica follows the other replicas' approval writes: the store's change feed (LISTEN on
//! a connection of its own) hands each change to a task that republishes the record on this
//! replica's event stream, so every console sees an approval appear and settle at once,
//! whichever replica it is connected to. What this replica wrote it published itself and
//! skips here.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::approvals::Approvals;
use crate::store::{Listening, Store};

/// The pause before listening again after the feed broke or could not connect.
const RETRY: Duration = Duration::from_secs(2);
/// Logged once each time the feed goes down.
const DOWN: &str = "the approvals feed is down; other replicas' approvals show up on the next list";

/// Starts following (a replica on PostgreSQL only); listening before it returns, so no
/// approval a console here could see is missed. The task ends at `stop`.
pub(super) async fn follow_approvals(
    store: &Store,
    approvals: &Arc<Approvals>,
    me: &str,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) {
    let Some(feed) = store.approval_feed() else {
        return;
    };
    let mut listening = feed
        .listen()
        .await
        .inspect_err(|e| tracing::warn!(error = %e, DOWN))
        .ok();
    let approvals = approvals.clone();
    let me = me.to_string();
    let stop = stop.clone();
    tracker.spawn(async move {
        loop {
            if let Some(l) = listening.take() {
                if !republish(l, &approvals, &me, &stop).await {
                    return;
                }
                tracing::warn!(DOWN);
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(RETRY) => {}
            }
            listening = feed.listen().await.ok();
        }
    });
}

/// Republishes what the others wrote until the feed breaks (`true`) or `stop` (`false`).
async fn republish(
    mut l: Listening,
    approvals: &Approvals,
    me: &str,
    stop: &CancellationToken,
) -> bool {
    loop {
        let change = tokio::select! {
            _ = stop.cancelled() => return false,
            c = l.changes.recv() => c,
        };
        match change {
            Some(c) if c.writer != me => approvals.republish(&c.approval_id).await,
            Some(_) => {}
            None => return true,
        }
    }
}
