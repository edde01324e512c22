//! Point reads of many concurrent callers, sent as one statement.
//!
//! The tiered `async` store asks Postgres about every key Redis did not know (its cold
//! path), so each new key costs a read. A statement costs Postgres a backend wake-up and
//! the origin a protocol exchange, whatever it reads. So one task sends the reads, one
//! statement at a time: while a statement is out, callers queue, and the next statement
//! reads for all of them (group commit, as the outbox writes).
//!
//! A caller is answered only by a statement sent after it asked, never by one already
//! in flight, so it sees every write committed before it asked, as its own read would.
//! It waits at most the store's timeout from the moment it asks, the wait for the
//! statement in flight included: when statements take more than half the timeout,
//! queued callers fail (503) where reads of their own might not have.
//!
//! `idem_tiered_cold_read_statements_total` counts the statements,
//! `idem_tiered_cold_reads_total` the reads they answered.

use super::PostgresStore;
use crate::store::StoreError;
use idem_core::{Record, RecordKey};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Most keys per statement.
const BATCH: usize = 256;

type Answer = oneshot::Sender<Result<Option<Record>, StoreError>>;

/// The queue of reads and the task that sends them; dropping it ends the task.
pub(crate) struct BatchedReads {
    queue: mpsc::Sender<(RecordKey, Answer)>,
    pg: Arc<PostgresStore>,
    /// Statements sent so far (read by tests; operators have the metric).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    statements: Arc<AtomicU64>,
}

impl BatchedReads {
    /// Starts the sending task on the current runtime.
    pub(crate) fn start(pg: Arc<PostgresStore>) -> Self {
        let (queue, waiting) = mpsc::channel(BATCH * 4);
        let statements = Arc::new(AtomicU64::new(0));
        tokio::spawn(send_reads(pg.clone(), waiting, statements.clone()));
        BatchedReads {
            queue,
            pg,
            statements,
        }
    }

    /// Statements sent so far.
    #[cfg(feature = "testing")]
    pub(crate) fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// `key`'s record in Postgres, if it has one.
    pub(crate) async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        let timeout = self.pg.timeout();
        let (answer, answered) = oneshot::channel();
        let alone = async || {
            tracing::error!("the batched cold reads' task is gone; reading alone");
            self.pg.get_record(key).await
        };
        let read = async {
            if self.queue.send((key.clone(), answer)).await.is_err() {
                return alone().await; // the task is gone: it can only have panicked
            }
            match answered.await {
                Ok(found) => found,
                Err(_) => alone().await,
            }
        };
        tokio::time::timeout(timeout, read)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::unavailable(format!(
                    "postgres: no answer within {timeout:?}"
                )))
            })
    }
}

async fn send_reads(
    pg: Arc<PostgresStore>,
    mut waiting: mpsc::Receiver<(RecordKey, Answer)>,
    statements: Arc<AtomicU64>,
) {
    let mut reads = Vec::with_capacity(BATCH);
    // Zero when every sender is gone: the store was dropped.
    while waiting.recv_many(&mut reads, BATCH).await > 0 {
        // Callers that gave up (timed out, or their request was dropped) need no read.
        reads.retain(|(_, answer)| !answer.is_closed());
        if !reads.is_empty() {
            statements.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("idem_tiered_cold_read_statements_total").increment(1);
            metrics::counter!("idem_tiered_cold_reads_total").increment(reads.len() as u64);
            answer(&pg, &mut reads).await;
        }
    }
}

/// Reads `reads`' keys in one statement and answers each caller (every one of them
/// with the error, if the statement failed), leaving `reads` empty.
async fn answer(pg: &PostgresStore, reads: &mut Vec<(RecordKey, Answer)>) {
    let rows = {
        let keys: Vec<&str> = reads.iter().map(|(key, _)| key.as_str()).collect();
        pg.get_records(&keys).await
    };
    match rows {
        Ok(rows) => {
            let found: HashMap<String, Result<Record, StoreError>> = rows.into_iter().collect();
            for (key, answer) in reads.drain(..) {
                // Cloned: two callers may ask for one key. A record that does not
                // decode fails its own key's callers only.
                let _ = answer.send(found.get(key.as_str()).cloned().transpose());
            }
        }
        Err(e) => {
            for (_, answer) in reads.drain(..) {
                let _ = answer.send(Err(e.clone()));
            }
        }
    }
}
