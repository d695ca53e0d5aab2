//! Budgets: a principal's spend caps, applied where executions start and go on.
//!
//! - **Daily, monthly and token caps gate fresh turns** ([`Budgets::within`]): the
//!   principal's totals are the store's plus this process's unwritten deltas, read under the
//!   current config. A refusal consumes nothing. The report that crosses a cap never fails
//!   its own turn: running executions finish and held turns are answered.
//! - **The per-execution cap stops the execution** at its next round (the claim, `resume.rs`)
//!   or its next model request within a leg (`leg.rs`) after the report that crossed it.
//!
//! A principal with no caps, on a model with no price, costs nothing here: no store read, no
//! spend counter, the meter counts tokens only.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::execution::ExecutionMeta;
use super::ledger::Ledger;
use super::EngineError;
use crate::backend::Meter;
use crate::budget::{month_start, resets_on, Budget, Cap, Exceeded, Price, Used};
use crate::metrics::Metrics;
use crate::store::{day_of, Store, StoreError};

/// One cap of a principal and what is left of it.
#[derive(Debug, Clone, PartialEq)]
pub struct CapView {
    pub cap: Cap,
    /// In nano-USD or tokens ([`Cap::in_usd`]).
    pub limit: u64,
    /// Used in the cap's current window (None for the per-execution cap).
    pub used: Option<u64>,
    /// Unix seconds when the window starts again (None for the per-execution cap).
    pub resets_at: Option<u64>,
}

/// A principal's standing against one of its caps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Standing {
    pub cap: Cap,
    /// Used over the cap's limit (1 or more once reached).
    pub fraction: f64,
    /// Unix seconds when the cap's window starts again.
    pub resets_at: u64,
}

/// How many principals [`OverCaps`] remembers at most.
const MAX_OVER_CAPS: usize = 10_000;

/// Principals found at or over a daily, monthly or token cap, until it resets: spend only
/// grows within a window, so a principal refused once is refused again without a store read
/// (a client retrying in a loop costs nothing). An entry holds for the budget it was found
/// under: a reload that changes the principal's budget makes it read the store again.
#[derive(Default)]
pub(super) struct OverCaps(Mutex<HashMap<String, (Budget, Exceeded)>>);

impl OverCaps {
    fn get(&self, principal: &str, budget: &Budget, now: u64) -> Option<Exceeded> {
        let map = self.0.lock();
        let (b, e) = map.get(principal)?;
        (b == budget && e.resets_at.is_some_and(|at| now < at)).then_some(*e)
    }

    fn put(&self, principal: &str, budget: Budget, e: Exceeded, now: u64) {
        let mut map = self.0.lock();
        if map.len() >= MAX_OVER_CAPS {
            map.retain(|_, (_, e)| e.resets_at.is_some_and(|at| now < at));
        }
        if map.len() < MAX_OVER_CAPS {
            map.insert(principal.to_string(), (budget, e));
        }
    }
}

/// The budget checks, an engine part that owns their state: the usage ledger (this process's
/// unwritten deltas), the store it adds to, and the principals known to be over a cap.
pub(super) struct Budgets {
    ledger: Arc<Ledger>,
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    over_caps: OverCaps,
}

impl Budgets {
    pub fn new(store: Arc<Store>, metrics: Arc<Metrics>) -> Budgets {
        Budgets {
            ledger: Ledger::new(metrics.clone()),
            store,
            metrics,
            over_caps: OverCaps::default(),
        }
    }

    /// Writes the usage deltas to the store (`caps`: each principal's budget, for the
    /// thresholds the write crosses).
    pub async fn flush(&self, caps: &(dyn Fn(&str) -> Budget + Sync)) -> Result<(), StoreError> {
        self.ledger.flush(&self.store, caps).await
    }

    /// What the principal used today and this month (UTC), on day `today`.
    async fn used(&self, principal: &str, today: u32) -> Result<Used, StoreError> {
        let t = (self.ledger)
            .used(&self.store, principal, month_start(today), today)
            .await?;
        Ok(Used {
            tokens_today: t.tokens_today,
            nanos_today: t.spend_today,
            nanos_month: t.spend_since,
        })
    }

