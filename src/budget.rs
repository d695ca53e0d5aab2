//! Spend: what a model's tokens cost and the caps a principal's spend is held under. Pure
//! arithmetic over the UTC calendar; the engine meters and applies it (`engine::budget`).
//!
//! Money is counted in nano-USD (`u64`): prices and costs add up exactly, without float
//! drift, up to 18 billion USD.

use crate::store::{civil_of, day_of_civil};
use crate::turn::Usage;

/// Nano-USD in one USD.
pub const NANOS_PER_USD: u64 = 1_000_000_000;

/// USD as nano-USD (rounded; negative and non-finite amounts are refused by the config).
pub fn nanos(usd: f64) -> u64 {
    (usd * NANOS_PER_USD as f64).round() as u64
}

/// Nano-USD as USD.
pub fn usd(nanos: u64) -> f64 {
    nanos as f64 / NANOS_PER_USD as f64
}

/// A model's price per million tokens, in nano-USD: `[[models]] price`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Price {
    /// Uncached input.
    pub input: u64,
    /// Input read from the provider's cache.
    pub cached_input: u64,
    /// Input written to the provider's cache.
    pub cache_write: u64,
    /// Output, reasoning included (counted once: it is part of the output count).
    pub output: u64,
}

impl Price {
    /// What one reported model request cost, in nano-USD (rounded down). The reported input
    /// includes cached reads and cache writes, which have prices of their own.
    pub fn cost(&self, u: &Usage) -> u64 {
        let uncached = u
            .prompt_tokens
            .saturating_sub(u.cached_tokens.saturating_add(u.cache_write_tokens));
        let per_million = [
            (uncached, self.input),
            (u.cached_tokens, self.cached_input),
            (u.cache_write_tokens, self.cache_write),
            (u.completion_tokens, self.output),
        ]
        .iter()
        .map(|&(n, p)| u128::from(n) * u128::from(p))
        .sum::<u128>();
        u64::try_from(per_million / 1_000_000).unwrap_or(u64::MAX)
    }
}

/// A principal's caps (`budget = { … }` of a client entry, or an issuer's default for its
/// subjects); `None` is no cap. Amounts in nano-USD.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    pub usd_per_day: Option<u64>,
    pub usd_per_month: Option<u64>,
    pub tokens_per_day: Option<u64>,
    pub usd_per_execution: Option<u64>,
}

/// One cap of a [`Budget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    UsdPerDay,
    UsdPerMonth,
    TokensPerDay,
    UsdPerExecution,
}

impl Cap {
    pub const ALL: [Cap; 4] = [
        Cap::UsdPerDay,
        Cap::UsdPerMonth,
        Cap::TokensPerDay,
        Cap::UsdPerExecution,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cap::UsdPerDay => "usd_per_day",
            Cap::UsdPerMonth => "usd_per_month",
            Cap::TokensPerDay => "tokens_per_day",
            Cap::UsdPerExecution => "usd_per_execution",
        }
    }

    /// Counted in USD (else in tokens).
    pub fn in_usd(self) -> bool {
        self != Cap::TokensPerDay
    }
}

/// What a principal used in the windows its caps count: today and this month (UTC).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Used {
    pub tokens_today: u64,
    pub nanos_today: u64,
    pub nanos_month: u64,
}

/// A cap reached: which, its amount, and when it resets (Unix seconds; None for a
/// per-execution cap, which never resets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exceeded {
    pub cap: Cap,
    pub limit: u64,
    pub resets_at: Option<u64>,
}

impl Exceeded {
    /// The cap as its users read it: `$20.00` or `5000000 tokens`.
    pub fn amount(&self) -> String {
        match self.cap.in_usd() {
            true => format!("${:.2}", usd(self.limit)),
            false => format!("{} tokens", self.limit),
        }
    }
}

impl Budget {
    /// A cap that gates fresh turns (daily, monthly, tokens) is set.
    pub fn gates_fresh(&self) -> bool {
        self.usd_per_day.is_some() || self.usd_per_month.is_some() || self.tokens_per_day.is_some()
    }

    /// Any USD cap is set.
    pub fn has_usd(&self) -> bool {
        self.usd_per_day.is_some()
            || self.usd_per_month.is_some()
            || self.usd_per_execution.is_some()
    }

    pub fn limit(&self, cap: Cap) -> Option<u64> {
        match cap {
            Cap::UsdPerDay => self.usd_per_day,
            Cap::UsdPerMonth => self.usd_per_month,
            Cap::TokensPerDay => self.tokens_per_day,
            Cap::UsdPerExecution => self.usd_per_execution,
        }
    }

