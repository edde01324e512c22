//! The write-behind queue of the `async` tiered store: a bounded queue drained by one
//! batching writer (a multi-row upsert per batch, so one commit covers many requests).
//!
//! Back-pressure: a claim reserves two slots before it writes anything — one for the
//! claim, one parked for its completion or release — waiting at most `enqueue_wait`.
//! If the queue is still full (Postgres slower than the traffic, or down), the claim
//! fails with an unavailable [`StoreError`]: it answers 503 and the handler does not run.
//! An accepted claim can therefore always queue its final write without waiting.
//! Heartbeats take a slot only if one is free (the lease in Postgres matters only
//! after Redis lost the record, and the completion carries the final state anyway).
//!
//! Failed batches are retried with backoff until they land. On shutdown the queue is
//! closed and drained, retrying until `drain_deadline`.
//!
//! A writer that must know when its record reached Postgres (a release: see
//! `TieredStore::holder_write`) sends it with `Slot::send_acknowledged`; it is told
//! once the batch that wrote it (or a record of the key that superseded it) committed.

use crate::store::{PostgresStore, StoreError};
use idem_core::{Millis, Record, RecordKey};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;

/// Sizing of the outbox.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct OutboxOptions {
    /// Records the queue holds before writers have to wait.
    pub capacity: usize,
    /// Most records per upsert.
    pub batch: usize,
    /// How long a writer waits for a free slot before failing.
    pub enqueue_wait: Duration,
    /// How long a shutdown keeps retrying to write what is queued.
    pub drain_deadline: Duration,
}

impl Default for OutboxOptions {
    fn default() -> Self {
        OutboxOptions {
            capacity: 10_000,
            batch: 500,
            enqueue_wait: Duration::from_secs(1),
            drain_deadline: Duration::from_secs(10),
        }
    }
}

/// Each setting, from [`OutboxOptions::default`] on (the struct is non-exhaustive: it
/// will grow).
impl OutboxOptions {
    /// Sets `capacity`: records the queue holds before writers have to wait.
    #[must_use]
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// Sets `batch`: most records per upsert.
    #[must_use]
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// Sets `enqueue_wait`: how long a writer waits for a free slot before failing.
    #[must_use]
    pub fn enqueue_wait(mut self, enqueue_wait: Duration) -> Self {
        self.enqueue_wait = enqueue_wait;
        self
    }

    /// Sets `drain_deadline`: how long a shutdown keeps retrying to write what is queued.
    #[must_use]
    pub fn drain_deadline(mut self, drain_deadline: Duration) -> Self {
        self.drain_deadline = drain_deadline;
        self
    }
}

/// A record to write, and who waits for it to be written, if anyone.
type Entry = (RecordKey, Record, Option<oneshot::Sender<()>>);

pub(crate) struct Outbox {
    tx: mpsc::Sender<Entry>,
    enqueue_wait: Duration,
    shutdown: Arc<Notify>,
    writer: Mutex<Option<JoinHandle<u64>>>,
    /// Final-write slots reserved by accepted claims, by (key, token), with the
    /// instant they were parked.
    parked: Mutex<HashMap<(RecordKey, u64), (Slot, Millis)>>,
}

/// Parked slots older than this are given back (a holder that never wrote its final
/// record — its process state was lost, or Redis stayed down — must not pin capacity).
const PARKED_MAX_AGE_MS: u64 = 15 * 60 * 1000;

/// A reserved slot: sending can't fail or wait.
pub(crate) struct Slot(mpsc::OwnedPermit<Entry>);

impl Slot {
    pub(crate) fn send(self, key: RecordKey, record: Record) {
        self.0.send((key, record, None));
        metrics::gauge!("idem_outbox_depth").increment(1.0);
    }

    /// Sends `record`; the receiver hears once Postgres committed it (it is dropped
    /// unheard if the outbox gave up on it: shut down past its drain deadline).
    pub(crate) fn send_acknowledged(self, key: RecordKey, record: Record) -> oneshot::Receiver<()> {
        let (written, heard) = oneshot::channel();
        self.0.send((key, record, Some(written)));
        metrics::gauge!("idem_outbox_depth").increment(1.0);
        heard
    }
}

impl Outbox {
    pub(crate) fn start(pg: Arc<PostgresStore>, options: OutboxOptions) -> Self {
        let (tx, rx) = mpsc::channel(options.capacity.max(1));
        let shutdown = Arc::new(Notify::new());
        let writer = tokio::spawn(write_behind(pg, rx, options.clone(), shutdown.clone()));
        Outbox {
            tx,
            enqueue_wait: options.enqueue_wait,
            shutdown,
            writer: Mutex::new(Some(writer)),
            parked: Mutex::new(HashMap::new()),
        }
    }

