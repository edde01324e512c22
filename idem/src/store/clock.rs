//! The store's clock, as this process knows it.
//!
//! Leases and expiries are judged on the clock of the store that holds the record —
//! never on a replica's own wall clock, which may run ahead (taking over a live
//! holder) or behind (its leases ending early). Every statement that reads or writes
//! a record also returns the store's time; decisions over an existing record are made
//! with that time, and writes computed from the caller's `now` are refused by the
//! store itself when that `now` is further than a tolerance from its clock (see
//! [`Stamp`]). This module keeps the offset between the store's clock and ours, so that
//! the next `now` is usually right at the first try.

#[cfg(any(feature = "postgres", feature = "redis"))]
use idem_core::Millis;
pub use idem_core::Stamp;
#[cfg(any(feature = "postgres", feature = "redis"))]
use std::sync::atomic::{AtomicI64, Ordering};

#[cfg(any(feature = "postgres", feature = "redis"))]
/// The store's clock: the local clock plus the offset last observed.
#[derive(Debug, Default)]
pub(crate) struct StoreClock {
    offset_ms: AtomicI64,
}

#[cfg(any(feature = "postgres", feature = "redis"))]
impl StoreClock {
    /// A clock that trusts the local one until it observes the store's.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The store's time, estimated from the last observation.
    pub(crate) fn now(&self) -> Millis {
        shift(crate::now(), self.offset_ms.load(Ordering::Relaxed))
    }

    /// Records the store's time as a statement just returned it.
    pub(crate) fn observe(&self, store_now: Millis) {
        let local = i128::from(crate::now());
        let offset = (i128::from(store_now) - local).clamp(i64::MIN.into(), i64::MAX.into());
        self.offset_ms.store(offset as i64, Ordering::Relaxed);
    }
}

#[cfg(any(feature = "postgres", feature = "redis"))]
fn shift(t: Millis, by: i64) -> Millis {
    if by >= 0 {
        t.saturating_add(by as u64)
    } else {
        t.saturating_sub(by.unsigned_abs())
    }
}

#[cfg(all(test, any(feature = "postgres", feature = "redis")))]
mod tests {
    use super::*;

    #[test]
    fn follows_the_observed_store_clock() {
        let clock = StoreClock::new();
        let local = crate::now();
        clock.observe(local + 60_000);
        assert!(clock.now().abs_diff(local + 60_000) < 1_000);
        clock.observe(local.saturating_sub(5_000));
        assert!(clock.now().abs_diff(local - 5_000) < 1_000);
        clock.observe(0);
        assert!(clock.now() < 1_000, "never below the epoch");
    }
}
