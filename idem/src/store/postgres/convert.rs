//! Converting a table of idem 0.1 to binary keys (`idem-origin convert-keys`).
//!
//! The conversion rewrites the table under an exclusive lock. Replicas already running
//! keep the statements they rendered for text keys at start-up: after it, each of their
//! statements fails (503s), and a handler one of them was running can't store its
//! answer, so once its lease ends a retry runs it again, as after a crash. Hence the
//! conversion is refused while sessions of idem, or that used `idem_records`, are
//! connected. That check is a safety net, not a proof: sessions of another role are
//! seen only by their `application_name` (not their statements) without
//! `pg_read_all_stats`, idem 0.1 set none, and replicas behind a transaction-pooling
//! PgBouncer may hold no server session at the moment. Stopping the replicas is the
//! operator's part.

use super::{connector, id_column_type, unavailable, Connector, IdColumn, MIGRATION_LOCK};
use crate::store::StoreError;
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

/// What [`convert_keys`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Converted {
    /// The table held text keys; now it holds binary keys.
    Rows {
        /// The rows converted.
        rows: u64,
        /// How long the conversion took.
        took: Duration,
    },
    /// The table already held binary keys: nothing was changed.
    AlreadyBinary,
}

/// Converts `idem_records` at `url` to binary keys, in one transaction, under the lock
/// that serialises migrations (a replica starting meanwhile waits, then sees bytea).
/// Refused while other sessions of idem (by their `application_name`), or whose last
/// statement used `idem_records`, are connected (running replicas), unless `force`. `timeout` bounds connecting and the wait for the
/// table's lock, not the rewrite.
pub async fn convert_keys(
    url: &str,
    ca_file: Option<&std::path::Path>,
    timeout: Duration,
    force: bool,
) -> Result<Converted, StoreError> {
    let mut client = match connector(url, timeout, ca_file, None)? {
        Connector::Plain(config) => {
            let (client, connection) = config.connect(NoTls).await.map_err(unavailable)?;
            tokio::spawn(connection);
            client
        }
        Connector::Tls(config, tls) => {
            let (client, connection) = config.connect(tls).await.map_err(unavailable)?;
            tokio::spawn(connection);
            client
        }
    };
    let tx = client.transaction().await.map_err(unavailable)?;
    // Bounds the waits for the migration lock and for the table's, not the rewrite.
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = {}; SET LOCAL statement_timeout = 0",
        timeout.as_millis().max(1)
    ))
    .await
    .map_err(unavailable)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(unavailable)?;
    let column = id_column_type(&tx).await?;
    match column.as_deref().and_then(IdColumn::of_type) {
        Some(IdColumn::Bytes) => return Ok(Converted::AlreadyBinary),
        Some(IdColumn::Text) => {}
        None => {
            return Err(StoreError::unavailable(match column {
                None => "there is no idem_records table on this search_path".into(),
                Some(t) => format!("idem_records.id is of type {t}, neither text nor bytea"),
            }))
        }
    }
    if !force {
        let users = tx
            .query(
                "SELECT pid, coalesce(host(client_addr), 'local'), application_name
                 FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND backend_type = 'client backend'
                   AND (query ILIKE '%idem_records%' OR application_name LIKE 'idem%')
                 ORDER BY pid",
                &[],
            )
            .await
            .map_err(unavailable)?;
        if !users.is_empty() {
            let listed: Vec<String> = users
                .iter()
                .take(5)
                .map(|r| {
                    format!(
                        "pid {} from {} ({:?})",
                        r.get::<_, i32>(0),
                        r.get::<_, String>(1),
                        r.get::<_, String>(2)
                    )
                })
                .collect();
            return Err(StoreError::unavailable(format!(
                "{} other sessions have used idem_records, replicas still running ({}): stop \
                 every replica first (a handler one is running would run again after its \
                 lease), or pass --force if they are not idem's",
                users.len(),
                listed.join(", ")
            )));
        }
    }
    let started = Instant::now();
    tx.batch_execute(include_str!("0003_binary_ids.sql"))
        .await
        .map_err(unavailable)?;
    tx.execute(
        "INSERT INTO idem_schema_migrations (version) VALUES (3) ON CONFLICT DO NOTHING",
        &[],
    )
    .await
    .map_err(unavailable)?;
    let rows: i64 = tx
        .query_one("SELECT count(*) FROM idem_records", &[])
        .await
        .map_err(unavailable)?
        .get(0);
    tx.commit().await.map_err(unavailable)?;
    Ok(Converted::Rows {
        rows: u64::try_from(rows).unwrap_or(0),
        took: started.elapsed(),
    })
}
