//! Purges and the in-progress listing for the admin API, and the purge channel:
//! `NOTIFY idem_purge` in the deleting statement, `LISTEN` on a connection of its own.

use super::{sql_i64, unavailable, Connector, PostgresStore};
use crate::store::purge::{forward, Deletion, InProgressPage, PurgeChannel, QUEUE};
use crate::store::{decode, StoreError};
use async_trait::async_trait;
use futures_util::future::poll_fn;
use idem_core::{Millis, Record, RecordKey, TOKENS_PER_MS};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::AsyncMessage;

/// The channel every process of a database listens on. Shared by deployments that
/// share a database (in other schemas): they hear each other's purges, which only
/// costs them a cache entry they did not have.
pub(crate) const CHANNEL: &str = "idem_purge";

impl PostgresStore {
    pub(crate) async fn delete_record_if_same(
        &self,
        key: &RecordKey,
        expected: &Record,
        not_before: Millis,
    ) -> Result<Deletion, StoreError> {
        let expected = expected.encode();
        let not_before = sql_i64(not_before);
        self.with_client(async |client| {
            let stmt = client
                .prepare_cached(&self.sql.delete_if_same)
                .await
                .map_err(unavailable)?;
            let row = client
                .query_one(&stmt, &[&key.as_str(), &expected, &not_before])
                .await
                .map_err(unavailable)?;
            // Not deleted: too early if the clock said so, else the row changed (it may
            // have changed while the delete waited for its lock, after its snapshot).
            Ok(match (row.get::<_, i32>(0), row.get::<_, i64>(1)) {
                (1, _) => Deletion::Deleted,
                (_, now) if now < not_before => Deletion::TooEarly,
                _ => Deletion::Changed,
            })
        })
        .await
    }

    pub(crate) async fn in_progress_records(
        &self,
        claimed_before: Millis,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<InProgressPage, StoreError> {
        let before = sql_i64(claimed_before.saturating_mul(TOKENS_PER_MS));
        // A cursor is the last record key of the previous page: anything else is the
        // caller's mistake (and a bytea table's `decode` would fail on it).
        if let Some(c) = cursor.filter(|c| RecordKey::from_stored(c).is_none()) {
            return Err(StoreError::corrupt(format!("listing cursor {c:?}")));
        }
        let after = cursor.unwrap_or("");
        // One more than asked tells whether a next page exists.
        let fetch = i64::try_from(limit).unwrap_or(i64::MAX - 1) + 1;
        let rows = self
            .with_client(async |client| {
                let stmt = client
                    .prepare_cached(&self.sql.in_progress)
                    .await
                    .map_err(unavailable)?;
                client
                    .query(&stmt, &[&before, &after, &fetch])
                    .await
                    .map_err(unavailable)
            })
            .await?;
        let mut found = Vec::with_capacity(rows.len());
        for row in rows {
            let id: String = row.get(0);
            let key = RecordKey::from_stored(&id)
                .ok_or_else(|| StoreError::corrupt(format!("record key {id:?} is not a key")))?;
            found.push((key, decode(row.get::<_, &[u8]>(1))?));
        }
        Ok(crate::store::memory::page_by_key(found, limit))
    }
}

/// [`PurgeChannel`] over `LISTEN`/`NOTIFY`. Probes go out on the listening connection
/// itself: they need no pooled connection, so a pool busy with claims can't delay
/// them, and they prove that very connection alive.
pub(crate) struct PgPurgeChannel {
    store: PostgresStore,
    listening: std::sync::Mutex<Option<Arc<tokio_postgres::Client>>>,
}

impl PgPurgeChannel {
    pub(super) fn new(store: PostgresStore) -> Self {
        PgPurgeChannel {
            store,
            listening: std::sync::Mutex::new(None),
        }
    }

    fn listening(&self) -> Option<Arc<tokio_postgres::Client>> {
        self.listening
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[async_trait]
impl PurgeChannel for PgPurgeChannel {
    async fn subscribe(&self) -> Result<mpsc::Receiver<String>, StoreError> {
        let store = &self.store;
        let connecting = async {
            // Named, so that an operator (or a test) can tell it from the pools'.
            let name = format!("idem purge listener {}", std::process::id());
            match &store.connector {
                Connector::Plain(config) => {
                    let mut config = config.clone();
                    config.application_name(&name);
                    let (client, connection) = config
                        .connect(tokio_postgres::NoTls)
                        .await
                        .map_err(unavailable)?;
                    listen(client, connection).await
                }
                Connector::Tls(config, tls) => {
                    let mut config = config.clone();
                    config.application_name(&name);
                    let (client, connection) =
                        config.connect(tls.clone()).await.map_err(unavailable)?;
                    listen(client, connection).await
                }
            }
        };
        let (client, messages) = tokio::time::timeout(store.options.timeout, connecting)
            .await
            .map_err(|_| StoreError::unavailable("postgres: LISTEN did not answer in time"))??;
        *self.listening.lock().unwrap_or_else(|p| p.into_inner()) = Some(client);
        Ok(messages)
    }

    async fn publish(&self, message: &str) -> Result<(), StoreError> {
        self.store.publish(message).await
    }

    async fn probe(&self, id: &str) -> Result<Vec<String>, StoreError> {
        let Some(client) = self.listening() else {
            return Err(StoreError::unavailable("not listening"));
        };
        client
            .execute("SELECT pg_notify('idem_purge', $1)", &[&id])
            .await
            .map_err(unavailable)?;
        Ok(vec![id.to_owned()])
    }
}

impl PostgresStore {
    /// Announces `message` on the purge channel, through the pool.
    pub(crate) async fn publish(&self, message: &str) -> Result<(), StoreError> {
        self.with_client(async |client| {
            let stmt = client
                .prepare_cached("SELECT pg_notify('idem_purge', $1)")
                .await
                .map_err(unavailable)?;
            client
                .execute(&stmt, &[&message])
                .await
                .map_err(unavailable)
                .map(drop)
        })
        .await
    }
}

/// Drives `connection` in a task of its own that forwards every notification, sends
/// `LISTEN`, and keeps the client alive for as long as the task runs.
async fn listen<S, T>(
    client: tokio_postgres::Client,
    mut connection: tokio_postgres::Connection<S, T>,
) -> Result<(Arc<tokio_postgres::Client>, mpsc::Receiver<String>), StoreError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (to_listener, received) = mpsc::channel(QUEUE);
    let (keep_client, client_kept) = oneshot::channel::<Arc<tokio_postgres::Client>>();
    tokio::spawn(async move {
        // Holds the client (sent below) until the connection ends.
        let _client = client_kept;
        while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if !forward(&to_listener, n.payload().to_owned()) {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the purge channel's connection failed");
                    break;
                }
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .await
        .map_err(unavailable)?;
    let client = Arc::new(client);
    let _ = keep_client.send(client.clone());
    Ok((client, received))
}