    /// The first cap that `used` is at or over on day `today`, the one that resets last
    /// first (so the reset it names is the one that lets the principal go on).
    pub fn reached(&self, used: &Used, today: u32) -> Option<Exceeded> {
        [
            (Cap::UsdPerMonth, used.nanos_month),
            (Cap::UsdPerDay, used.nanos_today),
            (Cap::TokensPerDay, used.tokens_today),
        ]
        .into_iter()
        .find_map(|(cap, n)| {
            let limit = self.limit(cap)?;
            (n >= limit).then(|| Exceeded {
                cap,
                limit,
                resets_at: Some(u64::from(resets_on(cap, today)) * 86_400),
            })
        })
    }

    /// These caps with the per-execution cap tightened to `cap` (an execution's own).
    pub fn capped(mut self, cap: Option<u64>) -> Budget {
        self.usd_per_execution = match (self.usd_per_execution, cap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self
    }

    /// The per-execution cap, when an execution has spent `nanos`.
    pub fn execution_reached(&self, nanos: u64) -> Option<Exceeded> {
        let limit = self.usd_per_execution?;
        (nanos >= limit).then_some(Exceeded {
            cap: Cap::UsdPerExecution,
            limit,
            resets_at: None,
        })
    }
}

/// The shares of a cap, in percent, whose crossing notifies (`budget.threshold`).
pub const THRESHOLDS: [u8; 3] = [75, 95, 100];

/// A threshold of a cap that usage crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Threshold {
    pub cap: Cap,
    pub percent: u8,
    pub limit: u64,
    pub used: u64,
    /// The first day of the cap's window.
    pub window: u32,
    /// Unix seconds when the window starts again.
    pub resets_at: u64,
}

impl Budget {
    /// For each cap that gates fresh turns, the highest of [`THRESHOLDS`] that going from
    /// `before` to `after` on day `today` crossed (one event for a jump over several).
    pub fn crossed(&self, before: &Used, after: &Used, today: u32) -> Vec<Threshold> {
        [
            (Cap::UsdPerDay, before.nanos_today, after.nanos_today, today),
            (
                Cap::UsdPerMonth,
                before.nanos_month,
                after.nanos_month,
                month_start(today),
            ),
            (
                Cap::TokensPerDay,
                before.tokens_today,
                after.tokens_today,
                today,
            ),
        ]
        .into_iter()
        .filter_map(|(cap, was, is, window)| {
            let limit = self.limit(cap)?;
            let at = |pct: u8| u128::from(limit) * u128::from(pct);
            let percent = THRESHOLDS
                .into_iter()
                .rev()
                .find(|&pct| u128::from(was) * 100 < at(pct) && at(pct) <= u128::from(is) * 100)?;
            Some(Threshold {
                cap,
                percent,
                limit,
                used: is,
                window,
                resets_at: u64::from(resets_on(cap, today)) * 86_400,
            })
        })
        .collect()
    }
}

/// The first day of `day`'s calendar month.
pub fn month_start(day: u32) -> u32 {
    let (y, m, _) = civil_of(day);
    day_of_civil(y, m, 1)
}

/// The day a cap counted on `day` starts again from zero: the next day, or the first day of
/// the next month.
pub fn resets_on(cap: Cap, day: u32) -> u32 {
    match cap {
        Cap::UsdPerMonth => {
            let (y, m, _) = civil_of(day);
            let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            day_of_civil(y, m, 1)
        }
        _ => day + 1,
    }
}

/// The wall clock that days and months are counted on. Tests run it on tokio's paused
/// clock from a chosen instant.
#[derive(Debug, Clone, Copy, Default)]
pub enum Clock {
    #[default]
    Wall,
    #[cfg(test)]
    Paused {
        base_unix: u64,
        at: tokio::time::Instant,
    },
}

impl Clock {
    #[cfg(test)]
    pub fn paused_at(base_unix: u64) -> Clock {
        Clock::Paused {
            base_unix,
            at: tokio::time::Instant::now(),
        }
    }