    /// Reserves the two slots a claim needs, or neither.
    pub(crate) async fn reserve_pair(&self) -> Result<(Slot, Slot), StoreError> {
        let first = self.reserve().await?;
        let second = self.reserve().await?;
        Ok((first, second))
    }

    /// A slot if one is free now.
    pub(crate) fn try_reserve(&self) -> Option<Slot> {
        self.tx.clone().try_reserve_owned().ok().map(Slot)
    }

    /// Keeps `slot` for the final write of the holder `token` of `key`.
    pub(crate) fn park(&self, key: RecordKey, token: u64, slot: Slot, now: Millis) {
        self.parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((key, token), (slot, now));
    }

    /// The slot parked for this holder, if any.
    pub(crate) fn take_parked(&self, key: &RecordKey, token: u64) -> Option<Slot> {
        self.parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(key.clone(), token))
            .map(|(slot, _)| slot)
    }

    /// Gives back parked slots older than [`PARKED_MAX_AGE_MS`]; returns how many.
    pub(crate) fn purge_parked(&self, now: Millis) -> usize {
        let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        let before = parked.len();
        parked.retain(|_, (_, at)| now.saturating_sub(*at) < PARKED_MAX_AGE_MS);
        before - parked.len()
    }

    /// Reserves a slot, waiting at most `enqueue_wait`.
    pub(crate) async fn reserve(&self) -> Result<Slot, StoreError> {
        match tokio::time::timeout(self.enqueue_wait, self.tx.clone().reserve_owned()).await {
            Ok(Ok(permit)) => Ok(Slot(permit)),
            Ok(Err(_)) => Err(StoreError::unavailable("the outbox is shut down")),
            Err(_) => {
                metrics::counter!("idem_outbox_rejected_total").increment(1);
                Err(StoreError::unavailable(format!(
                    "the outbox is full ({} records waiting for Postgres)",
                    self.tx.max_capacity()
                )))
            }
        }
    }

    /// Stops taking records and writes out everything queued. Returns how many records
    /// the writer wrote over its life.
    pub(crate) async fn flush(&self) -> u64 {
        // Parked slots would hold the queue open: the holders they were kept for are
        // done (the server drained its requests before flushing) or never coming back.
        self.parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.shutdown.notify_one();
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        match writer {
            Some(w) => w.await.unwrap_or(0),
            None => 0,
        }
    }
}

async fn write_behind(
    pg: Arc<PostgresStore>,
    mut rx: mpsc::Receiver<Entry>,
    options: OutboxOptions,
    shutdown: Arc<Notify>,
) -> u64 {
    let mut written = 0u64;
    let mut drain_until: Option<Instant> = None;
    loop {
        let first = tokio::select! {
            entry = rx.recv() => entry,
            // A slot reserved and never used would keep a closed queue open forever.
            _ = tokio::time::sleep_until(drain_until.unwrap_or_else(Instant::now).into()), if drain_until.is_some() => {
                tracing::error!("outbox drain deadline passed with slots still reserved");
                break;
            }
            _ = shutdown.notified(), if drain_until.is_none() => {
                rx.close(); // no new records; what is queued is still delivered
                drain_until = Some(Instant::now() + options.drain_deadline);
                continue;
            }
        };
        let Some(first) = first else { break };
        // Group commit: everything that queued up while the last batch was written.
        let mut batch: HashMap<RecordKey, Record> = HashMap::new();
        let mut waiting = Vec::new();
        let mut next = Some(first);
        let mut taken = 0usize;
        while let Some((key, record, written)) = next.take() {
            taken += 1;
            waiting.extend(written);
            // One row per key per statement: keep the record that supersedes.
            if batch
                .get(&key)
                .is_none_or(|current| record.supersedes(current))
            {
                batch.insert(key, record);
            }
            if taken < options.batch {
                next = rx.try_recv().ok();
            }
        }
        metrics::gauge!("idem_outbox_depth").decrement(taken as f64);
        let rows: Vec<(RecordKey, Record)> = batch.into_iter().collect();
        let mut backoff = Duration::from_millis(20);
        loop {
            match pg.upsert_superseding(&rows).await {
                Ok(_) => {
                    written += rows.len() as u64;
                    metrics::counter!("idem_outbox_written_total").increment(rows.len() as u64);
                    metrics::counter!("idem_outbox_batches_total").increment(1);
                    for w in waiting.drain(..) {
                        let _ = w.send(());
                    }
                    break;
                }
                Err(e) => {
                    metrics::counter!("idem_outbox_failures_total").increment(1);
                    if drain_until.is_some_and(|d| Instant::now() >= d) {
                        metrics::counter!("idem_outbox_lost_total").increment(rows.len() as u64);
                        tracing::error!(error = %e, records = rows.len(), "outbox drain deadline passed; records not written to Postgres");
                        break;
                    }
                    tracing::warn!(error = %e, records = rows.len(), "outbox batch failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
    tracing::info!(written, "outbox drained");
    written
}
