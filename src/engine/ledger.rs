//! Usage accounting: every model request a backend reports is counted at once in the
//! metrics (`turnstile_tokens_total`) and in an in-memory delta per UTC day, principal and
//! model, which the timer folds into the store about once a second (and before a usage read,
//! and at shutdown): one upsert per key, never a store write per request on the relay path.
//! A crash loses at most the last second of deltas.
//!
//! A priced model's request also costs: its spend (nano-USD) goes into the same delta, the
//! metrics, and the execution's own running total ([`Spent`]). [`Ledger::used`] is what the
//! budget caps read: the store's totals plus the deltas not written yet.
//!
//! The meter a backend gets holds only this ledger and the metrics, never the engine, so a
//! backend keeping it does not keep the engine alive.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::auth::grant::Groups;
use crate::backend::Meter;
use crate::budget::{month_start, Budget, Clock, Price, Used};
use crate::metrics::{slot, Metrics};
use crate::store::{day_of, ChangeKind, Crossed, Store, StoreError, UsageRow, UsageTotals, Watch};
use crate::turn::Usage;

/// One key's delta: its usage, model requests and spend (nano-USD).
#[derive(Debug, Clone, Copy, Default)]
struct Delta {
    usage: Usage,
    requests: u64,
    spend: u64,
}

/// By day, principal and model (nested so that recording looks up by `&str`).
type Deltas = BTreeMap<u32, BTreeMap<String, BTreeMap<String, Delta>>>;

fn fold(deltas: &mut Deltas, (day, principal, model): (u32, &str, &str), d: Delta) {
    let total = slot(slot(deltas.entry(day).or_default(), principal), model);
    total.usage.add(d.usage);
    total.requests = total.requests.saturating_add(d.requests);
    total.spend = total.spend.saturating_add(d.spend);
}

/// What an execution has spent, in nano-USD, when its model is priced: shared by the meters
/// of its legs (usage reported after a leg ended still counts) and read at each round.
pub type Spent = Option<Arc<AtomicU64>>;

pub(super) struct Ledger {
    metrics: Arc<Metrics>,
    clock: Clock,
    pending: Mutex<Deltas>,
    /// Deltas on their way to the store: still counted by [`Ledger::used`] until written.
    flushing: Mutex<Deltas>,
    /// One flush at a time (the timer's and a usage read's), so `flushing` is one batch.
    flush_turn: tokio::sync::Mutex<()>,
    /// Odd while a flush moves deltas from memory to the store: a [`Ledger::used`] that saw
    /// it change read the batch twice or not at all, and reads again.
    flush_gen: AtomicU64,
}

impl Ledger {
    pub fn new(metrics: Arc<Metrics>) -> Arc<Ledger> {
        Self::with_clock(metrics, Clock::Wall)
    }

    pub fn with_clock(metrics: Arc<Metrics>, clock: Clock) -> Arc<Ledger> {
        Arc::new(Ledger {
            metrics,
            clock,
            pending: Mutex::new(BTreeMap::new()),
            flushing: Mutex::new(BTreeMap::new()),
            flush_turn: tokio::sync::Mutex::new(()),
            flush_gen: AtomicU64::new(0),
        })
    }

