//! The authoritative store: one table, `idem_records`, in Postgres.
//!
//! Three claim strategies, chosen with [`PgStrategy`]:
//!
//! * `on-conflict` (default): one statement inserts the claim if absent and returns
//!   the existing record otherwise; the core decides; a takeover or a reclaim of an
//!   expired key is a compare-and-swap on the whole record.
//! * `advisory-lock`: a transaction takes `pg_advisory_xact_lock(hashtext(id))`, reads,
//!   asks the core, writes conditionally (holder writes don't take the lock).
//! * `naive`: SELECT, then INSERT … ON CONFLICT DO UPDATE, with no lock — the classic
//!   race, kept only so the race tests can prove they detect a double execution.
//!
//! Holder writes (heartbeat, complete, release) are one `UPDATE … WHERE token = $t AND
//! state = 0` each: exactly [`idem_core::Holder::check`]'s precondition.
//!
//! Time is Postgres' own: every claim and holder write returns `clock_timestamp()`,
//! decisions over an existing row are made at that time, and a row computed at a
//! time further than the tolerance from it is not written (see [`super::clock`]).

use super::{
    claim_by_cas, decode, holder_write_at, CasRecords, HolderWrite, Insert, Stamp, Store,
    StoreClock, StoreError, Swap, Written,
};
use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use idem_core::{
    decide, Decision, Fingerprint, Holder, Millis, Policy, Record, RecordKey, Transition,
};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::NoTls;

/// How the Postgres store claims a key.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PgStrategy {
    /// `INSERT … ON CONFLICT DO NOTHING` plus compare-and-swap: one round trip per new key.
    OnConflict,
    /// `pg_advisory_xact_lock(hashtext(key))`, then read and write in one transaction.
    AdvisoryLock,
    /// SELECT then INSERT without a lock. Unsafe on purpose: for race tests only
    /// (cargo feature `testing`).
    #[cfg(feature = "testing")]
    Naive,
}

/// Connection and behaviour settings of [`PostgresStore`].
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// Claim strategy.
    pub strategy: PgStrategy,
    /// Pool size.
    pub pool_size: usize,
    /// Bound on connecting, and on each store operation (pool wait included).
    pub timeout: Duration,
    /// `naive` only: how long it dawdles between its SELECT and its INSERT, which
    /// widens the race window so tests see it reliably.
    #[cfg(feature = "testing")]
    pub naive_window: Duration,
    /// CA certificates (PEM) to verify the server with; overrides `sslrootcert`.
    pub ca_file: Option<std::path::PathBuf>,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            strategy: PgStrategy::OnConflict,
            pool_size: 16,
            timeout: Duration::from_secs(5),
            #[cfg(feature = "testing")]
            naive_window: Duration::from_millis(20),
            ca_file: None,
        }
    }
}

/// Each setting, from [`PgOptions::default`] on (the struct is non-exhaustive: it
/// will grow).
impl PgOptions {
    /// Sets `strategy`: claim strategy.
    #[must_use]
    pub fn strategy(mut self, strategy: PgStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Sets `pool_size`: pool size.
    #[must_use]
    pub fn pool_size(mut self, pool_size: usize) -> Self {
        self.pool_size = pool_size;
        self
    }

    /// Sets `timeout`: bound on connecting, and on each store operation (pool wait
    /// included).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    #[cfg(feature = "testing")]
    /// Sets `naive_window`: `naive` only: how long it dawdles between its SELECT and
    /// its INSERT, which widens the race window so tests see it reliably.
    #[must_use]
    pub fn naive_window(mut self, naive_window: Duration) -> Self {
        self.naive_window = naive_window;
        self
    }

    /// Sets `ca_file`: the CA certificates (PEM) to verify the server with; overrides
    /// `sslrootcert`.
    #[must_use]
    pub fn ca_file(mut self, ca_file: Option<std::path::PathBuf>) -> Self {
        self.ca_file = ca_file;
        self
    }
}

/// Postgres-backed [`Store`]. Cloning it shares its pools.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    /// Renewals' own connections: a flood of new claims holding every pooled
    /// connection must not starve the renewals of running holders' leases.
    renewals: renewals::RenewalConnections,
    /// Handlers' transactions' own connections: a handler holding one for as long as
    /// it runs must not starve claims and completions.
    transaction_pool: Pool,
    options: PgOptions,
    /// The statements, for the table's key column.
    sql: Arc<Sql>,
    clock: Arc<StoreClock>,
    /// How to open a connection outside the pools (the purge channel's `LISTEN`).
    connector: Connector,
}

/// A connection's settings and TLS, as the pools open them.
#[derive(Clone)]
enum Connector {
    Plain(tokio_postgres::Config),
    Tls(
        tokio_postgres::Config,
        tokio_postgres_rustls::MakeRustlsConnect,
    ),
}

impl Connector {
    /// Opens a connection outside the pools; `closed` is told when it ends.
    async fn open(
        &self,
        closed: Option<Arc<tokio::sync::Notify>>,
    ) -> Result<deadpool_postgres::ClientWrapper, StoreError> {
        let (client, session) = match self {
            Connector::Plain(config) => {
                let (client, connection) = config.connect(NoTls).await.map_err(unavailable)?;
                (client, tokio::spawn(run_session(connection, closed)))
            }
            Connector::Tls(config, tls) => {
                let (client, connection) =
                    config.connect(tls.clone()).await.map_err(unavailable)?;
                (client, tokio::spawn(run_session(connection, closed)))
            }
        };
        Ok(deadpool_postgres::ClientWrapper::new(client, session))
    }
}

