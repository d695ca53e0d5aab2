//! The delivery task: leases due outbox rows, sends each once per lease, and records how it
//! went. It sleeps until the earliest due row, a wake after a commit, or the sweep (rows
//! another replica wrote, or left when it died); its attempts are bounded in number and time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{sign, Notifier};
use crate::config::WebhookConfig;
use crate::store::{now_unix, now_unix_ms, Attempt, Delivery};

/// Rows leased at a time.
const BATCH: u32 = 16;
/// Attempts in flight at once.
const IN_FLIGHT: usize = 16;
/// The longest sleep: rows another replica wrote, or left leased when it died, are found
/// within this.
const SWEEP: Duration = Duration::from_secs(10);
/// The first retry's delay; each next one is four times longer, up to [`MAX_DELAY`].
const FIRST_DELAY: Duration = Duration::from_secs(5);
const MAX_DELAY: Duration = Duration::from_secs(2 * 3600);
/// Delivered and dead rows are kept this long for the console.
const KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// An endpoint's client: no redirects, no proxy variables, one attempt's time bound, the
/// platform's roots plus `ca_file`.
pub(super) fn client(cfg: &WebhookConfig) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .connect_timeout(cfg.timeout.min(Duration::from_secs(5)))
        .timeout(cfg.timeout)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("turnstile-webhooks/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = &cfg.ca_file {
        let pem =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| e.to_string())? {
            b = b.add_root_certificate(cert);
        }
    }
    b.build().map_err(|e| e.to_string())
}

pub(super) async fn run(n: Arc<Notifier>, shutdown: CancellationToken) {
    let attempts = TaskTracker::new();
    let places = Arc::new(Semaphore::new(IN_FLIGHT));
    let lease = n
        .endpoints
        .iter()
        .map(|e| e.cfg.timeout)
        .max()
        .unwrap_or(SWEEP)
        + Duration::from_secs(5);
    let mut pruned_at: Option<Instant> = None;
    loop {
        n.fresh.store(0, std::sync::atomic::Ordering::Relaxed);
        let now = now_unix_ms();
        let batch = match n
            .store
            .outbox_lease(now, now + lease.as_millis() as u64, BATCH)
            .await
        {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "could not lease notifications; retried at the next sweep");
                Vec::new()
            }
        };
        let full = batch.len() as u32 == BATCH;
        for d in batch {
            let Ok(place) = places.clone().acquire_owned().await else {
                break;
            };
            let n = n.clone();
            attempts.spawn(async move {
                attempt(&n, d).await;
                drop(place);
                n.wake.notify_one();
            });
        }
        if pruned_at.is_none_or(|at| at.elapsed() >= Duration::from_secs(3600)) {
            pruned_at = Some(Instant::now());
            let before = now_unix_ms().saturating_sub(KEEP.as_millis() as u64);
            if let Err(e) = n.store.outbox_prune(before).await {
                tracing::warn!(error = %e, "could not prune delivered notifications");
            }
        }
        if full {
            continue;
        }
        let wait = match n.store.outbox_next_due().await {
            Ok(Some(due)) => Duration::from_millis(due.saturating_sub(now_unix_ms())).min(SWEEP),
            _ => SWEEP,
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = n.wake.notified() => {}
            _ = shutdown.cancelled() => break,
        }
    }
    // An attempt is bounded by its endpoint's timeout; one cut short is due again after
    // the lease (another replica) or at this replica's next start.
    attempts.close();
    attempts.wait().await;
}

/// One attempt of a leased row, recorded.
async fn attempt(n: &Notifier, d: Delivery) {
    let now = now_unix_ms();
    let Some(e) = n.endpoint(&d.endpoint) else {
        let gone = Attempt::Failed {
            status: None,
            error: "endpoint not configured".into(),
            retry_at_ms: None,
        };
        let _ = n.store.outbox_attempted(&d.id, &gone, now).await;
        return;
    };
    let timestamp = now_unix();
    let body = super::links::expand(&d.body, &e.secrets);
    let signature = sign::signature(&e.secrets, &d.id, timestamp, body.as_bytes());
    let started = Instant::now();
    let sent = e
        .client
        .post(&e.cfg.url)
        .header("content-type", "application/json")
        .header("webhook-id", &d.id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await;
    let took = started.elapsed();
    let failed = |status: Option<u16>, error: String, after: Option<Duration>| {
        let delay = after.unwrap_or_else(|| backoff(d.attempts + 1));
        let at = now_unix_ms() + delay.as_millis() as u64;
        let window = d.created_ms + e.cfg.retry_for.as_millis() as u64;
        Attempt::Failed {
            status,
            error,
            retry_at_ms: (at <= window).then_some(at),
        }
    };
    let outcome = match sent {
        Ok(r) if r.status().is_success() => Attempt::Delivered {
            status: r.status().as_u16(),
            latency_ms: took.as_millis() as u64,
        },
        Ok(r) => {
            let status = r.status().as_u16();
            let after = retry_after(&r);
            failed(Some(status), format!("answered {status}"), after)
        }
        // Never the URL: it may carry the endpoint's secret (a Slack webhook's path).
        Err(err) => failed(None, describe(&err.without_url()), None),
    };
    let s = &e.stats;
    let counter = match &outcome {
        Attempt::Delivered { .. } => {
            s.latency.observe(took);
            &s.sent
        }
        Attempt::Failed {
            retry_at_ms: Some(_),
            ..
        } => {
            s.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            &s.retried
        }
        Attempt::Failed { .. } => {
            s.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            &s.dead
        }
    };
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Attempt::Failed {
        error,
        retry_at_ms: None,
        ..
    } = &outcome
    {
        tracing::warn!(endpoint = %d.endpoint, id = %d.id, event = %d.event, error = %error, "notification dead-lettered");
    }
    if let Err(err) = n
        .store
        .outbox_attempted(&d.id, &outcome, now_unix_ms())
        .await
    {
        // The lease lapses and the row is attempted again: at least once.
        tracing::error!(endpoint = %d.endpoint, id = %d.id, error = %err, "could not record a notification attempt");
    }
}

/// The delay before attempt `n + 1` after `n` failed ones: 5 s, 20 s, 80 s … up to two
/// hours, each within ±20 % so that endpoints coming back are not hit at once.
pub(super) fn backoff(failed: u32) -> Duration {
    let base = FIRST_DELAY.as_secs_f64() * 4f64.powi(failed.saturating_sub(1).min(10) as i32);
    let base = base.min(MAX_DELAY.as_secs_f64());
    Duration::from_secs_f64(base * rand::random_range(0.8..1.2))
}

/// A 429's or 503's `Retry-After` in seconds (at most the longest delay).
fn retry_after(r: &reqwest::Response) -> Option<Duration> {
    if !matches!(r.status().as_u16(), 429 | 503) {
        return None;
    }
    let secs: u64 = r
        .headers()
        .get("retry-after")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(MAX_DELAY))
}

/// What went wrong, in words that carry no URL.
fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "could not connect".into()
    } else if e.is_redirect() {
        "redirected (not followed)".into()
    } else {
        "request failed".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_grows_fourfold_within_its_jitter_and_stops_at_two_hours() {
        for (n, secs) in [(1, 5.0), (2, 20.0), (3, 80.0), (30, 7200.0)] {
            let d = backoff(n).as_secs_f64();
            assert!(d >= secs * 0.8 && d <= secs * 1.2, "{n}: {d}");
        }
    }
}