    /// Unix seconds on the clock days are counted on.
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// The meter of one execution's leg. An unpriced model's meter counts tokens only.
    pub fn meter(
        self: &Arc<Self>,
        principal: Arc<str>,
        pools: Groups,
        model: Arc<str>,
        price: Option<Price>,
        spent: Spent,
    ) -> Meter {
        let ledger = self.clone();
        match (price, spent) {
            (Some(price), Some(spent)) => Arc::new(move |u: Usage| {
                let cost = price.cost(&u);
                // Saturating: an upstream's absurd count must not wrap the total under a cap.
                let _ = spent.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_add(cost))
                });
                ledger.record(&principal, &model, u, cost);
                ledger.pool(&pools, &model, u, cost);
            }),
            _ => Arc::new(move |u: Usage| {
                ledger.record(&principal, &model, u, 0);
                ledger.pool(&pools, &model, u, 0);
            }),
        }
    }

    /// Adds a report to the group budgets it is pooled into (not to the metrics: the
    /// principal's own record counted it there).
    fn pool(&self, pools: &[String], model: &str, u: Usage, spend: u64) {
        if pools.is_empty() {
            return;
        }
        let d = Delta {
            usage: u,
            requests: 1,
            spend,
        };
        let day = day_of(self.clock.now());
        let mut pending = self.pending.lock();
        for pool in pools {
            fold(&mut pending, (day, pool, model), d);
        }
    }

    pub fn record(&self, principal: &str, model: &str, u: Usage, spend: u64) {
        self.metrics.tokens(principal, model, u);
        if spend > 0 {
            self.metrics.spend(model, spend);
        }
        let d = Delta {
            usage: u,
            requests: 1,
            spend,
        };
        fold(
            &mut self.pending.lock(),
            (day_of(self.clock.now()), principal, model),
            d,
        );
    }

    /// The principal's totals on `today` and from `since` to `today`: the store's, plus
    /// what this process counted and has not written yet, each delta counted once. Read
    /// without waiting for a flush, unless one ran meanwhile (then once more, between two).
    pub async fn used(
        &self,
        store: &Store,
        principal: &str,
        since: u32,
        today: u32,
    ) -> Result<UsageTotals, StoreError> {
        let seen = self.flush_gen.load(Ordering::Acquire);
        if seen.is_multiple_of(2) {
            let t = self.used_now(store, principal, since, today).await?;
            if self.flush_gen.load(Ordering::Acquire) == seen {
                return Ok(t);
            }
        }
        let _turn = self.flush_turn.lock().await;
        self.used_now(store, principal, since, today).await
    }

    async fn used_now(
        &self,
        store: &Store,
        principal: &str,
        since: u32,
        today: u32,
    ) -> Result<UsageTotals, StoreError> {
        let mut t = store.usage_totals(principal, since, today).await?;
        for deltas in [&self.pending, &self.flushing] {
            for (day, by_principal) in deltas.lock().range(since..=today) {
                for d in by_principal
                    .get(principal)
                    .into_iter()
                    .flat_map(|m| m.values())
                {
                    if *day == today {
                        let tokens = d
                            .usage
                            .prompt_tokens
                            .saturating_add(d.usage.completion_tokens);
                        t.tokens_today = t.tokens_today.saturating_add(tokens);
                        t.spend_today = t.spend_today.saturating_add(d.spend);
                    }
                    t.spend_since = t.spend_since.saturating_add(d.spend);
                }
            }
        }
        Ok(t)
    }

    /// Writes the deltas to the store; on failure they are kept for the next flush. `caps`
    /// is each principal's budget under the current config: while an endpoint subscribes to
    /// `budget.threshold`, the write reports the thresholds of them it crossed.
    pub async fn flush(
        &self,
        store: &Store,
        caps: &(dyn Fn(&str) -> Budget + Sync),
    ) -> Result<(), StoreError> {
        let _turn = self.flush_turn.lock().await;
        if self.pending.lock().is_empty() {
            return Ok(());
        }
        self.flush_gen.fetch_add(1, Ordering::AcqRel);
        let written = self.write_pending(store, caps).await;
        self.flush_gen.fetch_add(1, Ordering::AcqRel);
        written
    }

    /// Moves the pending deltas into the store (through `flushing`, where readers still
    /// count them), or back into `pending` when the write fails.
    async fn write_pending(
        &self,
        store: &Store,
        caps: &(dyn Fn(&str) -> Budget + Sync),
    ) -> Result<(), StoreError> {
        let taken = std::mem::take(&mut *self.pending.lock());
        let mut rows: Vec<UsageRow> = Vec::new();
        for (day, by_principal) in &taken {
            for (principal, by_model) in by_principal {
                for (model, d) in by_model {
                    rows.push(UsageRow {
                        day: *day,
                        principal: principal.clone(),
                        model: model.clone(),
                        usage: d.usage,
                        requests: d.requests,
                        spend: d.spend,
                    });
                }
            }
        }
        *self.flushing.lock() = taken;
        let watched: Vec<(&str, Budget)> = match store.announces(ChangeKind::Budget) {
            false => Vec::new(),
            true => {
                let mut principals: Vec<&str> = rows.iter().map(|r| r.principal.as_str()).collect();
                principals.sort_unstable();
                principals.dedup();
                principals
                    .into_iter()
                    .map(|p| (p, caps(p)))
                    .filter(|(_, b)| b.gates_fresh())
                    .collect()
            }
        };
        let today = day_of(self.clock.now());
        let watch = Watch {
            principals: watched.iter().map(|(p, _)| *p).collect(),
            since: month_start(today),
            today,
            crossed: &|principal, before, after| {
                crossings(&watched, today, principal, before, after)
            },
        };
        let written = store.usage_added(&rows, Some(&watch)).await;
        let taken = std::mem::take(&mut *self.flushing.lock());
        if written.is_err() {
            let mut pending = self.pending.lock();
            for (day, by_principal) in &taken {
                for (principal, by_model) in by_principal {
                    for (model, d) in by_model {
                        fold(&mut pending, (*day, principal, model), *d);
                    }
                }
            }
        }
        written
    }
}

/// The thresholds of `principal`'s caps (among `watched`) that going from `before` to
/// `after` on day `today` crossed.
fn crossings<'p>(
    watched: &[(&str, Budget)],
    today: u32,
    principal: &'p str,
    before: &UsageTotals,
    after: &UsageTotals,
) -> Vec<Crossed<'p>> {
    let Some((_, budget)) = watched.iter().find(|(p, _)| *p == principal) else {
        return Vec::new();
    };
    let used = |t: &UsageTotals| Used {
        tokens_today: t.tokens_today,
        nanos_today: t.spend_today,
        nanos_month: t.spend_since,
    };
    budget
        .crossed(&used(before), &used(after), today)
        .into_iter()
        .map(|t| Crossed {
            principal,
            cap: t.cap.as_str(),
            percent: t.percent,
            limit: t.limit,
            used: t.used,
            window: t.window,
            resets_at: t.resets_at,
        })
        .collect()
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
        let meter = ledger.meter(
            "alice".into(),
            Default::default(),
            "codex".into(),
            None,
            None,
        );
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
        ledger.flush(&store, &|_| Budget::default()).await.unwrap();
        ledger.flush(&store, &|_| Budget::default()).await.unwrap();
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
