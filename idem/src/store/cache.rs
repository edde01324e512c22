//! A bounded in-process cache of completed records in front of any store, so that a
//! replay costs no backend round trip.
//!
//! Safe because a completed record never changes until it expires — takeovers,
//! heartbeats and releases only ever replace an in-progress record, and the sweeper
//! deletes only expired ones — except when an operator purges it. An entry is used
//! only while the core still decides to replay it (or to refuse a different request
//! with its key), and it expires no later than the stored record (a completion the
//! cache learns from a holder's write is kept until the claim's time plus the TTL: the
//! store made its record later than that, maybe much later than the cache can tell).
//! In-progress records are never cached.
//!
//! Purges reach every replica's cache through the store's [`PurgeChannel`]. The cache
//! serves only while it can prove it hears that channel: it publishes a probe every
//! [`PROBE_EVERY`] and stops serving (and empties itself) when one is not heard back
//! within [`PROBE_DEADLINE`] or the subscription ends. So a purge stops replays from
//! every replica's memory within the channel's delivery time while it is healthy, and
//! within [`STALENESS_BOUND`] whatever happens to it.

use super::{Deletion, HolderWrite, InProgressPage, PurgeChannel, Store, StoreError};
use async_trait::async_trait;
use idem_core::{
    decide, Decision, Fingerprint, Holder, Millis, Policy, Record, RecordKey, Transition,
};
use quick_cache::sync::Cache;
use quick_cache::Weighter;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Bookkeeping bytes counted per entry on top of the key and the response.
const ENTRY_OVERHEAD: u64 = 128;

/// How often a listening cache publishes a probe on the purge channel.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(500);
/// How long a probe may take to come back before the cache stops serving.
pub(crate) const PROBE_DEADLINE: Duration = Duration::from_millis(1000);
/// How often the listener looks at its probe.
const TICK: Duration = Duration::from_millis(100);
/// The longest a cache serves an entry after its record was purged, whatever happens
/// to the purge channel: the last probe heard may have been published just before the
/// channel broke; the next is sent a period later (rounded up to a tick) and given up
/// on at its deadline (rounded up to a tick).
pub const STALENESS_BOUND: Duration = Duration::from_millis(
    PROBE_EVERY.as_millis() as u64
        + PROBE_DEADLINE.as_millis() as u64
        + 2 * TICK.as_millis() as u64,
);

/// A [`Store`] that answers replays of completed records from memory.
pub struct ReplayCache {
    inner: Arc<dyn Store>,
    state: Arc<Entries>,
}

/// The entries, and whether they may be served.
struct Entries {
    completed: Cache<String, Arc<Record>, ByWeight>,
    /// Always with a store no other process shares; with a purge channel, only while
    /// the listener hears its own probes.
    serving: AtomicBool,
    /// Moves on every invalidation: a record read before one is not kept after it.
    generation: AtomicU64,
}

impl Entries {
    fn serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }

    /// Forgets `key`. The generation moves first: a record read before this and
    /// inserted after the removal is taken out again by its keeper ([`Self::keep`]).
    fn invalidate(&self, key: &str) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.completed.remove(key);
    }

    /// Stops serving and forgets everything: purges may be missed from now on.
    fn stop_serving(&self) {
        self.serving.store(false, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.completed.clear();
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Keeps a completed `record` read when the generation was `read_at`, unless an
    /// invalidation came in between.
    fn keep(&self, key: &RecordKey, record: Record, read_at: u64) {
        if !record.is_completed() || !self.serving() || self.generation() != read_at {
            return;
        }
        self.completed
            .insert(key.as_str().to_owned(), Arc::new(record));
        if self.generation() != read_at {
            self.completed.remove(key.as_str());
        }
    }
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
    /// `inner`. With a store other processes share, it listens on the store's purge
    /// channel (a task on the current Tokio runtime) and serves once it hears it.
    pub fn new(inner: Arc<dyn Store>, max_bytes: u64) -> Self {
        // quick_cache sizes its tables from an entry estimate, and grows them (rehashing
        // on the response path) past it: a small JSON answer with its key and the
        // bookkeeping weighs ~300 B, so assume 256 B each.
        let estimated_entries = (max_bytes / 256).clamp(16, 1 << 21) as usize;
        let channel = inner.purge_channel();
        let state = Arc::new(Entries {
            completed: Cache::with_weighter(estimated_entries, max_bytes, ByWeight),
            serving: AtomicBool::new(channel.is_none()),
            generation: AtomicU64::new(0),
        });
        if let Some(channel) = channel {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(listen(Arc::downgrade(&state), channel));
                }
                Err(_) => tracing::warn!(
                    "replay cache built outside a Tokio runtime: it cannot hear purges, so it stays off"
                ),
            }
        }
        ReplayCache { inner, state }
    }

    /// Whether the cache answers from memory now (it does not while it cannot prove
    /// that it hears purges).
    pub fn is_serving(&self) -> bool {
        self.state.serving()
    }
}

