//! Where records live. One trait, one adapter file per backend.
//!
//! Every adapter executes the core's decisions atomically and nothing else: the
//! state transitions (who may execute, who may complete) are decided by
//! [`idem_core::decide`] and [`idem_core::Holder::check`], never here.

use async_trait::async_trait;
use idem_core::{
    decide, Decision, Fingerprint, Holder, Millis, Policy, Record, RecordKey, Refusal,
    StoredResponse,
};
use std::fmt;

pub mod cache;
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
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Unavailable(e) => write!(f, "store unavailable: {e}"),
            StoreError::Corrupt(e) => write!(f, "stored record is corrupt: {e}"),
            StoreError::Contention => f.write_str("store contention: claim retried too often"),
        }
    }
}

impl std::error::Error for StoreError {}

/// Whether a holder write ends the holder's claim (a completion or a release) or
/// only renews it. Stores that buffer writes treat them differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HolderWriteKind {
    /// A heartbeat.
    Heartbeat,
    /// A completion or a release.
    Final,
}

/// The outcome of a holder's write: done, or refused by the core's precondition.
pub type HolderWrite = Result<(), Refusal>;

/// A record store. Implementations must make each method atomic with respect to
/// every other call on the same key, across processes.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A short name for logs and metrics (`memory`, `postgres`, …).
    fn name(&self) -> &'static str;

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

    /// Writes `next` only if the key's record still belongs to `holder`
    /// ([`idem_core::Holder::check`]: in progress, with the holder's token) — one
    /// atomic step. The core made `next`; the store only checks and writes.
    async fn write_as_holder(
        &self,
        key: &RecordKey,
        holder: &Holder,
        next: Record,
        kind: HolderWriteKind,
    ) -> Result<HolderWrite, StoreError>;

    /// Renews the holder's lease.
    async fn heartbeat(
        &self,
        key: &RecordKey,
        holder: &Holder,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        self.write_as_holder(
            key,
            holder,
            holder.renewed(now, policy),
            HolderWriteKind::Heartbeat,
        )
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
        self.write_as_holder(
            key,
            holder,
            holder.completed(response, now, policy),
            HolderWriteKind::Final,
        )
        .await
    }

    /// Frees the key so that a retry may run.
    async fn release(
        &self,
        key: &RecordKey,
        holder: &Holder,
        now: Millis,
    ) -> Result<HolderWrite, StoreError> {
        self.write_as_holder(key, holder, holder.released(now), HolderWriteKind::Final)
            .await
    }

    /// Reads the key's record, expired or not.
    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError>;

    /// Deletes up to `batch` records that expired strictly before `now`; returns how many.
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
pub(crate) enum Insert {
    /// The key had no record; ours is stored.
    Stored,
    /// The key has this record; nothing was written.
    Existing(Record),
    /// A concurrent insert won, but its row is not visible to this statement yet
    /// (Postgres: committed after the statement's snapshot). Ask again.
    NotYetVisible,
}

/// The two atomic primitives a claim needs from a store without locks.
#[async_trait]
pub(crate) trait CasRecords: Sync {
    /// Stores `record` only if the key has none.
    async fn insert_if_absent(
        &self,
        key: &RecordKey,
        record: &Record,
    ) -> Result<Insert, StoreError>;
    /// Replaces the record only if it still carries the token `expected`.
    async fn replace(
        &self,
        key: &RecordKey,
        expected: u64,
        record: &Record,
    ) -> Result<bool, StoreError>;
}

/// CAS attempts before a claim gives up with [`StoreError::Contention`].
const MAX_CLAIM_ROUNDS: usize = 16;

/// A claim on a compare-and-swap store: assume the key is new (one round trip in the
/// common case); otherwise let the core decide on the existing record and, when the
/// decision is a claim, swap it in only if nobody got there first. Returns the decision
/// and the record it leaves stored.
pub(crate) async fn claim_by_cas(
    store: &impl CasRecords,
    key: &RecordKey,
    fp: &Fingerprint,
    now: Millis,
    policy: &Policy,
) -> Result<(Decision, Option<Record>), StoreError> {
    for _ in 0..MAX_CLAIM_ROUNDS {
        let fresh = decide(None, fp, now, policy);
        let Decision::Execute(claim) = &fresh else {
            unreachable!("no record always executes")
        };
        let existing = match store.insert_if_absent(key, &claim.record).await? {
            Insert::Stored => {
                let record = claim.record.clone();
                return Ok((fresh, Some(record)));
            }
            Insert::Existing(existing) => existing,
            Insert::NotYetVisible => continue,
        };
        let decision = decide(Some(&existing), fp, now, policy);
        match &decision {
            Decision::Execute(c) | Decision::TakeOver(c) => {
                let expected = c
                    .replaces
                    .expect("a claim over an existing record names its token");
                if store.replace(key, expected, &c.record).await? {
                    let record = c.record.clone();
                    return Ok((decision, Some(record)));
                }
            }
            _ => return Ok((decision, Some(existing))),
        }
    }
    Err(StoreError::Contention)
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
    Record::decode(bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
}
