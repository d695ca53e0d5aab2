//! Notifications that reach people: `[[webhooks]]` endpoints, fed by the store's outbox.
//!
//! The store writes an event's rows in the transaction of the change it reports (through
//! [`Announce`], which this module implements); the delivery task (`deliver.rs`) leases due
//! rows after commit and sends each, signed per the Standard Webhooks specification, with the
//! same `webhook-id` on every attempt, retrying with exponential backoff and jitter until the
//! endpoint's retry window closes (then the row is dead-lettered). Without an endpoint none of
//! this exists: the store does no outbox work and no task runs.

mod body;
mod deliver;
pub mod links;
pub mod sign;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{WebhookConfig, WebhookFormat};
use crate::ids::new_id;
use crate::metrics::Histogram;
use crate::store::{
    now_unix_ms, Announce, Change, ChangeKind, DeliveryRow, Notice, Store, StoreError,
};
use sign::Secret;

/// The event a "send test event" action sends.
pub const TEST_EVENT: &str = "webhook.test";

/// Delivery counts of one endpoint since start.
#[derive(Default)]
struct Stats {
    sent: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    latency: Histogram,
}

struct Endpoint {
    cfg: WebhookConfig,
    secrets: Vec<Secret>,
    client: reqwest::Client,
    stats: Stats,
}

pub struct Notifier {
    endpoints: Vec<Endpoint>,
    store: Arc<Store>,
    /// Rows announced since the delivery task last looked.
    fresh: AtomicU64,
    wake: Notify,
    /// Which change kinds any endpoint subscribes to.
    kinds: Vec<ChangeKind>,
    /// Where decision links point: `server.public_url`, else the address the gateway
    /// listens on (set once it is bound).
    base_url: std::sync::OnceLock<String>,
}

/// Why notifications cannot start.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("webhooks.{endpoint}: {variable} {why}")]
    Secret {
        endpoint: String,
        variable: String,
        why: &'static str,
    },
    #[error("webhooks.{endpoint}: {why}")]
    Client { endpoint: String, why: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Each endpoint's secrets from the environment, current first (`turnstile check` and start).
pub fn secrets(cfg: &WebhookConfig) -> Result<Vec<Secret>, NotifyError> {
    cfg.secret_envs()
        .map(|var| {
            let bad = |why| NotifyError::Secret {
                endpoint: cfg.id.clone(),
                variable: var.to_string(),
                why,
            };
            let value = std::env::var(var).map_err(|_| bad("is not set"))?;
            Secret::parse(&value).map_err(bad)
        })
        .collect()
}

fn kind_of(event: &str) -> Option<ChangeKind> {
    match event {
        "approval.pending" | "approval.decided" => Some(ChangeKind::Approval),
        "turn.requires_action" => Some(ChangeKind::Held),
        "execution.failed" | "execution.ended" => Some(ChangeKind::Ended),
        "budget.threshold" => Some(ChangeKind::Budget),
        s if s.starts_with("session.") => Some(ChangeKind::Session),
        _ => None,
    }
}

impl Notifier {
    /// Reads the secrets, builds each endpoint's client, hooks the store's outbox and starts
    /// delivering (None: no endpoint is configured).
    pub async fn start(
        webhooks: &[WebhookConfig],
        store: Arc<Store>,
        tracker: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<Option<Arc<Notifier>>, NotifyError> {
        if webhooks.is_empty() {
            return Ok(None);
        }
        let mut endpoints = Vec::with_capacity(webhooks.len());
        for cfg in webhooks {
            let client = deliver::client(cfg).map_err(|why| NotifyError::Client {
                endpoint: cfg.id.clone(),
                why,
            })?;
            endpoints.push(Endpoint {
                secrets: secrets(cfg)?,
                cfg: cfg.clone(),
                client,
                stats: Stats::default(),
            });
        }
        let mut kinds: Vec<ChangeKind> = webhooks
            .iter()
            .flat_map(|w| w.events.iter().filter_map(|e| kind_of(e)))
            .collect();
        kinds.dedup();
        let reclaimed = store.outbox_reclaim(now_unix_ms()).await?;
        if reclaimed > 0 {
            tracing::info!(
                reclaimed,
                "notifications a previous process was sending are due again"
            );
        }
        let n = Arc::new(Notifier {
            endpoints,
            store: store.clone(),
            fresh: AtomicU64::new(0),
            wake: Notify::new(),
            kinds,
            base_url: std::sync::OnceLock::new(),
        });
        store.announce_with(n.clone());
        let task = n.clone();
        tracker.spawn(async move { deliver::run(task, shutdown).await });
        Ok(Some(n))
    }

    fn endpoint(&self, id: &str) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.cfg.id == id)
    }

    /// Queues a `webhook.test` event to endpoint `id`, asked by `by` (None: no such
    /// endpoint). Returns its `webhook-id`.
    pub async fn send_test(&self, id: &str, by: &str) -> Option<Result<String, StoreError>> {
        let e = self.endpoint(id)?;
        let at_ms = now_unix_ms();
        let data = json!({"object": "webhook_test", "endpoint": id, "requested_by": by});
        let msg = new_id("msg_");
        let notice = Notice {
            endpoint: id.to_string(),
            event: TEST_EVENT.into(),
            principal: by.to_string(),
            body: body::render(e.cfg.format, &msg, TEST_EVENT, &data, at_ms, None),
            id: msg,
            at_ms,
            links: Vec::new(),
        };
        let msg = notice.id.clone();
        let queued = self.store.outbox_enqueue(&[notice]).await;
        self.wake.notify_one();
        Some(queued.map(|()| msg))
    }

    /// The endpoints (without their URLs, which may carry a secret) and the newest
    /// deliveries.
    pub async fn view(&self) -> Result<Value, StoreError> {
        let recent = self.store.outbox_recent(None, 100).await?;
        let counts = self.store.outbox_counts().await?;
        let count = |id: &str, state: &str| {
            counts
                .iter()
                .find(|(e, s, _)| e == id && s == state)
                .map_or(0, |c| c.2)
        };
        let endpoints: Vec<Value> = self
            .endpoints
            .iter()
            .map(|e| {
                let s = &e.stats;
                json!({
                    "id": e.cfg.id,
                    "format": match e.cfg.format {
                        crate::config::WebhookFormat::Standard => "standard",
                        crate::config::WebhookFormat::Slack => "slack",
                    },
                    "events": e.cfg.events,
                    "sent": s.sent.load(Ordering::Relaxed),
                    "failed": s.failed.load(Ordering::Relaxed),
                    "retried": s.retried.load(Ordering::Relaxed),
                    "dead_lettered": s.dead.load(Ordering::Relaxed),
                    "outbox": {
                        "pending": count(&e.cfg.id, "pending"),
                        "dead": count(&e.cfg.id, "dead"),
                    },
                })
            })
            .collect();
        Ok(json!({
            "object": "list",
            "endpoints": endpoints,
            "deliveries": recent.iter().map(row_json).collect::<Vec<_>>(),
        }))
    }

    /// The delivery metrics, in Prometheus text: this replica's counts and latencies, and the
    /// outbox's rows (one store read; left out when the store cannot say).
    pub async fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        if let Ok(counts) = self.store.outbox_counts().await {
            out.push_str("# HELP turnstile_webhook_outbox Notifications in the outbox by endpoint and state (pending; dead: dead-lettered, kept 7 days), every replica's.\n# TYPE turnstile_webhook_outbox gauge\n");
            for e in &self.endpoints {
                for state in ["pending", "dead"] {
                    let n = counts
                        .iter()
                        .find(|(id, s, _)| *id == e.cfg.id && s == state)
                        .map_or(0, |c| c.2);
                    let _ = writeln!(
                        out,
                        "turnstile_webhook_outbox{{endpoint=\"{}\",state=\"{state}\"}} {n}",
                        e.cfg.id
                    );
                }
            }
        }
        out.push_str("# HELP turnstile_webhook_deliveries_total Notification attempts by endpoint and outcome (sent, failed; a failed one is retried or dead-lettered).\n# TYPE turnstile_webhook_deliveries_total counter\n");
        for e in &self.endpoints {
            let s = &e.stats;
            for (outcome, n) in [
                ("sent", &s.sent),
                ("failed", &s.failed),
                ("retried", &s.retried),
                ("dead_lettered", &s.dead),
            ] {
                let _ = writeln!(
                    out,
                    "turnstile_webhook_deliveries_total{{endpoint=\"{}\",outcome=\"{outcome}\"}} {}",
                    e.cfg.id,
                    n.load(Ordering::Relaxed)
                );
            }
        }
        for e in &self.endpoints {
            let labels = format!("endpoint=\"{}\"", e.cfg.id);
            e.stats.latency.render_labeled(
                "turnstile_webhook_latency_seconds",
                "Time from sending a notification to its endpoint's answer.",
                &labels,
                out,
            );
        }
    }
}

