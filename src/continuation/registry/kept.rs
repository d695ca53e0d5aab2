//! Bytes a principal keeps beside its batches (a Responses socket's last response), under
//! the same `max_kept_bytes_per_client` bound and in the same count.

use super::{Parked, Registry};

impl<P: Parked> Registry<P> {
    /// Changes what `principal` keeps outside any batch (a socket's last response) from `was`
    /// to `now` bytes, under the bound its batches share; false, changing nothing, over it.
    pub fn rekeep(&self, principal: &str, was: usize, now: usize) -> bool {
        let mut g = self.inner.lock();
        let other = g.kept.get(principal).map_or(0, |k| k.saturating_sub(was));
        if now > was && other.saturating_add(now) > self.limits.max_kept_bytes_per_client {
            return false;
        }
        match other + now {
            0 => g.kept.remove(principal),
            n => g.kept.insert(principal.into(), n),
        };
        true
    }
}
