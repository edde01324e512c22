//! Where records live. One trait, one adapter file per backend.
//!
//! Every adapter executes the core's decisions atomically and nothing else: the
//! state transitions (who may execute, who may complete) are decided by
//! [`idem_core::decide`] and [`idem_core::Holder::check`], never here.

use async_trait::async_trait;
use idem_core::{
    decide, Decision, Fingerprint, Holder, Millis, Policy, Record, RecordKey, Refusal,
    StoredResponse, Transition,
};
use std::fmt;

pub use clock::{Stamp, StoreClock};

pub mod cache;
pub mod clock;
pub mod memory;
pub mod postgres;
pub mod redis;
pub mod tiered;
pub mod tls;

pub use self::redis::{RedisOptions, RedisStore};
pub use cache::ReplayCache;
pub use memory::MemoryStore;
pub use postgres::{PgStrategy, PostgresStore};
pub use tiered::{Durability, TieredStore};

/// A store failed to answer; the request must not run unguarded (fail closed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The backend is unreachable, timed out or returned an error.
    Unavailable(String),
    /// A stored record could not be decoded.
    Corrupt(String),
    /// A compare-and-swap kept losing to concurrent writers.
    Contention,
    /// The backend is configured so that it may lose records (an evicting Redis).
    Unsafe(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Unavailable(e) => write!(f, "store unavailable: {e}"),
            StoreError::Corrupt(e) => write!(f, "stored record is corrupt: {e}"),
            StoreError::Contention => f.write_str("store contention: claim retried too often"),
            StoreError::Unsafe(e) => write!(f, "unsafe store configuration: {e}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// The outcome of a holder's write: done, or refused by the core's precondition.
pub type HolderWrite = Result<(), Refusal>;

/// A record store. Implementations must make each method atomic with respect to
/// every other call on the same key, across processes.
///
/// Time: every `now` is a reading of *the store's* clock ([`Store::now`]). Shared
/// stores judge leases and expiries on their own clock: they decide over an existing
/// record with the time the store itself returned, and refuse writes whose `now` is
/// too far from it ([`clock::Stamp`]), recomputing them at the store's time.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A short name for logs and metrics (`memory`, `postgres`, …).
    fn name(&self) -> &'static str;

    /// The store's clock as this process last observed it: the `now` to pass in.
    fn now(&self) -> Millis {
        crate::now()
    }

    /// The Postgres database holding this store's authoritative records, where a
    /// handler can commit its effects together with its answer
    /// ([`crate::idempotency::IdempotencyContext::transaction`]); `None` when the
    /// records live elsewhere only (memory, Redis).
    fn authority(&self) -> Option<postgres::Authority> {
        None
    }

    /// Tells the store that `record`, the holder's completion, was committed in
    /// [`Store::authority`] by the handler's transaction: tiers in front of the
    /// authority (the tiered store's Redis) learn it here. Best effort: a tier that
    /// misses it asks the authority before anything runs again.
    async fn committed(
        &self,
        key: &RecordKey,
        holder: &Holder,
        record: &Record,
    ) -> Result<(), StoreError> {
        let _ = (key, holder, record);
        Ok(())
    }

    /// Reads the key's record, asks [`idem_core::decide`], and when the decision is a
    /// claim, writes it — all as one atomic step. Returns the decision.
    async fn claim(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        now: Millis,
        policy: &Policy,
    ) -> Result<Decision, StoreError> {
        Ok(self
            .claim_with_record(key, fingerprint, now, policy)
            .await?
            .0)
    }

    /// [`Store::claim`], also returning the record it leaves stored when the store
    /// read or wrote it anyway (a replay's completed record is what [`ReplayCache`]
    /// keeps), or `None` when it has none at hand.
    async fn claim_with_record(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        now: Millis,
        policy: &Policy,
    ) -> Result<(Decision, Option<Record>), StoreError>;

    /// Writes `change`'s record only if the key's record still belongs to `holder`
    /// ([`idem_core::Holder::check`]: in progress, with the holder's token) — one
    /// atomic step. The core makes the record ([`Transition::record`]) at the store's
    /// time; the store only checks and writes.
    async fn write_as_holder(
        &self,
        key: &RecordKey,
        holder: &Holder,
        change: &Transition,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError>;

    /// Renews the holder's lease.
    async fn heartbeat(
        &self,
        key: &RecordKey,
        holder: &Holder,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        self.write_as_holder(key, holder, &Transition::Renew, now, policy)
            .await
    }

    /// Stores the holder's response.
    async fn complete(
        &self,
        key: &RecordKey,
        holder: &Holder,
        response: StoredResponse,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        self.write_as_holder(key, holder, &Transition::Complete(response), now, policy)
            .await
    }

    /// Frees the key so that a retry may run.
    async fn release(
        &self,
        key: &RecordKey,
        holder: &Holder,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        self.write_as_holder(key, holder, &Transition::Release, now, policy)
            .await
    }

    /// Reads the key's record, expired or not.
    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError>;

    /// Deletes up to `batch` records that expired strictly before `now` (and before
    /// the store's own clock); returns how many.
    async fn sweep(&self, now: Millis, batch: usize) -> Result<u64, StoreError>;

    /// Checks that the backend answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Writes out anything buffered (the async tiered store's outbox) and stops
    /// buffering; called once at shutdown.
    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// What an insert-if-absent found.
#[derive(Debug)]
pub enum Insert {
    /// The key had no record; ours is stored.
    Stored,
    /// The key has this record; nothing was written.
    Existing(Record),
    /// A concurrent insert won, but its row is not visible to this statement yet
    /// (Postgres: committed after the statement's snapshot). Ask again.
    NotYetVisible,
    /// The key had no record, and ours was computed at a time too far from the
    /// store's clock: nothing was written.
    Skewed,
}

/// What a compare-and-swap did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swap {
    /// The expected record was there and is replaced.
    Replaced,
    /// The record is no longer the expected one (or is gone): nothing was written.
    Changed,
    /// The new record was computed too far from the store's clock: nothing was written.
    Skewed,
}

/// The two atomic primitives a claim needs from a store without locks (Postgres'
/// `on-conflict` strategy, Redis). Each also returns the store's clock at the time it
/// ran. Public so that conformance tests can force interleavings between them.
#[async_trait]
pub trait CasRecords: Sync {
    /// Stores `record` (computed at `at.now`) only if the key has none and `at` is
    /// within its tolerance of the store's clock.
    async fn insert_if_absent(
        &self,
        key: &RecordKey,
        record: &Record,
        at: Stamp,
    ) -> Result<(Insert, Millis), StoreError>;
    /// Replaces the record only if it is still exactly `expected` (every field, not
    /// just the token) and `at` is within its tolerance of the store's clock.
    async fn replace(
        &self,
        key: &RecordKey,
        expected: &Record,
        record: &Record,
        at: Stamp,
    ) -> Result<(Swap, Millis), StoreError>;
}

/// CAS attempts before a claim gives up with [`StoreError::Contention`].
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
    Err(StoreError::Contention)
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
            Written::Done => return Ok(Ok(())),
            Written::Refused(current) => {
                if holder.already_wrote(current.as_ref(), change) {
                    // An earlier attempt whose answer was lost had landed.
                    return Ok(Ok(()));
                }
                return match holder.check(current.as_ref()) {
                    Err(refusal) => Ok(Err(refusal)),
                    // Tokens only grow, so the record can't have changed back; report
                    // contention rather than guess.
                    Ok(()) => Err(StoreError::Contention),
                };
            }
            Written::Skewed(store_now) => at = at.at(store_now),
        }
    }
    Err(StoreError::Contention)
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
    Record::decode(bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
}
