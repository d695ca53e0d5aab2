//! Per-principal admission limits for fresh turns: a GCRA request rate (`governor`, keyed by
//! principal), executions live at once, and suspended executions; and the bound on one
//! principal's open long-lived responses (event streams, streamed legs).
//!
//! Limits are read from the **current** config on every admission, so a SIGHUP reload applies
//! a client's new limit at once (a changed rate starts that principal with a full burst under
//! the new quota). A continuation is never admitted here: refusing it would strand a held
//! turn. A live execution holds a [`Slot`] from admission until it is dropped, whatever path
//! ends it; the counts are therefore exact without any ending having to remember them.
//!
//! Lock order: the registry is read *before* the slot map is locked, and a `Slot` is never
//! dropped while the slot map is locked, so the two locks are never nested the other way.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::config::{ClientLimits, Rate};

/// A refusal: which limit, and how long to wait before retrying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub limit: &'static str,
    pub retry_after: Duration,
}

/// How many of a principal's executions are suspended, as the registry sees them.
#[derive(Debug, Clone, Copy, Default)]
pub struct SuspendedCounts {
    /// All suspended executions.
    pub all: usize,
    /// Durable ones (stateless upstreams): they hold no [`Slot`] while suspended.
    pub durable: usize,
}

/// Places by principal, hashed with a seeded fast hash (every request looks here several
/// times; the keys are principals, not a caller's free text).
type Counts = HashMap<Arc<str>, usize, foldhash::fast::RandomState>;

/// Live executions by principal; shared with every [`Slot`].
type Live = Arc<Mutex<Counts>>;

/// One live execution of a principal; dropping it frees the place.
pub struct Slot {
    live: Live,
    /// The map's own key (no copy per slot).
    principal: Arc<str>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut map = self.live.lock();
        if let Some(n) = map.get_mut(&*self.principal) {
            *n -= 1;
            if *n == 0 {
                map.remove(&*self.principal);
            }
        }
    }
}

/// Counts one more place of `principal` in `map`; returns the map's key for it.
fn enter(map: &mut Counts, principal: &str) -> Arc<str> {
    if let Some((key, _)) = map.get_key_value(principal) {
        let key = key.clone();
        *map.get_mut(principal).expect("just found") += 1;
        return key;
    }
    let key: Arc<str> = principal.into();
    map.insert(key.clone(), 1);
    key
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("principal", &self.principal)
            .finish()
    }
}

pub struct Limiter {
    live: Live,
    /// Open long-lived responses (event streams, streamed legs) by principal.
    streams: Live,
    /// One keyed GCRA limiter per distinct quota, keyed by principal.
    rates: Mutex<HashMap<Rate, Arc<DefaultKeyedRateLimiter<String>>>>,
    clock: DefaultClock,
}

impl Default for Limiter {
    fn default() -> Self {
        Limiter {
            live: Arc::default(),
            streams: Arc::default(),
            rates: Mutex::new(HashMap::new()),
            clock: DefaultClock::default(),
        }
    }
}

impl Limiter {
    /// Admits a fresh turn of `principal` under `limits`, or says which limit refuses it.
    /// A refusal consumes nothing: the rate is checked last, so a count refusal does not
    /// spend a request, and a rate refusal takes no slot.
    pub fn admit(
        &self,
        principal: &str,
        limits: &ClientLimits,
        suspended: SuspendedCounts,
    ) -> Result<Slot, Refusal> {
        let mut live = self.live.lock();
        let running = live.get(principal).copied().unwrap_or(0);
        if let Some(max) = limits.concurrent_executions {
            if running + suspended.durable >= max {
                return Err(Refusal {
                    limit: "concurrent_executions",
                    retry_after: Duration::from_secs(1),
                });
            }
        }
        if let Some(max) = limits.max_suspended {
            if suspended.all >= max {
                return Err(Refusal {
                    limit: "max_suspended",
                    retry_after: Duration::from_secs(1),
                });
            }
        }
        if let Some(rate) = limits.rate {
            let limiter = self.rate_limiter(rate);
            if let Err(not_until) = limiter.check_key(&principal.to_string()) {
                return Err(Refusal {
                    limit: "requests_per_minute",
                    retry_after: not_until.wait_time_from(self.clock.now()),
                });
            }
        }
        let principal = enter(&mut live, principal);
        Ok(Slot {
            live: self.live.clone(),
            principal,
        })
    }

    /// A slot taken without any check: continuations and restored executions.
    pub fn hold(&self, principal: &str) -> Slot {
        let principal = enter(&mut self.live.lock(), principal);
        Slot {
            live: self.live.clone(),
            principal,
        }
    }