/// Drives a connection until it ends, then tells `closed`.
async fn run_session<S, T>(
    connection: tokio_postgres::Connection<S, T>,
    closed: Option<Arc<tokio::sync::Notify>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let _ = connection.await;
    if let Some(closed) = closed {
        closed.notify_one();
    }
}

const MIGRATIONS: &[(i32, &str)] = &[(1, include_str!("postgres/0001_records.sql"))];
/// Applied only with the table itself, to a table still empty. A table of idem 0.1 keeps
/// its text keys until its operator converts it (docs/stores.md, "Postgres"): converting rewrites
/// the table under an exclusive lock, and replicas of 0.1 can't use it afterwards.
const WITH_NEW_TABLE: &[(i32, &str)] = &[(3, include_str!("postgres/0003_binary_ids.sql"))];
/// Indexes added to an existing table: in the migration when the table is small, else
/// with `CREATE INDEX CONCURRENTLY`, in the background after start-up, outside a
/// transaction and with no statement timeout, so that adding one to a large table
/// neither blocks claims nor holds start-up: (version, index name, statement).
const CONCURRENT_INDEXES: &[(i32, &str, &str)] = &[(
    2,
    "idem_records_in_progress",
    include_str!("postgres/0002_in_progress.sql"),
)];
/// Arbitrary constant: serialises concurrent migrators across processes.
const MIGRATION_LOCK: i64 = 0x1de4_0001;
/// The same for the background index builds (with the schema's hash as second key).
const INDEX_LOCK: i32 = 0x1de4_0002;

#[cfg(feature = "tiered")]
pub(crate) mod batched_reads;
mod convert;
mod purge;
mod renewals;
mod sql;
pub(crate) mod transaction;

pub use convert::{convert_keys, Converted};
pub use sql::IdColumn;
use sql::{Sql, ADVISORY_LOCK, SWEEP};

pub use transaction::{Authority, BeginError, CommitError, FencedTransaction};
/// The Postgres client crates the store is built on, for handlers that run their own
/// statements in a [`FencedTransaction`].
pub use {deadpool_postgres, tokio_postgres};

/// The statements a claim of a new key sends, in order, with the strategy's
/// parameters (`$1` id, `$2` token, `$3` state, `$4` expires_at, `$5` record, `$6`
/// the caller's clock, `$7` its tolerance). The bench runs them under `pgbench` to
/// measure the raw database on the store's own SQL.
#[cfg(feature = "testing")]
pub fn claim_statements(strategy: PgStrategy, id: IdColumn) -> Vec<String> {
    let statements: &[&str] = match strategy {
        PgStrategy::OnConflict => &[sql::CLAIM_INSERT],
        PgStrategy::AdvisoryLock => &[
            "BEGIN",
            ADVISORY_LOCK,
            sql::GET_WITH_CLOCK,
            sql::INSERT_LOCKED,
            "COMMIT",
        ],
        PgStrategy::Naive => &[sql::GET, sql::UPSERT],
    };
    statements.iter().map(|s| id.render(s)).collect()
}

/// The statement a holder's completion sends (`$1` id, `$2` token, `$3` state,
/// `$4` expires_at, `$5` record, `$6` the caller's clock, `$7` its tolerance): the
/// second round trip of every new request.
#[cfg(feature = "testing")]
pub fn completion_statement(id: IdColumn) -> String {
    id.render(sql::HOLDER_WRITE)
}

fn unavailable(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    // Its Display shows the error's sources, where tokio-postgres puts the useful part
    // ("connection refused", the server's message).
    StoreError::unavailable("").with_source(e)
}

/// Tokens and instants are u64 in the core and bigint here; both stay far below 2^63.
fn sql_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The column values of a record, in the order the statements take them.
struct Row {
    token: i64,
    state: i16,
    expires_at: i64,
    record: Vec<u8>,
}

impl Row {
    fn of(record: &Record) -> Row {
        Row {
            token: sql_i64(record.token()),
            state: i16::from(record.state_code()),
            expires_at: sql_i64(record.expires_at()),
            record: record.encode(),
        }
    }
}

type Client = deadpool_postgres::Client;

/// A pooled connection in use. Dropped before its work finished — a statement maybe
/// still running, or still waiting to be sent, on it — it is closed rather than handed
/// to the next caller, who would otherwise wait behind that statement: after a
/// network partition heals, behind TCP's retransmission backoff.
struct InUse(Option<deadpool_postgres::Object>);

impl Drop for InUse {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

/// Connections kept for renewals, besides the pool: a quarter of it, at least two.
fn renewal_connections(pool_size: usize) -> usize {
    (pool_size / 4).max(2)
}

impl PostgresStore {
    /// Closes the lease renewals' connections and stops keeping them open: for a
    /// store that never renews a lease here (the tiered store's `async` mode renews in
    /// Redis).
    #[cfg(feature = "tiered")]
    pub(crate) fn retire_renewals(&self) {
        self.renewals.retire();
    }

    /// How long a statement, pool wait included, may take.
    #[cfg(feature = "tiered")]
    pub(crate) fn timeout(&self) -> Duration {
        self.options.timeout
    }

