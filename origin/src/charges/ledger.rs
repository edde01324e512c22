//! Where the demo's charges are written: memory, or a `charges` table in Postgres.

use super::Charge;
use async_trait::async_trait;
use deadpool_postgres::Pool;
use std::sync::Mutex;

/// A ledger write or read failed.
#[derive(Debug, Clone)]
pub struct LedgerError(pub String);

impl std::fmt::Display for LedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The charges ledger.
#[async_trait]
pub trait Ledger: Send + Sync + 'static {
    /// Records a charge, with the execution it ran under.
    async fn insert(&self, charge: &Charge, execution: &Execution<'_>) -> Result<(), LedgerError>;
    /// A customer's charges, oldest first.
    async fn list(&self, customer: &str) -> Result<Vec<Charge>, LedgerError>;
    /// Checks that the ledger answers.
    async fn ping(&self) -> Result<(), LedgerError>;
}

/// Which execution made a charge: countable per key, per token, per process.
#[derive(Clone, Copy, Debug, Default)]
pub struct Execution<'a> {
    /// The request's idempotency key (not unique in the ledger, on purpose).
    pub idempotency_key: Option<&'a str>,
    /// The execution's fencing token.
    pub fencing_token: Option<u64>,
    /// The key a payment processor would get for this charge
    /// ([`idem::IdempotencyContext::downstream_key`]).
    pub processor_key: Option<&'a str>,
}

/// Charges in memory.
#[derive(Default)]
pub struct MemoryLedger {
    rows: Mutex<Vec<(Charge, Option<String>)>>,
}

impl MemoryLedger {
    /// How many charges were made under `key`.
    pub fn count_for_key(&self, key: &str) -> usize {
        self.rows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, k)| k.as_deref() == Some(key))
            .count()
    }

    /// How many charges were made in all.
    pub fn len(&self) -> usize {
        self.rows.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no charge was made.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl Ledger for MemoryLedger {
    async fn insert(&self, charge: &Charge, execution: &Execution<'_>) -> Result<(), LedgerError> {
        self.rows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((charge.clone(), execution.idempotency_key.map(str::to_owned)));
        Ok(())
    }

    async fn list(&self, customer: &str) -> Result<Vec<Charge>, LedgerError> {
        let rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        Ok(rows
            .iter()
            .filter(|(c, _)| c.customer == customer)
            .map(|(c, _)| c.clone())
            .collect())
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        Ok(())
    }
}

/// Charges in the `charges` table.
pub struct PgLedger {
    pool: Pool,
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS charges (
        id              text PRIMARY KEY,
        amount          bigint NOT NULL,
        currency        text NOT NULL,
        customer        text NOT NULL,
        created         bigint NOT NULL,
        idempotency_key text          -- deliberately not unique: duplicates must be countable
    );
    -- Which execution made the charge: its fencing token and the process, so that a fault
    -- campaign can tell a duplicate after a crashed holder from any other.
    ALTER TABLE charges ADD COLUMN IF NOT EXISTS fencing_token bigint;
    ALTER TABLE charges ADD COLUMN IF NOT EXISTS executed_by int;
    -- The idempotency key a payment processor would get: the same for every attempt.
    ALTER TABLE charges ADD COLUMN IF NOT EXISTS processor_key text;
    CREATE INDEX IF NOT EXISTS charges_customer ON charges (customer);";

fn pg_error(e: impl std::fmt::Display) -> LedgerError {
    LedgerError(e.to_string())
}

impl PgLedger {
    /// A ledger on `pool`, creating its table if needed.
    pub async fn new(pool: Pool) -> Result<Self, LedgerError> {
        let client = pool.get().await.map_err(pg_error)?;
        client.batch_execute(SCHEMA).await.map_err(pg_error)?;
        drop(client);
        Ok(PgLedger { pool })
    }
}

const INSERT: &str = "INSERT INTO charges (id, amount, currency, customer, created, idempotency_key, fencing_token, executed_by, processor_key) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// Inserts `c` on `client` — in whatever transaction it is in.
pub async fn insert_charge(
    client: &deadpool_postgres::ClientWrapper,
    c: &Charge,
    execution: &Execution<'_>,
) -> Result<(), LedgerError> {
    let stmt = client.prepare_cached(INSERT).await.map_err(pg_error)?;
    let token = execution.fencing_token.and_then(|t| i64::try_from(t).ok());
    let pid = i32::try_from(std::process::id()).unwrap_or(-1);
    client
        .execute(
            &stmt,
            &[
                &c.id,
                &c.amount,
                &c.currency,
                &c.customer,
                &c.created,
                &execution.idempotency_key,
                &token,
                &pid,
                &execution.processor_key,
            ],
        )
        .await
        .map_err(pg_error)?;
    Ok(())
}

#[async_trait]
impl Ledger for PgLedger {
    async fn insert(&self, c: &Charge, execution: &Execution<'_>) -> Result<(), LedgerError> {
        let client = self.pool.get().await.map_err(pg_error)?;
        insert_charge(&client, c, execution).await
    }

    async fn list(&self, customer: &str) -> Result<Vec<Charge>, LedgerError> {
        let client = self.pool.get().await.map_err(pg_error)?;
        let rows = client
            .query("SELECT id, amount, currency, customer, created FROM charges WHERE customer = $1 ORDER BY created, id", &[&customer])
            .await
            .map_err(pg_error)?;
        Ok(rows
            .iter()
            .map(|r| Charge {
                id: r.get(0),
                amount: r.get(1),
                currency: r.get(2),
                customer: r.get(3),
                created: r.get(4),
            })
            .collect())
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        let client = self.pool.get().await.map_err(pg_error)?;
        client
            .simple_query("SELECT 1")
            .await
            .map_err(pg_error)
            .map(drop)
    }
}
