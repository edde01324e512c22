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
    /// Records a charge, with the idempotency key it ran under (not unique on purpose)
    /// and the fencing token of that execution.
    async fn insert(
        &self,
        charge: &Charge,
        idempotency_key: Option<&str>,
        fencing_token: Option<u64>,
    ) -> Result<(), LedgerError>;
    /// A customer's charges, oldest first.
    async fn list(&self, customer: &str) -> Result<Vec<Charge>, LedgerError>;
    /// Checks that the ledger answers.
    async fn ping(&self) -> Result<(), LedgerError>;
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
    async fn insert(
        &self,
        charge: &Charge,
        key: Option<&str>,
        _: Option<u64>,
    ) -> Result<(), LedgerError> {
        self.rows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((charge.clone(), key.map(str::to_owned)));
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

#[async_trait]
impl Ledger for PgLedger {
    async fn insert(
        &self,
        c: &Charge,
        key: Option<&str>,
        token: Option<u64>,
    ) -> Result<(), LedgerError> {
        let client = self.pool.get().await.map_err(pg_error)?;
        let stmt = client
            .prepare_cached("INSERT INTO charges (id, amount, currency, customer, created, idempotency_key, fencing_token, executed_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
            .await
            .map_err(pg_error)?;
        let token = token.and_then(|t| i64::try_from(t).ok());
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
                    &key,
                    &token,
                    &pid,
                ],
            )
            .await
            .map_err(pg_error)?;
        Ok(())
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
