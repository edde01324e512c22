//! The instant a write was computed at, as a store judges it.
//!
//! Leases and expiries are judged on the clock of the store that holds the record.
//! A caller computes a record at its estimate of that clock; the store refuses the
//! write when the estimate is further than the tolerance from its own reading, and the
//! caller recomputes at the store's time. The tolerance is the protocol's bound on
//! clock error: a lease or an expiry may be off by at most that much.

use crate::{Millis, Policy};

/// The instant a write was computed at, and how far from the store's clock that may be.
///
/// A store refuses a write whose `now` differs from its own clock by
/// more than `tolerance`: the caller recomputes the record at the store's time and
/// tries again. Within the tolerance a lease or an expiry may be off by at most that
/// much, which is why it is a small fraction of the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The caller's estimate of the store's clock.
    pub now: Millis,
    /// The largest accepted difference from the store's clock.
    pub tolerance: u64,
}

impl Stamp {
    /// `now` with the tolerance the policy allows: a tenth of the lease, at least 50 ms.
    pub fn new(now: Millis, policy: &Policy) -> Stamp {
        Stamp {
            now,
            tolerance: (policy.lease_ms / 10).max(50),
        }
    }

    /// Whether the store's clock reading `store_now` accepts this stamp.
    pub fn accepted_by(&self, store_now: Millis) -> bool {
        self.now.abs_diff(store_now) <= self.tolerance
    }

    /// The same tolerance at the store's time.
    pub fn at(self, store_now: Millis) -> Stamp {
        Stamp {
            now: store_now,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// Found untested by cargo-mutants (docs/mutants.md): a stamp refused as skewed is
    /// sent again at the store's time, with the same tolerance.
    #[wasm_bindgen_test(unsupported = test)]
    fn a_stamp_moves_to_the_store_s_time() {
        let p = Policy {
            lease_ms: 1_000,
            ttl_ms: 60_000,
        };
        let moved = Stamp::new(0, &p).at(5_000);
        assert_eq!((moved.now, moved.tolerance), (5_000, 100));
        assert!(moved.accepted_by(5_000) && !Stamp::new(0, &p).accepted_by(5_000));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn stamps_accept_only_nearby_store_clocks() {
        let p = Policy {
            lease_ms: 30_000,
            ttl_ms: 60_000,
        };
        let s = Stamp::new(100_000, &p);
        assert_eq!(s.tolerance, 3_000);
        assert!(s.accepted_by(103_000) && s.accepted_by(97_000));
        assert!(!s.accepted_by(103_001) && !s.accepted_by(96_999));
        assert_eq!(
            Stamp::new(
                0,
                &Policy {
                    lease_ms: 100,
                    ttl_ms: 1
                }
            )
            .tolerance,
            50
        );
    }
}