    /// Connects (bounded by `options.timeout`) and applies pending migrations.
    pub async fn connect(url: &str, options: PgOptions) -> Result<Self, StoreError> {
        // idem's own statements end on the server too when the store timeout gives up
        // on them: one left waiting on a lock would otherwise hold its backend on.
        let pool = pool_with(
            url,
            options.pool_size,
            options.timeout,
            options.ca_file.as_deref(),
            Some(options.timeout),
        )?;
        let renewals = renewals::RenewalConnections::new(
            connector(
                url,
                options.timeout,
                options.ca_file.as_deref(),
                Some(options.timeout),
            )?,
            renewal_connections(options.pool_size),
            options.timeout,
        );
        let transaction_pool = self::pool(
            url,
            options.pool_size,
            options.timeout,
            options.ca_file.as_deref(),
        )?;
        let connector = connector(url, options.timeout, options.ca_file.as_deref(), None)?;
        let mut store = PostgresStore {
            pool,
            renewals,
            transaction_pool,
            options,
            sql: Arc::new(Sql::new(IdColumn::Bytes)),
            clock: Arc::new(StoreClock::new()),
            connector,
        };
        let (pending, id) = store.with_client(async |c| migrate(c).await).await?;
        store.sql = Arc::new(Sql::new(id));
        store.renewals.open(&store.sql.holder_write).await;
        // Indexes too big to build in the migration are built in the background: the
        // listing they speed up works without them.
        if pending && tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(build_indexes(store.connector.clone()));
        }
        Ok(store)
    }

    /// The connection pool, shared with the demo ledger. Its sessions plan without
    /// sequential scans (idem's statements all have an index; see `connector`): a
    /// caller whose own queries need them should use a pool of its own.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// This database as the authority handlers commit their effects in.
    pub fn authority(&self) -> Authority {
        let authority = Authority::new(
            self.transaction_pool.clone(),
            self.sql.clone(),
            self.clock.clone(),
            self.options.timeout,
        );
        match self.options.strategy {
            #[cfg(feature = "testing")]
            PgStrategy::Naive => authority
                .unfenced("the naive claim strategy's upsert can overwrite a completed record"),
            _ => authority,
        }
    }

    /// The claim strategy in use.
    pub fn strategy(&self) -> PgStrategy {
        self.options.strategy
    }

    /// How the table holds records' keys.
    pub fn id_column(&self) -> IdColumn {
        self.sql.id
    }

