//! The embedded default store: a map behind a mutex. Fast, and gone when the process
//! exits — not durable, and not shared between processes.

use super::{Deletion, HolderWrite, InProgressPage, Store, StoreError};
use async_trait::async_trait;
use idem_core::{
    decide, Decision, Fingerprint, Holder, Millis, Policy, Record, RecordKey, Transition,
};
use std::collections::HashMap;
use std::sync::Mutex;

/// An in-process store.
#[derive(Default)]
pub struct MemoryStore {
    records: Mutex<HashMap<RecordKey, Record>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records are held (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RecordKey, Record>> {
        // A panic while holding the lock can't leave a half-written record (every
        // write is a single insert/remove), so a poisoned map is still consistent.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    /// Returns no record: this store is a map in the process already, so nothing is
    /// cached in front of it.
    async fn claim_with_record(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        now: Millis,
        policy: &Policy,
    ) -> Result<(Decision, Option<Record>), StoreError> {
        let mut map = self.lock();
        let decision = decide(map.get(key), fingerprint, now, policy);
        if let Decision::Execute(c) | Decision::TakeOver(c) = &decision {
            map.insert(key.clone(), c.record.clone());
        }
        Ok((decision, None))
    }

    async fn write_as_holder(
        &self,
        key: &RecordKey,
        holder: &Holder,
        change: &Transition,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        // The process's clock is this store's clock: `now` needs no check.
        let mut map = self.lock();
        if holder.already_wrote(map.get(key), change, now) {
            return Ok(HolderWrite::Written);
        }
        if let Err(refusal) = holder.check(map.get(key), now) {
            return Ok(HolderWrite::Refused(refusal));
        }
        map.insert(key.clone(), change.record(holder, now, policy));
        Ok(HolderWrite::Written)
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        Ok(self.lock().get(key).cloned())
    }

    async fn delete_if_same(
        &self,
        key: &RecordKey,
        expected: &Record,
        not_before: Millis,
    ) -> Result<Deletion, StoreError> {
        let mut map = self.lock();
        if map.get(key) != Some(expected) {
            return Ok(Deletion::Changed);
        }
        if crate::now() < not_before {
            return Ok(Deletion::TooEarly);
        }
        map.remove(key);
        Ok(Deletion::Deleted)
    }

    async fn in_progress(
        &self,
        claimed_before: Millis,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<InProgressPage, StoreError> {
        let map = self.lock();
        let mut found: Vec<(RecordKey, Record)> = map
            .iter()
            .filter(|(k, r)| {
                r.in_progress_claimed_before(claimed_before)
                    && cursor.is_none_or(|after| k.as_str() > after)
            })
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(page_by_key(found, limit))
    }

    async fn sweep(&self, now: Millis, batch: usize) -> Result<u64, StoreError> {
        // Nothing that has not expired on this store's clock (the process's) goes.
        let now = now.min(crate::now());
        let mut map = self.lock();
        let expired: Vec<RecordKey> = map
            .iter()
            .filter(|(_, r)| r.expires_at() < now)
            .map(|(k, _)| k.clone())
            .take(batch)
            .collect();
        for k in &expired {
            map.remove(k);
        }
        Ok(expired.len() as u64)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The first `limit` of `sorted` (by key), and the last key as the next page's cursor
/// when more follow.
pub(crate) fn page_by_key(mut sorted: Vec<(RecordKey, Record)>, limit: usize) -> InProgressPage {
    let more = sorted.len() > limit;
    sorted.truncate(limit);
    let next = more
        .then(|| sorted.last().map(|(k, _)| k.as_str().to_owned()))
        .flatten();
    InProgressPage {
        records: sorted,
        next,
    }
}
