//! What the engine's one timer task (`Engine::run_timer`) waits on, in the manner of
//! mini-redis's purge task: it sleeps until the earliest deadline (a suspended execution's, a
//! pending approval's or an idle thread's), settles or releases what is due, and goes back to
//! sleep; a new registration wakes it to recompute. Backend deaths are events (each agent
//! backend's death counter), not something polled for. Nothing scans on a fixed tick, except
//! forgetting idle rate-limit state once a minute and writing reported usage to the store
//! once a second.

use std::time::Duration;

use futures::future::select_all;
use tokio::sync::watch;
use tokio::time::Instant;

/// How often rate-limit state of idle principals is dropped.
pub(super) const FORGET_IDLE_EVERY: Duration = Duration::from_secs(60);
/// How often reported usage is written to the store (nothing is written when there is none).
pub(super) const FLUSH_USAGE_EVERY: Duration = Duration::from_secs(1);

pub(super) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Resolves when any of the death counters changes; never when there are none.
pub(super) async fn any_death(deaths: &mut Vec<watch::Receiver<u64>>) {
    if deaths.is_empty() {
        return std::future::pending().await;
    }
    let changed = deaths.iter_mut().map(|d| Box::pin(d.changed()));
    let (result, i, rest) = select_all(changed).await;
    drop(rest);
    if result.is_err() {
        // The backend is gone for good: stop listening to it.
        deaths.swap_remove(i);
    }
}
