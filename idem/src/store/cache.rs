//! A bounded in-process cache of completed records in front of any store, so that a
//! replay costs no backend round trip.
//!
//! Safe because a completed record never changes until it expires: takeovers,
//! heartbeats and releases only ever replace an in-progress record, and the sweeper
//! deletes only expired ones. An entry is used only while the core still decides to
//! replay it (or to refuse a different request with its key), so it stops answering
//! the moment the record expires. In-progress records are never cached.

use super::{HolderWrite, Store, StoreError};
use async_trait::async_trait;
use idem_core::{
    decide, Decision, Fingerprint, Holder, Millis, Policy, Record, RecordKey, Transition,
};
use quick_cache::sync::Cache;
use quick_cache::Weighter;
use std::sync::Arc;

/// Bookkeeping bytes counted per entry on top of the key and the response.
const ENTRY_OVERHEAD: u64 = 128;

/// A [`Store`] that answers replays of completed records from memory.
pub struct ReplayCache {
    inner: Arc<dyn Store>,
    completed: Cache<String, Arc<Record>, ByWeight>,
}

#[derive(Clone)]
struct ByWeight;

impl Weighter<String, Arc<Record>> for ByWeight {
    fn weight(&self, key: &String, record: &Arc<Record>) -> u64 {
        let response = match &**record {
            Record::Completed { response, .. } => {
                response.body.len()
                    + response
                        .headers
                        .iter()
                        .map(|(n, v)| n.len() + v.len())
                        .sum::<usize>()
            }
            Record::InProgress { .. } => 0,
        };
        (key.len() + response) as u64 + ENTRY_OVERHEAD
    }
}

impl ReplayCache {
    /// Caches up to `max_bytes` of completed records (keys and responses) in front of
    /// `inner`.
    pub fn new(inner: Arc<dyn Store>, max_bytes: u64) -> Self {
        // quick_cache sizes its tables from an entry estimate: assume ~1 KiB each.
        let estimated_entries = (max_bytes / 1024).clamp(16, 1 << 20) as usize;
        ReplayCache {
            inner,
            completed: Cache::with_weighter(estimated_entries, max_bytes, ByWeight),
        }
    }

    fn keep(&self, key: &RecordKey, record: Record) {
        if record.is_completed() {
            self.completed
                .insert(key.as_str().to_owned(), Arc::new(record));
        }
    }
}

#[async_trait]
impl Store for ReplayCache {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn now(&self) -> Millis {
        self.inner.now()
    }

    async fn claim_with_record(
        &self,
        key: &RecordKey,
        fp: &Fingerprint,
        now: Millis,
        policy: &Policy,
    ) -> Result<(Decision, Option<Record>), StoreError> {
        if let Some(record) = self.completed.get(key.as_str()) {
            match decide(Some(&record), fp, now, policy) {
                decision @ (Decision::Replay { .. } | Decision::Mismatch) => {
                    crate::metrics::replay_cache_hit();
                    return Ok((decision, None));
                }
                // Expired: the store decides afresh.
                _ => {
                    self.completed.remove(key.as_str());
                }
            }
        }
        let (decision, record) = self.inner.claim_with_record(key, fp, now, policy).await?;
        if let (Decision::Replay { .. }, Some(r)) = (&decision, &record) {
            self.keep(key, r.clone());
        }
        Ok((decision, record))
    }

    async fn write_as_holder(
        &self,
        key: &RecordKey,
        holder: &Holder,
        change: &Transition,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        let written = self
            .inner
            .write_as_holder(key, holder, change, now, policy)
            .await?;
        if let (HolderWrite::Written, Transition::Complete(_)) = (&written, change) {
            // The record the store writes is the core's, so the cache can make the same
            // (its expiry within the store's clock tolerance).
            self.keep(key, change.record(holder, now, policy));
        }
        Ok(written)
    }

    #[cfg(feature = "postgres")]
    fn authority(&self) -> Option<crate::store::postgres::Authority> {
        self.inner.authority()
    }

    async fn committed(
        &self,
        key: &RecordKey,
        holder: &Holder,
        record: &Record,
    ) -> Result<(), StoreError> {
        self.inner.committed(key, holder, record).await?;
        self.keep(key, record.clone());
        Ok(())
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }

    async fn sweep(&self, now: Millis, batch: usize) -> Result<u64, StoreError> {
        self.inner.sweep(now, batch).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush().await
    }
}
