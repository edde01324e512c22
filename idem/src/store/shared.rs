//! What the shared stores (Postgres, Redis) have in common: a claim by
//! compare-and-swap, and a holder write at the store's time.

use super::{CasRecords, HolderWrite, Insert, Stamp, StoreError, Swap};
use idem_core::{
    decide, Decision, Fingerprint, Holder, Millis, Policy, Record, RecordKey, Transition,
};

/// CAS attempts before a claim gives up with [`StoreError::contention()`].
pub(crate) const MAX_CLAIM_ROUNDS: usize = 16;

/// A claim on a compare-and-swap store: assume the key is new (one round trip in the
/// common case); otherwise let the core decide on the existing record *at the store's
/// time* and, when the decision is a claim, swap it in only if the record is still
/// exactly what was decided on. Returns the decision and the record it leaves stored.
pub(crate) async fn claim_by_cas(
    store: &impl CasRecords,
    key: &RecordKey,
    fp: &Fingerprint,
    now: Millis,
    policy: &Policy,
) -> Result<(Decision, Option<Record>), StoreError> {
    let mut at = Stamp::new(now, policy);
    for _ in 0..MAX_CLAIM_ROUNDS {
        let fresh = decide(None, fp, at.now, policy);
        let Decision::Execute(claim) = &fresh else {
            unreachable!("no record always executes")
        };
        let (found, store_now) = store.insert_if_absent(key, &claim.record, at).await?;
        at = at.at(store_now);
        let existing = match found {
            Insert::Stored => {
                let record = claim.record.clone();
                return Ok((fresh, Some(record)));
            }
            Insert::Existing(existing) => existing,
            Insert::NotYetVisible | Insert::Skewed => continue,
        };
        // The store's own clock judges the lease and the expiry.
        let decision = decide(Some(&existing), fp, at.now, policy);
        match &decision {
            Decision::Execute(c) | Decision::TakeOver(c) => {
                let expected = c
                    .replaces
                    .as_ref()
                    .expect("a claim over an existing record names it");
                let (swap, store_now) = store.replace(key, expected, &c.record, at).await?;
                if swap == Swap::Replaced {
                    let record = c.record.clone();
                    return Ok((decision, Some(record)));
                }
                at = at.at(store_now);
            }
            _ => return Ok((decision, Some(existing))),
        }
    }
    Err(StoreError::contention())
}

/// What a store's holder write did.
pub(crate) enum Written {
    /// Written.
    Done,
    /// The precondition failed; the record the store holds (if it returned it).
    Refused(Option<Record>),
    /// The record was computed too far from the store's clock, which read this.
    Skewed(Millis),
}

/// Holder-write attempts when the store keeps reporting a clock difference.
const MAX_SKEW_ROUNDS: usize = 4;

/// A holder write at the store's time: `write` is one guarded statement; a write
/// refused for skew is recomputed by the core at the store's time and sent again.
pub(crate) async fn holder_write_at<F, Fut>(
    holder: &Holder,
    change: &Transition,
    now: Millis,
    policy: &Policy,
    mut write: F,
) -> Result<HolderWrite, StoreError>
where
    F: FnMut(Record, Stamp) -> Fut,
    Fut: std::future::Future<Output = Result<Written, StoreError>>,
{
    let mut at = Stamp::new(now, policy);
    for _ in 0..MAX_SKEW_ROUNDS {
        match write(change.record(holder, at.now, policy), at).await? {
            Written::Done => return Ok(HolderWrite::Written),
            Written::Refused(current) => {
                if holder.already_wrote(current.as_ref(), change, at.now) {
                    // An earlier attempt whose answer was lost had landed.
                    return Ok(HolderWrite::Written);
                }
                return match holder.check(current.as_ref(), at.now) {
                    Err(refusal) => Ok(HolderWrite::Refused(refusal)),
                    // Tokens only grow, so the record can't have changed back; report
                    // contention rather than guess.
                    Ok(()) => Err(StoreError::contention()),
                };
            }
            Written::Skewed(store_now) => at = at.at(store_now),
        }
    }
    Err(StoreError::contention())
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
    Record::decode(bytes).map_err(|e| StoreError::corrupt(e.to_string()))
}
