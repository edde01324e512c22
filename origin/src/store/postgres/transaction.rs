//! A handler's own transaction on the database that holds the records: its effects and
//! its answer commit together, or not at all.
//!
//! [`Authority::begin`] opens a transaction and checks that the holder still owns its
//! claim (so a holder already fenced out does nothing). The handler runs its writes on
//! [`FencedTransaction::client`]. [`FencedTransaction::commit`] then writes the
//! completion *in that transaction*, under the row lock its `UPDATE` takes and with
//! the core's precondition re-checked on the row as it is then, and commits. So:
//!
//! * a crash before the commit loses the effects with the claim (a retry runs once),
//!   a crash after it keeps both (a retry replays);
//! * a holder paused past its lease finds, at commit, the takeover's token or its
//!   completion: its writes are rolled back.
//!
//! The connection is never returned to the pool mid-transaction: a transaction that is
//! dropped, or whose fate is unclear, has its connection closed, which makes the
//! server roll it back.

use super::{sql_i64, unavailable, Row, GET_WITH_CLOCK, HOLDER_WRITE};
use crate::store::{decode, Stamp, StoreClock, StoreError};
use deadpool_postgres::{ClientWrapper, Object, Pool};
use idem_core::{Holder, Millis, Policy, Record, RecordKey, Refusal, StoredResponse};
use std::sync::Arc;
use std::time::Duration;

/// A completion over a record written behind (the tiered store's `async` mode): the
/// authority may not have seen this holder's claim, nor a takeover of it, so the upsert
/// admits exactly [`Holder::check_behind`]'s records.
const COMPLETE_BEHIND: &str = concat!(
    "WITH clock AS MATERIALIZED (SELECT ",
    clock_ms!(),
    " AS now),
    up AS (
        INSERT INTO idem_records (id, token, state, expires_at, record)
        SELECT $1::text, $2::int8, $3::int2, $4::int8, $5::bytea FROM clock
        WHERE abs(clock.now - $6::int8) <= $7::int8
        ON CONFLICT (id) DO UPDATE SET token = EXCLUDED.token, state = EXCLUDED.state,
            expires_at = EXCLUDED.expires_at, record = EXCLUDED.record
        WHERE (idem_records.state = 0 AND idem_records.token <= EXCLUDED.token)
           OR (idem_records.state = 1 AND idem_records.token < EXCLUDED.token
               AND idem_records.expires_at <= ",
    clock_ms!(),
    ")
        RETURNING 1)
    SELECT (SELECT count(*) FROM up)::int AS written, (SELECT now FROM clock) AS now,
           (SELECT record FROM idem_records WHERE id = $1) AS current"
);

/// Rounds of the completion when the database keeps reporting a clock difference, or
/// a concurrent write behind is not yet visible to the statement that lost to it.
const MAX_ROUNDS: usize = 4;

/// The database that holds a store's authoritative records, where handlers can
/// commit their effects with their answer.
#[derive(Clone)]
pub struct Authority {
    pool: Pool,
    clock: Arc<StoreClock>,
    timeout: Duration,
    /// Whether its records are written behind (the claim may not be there yet).
    behind: bool,
}

/// Why a fenced transaction did not commit.
#[derive(Debug)]
pub enum CommitError {
    /// The holder no longer owns the key: everything was rolled back.
    Refused(Refusal),
    /// The database failed before the commit was sent: everything was rolled back.
    Failed(StoreError),
    /// The commit was sent and its answer lost: it may have landed. The key's record
    /// tells (completed under this holder's token, or not).
    Unknown(StoreError),
}

impl std::fmt::Display for CommitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommitError::Refused(r) => write!(f, "refused, rolled back: {r}"),
            CommitError::Failed(e) => write!(f, "failed, rolled back: {e}"),
            CommitError::Unknown(e) => write!(f, "outcome unknown: {e}"),
        }
    }
}

/// Why a fenced transaction could not begin.
#[derive(Debug)]
pub enum BeginError {
    /// The holder no longer owns the key.
    Refused(Refusal),
    /// The database did not answer.
    Failed(StoreError),
}

impl Authority {
    pub(super) fn new(pool: Pool, clock: Arc<StoreClock>, timeout: Duration) -> Self {
        Authority {
            pool,
            clock,
            timeout,
            behind: false,
        }
    }

    /// The same database, whose records are written behind by another store.
    pub(crate) fn written_behind(self) -> Self {
        Authority {
            behind: true,
            ..self
        }
    }

    /// Whether records reach this database behind the store that decides claims.
    pub fn is_behind(&self) -> bool {
        self.behind
    }

    /// The core's precondition for this holder's completion here.
    fn check(&self, holder: &Holder, current: Option<&Record>, now: Millis) -> Result<(), Refusal> {
        if self.behind {
            holder.check_behind(current, now)
        } else {
            holder.check(current)
        }
    }

