//! Usage accounting: every model request a backend reports is counted at once in the
//! metrics (`turnstile_tokens_total`) and in an in-memory delta per UTC day, principal and
//! model, which the timer folds into the store about once a second (and before a usage read,
//! and at shutdown): one upsert per key, never a store write per request on the relay path.
//! A crash loses at most the last second of deltas.
//!
//! The meter a backend gets holds only this ledger and the metrics, never the engine, so a
//! backend keeping it does not keep the engine alive.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::Meter;
use crate::metrics::{slot, Metrics};
use crate::store::{day_of, now_unix, Store, StoreError, UsageRow};
use crate::turn::Usage;

/// By day, principal and model (nested so that recording looks up by `&str`).
type Deltas = BTreeMap<u32, BTreeMap<String, BTreeMap<String, (Usage, u64)>>>;

fn fold(deltas: &mut Deltas, (day, principal, model): (u32, &str, &str), usage: Usage, n: u64) {
    let (total, requests) = slot(slot(deltas.entry(day).or_default(), principal), model);
    total.add(usage);
    *requests += n;
}

pub(super) struct Ledger {
    metrics: Arc<Metrics>,
    pending: Mutex<Deltas>,
}

impl Ledger {
    pub fn new(metrics: Arc<Metrics>) -> Arc<Ledger> {
        Arc::new(Ledger {
            metrics,
            pending: Mutex::new(BTreeMap::new()),
        })
    }

    /// The meter of one execution.
    pub fn meter(self: &Arc<Self>, principal: &str, model: &str) -> Meter {
        let (ledger, principal, model) = (self.clone(), principal.to_string(), model.to_string());
        Arc::new(move |u: Usage| ledger.record(&principal, &model, u))
    }

    pub fn record(&self, principal: &str, model: &str, u: Usage) {
        self.metrics.tokens(principal, model, u);
        fold(
            &mut self.pending.lock(),
            (day_of(now_unix()), principal, model),
            u,
            1,
        );
    }

    /// Writes the deltas to the store; on failure they are kept for the next flush.
    pub async fn flush(&self, store: &Store) -> Result<(), StoreError> {
        let taken = std::mem::take(&mut *self.pending.lock());
        if taken.is_empty() {
            return Ok(());
        }
        let mut rows: Vec<UsageRow> = Vec::new();
        for (day, by_principal) in taken {
            for (principal, by_model) in by_principal {
                for (model, (usage, requests)) in by_model {
                    let principal = principal.clone();
                    rows.push(UsageRow {
                        day,
                        principal,
                        model,
                        usage,
                        requests,
                    });
                }
            }
        }
        store.usage_added(&rows).await.inspect_err(|_| {
            let mut pending = self.pending.lock();
            for r in &rows {
                fold(
                    &mut pending,
                    (r.day, &r.principal, &r.model),
                    r.usage,
                    r.requests,
                );
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::UsageQuery;

    #[tokio::test]
    async fn a_meter_counts_into_metrics_and_the_store() {
        let metrics = Arc::new(Metrics::default());
        let ledger = Ledger::new(metrics.clone());
        let store = Store::open_in_memory().await.unwrap();
        let meter = ledger.meter("alice", "codex");
        let u = Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
            total_tokens: 15,
            cached_tokens: 2,
            cache_write_tokens: 3,
            reasoning_tokens: 1,
        };
        meter(u);
        meter(u);
        ledger.flush(&store).await.unwrap();
        ledger.flush(&store).await.unwrap();
        let rows = store.usage(&UsageQuery::default()).await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].usage.prompt_tokens, rows[0].requests), (20, 2));
        assert_eq!(rows[0].usage.reasoning_tokens, 2);
        let text = metrics.render(
            &crate::metrics::Gauges {
                suspended_executions: 0,
                pending_continuations: 0,
                tombstones: 0,
                pending_approvals: 0,
                sessions: Vec::new(),
                idle_threads: 0,
                store_round_trips: 0,
            },
            true,
        );
        assert!(text.contains(
            "turnstile_tokens_total{client=\"alice\",model=\"codex\",kind=\"output\"} 10"
        ));
    }
}