    /// A fresh turn of a principal at or over a daily, monthly or token cap of `budget` (its
    /// budget under the current config; `principal` may be a group's pool) is refused: 402 `budget_exceeded` (429
    /// `billing_error` on Messages), `Retry-After` until the cap resets. A store that cannot
    /// say fails closed (503).
    pub async fn within(&self, principal: &str, budget: &Budget) -> Result<(), EngineError> {
        let now = self.ledger.now();
        let exceeded = match self.over_caps.get(principal, budget, now) {
            Some(known) => known,
            None => {
                let today = day_of(now);
                let used = self.used(principal, today).await.map_err(|e| {
                    tracing::error!(error = %e, "could not read usage totals for a budget");
                    EngineError::Store
                })?;
                let Some(exceeded) = budget.reached(&used, today) else {
                    return Ok(());
                };
                self.over_caps.put(principal, *budget, exceeded, now);
                exceeded
            }
        };
        tracing::debug!(
            principal,
            cap = exceeded.cap.as_str(),
            "fresh turn refused by a budget cap"
        );
        self.metrics.budget_refusal(exceeded.cap.as_str());
        Err(EngineError::BudgetExceeded {
            exceeded,
            retry_after_secs: exceeded.resets_at.map(|at| at.saturating_sub(now).max(1)),
            group: (principal.strip_prefix(crate::auth::grant::GROUP_PREFIX)).map(str::to_string),
        })
    }

    /// An execution stopped at its per-execution cap: counted, and its error.
    pub fn stopped(&self, exceeded: Exceeded) -> EngineError {
        self.metrics.budget_refusal(exceeded.cap.as_str());
        EngineError::BudgetExceeded {
            exceeded,
            retry_after_secs: None,
            group: None,
        }
    }

    /// The meter of a leg of `meta`'s execution. A priced model's meter also adds to the
    /// execution's spend, which it starts on the first priced leg.
    pub fn meter(&self, meta: &mut ExecutionMeta, price: Option<Price>) -> Meter {
        if price.is_some() && meta.spent.is_none() {
            meta.spent = Some(Arc::new(AtomicU64::new(0)));
        }
        let spent = price.and(meta.spent.clone());
        self.ledger.meter(
            meta.principal.clone(),
            meta.pools(),
            meta.model.clone(),
            price,
            spent,
        )
    }

    /// Where `principal` stands against its fullest cap of `budget` that gates fresh turns
    /// (the one that resets last among equals); `None` without such a cap, or when the store
    /// cannot say (the answer goes without it).
    pub async fn standing(&self, principal: &str, budget: &Budget) -> Option<Standing> {
        if !budget.gates_fresh() {
            return None;
        }
        let caps = match self.view(principal, budget).await {
            Ok(caps) => caps,
            // Debug only: a store that is down would otherwise log once per answer (a fresh
            // turn's own budget check already fails closed and logs it).
            Err(e) => {
                tracing::debug!(error = %e, "could not read usage totals for a budget standing");
                return None;
            }
        };
        caps.iter()
            .filter_map(|c| {
                let (used, resets_at) = (c.used?, c.resets_at?);
                let fraction = used as f64 / c.limit.max(1) as f64;
                Some(Standing {
                    cap: c.cap,
                    fraction,
                    resets_at,
                })
            })
            .max_by(|a, b| (a.fraction.total_cmp(&b.fraction)).then(a.resets_at.cmp(&b.resets_at)))
    }

