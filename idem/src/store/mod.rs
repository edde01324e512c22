//! Where records live. One trait, one adapter file per backend.
//!
//! Every adapter executes the core's decisions atomically and nothing else: the
//! state transitions (who may execute, who may complete) are decided by
//! [`idem_core::decide`] and [`idem_core::Holder::check`], never here.

use async_trait::async_trait;
use idem_core::{
    Decision, Fingerprint, Holder, Millis, Policy, Record, RecordKey, Refusal, StoredResponse,
    Transition,
};
use std::fmt;
use std::sync::Arc;

pub use clock::Stamp;
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) use clock::StoreClock;

pub(crate) mod cache;
pub(crate) mod clock;
pub(crate) mod memory;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod purge;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod shared;
mod sweeper;
#[cfg(feature = "tiered")]
pub(crate) mod tiered;
#[cfg(any(feature = "postgres", feature = "redis"))]
pub mod tls;

#[cfg(feature = "tiered")]
pub(crate) use self::redis::RedisStore;
pub use cache::ReplayCache;
pub use memory::MemoryStore;
#[cfg(feature = "tiered")]
pub(crate) use postgres::PostgresStore;
pub use purge::{Deletion, InProgressPage, PurgeChannel, Purged};
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) use shared::{claim_by_cas, decode, holder_write_at, Written};
pub use sweeper::spawn_sweeper;

/// A store failed to answer; the request must not run unguarded (fail closed).
///
/// What kind of failure it was is [`StoreError::kind`]; the backend's own error, when
/// there is one, is its [`source`](std::error::Error::source). Its `Display` is the
/// kind, the detail and the text of the causes (each once), so that a log line written
/// with `%e` holds all of it, as it did when the causes were flattened into a string.
/// (A printer that walks `source()` too, such as anyhow's `{:#}`, shows them twice.)
#[derive(Clone)]
pub struct StoreError {
    kind: StoreErrorKind,
    detail: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// What kind of failure a [`StoreError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The backend is unreachable, timed out or returned an error.
    Unavailable,
    /// A stored record could not be decoded.
    Corrupt,
    /// A compare-and-swap kept losing to concurrent writers.
    Contention,
    /// The backend is configured so that it may lose records (an evicting Redis).
    Unsafe,
    /// The store is at its configured capacity (the memory store's cap): nothing was
    /// written.
    Full,
}

impl StoreError {
    /// An error of `kind`, described by `detail`.
    pub fn new(kind: StoreErrorKind, detail: impl Into<String>) -> Self {
        StoreError {
            kind,
            detail: detail.into(),
            source: None,
        }
    }

    /// The backend is unreachable, timed out or returned an error.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Unavailable, detail)
    }

    /// A stored record could not be decoded.
    pub fn corrupt(detail: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Corrupt, detail)
    }

    /// A compare-and-swap kept losing to concurrent writers.
    pub fn contention() -> Self {
        Self::new(StoreErrorKind::Contention, "")
    }

    /// The backend is configured so that it may lose records.
    pub fn unsafe_config(detail: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Unsafe, detail)
    }

    /// The store is at its configured capacity.
    pub fn full(detail: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Full, detail)
    }

    /// The same error, caused by `source` (the backend's own error).
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// What idem says of it, without its causes.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Debug for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("StoreError");
        d.field("kind", &self.kind).field("detail", &self.detail);
        if let Some(source) = &self.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            StoreErrorKind::Unavailable => "store unavailable",
            StoreErrorKind::Corrupt => "stored record is corrupt",
            StoreErrorKind::Contention => "store contention: claim retried too often",
            StoreErrorKind::Unsafe => "unsafe store configuration",
            StoreErrorKind::Full => "store full",
        })?;
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        // The causes too: tokio-postgres puts the useful part ("connection refused",
        // the server's message) in its error's sources. One whose text its parent
        // already showed (a RedisError shows its I/O error, and returns it as its
        // source) is not repeated.
        let mut shown = String::new();
        let mut cause = self.source.as_deref().map(|s| s as &dyn std::error::Error);
        while let Some(c) = cause {
            let text = c.to_string();
            if !shown.contains(&text) {
                write!(f, ": {text}")?;
            }
            shown = text;
            cause = c.source();
        }
        Ok(())
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// What a holder's write (heartbeat, completion, release) came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HolderWrite {
    /// The record is written.
    Written,
    /// The core's precondition refused it ([`idem_core::Holder::check`]): the key
    /// belongs to a newer attempt, is completed, or is gone.
    Refused(Refusal),
}

impl HolderWrite {
    /// Whether the record is written.
    pub fn is_written(self) -> bool {
        self == HolderWrite::Written
    }
}