    /// Unix seconds now.
    pub fn now(&self) -> u64 {
        match self {
            Clock::Wall => crate::store::now_unix(),
            #[cfg(test)]
            Clock::Paused { base_unix, at } => base_unix + at.elapsed().as_secs(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{date_of, day_from_date};

    fn day(s: &str) -> u32 {
        day_from_date(s).unwrap()
    }

    #[test]
    fn cost_prices_each_kind_of_token_once() {
        let p = Price {
            input: nanos(1.25),
            cached_input: nanos(0.125),
            cache_write: nanos(1.5625),
            output: nanos(10.0),
        };
        let u = Usage {
            prompt_tokens: 1_000_000,
            cached_tokens: 400_000,
            cache_write_tokens: 100_000,
            completion_tokens: 200_000,
            reasoning_tokens: 150_000,
            total_tokens: 1_200_000,
        };
        // 0.5 M uncached, 0.4 M cached, 0.1 M written, 0.2 M output (reasoning inside it).
        let want = 0.625 + 0.05 + 0.15625 + 2.0;
        assert_eq!(p.cost(&u), nanos(want));
        assert_eq!(Price::default().cost(&u), 0);
    }

    #[test]
    fn months_and_resets_follow_the_utc_calendar() {
        assert_eq!(date_of(month_start(day("2026-12-31"))), "2026-12-01");
        assert_eq!(
            date_of(resets_on(Cap::UsdPerMonth, day("2026-12-31"))),
            "2027-01-01"
        );
        assert_eq!(
            date_of(resets_on(Cap::UsdPerMonth, day("2028-02-10"))),
            "2028-03-01"
        );
        assert_eq!(
            date_of(resets_on(Cap::UsdPerDay, day("2028-02-28"))),
            "2028-02-29"
        );
    }

    #[test]
    fn an_executions_own_cap_tightens_the_principals() {
        let none = Budget::default();
        assert_eq!(none.capped(None).usd_per_execution, None);
        assert_eq!(none.capped(Some(5)).usd_per_execution, Some(5));
        let b = Budget {
            usd_per_execution: Some(10),
            ..Budget::default()
        };
        assert_eq!(b.capped(None).usd_per_execution, Some(10));
        assert_eq!(b.capped(Some(5)).usd_per_execution, Some(5));
        assert_eq!(b.capped(Some(50)).usd_per_execution, Some(10));
        assert!(b.capped(Some(5)).execution_reached(5).is_some());
    }

    #[test]
    fn the_cap_that_resets_last_is_named() {
        let b = Budget {
            usd_per_day: Some(nanos(1.0)),
            usd_per_month: Some(nanos(2.0)),
            tokens_per_day: Some(100),
            usd_per_execution: Some(nanos(0.5)),
        };
        let today = day("2026-12-03");
        let under = Used {
            tokens_today: 99,
            nanos_today: nanos(0.99),
            nanos_month: nanos(1.99),
        };
        assert_eq!(b.reached(&under, today), None);
        let tokens = Used {
            tokens_today: 100,
            ..under
        };
        let e = b.reached(&tokens, today).unwrap();
        assert_eq!(
            (e.cap, e.resets_at),
            (Cap::TokensPerDay, Some(u64::from(today + 1) * 86_400))
        );
        let all = Used {
            tokens_today: 100,
            nanos_today: nanos(1.0),
            nanos_month: nanos(2.0),
        };
        assert_eq!(b.reached(&all, today).unwrap().cap, Cap::UsdPerMonth);
        assert_eq!(b.execution_reached(nanos(0.49)), None);
        assert_eq!(b.execution_reached(nanos(0.5)).unwrap().amount(), "$0.50");
        assert!(Budget::default().reached(&all, today).is_none());
    }

    #[test]
    fn a_write_crosses_the_highest_threshold_it_passes_once() {
        let b = Budget {
            usd_per_day: Some(nanos(10.0)),
            tokens_per_day: Some(1000),
            ..Budget::default()
        };
        let today = day("2026-12-06");
        let used = |usd: f64, tokens: u64| Used {
            tokens_today: tokens,
            nanos_today: nanos(usd),
            nanos_month: nanos(usd),
        };
        let crossed = |was: Used, is: Used| -> Vec<(Cap, u8)> {
            b.crossed(&was, &is, today)
                .iter()
                .map(|t| (t.cap, t.percent))
                .collect()
        };
        assert_eq!(crossed(used(0.0, 0), used(7.4, 749)), []);
        assert_eq!(
            crossed(used(7.4, 749), used(7.5, 750)),
            [(Cap::UsdPerDay, 75), (Cap::TokensPerDay, 75)]
        );
        assert_eq!(
            crossed(used(7.5, 750), used(9.0, 800)),
            [],
            "already past 75"
        );
        assert_eq!(
            crossed(used(1.0, 0), used(12.0, 0)),
            [(Cap::UsdPerDay, 100)],
            "a jump over three thresholds is one event"
        );
        let t = b.crossed(&used(9.0, 0), &used(9.6, 0), today)[0];
        assert_eq!((t.percent, t.used, t.window), (95, nanos(9.6), today));
        assert_eq!(t.resets_at, u64::from(today + 1) * 86_400);
        assert!(Budget::default()
            .crossed(&used(0.0, 0), &used(100.0, 10_000), today)
            .is_empty());
    }
}