/// Listens on `channel` for as long as the cache lives: invalidates purged keys,
/// probes the subscription, and serves only while probes come back.
async fn listen(entries: Weak<Entries>, channel: Arc<dyn PurgeChannel>) {
    // Unique among the listeners (a pid is 1 in every container): std's randomly
    // seeded hasher is random enough to tell probes apart.
    let listener = {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        format!("{:016x}", h.finish())
    };
    let mut probes = 0u64;
    loop {
        let subscribed = channel.subscribe().await;
        let Some(state) = entries.upgrade() else {
            return;
        };
        // Purges published while not subscribed were missed: start empty.
        state.stop_serving();
        drop(state);
        let mut messages = match subscribed {
            Ok(messages) => messages,
            Err(e) => {
                tracing::warn!(error = %e, "replay cache: cannot subscribe to purges; replays go to the store");
                tokio::time::sleep(PROBE_DEADLINE).await;
                continue;
            }
        };
        let mut ticks = tokio::time::interval(TICK);
        // Probes are published by a task of their own, so that a slow publish never
        // keeps this loop from reading purges; it reports what it published here.
        let (published_tx, mut published) = tokio::sync::mpsc::channel::<(String, Vec<String>)>(4);
        let mut pending: Option<Probe> = None;
        let mut last_sent: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = ticks.tick() => {
                    let now = tokio::time::Instant::now();
                    if let Some(probe) = &pending {
                        if now.duration_since(probe.sent) >= PROBE_DEADLINE {
                            tracing::warn!("replay cache: a purge probe was not heard back in time; replays go to the store until one is");
                            break;
                        }
                        continue;
                    }
                    if last_sent.is_some_and(|t| now.duration_since(t) < PROBE_EVERY) {
                        continue;
                    }
                    probes += 1;
                    let id = format!("probe:{listener}:{probes}");
                    pending = Some(Probe { id: id.clone(), sent: now, expected: None, heard: Vec::new() });
                    last_sent = Some(now);
                    let (channel, report) = (channel.clone(), published_tx.clone());
                    tokio::spawn(async move {
                        match tokio::time::timeout(PROBE_DEADLINE, channel.probe(&id)).await {
                            Ok(Ok(sent)) => {
                                let _ = report.send((id, sent)).await;
                            }
                            Ok(Err(e)) => tracing::warn!(error = %e, "replay cache: cannot publish a purge probe"),
                            Err(_) => tracing::warn!("replay cache: publishing a purge probe timed out"),
                        }
                    });
                }
                Some((id, sent)) = published.recv() => {
                    if let Some(probe) = pending.as_mut().filter(|p| p.id == id) {
                        probe.expected = Some(sent);
                    }
                }
                message = messages.recv() => {
                    let Some(message) = message else {
                        tracing::warn!("replay cache: the purge subscription ended; replays go to the store until it is back");
                        break;
                    };
                    let Some(state) = entries.upgrade() else {
                        return;
                    };
                    if let Some(probe) = pending.as_mut().filter(|p| message.starts_with(&p.id)) {
                        probe.heard.push(message);
                    } else if !message.starts_with("probe:") {
                        state.invalidate(&message);
                    }
                }
            }
            // Every message the probe was published as heard: the channel works.
            if pending.as_ref().is_some_and(Probe::complete) {
                pending = None;
                if let Some(state) = entries.upgrade() {
                    if !state.serving.swap(true, Ordering::SeqCst) {
                        tracing::info!("replay cache: hearing purges; serving replays from memory");
                    }
                }
            }
        }
        match entries.upgrade() {
            Some(state) => state.stop_serving(),
            None => return,
        }
        tokio::time::sleep(TICK).await;
    }
}

/// A probe in flight.
struct Probe {
    id: String,
    sent: tokio::time::Instant,
    /// The messages it was published as, once the publisher says.
    expected: Option<Vec<String>>,
    heard: Vec<String>,
}

impl Probe {
    fn complete(&self) -> bool {
        self.expected
            .as_ref()
            .is_some_and(|all| all.iter().all(|m| self.heard.contains(m)))
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
        let entries = &self.state;
        if entries.serving() {
            if let Some(record) = entries.completed.get(key.as_str()) {
                match decide(Some(&record), fp, now, policy) {
                    decision @ (Decision::Replay { .. } | Decision::Mismatch) => {
                        crate::metrics::replay_cache_hit();
                        return Ok((decision, None));
                    }
                    // Expired: the store decides afresh.
                    _ => {
                        entries.completed.remove(key.as_str());
                    }
                }
            }
        }
        let read_at = entries.generation();
        let (decision, record) = self.inner.claim_with_record(key, fp, now, policy).await?;
        if let (Decision::Replay { .. }, Some(r)) = (&decision, &record) {
            entries.keep(key, r.clone(), read_at);
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
        let read_at = self.state.generation();
        let written = self
            .inner
            .write_as_holder(key, holder, change, now, policy)
            .await?;
        if let (HolderWrite::Written, Transition::Complete(response)) = (&written, change) {
            // The record the store holds is the core's completion, but made at a time
            // the cache can't know: an earlier write whose reply was lost may have
            // landed long before this one, or the store may have made it at its own
            // time. It was made after the claim, so it expires no earlier than the claim
            // time plus the TTL: the cache keeps it until then, and never replays an
            // answer the store has let go.
            let kept = holder.completed(response.clone(), holder.claimed_at(), policy);
            self.state.keep(key, kept, read_at);
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
        // Not kept here: the record was committed before this call, and a purge heard
        // in between would be undone by keeping it. The first replay reads the store.
        self.inner.committed(key, holder, record).await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }

    async fn delete_if_same(
        &self,
        key: &RecordKey,
        expected: &Record,
        not_before: Millis,
    ) -> Result<Deletion, StoreError> {
        let deleted = self.inner.delete_if_same(key, expected, not_before).await?;
        // This replica forgets it at once, whatever the channel does.
        self.state.invalidate(key.as_str());
        Ok(deleted)
    }

    async fn in_progress(
        &self,
        claimed_before: Millis,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<InProgressPage, StoreError> {
        self.inner.in_progress(claimed_before, cursor, limit).await
    }

    fn purge_channel(&self) -> Option<Arc<dyn PurgeChannel>> {
        self.inner.purge_channel()
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