fn row_json(r: &DeliveryRow) -> Value {
    json!({
        "id": r.id,
        "endpoint": r.endpoint,
        "event": r.event,
        "client": r.principal,
        "state": r.state,
        "attempts": r.attempts,
        "last_status": r.last_status,
        "last_error": r.last_error,
        "created_at": r.created_ms / 1000,
        "done_at": r.done_ms.map(|v| v / 1000),
        "latency_ms": r.latency_ms,
    })
}

impl Announce for Notifier {
    fn wants(&self, kind: ChangeKind) -> bool {
        self.kinds.contains(&kind)
    }

    fn notices(&self, change: &Change<'_>) -> Vec<Notice> {
        let principal = body::principal(change);
        let at_ms = now_unix_ms();
        let mut data = None;
        let mut out = Vec::new();
        for event in body::events(change) {
            for e in self
                .endpoints
                .iter()
                .filter(|e| e.cfg.subscribes(event, principal))
            {
                let data = data.get_or_insert_with(|| body::data(change));
                let id = body::id(change, &e.cfg.id);
                let (links, buttons) = match (e.cfg.format, change) {
                    (WebhookFormat::Slack, Change::ApprovalPending(r)) => self.links(&e.cfg.id, r),
                    _ => (Vec::new(), None),
                };
                out.push(Notice {
                    endpoint: e.cfg.id.clone(),
                    event: event.to_string(),
                    principal: principal.to_string(),
                    body: body::render(e.cfg.format, &id, event, data, at_ms, buttons.as_ref()),
                    id,
                    at_ms,
                    links,
                });
            }
        }
        self.fresh.fetch_add(out.len() as u64, Ordering::Relaxed);
        out
    }

    fn committed(&self) {
        if self.fresh.load(Ordering::Relaxed) > 0 {
            self.wake.notify_one();
        }
    }
}
