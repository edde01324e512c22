//! Where records live. One trait, one adapter file per backend.
//!
//! Every adapter executes the core's decisions atomically and nothing else: the
//! state transitions (who may execute, who may complete) are decided by
//! [`idem_core::decide`] and [`idem_core::Holder::check`], never here.

use async_trait::async_trait;
use idem_core::{
    Decision, Fingerprint, Holder, Millis, Policy, Record, RecordKey, Refusal, StoredResponse,
};
use std::fmt;

pub mod memory;
pub mod postgres;

pub use memory::MemoryStore;
pub use postgres::{PgStrategy, PostgresStore};

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
    ) -> Result<Decision, StoreError>;

    /// Renews the holder's lease.
    async fn heartbeat(
        &self,
        key: &RecordKey,
        holder: &Holder,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError>;

    /// Stores the holder's response.
    async fn complete(
        &self,
        key: &RecordKey,
        holder: &Holder,
        response: StoredResponse,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError>;

    /// Frees the key so that a retry may run.
    async fn release(
        &self,
        key: &RecordKey,
        holder: &Holder,
        now: Millis,
    ) -> Result<HolderWrite, StoreError>;

    /// Reads the key's record, expired or not.
    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError>;

    /// Deletes up to `batch` records that expired strictly before `now`; returns how many.
    async fn sweep(&self, now: Millis, batch: usize) -> Result<u64, StoreError>;

    /// Checks that the backend answers.
    async fn ping(&self) -> Result<(), StoreError>;
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
    Record::decode(bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
}
