//! Purging records (the admin API), and telling every replica's replay cache.
//!
//! A purge breaks the one rule the replay cache rests on — a completed record never
//! changes before it expires — so every process sharing the store must hear of it.
//! Each shared store has a [`PurgeChannel`] (Postgres `LISTEN`/`NOTIFY`, Redis
//! pub/sub) on which its compare-and-delete announces the key in the same atomic step;
//! [`super::ReplayCache`] listens, and stops answering from memory whenever it cannot
//! prove that it is listening.

use super::StoreError;
use async_trait::async_trait;
use idem_core::{Record, RecordKey};
use tokio::sync::mpsc;

/// What purging a key came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Purged {
    /// The record was deleted; this is what it held.
    Deleted(Record),
    /// The key has no record.
    Absent,
    /// An attempt holds the key under a live lease: not deleted (force to delete it).
    LeaseLive(Record),
    /// A write landed while the purge was deleting: the record became another attempt's,
    /// or its attempt completed (its answer may be with the client already). Not
    /// deleted; this is the record now.
    Changed(Record),
}

/// What a compare-and-delete did ([`super::Store::delete_if_same`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// The record was the one expected, and is deleted.
    Deleted,
    /// The record is no longer the one expected (or is gone): nothing was deleted.
    Changed,
    /// The store's clock has not reached `not_before` yet (a lease still live at the
    /// store's time): nothing was deleted.
    TooEarly,
}

/// A page of in-progress records ([`super::Store::in_progress`]).
#[derive(Clone, Debug, Default)]
pub struct InProgressPage {
    /// The records found, with their keys.
    pub records: Vec<(RecordKey, Record)>,
    /// Where the next page starts; `None` after the last.
    pub next: Option<String>,
}

#[cfg(any(feature = "postgres", feature = "redis"))]
/// Messages longer than this are not record keys nor probes, and are ignored.
pub(crate) const MAX_MESSAGE: usize = 128;

/// Where a shared store announces purges to every process using it.
///
/// Messages are record keys (64 hex digits) or probes (`probe:…`), which a listener
/// publishes to prove to itself that its subscription still hears the channel.
#[async_trait]
pub trait PurgeChannel: Send + Sync {
    /// Subscribes on a connection of its own: every message published from now on,
    /// until that connection is lost, when the receiver closes.
    async fn subscribe(&self) -> Result<mpsc::Receiver<String>, StoreError>;

    /// Announces `message` (a record key whose purge the delete itself could not
    /// announce).
    async fn publish(&self, message: &str) -> Result<(), StoreError>;

    /// Publishes the probe `id` along every path a purge's announcement may take to a
    /// subscriber (each master of a Redis Cluster, say), as messages that start with
    /// `id`; returns them. A subscriber that hears all of them hears purges.
    async fn probe(&self, id: &str) -> Result<Vec<String>, StoreError> {
        self.publish(id).await?;
        Ok(vec![id.to_owned()])
    }
}

#[cfg(any(feature = "postgres", feature = "redis"))]
/// Capacity of a subscription's queue; a listener that falls this far behind is
/// disconnected (and starts over with an empty cache) rather than buffering without
/// bound.
pub(crate) const QUEUE: usize = 4096;

#[cfg(any(feature = "postgres", feature = "redis"))]
/// Hands `message` to the subscriber; `false` when it is gone or too far behind, and
/// the subscription should end.
pub(crate) fn forward(to: &mpsc::Sender<String>, message: String) -> bool {
    if message.len() > MAX_MESSAGE {
        return true;
    }
    to.try_send(message).is_ok()
}