    async fn bounded<T>(
        &self,
        what: &str,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, op)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unavailable(format!(
                    "postgres: no answer to {what} within {:?}",
                    self.timeout
                )))
            })
    }

    /// Opens a transaction for `holder` of `key`, after checking (without a lock) that
    /// it still owns the key.
    pub async fn begin(
        &self,
        key: &RecordKey,
        holder: &Holder,
    ) -> Result<FencedTransaction, BeginError> {
        let client = self
            .bounded("a connection", async {
                self.pool.get().await.map_err(unavailable)
            })
            .await
            .map_err(BeginError::Failed)?;
        let mut tx = FencedTransaction {
            client: Some(client),
            authority: self.clone(),
            key: key.clone(),
            holder: *holder,
        };
        let read = self
            .bounded("BEGIN", async {
                let client = tx.client();
                let read = client
                    .prepare_cached(GET_WITH_CLOCK)
                    .await
                    .map_err(unavailable)?;
                let id = key.as_str();
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
                // Pipelined: one round trip.
                let (_, row) = tokio::try_join!(
                    client.batch_execute("BEGIN"),
                    client.query_one(&read, &params)
                )
                .map_err(unavailable)?;
                Ok((row.get::<_, Option<Vec<u8>>>(0), row.get::<_, i64>(1)))
            })
            .await;
        let (bytes, store_now) = match read {
            Ok(read) => read,
            Err(e) => {
                tx.discard();
                return Err(BeginError::Failed(e));
            }
        };
        let now = tx.observe(store_now);
        let current = match bytes.map(|b| decode(&b)).transpose() {
            Ok(current) => current,
            Err(e) => {
                tx.discard();
                return Err(BeginError::Failed(e));
            }
        };
        if let Err(refusal) = self.check(holder, current.as_ref(), now) {
            tx.rollback().await;
            return Err(BeginError::Refused(refusal));
        }
        Ok(tx)
    }
}

/// An open transaction of a claim's holder. Run the handler's statements on
/// [`Self::client`]; [`Self::commit`] stores the answer with them. Dropped without a
/// commit, it is rolled back (its connection is closed).
pub struct FencedTransaction {
    client: Option<Object>,
    authority: Authority,
    key: RecordKey,
    holder: Holder,
}

impl std::fmt::Debug for FencedTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedTransaction")
            .field("key", &self.key)
            .field("token", &self.holder.token)
            .finish_non_exhaustive()
    }
}

impl FencedTransaction {
    /// The transaction's connection: every statement run on it is part of the
    /// transaction. (Don't `COMMIT` or `ROLLBACK` on it: use [`Self::commit`] and
    /// [`Self::rollback`].)
    pub fn client(&self) -> &ClientWrapper {
        self.client
            .as_deref()
            .expect("the connection is only taken by commit, rollback or drop")
    }

    /// The fencing token the transaction runs under.
    pub fn token(&self) -> u64 {
        self.holder.token
    }

    fn observe(&self, store_now: i64) -> Millis {
        let now = u64::try_from(store_now).unwrap_or(0);
        self.authority.clock.observe(now);
        now
    }

    /// Closes the connection: the server rolls the transaction back.
    fn discard(&mut self) {
        if let Some(client) = self.client.take() {
            drop(Object::take(client));
        }
    }

    /// Rolls back; the connection goes back to the pool only if that worked.
    pub async fn rollback(mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let rolled_back = self
            .authority
            .bounded("ROLLBACK", async {
                client.batch_execute("ROLLBACK").await.map_err(unavailable)
            })
            .await;
        if rolled_back.is_err() {
            drop(Object::take(client));
        }
    }

    /// Writes the holder's completion with `response` in this transaction and commits
    /// it, if the holder still owns the key; returns the record committed.
    pub async fn commit(
        mut self,
        response: StoredResponse,
        policy: &Policy,
    ) -> Result<Record, CommitError> {
        let written = self.write_completion(response, policy).await;
        match written {
            Ok(Ok(record)) => {
                let committed = {
                    let client = self.client();
                    self.authority
                        .bounded("COMMIT", async {
                            client.batch_execute("COMMIT").await.map_err(unavailable)
                        })
                        .await
                };
                match committed {
                    Ok(()) => {
                        // Back to the pool, out of any transaction.
                        self.client.take();
                        Ok(record)
                    }
                    Err(e) => {
                        self.discard();
                        Err(CommitError::Unknown(e))
                    }
                }
            }
            Ok(Err(refusal)) => {
                self.rollback().await;
                Err(CommitError::Refused(refusal))
            }
            Err(e) => {
                self.discard();
                Err(CommitError::Failed(e))
            }
        }
    }

    /// The completion, at the database's time, under the core's precondition.
    async fn write_completion(
        &self,
        response: StoredResponse,
        policy: &Policy,
    ) -> Result<Result<Record, Refusal>, StoreError> {
        let authority = &self.authority;
        let statement = if authority.behind {
            COMPLETE_BEHIND
        } else {
            HOLDER_WRITE
        };
        let mut at = Stamp::new(authority.clock.now(), policy);
        for _ in 0..MAX_ROUNDS {
            let next = self.holder.completed(response.clone(), at.now, policy);
            let r = Row::of(&next);
            let (written, store_now, current) = authority
                .bounded("the completion", async {
                    let client = self.client();
                    let stmt = client
                        .prepare_cached(statement)
                        .await
                        .map_err(unavailable)?;
                    // HOLDER_WRITE takes the token as `$2`; COMPLETE_BEHIND inserts it.
                    let row = client
                        .query_one(
                            &stmt,
                            &[
                                &self.key.as_str(),
                                &sql_i64(self.holder.token),
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
                })
                .await?;
            let store_now = self.observe(store_now);
            if written {
                return Ok(Ok(next));
            }
            if !at.accepted_by(store_now) {
                at = at.at(store_now);
                continue;
            }
            let current = current.map(|b| decode(&b)).transpose()?;
            match authority.check(&self.holder, current.as_ref(), store_now) {
                Err(refusal) => return Ok(Err(refusal)),
                // Written behind: a row inserted concurrently is not visible to this
                // statement's snapshot yet. Ask again.
                Ok(()) if authority.behind && current.is_none() => continue,
                Ok(()) => return Err(StoreError::Contention),
            }
        }
        Err(StoreError::Contention)
    }
}

impl Drop for FencedTransaction {
    fn drop(&mut self) {
        self.discard();
    }
}
