//! Whether an operator may delete a record (the admin API's purge).
//!
//! Purging a completed record frees its key: the next request with it runs again. That
//! is the operator's call. Purging an in-progress record whose lease is live is a
//! different matter: its holder is probably still running the handler, and a retry
//! after the purge would run it a second time — so it is refused unless forced.

use crate::{Millis, Record};

/// What a purge of a key comes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PurgeDecision {
    /// Delete the record (only if it is still the one read: a compare-and-delete).
    Delete,
    /// The key has no record.
    Absent,
    /// An attempt holds the key under a live lease until this instant; not deleted.
    LeaseLive {
        /// When the holder's lease ends (store time).
        lease_until: Millis,
    },
}

/// Decides a purge of the key whose record is `record`, at the store's `now`. `force`
/// deletes an in-progress record even under a live lease (an operator who knows its
/// holder is gone: a process killed, a host lost).
pub fn decide_purge(record: Option<&Record>, now: Millis, force: bool) -> PurgeDecision {
    match record {
        None => PurgeDecision::Absent,
        Some(Record::InProgress { lease_until, .. }) if *lease_until > now && !force => {
            PurgeDecision::LeaseLive {
                lease_until: *lease_until,
            }
        }
        Some(_) => PurgeDecision::Delete,
    }
}

/// The store time before which a purge of `record` must not delete it: its holder's
/// lease end for an in-progress record (unless `force`), 0 otherwise. A store checks it
/// on its own clock in the deleting step — [`decide_purge`] ran on the caller's idea of
/// the store's time, which a replica whose clock runs ahead gets wrong.
pub fn purge_not_before(record: &Record, force: bool) -> Millis {
    match record {
        Record::InProgress { lease_until, .. } if !force => *lease_until,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fingerprint, StoredResponse};
    use wasm_bindgen_test::wasm_bindgen_test;

    fn in_progress(lease_until: Millis) -> Record {
        Record::InProgress {
            fingerprint: Fingerprint([1; 32]),
            token: 1000 * 1024,
            lease_until,
            expires_at: 90_000,
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_live_lease_is_refused_unless_forced() {
        let live = in_progress(31_000);
        assert_eq!(
            decide_purge(Some(&live), 30_999, false),
            PurgeDecision::LeaseLive {
                lease_until: 31_000
            }
        );
        assert_eq!(
            decide_purge(Some(&live), 30_999, true),
            PurgeDecision::Delete
        );
        // The lease ends at its instant: a takeover could happen now, so may a purge.
        assert_eq!(
            decide_purge(Some(&live), 31_000, false),
            PurgeDecision::Delete
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_store_checks_the_lease_on_its_own_clock() {
        let live = in_progress(31_000);
        assert_eq!(purge_not_before(&live, false), 31_000);
        assert_eq!(purge_not_before(&live, true), 0);
        let done = Record::Completed {
            fingerprint: Fingerprint([1; 32]),
            token: 7,
            response: StoredResponse::default(),
            expires_at: 10,
        };
        assert_eq!(purge_not_before(&done, false), 0);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn completed_and_absent() {
        let done = Record::Completed {
            fingerprint: Fingerprint([1; 32]),
            token: 7,
            response: StoredResponse::default(),
            expires_at: 10,
        };
        assert_eq!(decide_purge(Some(&done), 5, false), PurgeDecision::Delete);
        assert_eq!(decide_purge(None, 5, false), PurgeDecision::Absent);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn orphans_are_in_progress_records_claimed_before_the_instant() {
        let r = in_progress(31_000);
        assert_eq!(r.claimed_at(), 1000);
        assert!(r.in_progress_claimed_before(1001));
        assert!(!r.in_progress_claimed_before(1000));
        let done = Record::Completed {
            fingerprint: Fingerprint([1; 32]),
            token: 1,
            response: StoredResponse::default(),
            expires_at: 10,
        };
        assert!(!done.in_progress_claimed_before(u64::MAX));
    }
}