    /// Runs `f` on a pooled connection; the whole (pool wait included) is bounded by
    /// the store timeout, so an unreachable database answers within it.
    async fn with_client<T>(
        &self,
        f: impl AsyncFnOnce(&mut Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let deadline = tokio::time::Instant::now() + self.options.timeout;
        let client = match tokio::time::timeout_at(deadline, self.pool.get()).await {
            Ok(got) => got.map_err(unavailable)?,
            Err(_) => return Err(self.no_answer()),
        };
        // Closes the connection unless `f` finishes: given up at the deadline, or
        // dropped by the caller.
        let mut client = InUse(Some(client));
        let Some(conn) = client.0.as_mut() else {
            unreachable!("set just above")
        };
        let outcome = tokio::time::timeout_at(deadline, f(conn)).await;
        match outcome {
            Ok(result) => {
                // Finished: back to the pool.
                drop(client.0.take());
                result
            }
            Err(_) => Err(self.no_answer()),
        }
    }

    /// A statement (or getting a connection for it) given up at the store timeout.
    fn no_answer(&self) -> StoreError {
        StoreError::unavailable(format!(
            "postgres: no answer within {:?}",
            self.options.timeout
        ))
    }

    /// Decides at the time the database returns with the row, under the lock that
    /// serialises claims on the key. Holder writes don't take that lock, so the claim
    /// is still written conditionally — inserted if absent, or swapped for exactly the
    /// record decided on — and decided again when a holder wrote in between.
    async fn claim_advisory_lock(
        &self,
        key: &RecordKey,
        fp: &Fingerprint,
        policy: &Policy,
    ) -> Result<Decision, StoreError> {
        for _ in 0..super::shared::MAX_CLAIM_ROUNDS {
            if let Some(decision) = self.claim_advisory_lock_once(key, fp, policy).await? {
                return Ok(decision);
            }
        }
        Err(StoreError::contention())
    }

    /// One locked round: `None` when a holder's write changed the row in between.
    async fn claim_advisory_lock_once(
        &self,
        key: &RecordKey,
        fp: &Fingerprint,
        policy: &Policy,
    ) -> Result<Option<Decision>, StoreError> {
        self.with_client(async |client| {
            let tx = client.transaction().await.map_err(unavailable)?;
            tx.execute(ADVISORY_LOCK, &[&key.as_str()])
                .await
                .map_err(unavailable)?;
            let get = tx
                .prepare_cached(&self.sql.get_with_clock)
                .await
                .map_err(unavailable)?;
            let row = tx
                .query_one(&get, &[&key.as_str()])
                .await
                .map_err(unavailable)?;
            let existing = match row.get::<_, Option<&[u8]>>(0) {
                Some(bytes) => Some(decode(bytes)?),
                None => None,
            };
            let now = self.observe(row.get::<_, i64>(1));
            let decision = decide(existing.as_ref(), fp, now, policy);
            if let Decision::Execute(c) | Decision::TakeOver(c) = &decision {
                let r = Row::of(&c.record);
                let written = match &c.replaces {
                    None => {
                        let insert = tx
                            .prepare_cached(&self.sql.insert_locked)
                            .await
                            .map_err(unavailable)?;
                        tx.execute(
                            &insert,
                            &[&key.as_str(), &r.token, &r.state, &r.expires_at, &r.record],
                        )
                        .await
                        .map_err(unavailable)?
                    }
                    Some(expected) => {
                        let replace = tx
                            .prepare_cached(&self.sql.replace_locked)
                            .await
                            .map_err(unavailable)?;
                        tx.execute(
                            &replace,
                            &[
                                &key.as_str(),
                                &expected.encode(),
                                &r.token,
                                &r.state,
                                &r.expires_at,
                                &r.record,
                            ],
                        )
                        .await
                        .map_err(unavailable)?
                    }
                };
                if written != 1 {
                    tx.rollback().await.map_err(unavailable)?;
                    return Ok(None);
                }
            }
            tx.commit().await.map_err(unavailable)?;
            Ok(Some(decision))
        })
        .await
    }

    /// The bug this project exists to prevent: read, think, write — with nothing
    /// stopping a concurrent retry from doing the same in between.
    #[cfg(feature = "testing")]
    async fn claim_naive(
        &self,
        key: &RecordKey,
        fp: &Fingerprint,
        now: Millis,
        policy: &Policy,
    ) -> Result<Decision, StoreError> {
        let existing = self.get_record(key).await?;
        let decision = decide(existing.as_ref(), fp, now, policy);
        if let Decision::Execute(c) | Decision::TakeOver(c) = &decision {
            tokio::time::sleep(self.options.naive_window).await;
            let r = Row::of(&c.record);
            self.with_client(async |client| {
                let upsert = client
                    .prepare_cached(&self.sql.upsert)
                    .await
                    .map_err(unavailable)?;
                client
                    .execute(
                        &upsert,
                        &[&key.as_str(), &r.token, &r.state, &r.expires_at, &r.record],
                    )
                    .await
                    .map_err(unavailable)
            })
            .await?;
        }
        Ok(decision)
    }

    /// Reads a record.
    pub(crate) async fn get_record(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.with_client(async |client| read_record(client, &self.sql.get, key).await)
            .await
    }

    /// The records of those of `keys` that exist, each with its key, in one statement;
    /// each decoded on its own (one corrupt record fails its key only).
    #[cfg(feature = "tiered")]
    pub(crate) async fn get_records(
        &self,
        keys: &[&str],
    ) -> Result<Vec<(String, Result<Record, StoreError>)>, StoreError> {
        self.with_client(async |client| {
            let stmt = client
                .prepare_cached(&self.sql.get_many)
                .await
                .map_err(unavailable)?;
            let rows = client.query(&stmt, &[&keys]).await.map_err(unavailable)?;
            Ok(rows
                .iter()
                .map(|row| (row.get::<_, String>(0), decode(row.get::<_, &[u8]>(1))))
                .collect())
        })
        .await
    }

    /// Records the database's clock as a statement returned it; returns it as `Millis`.
    fn observe(&self, store_now: i64) -> Millis {
        let now = u64::try_from(store_now).unwrap_or(0);
        self.clock.observe(now);
        now
    }

    /// `UPDATE … WHERE token = $t AND state = 0` under the clock check, in one round
    /// trip that also returns the current row, so a refusal needs no second read.
    pub(crate) async fn holder_write(
        &self,
        key: &RecordKey,
        holder: &Holder,
        change: &Transition,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        holder_write_at(holder, change, now, policy, |next, at| async move {
            let write = async |client: &deadpool_postgres::ClientWrapper| {
                run_holder_write(client, &self.sql, key, holder, &next, at).await
            };
            let (written, store_now, current) = match change {
                Transition::Renew => {
                    let deadline = tokio::time::Instant::now() + self.options.timeout;
                    self.renewals
                        .with(deadline, || self.no_answer(), write)
                        .await?
                }
                _ => self.with_client(async |client| write(client).await).await?,
            };
            let store_now = self.observe(store_now);
            if written {
                return Ok(Written::Done);
            }
            if !at.accepted_by(store_now) {
                return Ok(Written::Skewed(store_now));
            }
            Ok(Written::Refused(current.map(|b| decode(&b)).transpose()?))
        })
        .await
    }

    /// Writes a batch behind (the tiered store's outbox): one statement, one commit.
    /// `batch` must hold each key at most once.
    #[cfg_attr(not(feature = "tiered"), allow(dead_code))]
    pub(crate) async fn upsert_superseding(
        &self,
        batch: &[(RecordKey, Record)],
    ) -> Result<u64, StoreError> {
        let ids: Vec<&str> = batch.iter().map(|(k, _)| k.as_str()).collect();
        let rows: Vec<Row> = batch.iter().map(|(_, r)| Row::of(r)).collect();
        let tokens: Vec<i64> = rows.iter().map(|r| r.token).collect();
        let states: Vec<i16> = rows.iter().map(|r| r.state).collect();
        let expiries: Vec<i64> = rows.iter().map(|r| r.expires_at).collect();
        let records: Vec<&[u8]> = rows.iter().map(|r| r.record.as_slice()).collect();
        self.with_client(async |client| {
            let stmt = client
                .prepare_cached(&self.sql.upsert_superseding)
                .await
                .map_err(unavailable)?;
            client
                .execute(&stmt, &[&ids, &tokens, &states, &expiries, &records])
                .await
                .map_err(unavailable)
        })
        .await
    }
}

/// Reads the key's record with `statement` (`$1` the key, one `record` column: [`GET`],
/// or a locking variant) on `client`, pooled or in a handler's transaction.
async fn read_record(
    client: &deadpool_postgres::ClientWrapper,
    statement: &str,
    key: &RecordKey,
) -> Result<Option<Record>, StoreError> {
    let stmt = client
        .prepare_cached(statement)
        .await
        .map_err(unavailable)?;
    let row = client
        .query_opt(&stmt, &[&key.as_str()])
        .await
        .map_err(unavailable)?;
    row.map(|r| decode(r.get::<_, &[u8]>(0))).transpose()
}

/// Runs [`HOLDER_WRITE`] for `holder`'s record `next`, computed at `at`, on `client`
/// (pooled, or a handler's transaction): whether it wrote, the database's clock, and
/// the row as the statement saw it.
async fn run_holder_write(
    client: &deadpool_postgres::ClientWrapper,
    sql: &Sql,
    key: &RecordKey,
    holder: &Holder,
    next: &Record,
    at: Stamp,
) -> Result<(bool, i64, Option<Vec<u8>>), StoreError> {
    let r = Row::of(next);
    let stmt = client
        .prepare_cached(&sql.holder_write)
        .await
        .map_err(unavailable)?;
    let row = client
        .query_one(
            &stmt,
            &[
                &key.as_str(),
                &sql_i64(holder.token),
                &r.state,
                &r.expires_at,
                &r.record,
                &sql_i64(at.now),
                &sql_i64(at.tolerance),
            ],
        )
        .await
        .map_err(unavailable)?;
    Ok((
        row.get::<_, i32>(0) == 1,
        row.get::<_, i64>(1),
        row.get::<_, Option<Vec<u8>>>(2),
    ))
}

/// Applies pending migrations. Returns whether an index is left to build in the
/// background, and how the table holds keys.
async fn migrate(client: &mut Client) -> Result<(bool, IdColumn), StoreError> {
    let tx = client.transaction().await.map_err(unavailable)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(unavailable)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS idem_schema_migrations (
            version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .map_err(unavailable)?;
    let applied: Vec<i32> = tx
        .query("SELECT version FROM idem_schema_migrations", &[])
        .await
        .map_err(unavailable)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let new_table = !applied.contains(&1);
    let with_new_table = WITH_NEW_TABLE.iter().filter(|_| new_table);
    for (version, sql) in MIGRATIONS.iter().chain(with_new_table) {
        if !applied.contains(version) {
            tx.batch_execute(sql).await.map_err(unavailable)?;
            tx.execute(
                "INSERT INTO idem_schema_migrations (version) VALUES ($1)",
                &[version],
            )
            .await
            .map_err(unavailable)?;
            tracing::info!(version, "applied migration");
        }
    }
    // An index on a table small enough (a new one, say) is built right here, in the
    // migration; on a big table it would hold claims up: that one is built concurrently,
    // in the background.
    let rows: f64 = tx
        .query_one(
            "SELECT COALESCE((SELECT reltuples FROM pg_class WHERE oid = to_regclass('idem_records')), 0)::float8",
            &[],
        )
        .await
        .map_err(unavailable)?
        .get(0);
    let mut pending = false;
    for (version, _, sql) in CONCURRENT_INDEXES {
        if applied.contains(version) {
            continue;
        }
        if rows < SMALL_TABLE_ROWS {
            tx.batch_execute(&sql.replace(" CONCURRENTLY", ""))
                .await
                .map_err(unavailable)?;
            tx.execute(
                "INSERT INTO idem_schema_migrations (version) VALUES ($1)",
                &[version],
            )
            .await
            .map_err(unavailable)?;
            tracing::info!(version, "applied migration");
        } else {
            pending = true;
        }
    }
    let id = id_column(&*tx).await?;
    tx.commit().await.map_err(unavailable)?;
    Ok((pending, id))
}

/// The type of `idem_records.id` on the search path (`format_type`), if the table exists.
async fn id_column_type(
    client: &impl tokio_postgres::GenericClient,
) -> Result<Option<String>, StoreError> {
    Ok(client
        .query_opt(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute
             WHERE attrelid = to_regclass('idem_records') AND attname = 'id' AND NOT attisdropped",
            &[],
        )
        .await
        .map_err(unavailable)?
        .map(|row| row.get(0)))
}

/// How `idem_records` on `client`'s search path holds keys; an error if there is no such
/// table or its `id` is neither `text` nor `bytea`.
pub async fn id_column(
    client: &impl tokio_postgres::GenericClient,
) -> Result<IdColumn, StoreError> {
    let column = id_column_type(client).await?;
    column
        .as_deref()
        .and_then(IdColumn::of_type)
        .ok_or_else(|| {
            StoreError::unavailable(format!(
                "idem_records.id is of type {}: idem uses bytea, or text as idem 0.1 created it",
                column.as_deref().unwrap_or("(none)")
            ))
        })
}

/// Below this many rows (Postgres' estimate) an index is built in the migration itself.
const SMALL_TABLE_ROWS: f64 = 100_000.0;

/// Builds [`CONCURRENT_INDEXES`] not built yet, for as long as it takes: one replica at
/// a time (a session advisory lock, polled with `pg_try_advisory_lock` so that a waiting
/// replica holds no snapshot the build would wait for); an invalid index left by a
/// build that failed half-way is dropped and built again.
async fn build_indexes(connector: Connector) {
    for (version, index, sql) in CONCURRENT_INDEXES {
        let mut waited = 0u32;
        loop {
            match build_index(&connector, *version, index, sql).await {
                Ok(true) => break,
                Ok(false) => {
                    waited += 1;
                    if waited == 60 {
                        tracing::info!(index, "another replica is still building an index");
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => {
                    tracing::warn!(index, error = %e, "building an index failed; trying again in 30 s");
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
            }
        }
    }
}

/// Whether migration `version` is recorded.
async fn index_done(client: &tokio_postgres::Client, version: i32) -> Result<bool, StoreError> {
    client
        .query_one(
            "SELECT count(*) FROM idem_schema_migrations WHERE version = $1",
            &[&version],
        )
        .await
        .map(|row| row.get::<_, i64>(0) > 0)
        .map_err(unavailable)
}

/// One attempt: `Ok(true)` when the index is there (built now or before), `Ok(false)`
/// when another replica holds the lock.
async fn build_index(
    connector: &Connector,
    version: i32,
    index: &str,
    sql: &str,
) -> Result<bool, StoreError> {
    let client = connector.open(None).await?;
    if index_done(&client, version).await? {
        return Ok(true);
    }
    let locked: bool = client
        // Per schema: deployments in other schemas build theirs at the same time.
        .query_one(
            "SELECT pg_try_advisory_lock($1, hashtext(current_schema()))",
            &[&INDEX_LOCK],
        )
        .await
        .map_err(unavailable)?
        .get(0);
    if !locked {
        return Ok(false);
    }
    // The lock is the session's: it goes with the connection, whatever happens here.
    if index_done(&client, version).await? {
        return Ok(true);
    }
    let invalid: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             WHERE c.relname = $1 AND c.relnamespace = current_schema()::text::regnamespace
               AND NOT i.indisvalid",
            &[&index],
        )
        .await
        .map_err(unavailable)?
        .get(0);
    if invalid > 0 {
        client
            .batch_execute(&format!("DROP INDEX CONCURRENTLY IF EXISTS {index}"))
            .await
            .map_err(unavailable)?;
    }
    client.batch_execute(sql).await.map_err(unavailable)?;
    client
        .execute(
            "INSERT INTO idem_schema_migrations (version) VALUES ($1) ON CONFLICT DO NOTHING",
            &[&version],
        )
        .await
        .map_err(unavailable)?;
    tracing::info!(version, index, "built index");
    Ok(true)
}

/// A bounded pool for `url` (TLS as its `sslmode` says; see [`super::tls`]);
/// connecting is lazy, so this never blocks.
pub(crate) fn pool(
    url: &str,
    size: usize,
    timeout: Duration,
    ca_file: Option<&std::path::Path>,
) -> Result<Pool, StoreError> {
    pool_with(url, size, timeout, ca_file, None)
}

/// [`pool`] for idem's own statements: ended by the server after `statement_timeout`,
/// and planned without sequential scans (see [`connector`]).
fn pool_with(
    url: &str,
    size: usize,
    timeout: Duration,
    ca_file: Option<&std::path::Path>,
    statement_timeout: Option<Duration>,
) -> Result<Pool, StoreError> {
    let recycling = || ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match connector(url, timeout, ca_file, statement_timeout)? {
        Connector::Plain(config) => Manager::from_config(config, NoTls, recycling()),
        Connector::Tls(config, tls) => Manager::from_config(config, tls, recycling()),
    };
    Pool::builder(manager)
        .max_size(size.max(1))
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(timeout))
        .create_timeout(Some(timeout))
        .recycle_timeout(Some(timeout))
        .build()
        .map_err(|e| StoreError::unavailable(format!("cannot build the connection pool: {e}")))
}

/// Whether every host of `config` is this machine (a Unix socket, `localhost`, a
/// loopback address): no network to be in the middle of.
fn only_loopback(config: &tokio_postgres::Config) -> bool {
    // With `hostaddr`, those addresses are what is connected to.
    let addrs = config.get_hostaddrs();
    if !addrs.is_empty() {
        return addrs.iter().all(std::net::IpAddr::is_loopback);
    }
    config.get_hosts().iter().all(|host| match host {
        tokio_postgres::config::Host::Tcp(name) => {
            name.eq_ignore_ascii_case("localhost")
                || name
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(_) => true,
    })
}

/// Whether every host of `config` is a Unix socket, where libpq never uses TLS.
fn only_unix_sockets(config: &tokio_postgres::Config) -> bool {
    #[cfg(unix)]
    let unix =
        |host: &tokio_postgres::config::Host| matches!(host, tokio_postgres::config::Host::Unix(_));
    #[cfg(not(unix))]
    let unix = |_: &tokio_postgres::config::Host| false;
    config.get_hostaddrs().is_empty()
        && !config.get_hosts().is_empty()
        && config.get_hosts().iter().all(unix)
}

/// How to connect to `url`: its settings, and TLS as its `sslmode` says (see
/// [`super::tls`]).
fn connector(
    url: &str,
    timeout: Duration,
    ca_file: Option<&std::path::Path>,
    statement_timeout: Option<Duration>,
) -> Result<Connector, StoreError> {
    let invalid = |e: String| StoreError::unavailable(format!("invalid database URL: {e}"));
    let tls = super::tls::split_pg_url(url).map_err(|e| invalid(e.into()))?;
    let mut config =
        tokio_postgres::Config::from_str(&tls.url).map_err(|e| invalid(e.to_string()))?;
    config.connect_timeout(timeout);
    // Names idem's sessions in `pg_stat_activity`, unless the URL names them.
    if config.get_application_name().is_none() {
        config.application_name("idem");
    }
    if let Some(limit) = statement_timeout {
        // Every statement idem sends on these pools has an index to use. A table
        // analysed while (nearly) empty makes a sequential scan look cheaper, and a
        // prepared statement keeps that plan as the table grows (docs/stores.md has the
        // measure): without sequential scans the plan is the index's, whatever the
        // statistics say. Handlers' transactions keep their sessions' settings
        // (transaction.rs turns scans off for idem's statements in them). A session
        // idle inside one of idem's transactions for as long was frozen (SIGSTOP, a VM
        // paused) holding its locks: the server ends it.
        let setting = format!(
            "-c statement_timeout={ms} -c idle_in_transaction_session_timeout={ms} \
             -c enable_seqscan=off",
            ms = limit.as_millis().max(1)
        );
        let options = match config.get_options() {
            Some(given) if !given.is_empty() => format!("{given} {setting}"),
            _ => setting,
        };
        config.options(&options);
    }
    // A peer that vanished (host down, connection cut without a reset) is noticed in
    // about half a minute, not after the kernel's default two hours.
    config
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(15))
        .keepalives_interval(Duration::from_secs(5))
        .keepalives_retries(3);
    match tls.verify {
        None if ca_file.is_some() || tls.ca_file.is_some() => Err(invalid(
            "sslmode=disable with a CA file (sslrootcert or --database-ca-file): the CA \
             would verify nothing. Use sslmode=verify-full, or drop the CA"
                .into(),
        )),
        None => Ok(Connector::Plain(config)),
        Some(verify) => {
            let ca = ca_file.map(std::path::Path::to_path_buf).or(tls.ca_file);
            // A CA given is a CA used: `prefer`/`require` with one verify the chain
            // (as libpq does with a root certificate), never silently ignore it — and
            // TLS is then required: under `prefer`, a man in the middle who answers the
            // SSLRequest with `N` would get the session in plain text, CA or not.
            let verify = match (verify, &ca) {
                (super::tls::Verify::Nothing, Some(_)) => super::tls::Verify::Chain,
                (v, _) => v,
            };
            if ca.is_some() && !only_unix_sockets(&config) {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
            } else if verify == super::tls::Verify::Nothing && !only_loopback(&config) {
                tracing::warn!(
                    "Postgres TLS is unverified (sslmode prefer or require without a CA) to a \
                     host off this machine: anyone on the path can read or change the \
                     records (and under prefer, strip TLS). Use sslmode=verify-full with \
                     sslrootcert or --database-ca-file"
                );
            }
            let client = super::tls::client_config(verify, ca.as_deref())
                .map_err(StoreError::unavailable)?;
            Ok(Connector::Tls(
                config,
                tokio_postgres_rustls::MakeRustlsConnect::new(client),
            ))
        }
    }
}

#[async_trait]
impl CasRecords for PostgresStore {
    /// One statement: insert if absent (and the clocks agree), and otherwise return
    /// the existing row; with the database's clock.
    async fn insert_if_absent(
        &self,
        key: &RecordKey,
        record: &Record,
        at: Stamp,
    ) -> Result<(Insert, Millis), StoreError> {
        let r = Row::of(record);
        let (inserted, existing, store_now) = self
            .with_client(async |client| {
                let stmt = client
                    .prepare_cached(&self.sql.claim_insert)
                    .await
                    .map_err(unavailable)?;
                let row = client
                    .query_one(
                        &stmt,
                        &[
                            &key.as_str(),
                            &r.token,
                            &r.state,
                            &r.expires_at,
                            &r.record,
                            &sql_i64(at.now),
                            &sql_i64(at.tolerance),
                        ],
                    )
                    .await
                    .map_err(unavailable)?;
                Ok((
                    row.get::<_, i32>(0) == 1,
                    row.get::<_, Option<Vec<u8>>>(1),
                    row.get::<_, i64>(2),
                ))
            })
            .await?;
        let store_now = self.observe(store_now);
        let found = match (inserted, existing) {
            (true, _) => Insert::Stored,
            (false, Some(bytes)) => Insert::Existing(decode(&bytes)?),
            (false, None) if !at.accepted_by(store_now) => Insert::Skewed,
            // The winner committed after this statement's snapshot: not visible yet.
            (false, None) => Insert::NotYetVisible,
        };
        Ok((found, store_now))
    }

    async fn replace(
        &self,
        key: &RecordKey,
        expected: &Record,
        record: &Record,
        at: Stamp,
    ) -> Result<(Swap, Millis), StoreError> {
        let r = Row::of(record);
        let expected = expected.encode();
        let (replaced, store_now) = self
            .with_client(async |client| {
                let stmt = client
                    .prepare_cached(&self.sql.replace)
                    .await
                    .map_err(unavailable)?;
                let row = client
                    .query_one(
                        &stmt,
                        &[
                            &key.as_str(),
                            &expected,
                            &r.token,
                            &r.state,
                            &r.expires_at,
                            &r.record,
                            &sql_i64(at.now),
                            &sql_i64(at.tolerance),
                        ],
                    )
                    .await
                    .map_err(unavailable)?;
                Ok((row.get::<_, i32>(0) == 1, row.get::<_, i64>(1)))
            })
            .await?;
        let store_now = self.observe(store_now);
        let swap = if replaced {
            Swap::Replaced
        } else if !at.accepted_by(store_now) {
            Swap::Skewed
        } else {
            Swap::Changed
        };
        Ok((swap, store_now))
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn now(&self) -> Millis {
        self.clock.now()
    }

    fn authority(&self) -> Option<Authority> {
        Some(PostgresStore::authority(self))
    }

    async fn claim_with_record(
        &self,
        key: &RecordKey,
        fp: &Fingerprint,
        now: Millis,
        policy: &Policy,
    ) -> Result<(Decision, Option<Record>), StoreError> {
        match self.options.strategy {
            PgStrategy::OnConflict => claim_by_cas(self, key, fp, now, policy).await,
            PgStrategy::AdvisoryLock => {
                Ok((self.claim_advisory_lock(key, fp, policy).await?, None))
            }
            #[cfg(feature = "testing")]
            PgStrategy::Naive => Ok((self.claim_naive(key, fp, now, policy).await?, None)),
        }
    }

    async fn write_as_holder(
        &self,
        key: &RecordKey,
        holder: &Holder,
        change: &Transition,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        self.holder_write(key, holder, change, now, policy).await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.get_record(key).await
    }

    async fn delete_if_same(
        &self,
        key: &RecordKey,
        expected: &Record,
        not_before: Millis,
    ) -> Result<crate::store::Deletion, StoreError> {
        self.delete_record_if_same(key, expected, not_before).await
    }

    async fn in_progress(
        &self,
        claimed_before: Millis,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<crate::store::InProgressPage, StoreError> {
        self.in_progress_records(claimed_before, cursor, limit)
            .await
    }

    fn purge_channel(&self) -> Option<Arc<dyn crate::store::PurgeChannel>> {
        Some(Arc::new(purge::PgPurgeChannel::new(self.clone())))
    }

    async fn sweep(&self, now: Millis, batch: usize) -> Result<u64, StoreError> {
        self.with_client(async |client| {
            let stmt = client.prepare_cached(SWEEP).await.map_err(unavailable)?;
            client
                .execute(&stmt, &[&sql_i64(now), &(batch as i64)])
                .await
                .map_err(unavailable)
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.with_client(async |client| {
            client
                .simple_query("SELECT 1")
                .await
                .map_err(unavailable)
                .map(drop)
        })
        .await
    }
}

#[cfg(test)]
mod tls_settings {
    use super::*;
    use std::str::FromStr;

    fn config(url: &str) -> tokio_postgres::Config {
        tokio_postgres::Config::from_str(url).unwrap()
    }

    #[test]
    fn what_counts_as_this_machine() {
        assert!(only_loopback(&config("postgres://u@localhost/db")));
        assert!(only_loopback(&config("postgres://u@127.0.0.1:5432/db")));
        assert!(only_loopback(&config("postgres://u@[::1]:5432/db")));
        assert!(!only_loopback(&config("postgres://u@db.example/db")));
        assert!(!only_loopback(&config(
            "postgres://u@localhost,db.example/db"
        )));
        // hostaddr is where it connects, whatever the name.
        assert!(!only_loopback(&config(
            "postgres://u@localhost/db?hostaddr=10.0.0.5"
        )));
        assert!(only_loopback(&config(
            "postgres://u@db.example/db?hostaddr=127.0.0.1"
        )));
        assert!(only_unix_sockets(&config(
            "host=/var/run/postgresql user=u dbname=db"
        )));
        assert!(!only_unix_sockets(&config(
            "host=/var/run/postgresql,db.example user=u"
        )));
        assert!(!only_unix_sockets(&config("postgres://u@localhost/db")));
    }

    #[test]
    fn a_ca_file_with_tls_disabled_is_refused() {
        let ca = std::path::Path::new("/nonexistent/ca.pem");
        let refused = |url: &str, ca: Option<&std::path::Path>| {
            connector(url, Duration::from_secs(1), ca, None)
                .err()
                .map(|e| e.to_string())
        };
        let flag = refused("postgres://u@db.example/db?sslmode=disable", Some(ca));
        assert!(flag.is_some_and(|e| e.contains("sslmode=disable with a CA file")));
        let url = refused(
            "postgres://u@db.example/db?sslmode=disable&sslrootcert=/nonexistent/ca.pem",
            None,
        );
        assert!(url.is_some_and(|e| e.contains("sslmode=disable with a CA file")));
        assert!(refused("postgres://u@db.example/db?sslmode=disable", None).is_none());
    }
}
