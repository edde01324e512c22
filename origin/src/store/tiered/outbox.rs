//! The write-behind queue of the `async` tiered store: a bounded queue drained by one
//! batching writer (a multi-row upsert per batch, so one commit covers many requests).
//!
//! Back-pressure: a writer of the hot path first reserves a slot, waiting at most
//! `enqueue_wait`; if the queue is still full (Postgres slower than the traffic, or
//! down), the operation fails with [`StoreError::Unavailable`] before anything is
//! written — a claim then answers 503 and the handler does not run.
//!
//! Failed batches are retried with backoff until they land. On shutdown the queue is
//! closed and drained, retrying until `drain_deadline`.

use crate::store::{PostgresStore, StoreError};
use idem_core::{Record, RecordKey};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

/// Sizing of the outbox.
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

type Entry = (RecordKey, Record);

pub(crate) struct Outbox {
    tx: mpsc::Sender<Entry>,
    enqueue_wait: Duration,
    shutdown: Arc<Notify>,
    writer: Mutex<Option<JoinHandle<u64>>>,
}

/// A reserved slot: sending can't fail or wait.
pub(crate) struct Slot(mpsc::OwnedPermit<Entry>);

impl Slot {
    pub(crate) fn send(self, key: RecordKey, record: Record) {
        self.0.send((key, record));
        metrics::gauge!("idem_outbox_depth").increment(1.0);
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
        }
    }

    /// Reserves a slot, waiting at most `enqueue_wait`.
    pub(crate) async fn reserve(&self) -> Result<Slot, StoreError> {
        match tokio::time::timeout(self.enqueue_wait, self.tx.clone().reserve_owned()).await {
            Ok(Ok(permit)) => Ok(Slot(permit)),
            Ok(Err(_)) => Err(StoreError::Unavailable("the outbox is shut down".into())),
            Err(_) => {
                metrics::counter!("idem_outbox_rejected_total").increment(1);
                Err(StoreError::Unavailable(format!(
                    "the outbox is full ({} records waiting for Postgres)",
                    self.tx.max_capacity()
                )))
            }
        }
    }

    /// Stops taking records and writes out everything queued. Returns how many records
    /// the writer wrote over its life.
    pub(crate) async fn flush(&self) -> u64 {
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
            _ = shutdown.notified(), if drain_until.is_none() => {
                rx.close(); // no new records; what is queued is still delivered
                drain_until = Some(Instant::now() + options.drain_deadline);
                continue;
            }
        };
        let Some(first) = first else { break };
        // Group commit: everything that queued up while the last batch was written.
        let mut batch: HashMap<RecordKey, Record> = HashMap::new();
        let mut next = Some(first);
        let mut taken = 0usize;
        while let Some((key, record)) = next.take() {
            taken += 1;
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
        let rows: Vec<Entry> = batch.into_iter().collect();
        let mut backoff = Duration::from_millis(20);
        loop {
            match pg.upsert_superseding(&rows).await {
                Ok(_) => {
                    written += rows.len() as u64;
                    metrics::counter!("idem_outbox_written_total").increment(rows.len() as u64);
                    metrics::counter!("idem_outbox_batches_total").increment(1);
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