/// A record store: the primitives only. Implementations must make each method atomic
/// with respect to every other call on the same key, across processes.
///
/// The operations a caller uses — claim, heartbeat, complete, release — are
/// [`StoreExt`]'s, derived from these primitives for every store alike: a store
/// cannot override them, by accident or otherwise.
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
    #[cfg(feature = "postgres")]
    fn authority(&self) -> Option<postgres::Authority> {
        None
    }

    /// Tells the store that `record`, the holder's completion, was committed in the
    /// authority by the handler's transaction: tiers in front of the authority (the
    /// tiered store's Redis) learn it here. Best effort: a tier that misses it asks
    /// the authority before anything runs again.
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
    /// claim, writes it — all as one atomic step. Returns the decision and the record
    /// it leaves stored when the store read or wrote it anyway (a replay's completed
    /// record is what [`ReplayCache`] keeps), or `None` when it has none at hand.
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

    /// Reads the key's record, expired or not.
    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError>;

    /// Deletes the key's record only if it is still exactly `expected` and the store's
    /// own clock has reached `not_before` ([`idem_core::purge_not_before`]) — a purge
    /// the core allowed ([`idem_core::decide_purge`]) — and announces the key on the
    /// store's [`PurgeChannel`] in the same atomic step.
    async fn delete_if_same(
        &self,
        key: &RecordKey,
        expected: &Record,
        not_before: Millis,
    ) -> Result<Deletion, StoreError>;

    /// In-progress records whose holders claimed them before `claimed_before`
    /// ([`Record::in_progress_claimed_before`]), a page at a time: the first with
    /// `cursor` `None`, each next one with the previous page's `next`. A page may hold
    /// fewer than `limit` records and still have a next one (a store bounds the work
    /// one page does).
    async fn in_progress(
        &self,
        claimed_before: Millis,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<InProgressPage, StoreError>;

    /// Where this store announces purges to the other processes that share it;
    /// `None` when none does (the memory store).
    fn purge_channel(&self) -> Option<Arc<dyn PurgeChannel>> {
        None
    }

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

/// The operations every [`Store`] has, derived from its primitives (implemented for
/// every store; there is nothing to implement).
#[async_trait]
pub trait StoreExt: Store {
    /// [`Store::claim_with_record`]'s decision.
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

    /// Purges the key's record as an operator asked, at the store's `now`: refused
    /// while an attempt holds it under a live lease, unless `force`
    /// ([`idem_core::decide_purge`]). The delete is a compare-and-delete of the record
    /// the decision read, decided again when a concurrent write changed it — on the same
    /// attempt in the same state only (a renewed lease), never on a completion or a
    /// claim that landed meanwhile.
    async fn purge(&self, key: &RecordKey, now: Millis, force: bool) -> Result<Purged, StoreError> {
        self.purge_expecting(key, now, force, None).await
    }

    /// [`Self::purge`] of the record an operator saw: deleted only while it is still
    /// `expected`'s attempt in `expected`'s state, [`Purged::Changed`] otherwise (an
    /// orphan listed a minute ago whose holder has completed it since).
    async fn purge_expecting(
        &self,
        key: &RecordKey,
        now: Millis,
        force: bool,
        expected: Option<idem_core::PurgeTarget>,
    ) -> Result<Purged, StoreError> {
        const ATTEMPTS: u32 = 8;
        let mut target = expected;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                // A write raced the purge (a holder's completion, a write-behind): let
                // it land, then read again.
                tokio::time::sleep(std::time::Duration::from_millis(10 << attempt)).await;
            }
            let record = self.get(key).await?;
            match (
                idem_core::decide_purge(record.as_ref(), target, now, force),
                record,
            ) {
                (idem_core::PurgeDecision::Absent, _) | (_, None) => {
                    // Announced all the same: a purge repeated after a failure half-way
                    // still reaches every replica's cache.
                    if let Some(channel) = self.purge_channel() {
                        channel.publish(key.as_str()).await?;
                    }
                    return Ok(Purged::Absent);
                }
                (idem_core::PurgeDecision::LeaseLive { .. }, Some(r)) => {
                    return Ok(Purged::LeaseLive(r))
                }
                (idem_core::PurgeDecision::Changed, Some(r)) => return Ok(Purged::Changed(r)),
                (idem_core::PurgeDecision::Delete, Some(r)) => {
                    target = Some(idem_core::PurgeTarget::of(&r));
                    let not_before = idem_core::purge_not_before(&r, force);
                    match self.delete_if_same(key, &r, not_before).await? {
                        Deletion::Deleted => return Ok(Purged::Deleted(r)),
                        // The lease is live on the store's clock, whatever ours said.
                        Deletion::TooEarly => return Ok(Purged::LeaseLive(r)),
                        Deletion::Changed => {}
                    }
                }
            }
        }
        Err(StoreError::contention())
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
}

impl<S: Store + ?Sized> StoreExt for S {}

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

#[cfg(test)]
mod tests {
    use super::{StoreError, StoreErrorKind};
    use std::error::Error as _;

    #[test]
    fn a_store_error_keeps_its_cause_and_shows_the_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = StoreError::unavailable("postgres: connecting").with_source(io);
        assert_eq!(e.kind(), StoreErrorKind::Unavailable);
        assert_eq!(e.detail(), "postgres: connecting");
        assert_eq!(
            e.to_string(),
            "store unavailable: postgres: connecting: connection refused"
        );
        let cause = e.source().expect("the cause is kept");
        assert_eq!(
            cause
                .downcast_ref::<std::io::Error>()
                .map(std::io::Error::kind),
            Some(std::io::ErrorKind::ConnectionRefused)
        );
        // Without a detail or a cause: the kind alone.
        assert_eq!(
            StoreError::contention().to_string(),
            "store contention: claim retried too often"
        );
        assert!(StoreError::full("at 10 records").source().is_none());
    }

    /// A cause that shows its own source's text (as a `RedisError` shows its I/O
    /// error, and returns it as its source) is not repeated.
    #[test]
    fn a_cause_already_shown_is_not_repeated() {
        #[derive(Debug)]
        struct Shows(std::io::Error);
        impl std::fmt::Display for Shows {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "Connection refused: {}", self.0)
            }
        }
        impl std::error::Error for Shows {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "os error 111");
        let e = StoreError::unavailable("redis").with_source(Shows(io));
        assert_eq!(
            e.to_string(),
            "store unavailable: redis: Connection refused: os error 111"
        );
    }
}