    /// The caps of `budget` and what `principal` has left of each, in the order of
    /// [`Cap::ALL`]; empty when it has none.
    pub async fn view(&self, principal: &str, budget: &Budget) -> Result<Vec<CapView>, StoreError> {
        let caps: Vec<(Cap, u64)> = Cap::ALL
            .iter()
            .filter_map(|&c| Some((c, budget.limit(c)?)))
            .collect();
        if caps.is_empty() {
            return Ok(Vec::new());
        }
        let today = day_of(self.ledger.now());
        let used = self.used(principal, today).await?;
        Ok(caps
            .into_iter()
            .map(|(cap, limit)| {
                let used = match cap {
                    Cap::UsdPerDay => Some(used.nanos_today),
                    Cap::UsdPerMonth => Some(used.nanos_month),
                    Cap::TokensPerDay => Some(used.tokens_today),
                    Cap::UsdPerExecution => None,
                };
                CapView {
                    cap,
                    limit,
                    used,
                    resets_at: used.map(|_| u64::from(resets_on(cap, today)) * 86_400),
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::ledger::Ledger;
    use crate::budget::{nanos, Budget, Clock, Price, Used};
    use crate::metrics::Metrics;
    use crate::store::{day_from_date, day_of, Store};
    use crate::turn::Usage;
    use std::sync::Arc;
    use std::time::Duration;

    /// 2026-12-31T23:59:30Z.
    const NEW_YEARS_EVE: u64 = 1_798_761_570;

    async fn used(l: &Ledger, s: &Store, principal: &str) -> (u32, Used) {
        let today = day_of(l.now());
        let t = l
            .used(s, principal, crate::budget::month_start(today), today)
            .await
            .unwrap();
        let used = Used {
            tokens_today: t.tokens_today,
            nanos_today: t.spend_today,
            nanos_month: t.spend_since,
        };
        (today, used)
    }

    #[tokio::test(start_paused = true)]
    async fn caps_reset_at_utc_midnight_and_month_end() {
        assert_eq!(day_of(NEW_YEARS_EVE), day_from_date("2026-12-31").unwrap());
        let ledger = Ledger::with_clock(
            Arc::new(Metrics::default()),
            Clock::paused_at(NEW_YEARS_EVE),
        );
        let store = Store::open_in_memory().await.unwrap();
        let price = Price {
            input: nanos(1.0),
            output: nanos(1.0),
            ..Price::default()
        };
        let budget = Budget {
            usd_per_day: Some(nanos(5.0)),
            usd_per_month: Some(nanos(8.0)),
            tokens_per_day: Some(1_000_000_000),
            usd_per_execution: None,
        };
        let spent: Arc<std::sync::atomic::AtomicU64> = Arc::new(0.into());
        let meter = ledger.meter(
            "alice".into(),
            Default::default(),
            "m".into(),
            Some(price),
            Some(spent.clone()),
        );
        let million = Usage {
            prompt_tokens: 3_000_000,
            completion_tokens: 2_000_000,
            total_tokens: 5_000_000,
            ..Usage::default()
        };
        meter(million);
        let (today, u) = used(&ledger, &store, "alice").await;
        assert_eq!((u.nanos_today, u.nanos_month), (nanos(5.0), nanos(5.0)));
        let e = budget.reached(&u, today).unwrap();
        assert_eq!(e.cap, crate::budget::Cap::UsdPerDay);
        assert_eq!(e.resets_at, Some(NEW_YEARS_EVE + 30), "midnight, UTC");
        // Half of it written to the store, half still in memory: both count.
        ledger.flush(&store, &|_| Budget::default()).await.unwrap();
        meter(Usage {
            prompt_tokens: 2_000_000,
            ..Usage::default()
        });
        let (_, u) = used(&ledger, &store, "alice").await;
        assert_eq!(u.nanos_month, nanos(7.0));
        assert_eq!(spent.load(std::sync::atomic::Ordering::Relaxed), nanos(7.0));
        // Another principal is unaffected.
        let (_, bob) = used(&ledger, &store, "bob").await;
        assert_eq!(bob, Used::default());

        // Midnight: a new day and a new month; both windows start from zero.
        tokio::time::advance(Duration::from_secs(31)).await;
        let (today, u) = used(&ledger, &store, "alice").await;
        assert_eq!(crate::store::date_of(today), "2027-01-01");
        assert_eq!(u, Used::default());
        assert_eq!(budget.reached(&u, today), None);

        // Within a month, a new day resets the daily caps, not the monthly one.
        meter(million);
        tokio::time::advance(Duration::from_secs(86_400)).await;
        meter(million);
        let (today, u) = used(&ledger, &store, "alice").await;
        assert_eq!((u.nanos_today, u.nanos_month), (nanos(5.0), nanos(10.0)));
        let e = budget.reached(&u, today).unwrap();
        assert_eq!(e.cap, crate::budget::Cap::UsdPerMonth);
        assert_eq!(
            crate::store::date_of(day_of(e.resets_at.unwrap())),
            "2027-02-01"
        );
    }
}

#[cfg(test)]
mod over_caps {
    use super::*;
    use crate::budget::nanos;

    #[test]
    fn a_refusal_is_remembered_until_the_reset_for_the_same_budget() {
        let over = OverCaps::default();
        let budget = Budget {
            usd_per_day: Some(nanos(1.0)),
            ..Budget::default()
        };
        let e = Exceeded {
            cap: Cap::UsdPerDay,
            limit: nanos(1.0),
            resets_at: Some(86_400),
        };
        over.put("alice", budget, e, 100);
        assert_eq!(over.get("alice", &budget, 86_399), Some(e));
        assert_eq!(over.get("alice", &budget, 86_400), None, "reset");
        assert_eq!(over.get("bob", &budget, 100), None);
        let raised = Budget {
            usd_per_day: Some(nanos(2.0)),
            ..budget
        };
        assert_eq!(over.get("alice", &raised, 100), None, "a reload raised it");
    }
}
