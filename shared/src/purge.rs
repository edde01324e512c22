//! Whether an operator may delete a record (the admin API's purge).
//!
//! Purging a completed record frees its key: the next request with it runs again. That
//! is the operator's call. Purging an in-progress record whose lease is live is a
//! different matter: its holder is probably still running the handler, and a retry
//! after the purge would run it a second time — so it is refused unless forced.
//!
//! A purge is decided on the record as it was read. If a write lands before the delete
//! (its compare-and-delete then finds the record changed), the purge decides again only
//! while the record is still the same attempt in the same state ([`PurgeTarget`]): a
//! heartbeat that renewed the lease, say. An orphan claim whose holder woke up and
//! completed it is not the record the operator chose to delete: its answer may already
//! be with the client, and deleting it would let a retry charge again.

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
    /// The record is no longer the attempt, or no longer in the state, the purge was
    /// decided on; not deleted.
    Changed,
}

/// The attempt (its token) and its state that a purge was decided on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PurgeTarget {
    /// The attempt's fencing token.
    pub token: u64,
    /// Whether it had completed.
    pub completed: bool,
}

impl PurgeTarget {
    /// `record`'s attempt and state.
    pub fn of(record: &Record) -> Self {
        PurgeTarget {
            token: record.token(),
            completed: record.is_completed(),
        }
    }
}

/// Decides a purge of the key whose record is `record`, at the store's `now`. `force`
/// deletes an in-progress record even under a live lease (an operator who knows its
/// holder is gone: a process killed, a host lost). `target`, when the purge was already
/// decided on an earlier read of the record, is what that read found: any other attempt
/// or state is [`PurgeDecision::Changed`].
pub fn decide_purge(
    record: Option<&Record>,
    target: Option<PurgeTarget>,
    now: Millis,
    force: bool,
) -> PurgeDecision {
    match record {
        None => PurgeDecision::Absent,
        Some(r) if target.is_some_and(|t| t != PurgeTarget::of(r)) => PurgeDecision::Changed,
        Some(Record::InProgress { lease_until, .. }) if *lease_until > now && !force => {
            PurgeDecision::LeaseLive {
                lease_until: *lease_until,
            }
        }
        Some(_) => PurgeDecision::Delete,
    }
}

/// Whether purging `record` at `now` frees its key for a retry that sends again a
/// request that may already have been sent: the record is a live in-progress one — an
/// attempt running, or one whose holder died mid-request (its lease over or not).
/// Where guarded requests are never sent twice (proxy mode: idem can't know what the
/// upstream did), such a purge needs the operator's explicit consent (`resend=true`);
/// without a purge, the attempt's next retry takes it over and stores its outcome as
/// unknown. An expired record (a released claim) frees nothing that isn't free.
pub fn purge_may_resend(record: &Record, now: Millis) -> bool {
    matches!(record, Record::InProgress { expires_at, .. } if *expires_at > now)
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

/// [`purge_not_before`] of `record` (`not_before`) held back by `copy`, the key's record
/// in another tier: a copy of the same attempt, still in progress, whose lease reaches
/// further — renewals the deciding tier lost — keeps the purge until that lease ends,
/// or its holder, still running, would see a retry run beside it. A forced purge (0)
/// stays forced.
pub fn purge_not_before_given_copy(record: &Record, copy: &Record, not_before: Millis) -> Millis {
    match (record, copy) {
        (
            Record::InProgress { token, .. },
            Record::InProgress {
                token: copied,
                lease_until,
                ..
            },
        ) if not_before != 0 && token == copied => not_before.max(*lease_until),
        _ => not_before,
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
    fn another_tier_s_renewed_copy_holds_a_purge_back() {
        let lapsed = in_progress(31_000);
        let renewed = in_progress(45_000);
        let not_before = purge_not_before(&lapsed, false);
        assert_eq!(
            purge_not_before_given_copy(&lapsed, &renewed, not_before),
            45_000
        );
        // Forced, it stays forced; a lease the copy does not extend changes nothing.
        assert_eq!(purge_not_before_given_copy(&lapsed, &renewed, 0), 0);
        assert_eq!(
            purge_not_before_given_copy(&renewed, &lapsed, 45_000),
            45_000
        );
        // Another attempt's claim is no copy of this one (is_newer_than decides those).
        let other = Record::InProgress {
            fingerprint: Fingerprint([1; 32]),
            token: 2000 * 1024,
            lease_until: 90_000,
            expires_at: 90_000,
        };
        assert_eq!(
            purge_not_before_given_copy(&lapsed, &other, not_before),
            31_000
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_live_lease_is_refused_unless_forced() {
        let live = in_progress(31_000);
        assert_eq!(
            decide_purge(Some(&live), None, 30_999, false),
            PurgeDecision::LeaseLive {
                lease_until: 31_000
            }
        );
        assert_eq!(
            decide_purge(Some(&live), None, 30_999, true),
            PurgeDecision::Delete
        );
        // The lease ends at its instant: a takeover could happen now, so may a purge.
        assert_eq!(
            decide_purge(Some(&live), None, 31_000, false),
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
        assert_eq!(
            decide_purge(Some(&done), None, 5, false),
            PurgeDecision::Delete
        );
        assert_eq!(decide_purge(None, None, 5, false), PurgeDecision::Absent);
    }

    /// Decided on an orphan claim, then its holder's completion landed: not the record
    /// the operator chose, even with force. A renewed lease is the same attempt, and
    /// is decided on again; another attempt's claim is not.
    #[wasm_bindgen_test(unsupported = test)]
    fn a_purge_decides_again_only_on_the_attempt_and_state_it_read() {
        let orphan = in_progress(31_000);
        let target = Some(PurgeTarget::of(&orphan));
        assert_eq!(target.map(|t| t.completed), Some(false));
        let completed = Record::Completed {
            fingerprint: Fingerprint([1; 32]),
            token: orphan.token(),
            response: StoredResponse::default(),
            expires_at: 90_000,
        };
        for force in [false, true] {
            assert_eq!(
                decide_purge(Some(&completed), target, 40_000, force),
                PurgeDecision::Changed
            );
        }
        let renewed = in_progress(45_000);
        assert_eq!(
            decide_purge(Some(&renewed), target, 40_000, false),
            PurgeDecision::LeaseLive {
                lease_until: 45_000
            }
        );
        assert_eq!(
            decide_purge(Some(&orphan), target, 40_000, false),
            PurgeDecision::Delete
        );
        let takeover = Record::InProgress {
            fingerprint: Fingerprint([1; 32]),
            token: orphan.token() + 1,
            lease_until: 31_000,
            expires_at: 90_000,
        };
        assert_eq!(
            decide_purge(Some(&takeover), target, 40_000, true),
            PurgeDecision::Changed
        );
        assert_eq!(
            decide_purge(None, target, 40_000, false),
            PurgeDecision::Absent
        );
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

    #[wasm_bindgen_test(unsupported = test)]
    fn an_attempt_that_may_have_run_is_flagged_live_or_orphaned() {
        assert!(purge_may_resend(&in_progress(2_000), 1_000), "running");
        assert!(purge_may_resend(&in_progress(2_000), 5_000), "orphaned");
        assert!(!purge_may_resend(&in_progress(2_000), 90_000), "expired");
        let done = Record::Completed {
            fingerprint: Fingerprint([1; 32]),
            token: 1,
            response: StoredResponse::default(),
            expires_at: 90_000,
        };
        assert!(!purge_may_resend(&done, 1_000));
    }
}
