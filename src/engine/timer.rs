//! The engine's one timer task, in the manner of mini-redis's purge task: it sleeps until the
//! earliest deadline (a suspended execution's, a pending approval's or an idle thread's),
//! settles or releases what is due, and goes back to sleep; a new registration wakes it to recompute. Backend deaths are events
//! (each agent backend's death counter), not something polled for. Nothing here scans on a
//! fixed tick, except forgetting idle rate-limit state once a minute and writing reported
//! usage to the store once a second.

use std::time::Duration;

use futures::future::select_all;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Engine;

/// How often rate-limit state of idle principals is dropped.
const FORGET_IDLE_EVERY: Duration = Duration::from_secs(60);
/// How often reported usage is written to the store (nothing is written when there is none).
const FLUSH_USAGE_EVERY: Duration = Duration::from_secs(1);

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Resolves when any of the death counters changes; never when there are none.
async fn any_death(deaths: &mut Vec<watch::Receiver<u64>>) {
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

impl Engine {
    pub(super) async fn run_timer(&self, mut deaths: Vec<watch::Receiver<u64>>) {
        let mut forget = tokio::time::interval(FORGET_IDLE_EVERY);
        forget.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut flush = tokio::time::interval(FLUSH_USAGE_EVERY);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let continuity = &self.inner.continuity;
        let registry = &self.inner.registry;
        let approvals = &self.inner.approvals;
        loop {
            let next = earliest(registry.next_deadline(), approvals.next_deadline());
            let next = earliest(next, continuity.next_expiry());
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.inner.shutdown.cancelled() => return,
                _ = sleep => self.expire_due(Instant::now()),
                _ = registry.changed().notified() => {}
                _ = approvals.changed().notified() => {}
                _ = continuity.changed().notified() => {}
                _ = any_death(&mut deaths) => {
                    for s in registry.take_dead() {
                        tracing::warn!(execution = %s.execution_id, "backend of a suspended execution died");
                        self.settled(s);
                    }
                }
                _ = forget.tick() => self.inner.limiter.forget_idle(),
                _ = flush.tick() => self.flush_usage(),
            }
        }
    }

    /// Settles every suspension and approval whose deadline is at or before `now`.
    pub(super) fn expire_due(&self, now: Instant) {
        for s in self.inner.registry.take_expired(now) {
            tracing::info!(execution = %s.execution_id, "suspended execution expired; turn interrupted");
            self.settled(s);
        }
        self.inner.approvals.expire_due(now);
        self.release_idle(now);
    }
}