    /// A place for one more long-lived response of `principal`, if it holds fewer than
    /// `max`; dropping the slot (with the response body) frees it.
    pub fn stream(&self, principal: &str, max: usize) -> Option<Slot> {
        let mut open = self.streams.lock();
        if open.get(principal).copied().unwrap_or(0) >= max {
            return None;
        }
        let principal = enter(&mut open, principal);
        Some(Slot {
            live: self.streams.clone(),
            principal,
        })
    }

    /// Live executions of `principal` that hold a slot.
    #[cfg(test)]
    pub fn live(&self, principal: &str) -> usize {
        self.live.lock().get(principal).copied().unwrap_or(0)
    }

    fn rate_limiter(&self, rate: Rate) -> Arc<DefaultKeyedRateLimiter<String>> {
        let mut rates = self.rates.lock();
        rates
            .entry(rate)
            .or_insert_with(|| {
                let quota = Quota::per_minute(rate.per_minute).allow_burst(rate.burst);
                Arc::new(RateLimiter::keyed(quota))
            })
            .clone()
    }

    /// Forgets rate state that equals a fresh start (and limiters left with none), so the
    /// maps stay as small as the set of recently active principals.
    pub fn forget_idle(&self) {
        let mut rates = self.rates.lock();
        rates.retain(|_, l| {
            l.retain_recent();
            !l.is_empty()
        });
    }
}

/// Seconds for a `Retry-After` header: rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::num::NonZeroU32;

    fn limits(
        rpm: Option<u32>,
        burst: Option<u32>,
        conc: Option<usize>,
        susp: Option<usize>,
    ) -> ClientLimits {
        ClientLimits {
            rate: rpm.map(|r| Rate {
                per_minute: NonZeroU32::new(r).unwrap(),
                burst: NonZeroU32::new(burst.unwrap_or(r)).unwrap(),
            }),
            concurrent_executions: conc,
            max_suspended: susp,
            max_streams: None,
            budget: Default::default(),
        }
    }

    #[test]
    fn gcra_refuses_past_the_burst_with_a_wait() {
        let l = Limiter::default();
        let lim = limits(Some(60), Some(2), None, None);
        let none = SuspendedCounts::default();
        let a = l.admit("alice", &lim, none).unwrap();
        let b = l.admit("alice", &lim, none).unwrap();
        let r = l.admit("alice", &lim, none).unwrap_err();
        assert_eq!(r.limit, "requests_per_minute");
        assert!(r.retry_after <= Duration::from_secs(1), "{r:?}");
        assert_eq!(retry_after_secs(r.retry_after), 1);
        // Keyed per principal: bob has his own bucket.
        assert!(l.admit("bob", &lim, none).is_ok());
        drop((a, b));
        // A changed quota (a reload) applies at once, with a fresh bucket.
        assert!(l
            .admit("alice", &limits(Some(120), Some(1), None, None), none)
            .is_ok());
    }

    #[test]
    fn slots_count_live_executions_until_dropped() {
        let l = Limiter::default();
        let lim = limits(None, None, Some(2), Some(1));
        let none = SuspendedCounts::default();
        let a = l.admit("alice", &lim, none).unwrap();
        let b = l.admit("alice", &lim, none).unwrap();
        assert_eq!(l.live("alice"), 2);
        assert_eq!(
            l.admit("alice", &lim, none).unwrap_err().limit,
            "concurrent_executions"
        );
        drop(a);
        let c = l.admit("alice", &lim, none).unwrap();
        // Durable suspended executions hold no slot but count as live.
        drop(c);
        let up = SuspendedCounts { all: 0, durable: 1 };
        assert_eq!(
            l.admit("alice", &lim, up).unwrap_err().limit,
            "concurrent_executions"
        );
        let held = SuspendedCounts { all: 1, durable: 0 };
        assert_eq!(
            l.admit("alice", &lim, held).unwrap_err().limit,
            "max_suspended"
        );
        drop(b);
        let h = l.hold("alice");
        assert_eq!(l.live("alice"), 1);
        drop(h);
        assert_eq!(l.live("alice"), 0);
        l.forget_idle();
    }

    #[test]
    fn streams_are_bounded_per_principal_and_freed_on_drop() {
        let l = Limiter::default();
        let a = l.stream("alice", 2).unwrap();
        let b = l.stream("alice", 2).unwrap();
        assert!(l.stream("alice", 2).is_none(), "a third stream over 2");
        assert!(
            l.stream("bob", 2).is_some(),
            "another principal is not affected"
        );
        drop(a);
        let c = l
            .stream("alice", 2)
            .expect("a dropped stream frees its place");
        drop((b, c));
        assert!(l.streams.lock().is_empty(), "no entry left behind");
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(3)), 3);
    }
}
