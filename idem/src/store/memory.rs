//! The embedded default store: a map behind a mutex. Fast, and gone when the process
//! exits — not durable, and not shared between processes.
//!
//! Bounded: keys are chosen by clients, so a map without a cap grows with every new
//! key until the process dies. A claim that would take the store past its records or
//! bytes is refused (a full [`StoreError`], `503 …:store-full`), and nothing runs; a
//! claim already admitted always stores its answer (refusing it would lose the outcome
//! of a handler that ran), so the bytes may pass the cap by the answers in flight.

use super::{Deletion, HolderWrite, InProgressPage, Store, StoreError};
use async_trait::async_trait;
use idem_core::{
    decide, Decision, Fingerprint, Holder, Millis, Policy, Record, RecordKey, Transition,
};
use std::collections::HashMap;
use std::sync::Mutex;

/// An in-process store.
pub struct MemoryStore {
    records: Mutex<Records>,
    max_records: usize,
    max_bytes: usize,
}

/// The records and the bytes they take, kept together under one lock.
#[derive(Default)]
struct Records {
    map: HashMap<RecordKey, Record>,
    bytes: usize,
}

impl Records {
    fn get(&self, key: &RecordKey) -> Option<&Record> {
        self.map.get(key)
    }

    fn insert(&mut self, key: &RecordKey, record: Record) {
        self.bytes += weight(key, &record);
        if let Some(old) = self.map.insert(key.clone(), record) {
            self.bytes -= weight(key, &old);
        }
    }

    fn remove(&mut self, key: &RecordKey) {
        if let Some(old) = self.map.remove(key) {
            self.bytes -= weight(key, &old);
        }
    }
}

/// About the bytes a record takes in the map: its key, its stored answer, and a fixed
/// allowance for the entry, the fingerprint and the record's fields.
fn weight(key: &RecordKey, record: &Record) -> usize {
    const ENTRY: usize = 128;
    let answer = match record {
        Record::InProgress { .. } => 0,
        Record::Completed { response, .. } => {
            response.body.len()
                + response
                    .headers
                    .iter()
                    .map(|(name, value)| name.len() + value.len() + 48)
                    .sum::<usize>()
        }
    };
    ENTRY + key.as_str().len() + answer
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// The most records a store from [`MemoryStore::new`] holds.
    pub const DEFAULT_MAX_RECORDS: usize = 1_000_000;
    /// The most bytes (about) a store from [`MemoryStore::new`] holds: 256 MiB.
    pub const DEFAULT_MAX_BYTES: usize = 256 * 1024 * 1024;

    /// An empty store of at most [`DEFAULT_MAX_RECORDS`](Self::DEFAULT_MAX_RECORDS)
    /// records and [`DEFAULT_MAX_BYTES`](Self::DEFAULT_MAX_BYTES) bytes.
    pub fn new() -> Self {
        Self::bounded(Self::DEFAULT_MAX_RECORDS, Self::DEFAULT_MAX_BYTES)
    }

    /// An empty store that admits a new claim only while it holds fewer than
    /// `max_records` records taking less than `max_bytes` (about: keys, answers and a
    /// fixed allowance per record).
    pub fn bounded(max_records: usize, max_bytes: usize) -> Self {
        MemoryStore {
            records: Mutex::new(Records::default()),
            max_records,
            max_bytes,
        }
    }

    /// How many records are held (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// About the bytes the records take (what the cap counts).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Records> {
        // A panic while holding the lock can't leave a half-written record (every
        // write is a single insert/remove), so a poisoned map is still consistent.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why a claim of a key not held cannot be admitted, if it cannot.
    fn full(&self, records: &Records) -> Option<String> {
        if records.map.len() >= self.max_records {
            return Some(format!(
                "the memory store holds its maximum of {} records",
                self.max_records
            ));
        }
        (records.bytes >= self.max_bytes).then(|| {
            format!(
                "the memory store's records take its maximum of {} bytes",
                self.max_bytes
            )
        })
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
            // A key already held (expired, or taken over) takes no new entry.
            if map.get(key).is_none() {
                if let Some(why) = self.full(&map) {
                    return Err(StoreError::full(why));
                }
            }
            map.insert(key, c.record.clone());
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
        map.insert(key, change.record(holder, now, policy));
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
        let records = self.lock();
        let mut found: Vec<(RecordKey, Record)> = records
            .map
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
            .map
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
