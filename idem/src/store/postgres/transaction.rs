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
//! The precondition, at begin and at commit, is [`Holder::check`] — the record is in
//! progress under this holder's token — as for every holder write. Where claims are
//! written behind (the tiered store's `async` mode), `begin` first writes the holder's
//! claim into the authority itself, under the write-behind rule (over an older token
//! or its own claim only, never over a live completion), so the same precondition
//! holds there: a takeover written after it, anyone else's completion, or the record
//! swept after a pause longer than the TTL, all refuse the commit.
//!
//! The connection is never returned to the pool mid-transaction: a transaction that is
//! dropped, or whose fate is unclear, has its connection closed, which makes the
//! server roll it back.

use super::{read_record, run_holder_write, unavailable, Row, Sql};
use crate::store::{decode, Stamp, StoreClock, StoreError};
use deadpool_postgres::{ClientWrapper, Object, Pool};
use idem_core::{Holder, Millis, Policy, Record, RecordKey, Refusal, StoredResponse};
use std::sync::Arc;
use std::time::Duration;

/// Rounds of the completion when the database keeps reporting a clock difference.
const MAX_ROUNDS: usize = 4;

/// The database that holds a store's authoritative records, where handlers can
/// commit their effects with their answer.
#[derive(Clone)]
pub struct Authority {
    pool: Pool,
    /// The store's statements, for its table's key column.
    sql: Arc<Sql>,
    clock: Arc<StoreClock>,
    timeout: Duration,
    /// Whether its records are written behind (the claim may not be there yet).
    behind: bool,
    /// Why a completion committed here would not fence other holders, if it wouldn't.
    unfenced: Option<&'static str>,
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

impl std::error::Error for CommitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CommitError::Refused(_) => None,
            CommitError::Failed(e) | CommitError::Unknown(e) => Some(e),
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

impl std::fmt::Display for BeginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BeginError::Refused(r) => write!(f, "refused: {r}"),
            BeginError::Failed(e) => write!(f, "failed: {e}"),
        }
    }
}

impl std::error::Error for BeginError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BeginError::Refused(_) => None,
            BeginError::Failed(e) => Some(e),
        }
    }
}

impl Authority {
    pub(super) fn new(
        pool: Pool,
        sql: Arc<Sql>,
        clock: Arc<StoreClock>,
        timeout: Duration,
    ) -> Self {
        Authority {
            pool,
            sql,
            clock,
            timeout,
            behind: false,
            unfenced: None,
        }
    }

    /// The same database under a claim strategy whose claims can overwrite a completed
    /// record: no completion committed here fences another holder.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(super) fn unfenced(self, why: &'static str) -> Self {
        Authority {
            unfenced: Some(why),
            ..self
        }
    }

    /// Why transactions here would not be fenced, if they would not.
    pub fn unfenced_because(&self) -> Option<&'static str> {
        self.unfenced
    }

    /// The same database, whose records are written behind by another store.
    #[cfg_attr(not(feature = "tiered"), allow(dead_code))]
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

    async fn bounded<T>(
        &self,
        what: &str,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, op)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::unavailable(format!(
                    "postgres: no answer to {what} within {:?}",
                    self.timeout
                )))
            })
    }

    /// Opens a transaction for `holder` of `key`, after checking (without a lock) that
    /// it still owns the key. A transaction left idle for two leases, at least a minute
    /// (its process frozen, its network cut), is ended by the server, so it can't hold
    /// its locks on.
    pub async fn begin(
        &self,
        key: &RecordKey,
        holder: &Holder,
        policy: &Policy,
    ) -> Result<FencedTransaction, BeginError> {
        if self.behind && holder.claim_outlived(self.clock.now(), policy) {
            // Writing it behind now could resurrect a claim swept after a takeover.
            return Err(BeginError::Refused(Refusal::Missing));
        }
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
        // A floor of a minute: a handler may legitimately sit between two statements
        // for a while; what this bounds is a holder that will never come back.
        let idle_ms = policy.lease_ms.saturating_mul(2).max(60_000);
        // idem's read plans without sequential scans, as on idem's own pools (see
        // `connector`); the handler's statements after it get the session's own back.
        // Read committed whatever the database's default: the holder's heartbeat updates
        // the record's row from another connection while the handler runs, and under
        // repeatable read or serializable the completion's update of that row would fail
        // with a serialization error, so every handler longer than a heartbeat would.
        let begin = format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; \
             SET LOCAL idle_in_transaction_session_timeout = {idle_ms}; \
             SET LOCAL enable_seqscan = off"
        );
        let claim = Row::of(&holder.renewed(self.clock.now(), policy));
        let read = self
            .bounded("BEGIN", async {
                let client = tx.client();
                // Prepared first, so that the pipeline below sends its statements in order.
                let read = client
                    .prepare_cached(&self.sql.get_with_clock)
                    .await
                    .map_err(unavailable)?;
                let upsert = match self.behind {
                    true => Some(
                        client
                            .prepare_cached(&self.sql.upsert_superseding)
                            .await
                            .map_err(unavailable)?,
                    ),
                    false => None,
                };
                let id = key.as_str();
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
                // Written behind: the claim goes into the authority first, on its own
                // (before BEGIN: its row lock must not last as long as the handler).
                let write_claim = async {
                    let Some(upsert) = &upsert else {
                        return Ok(0);
                    };
                    client
                        .execute(
                            upsert,
                            &[
                                &[id].as_slice(),
                                &[claim.token].as_slice(),
                                &[claim.state].as_slice(),
                                &[claim.expires_at].as_slice(),
                                &[claim.record.as_slice()].as_slice(),
                            ],
                        )
                        .await
                };
                // Pipelined, in this order: one round trip.
                let (_, _, row, _) = tokio::try_join!(
                    write_claim,
                    client.batch_execute(&begin),
                    client.query_one(&read, &params),
                    client.batch_execute("SET LOCAL enable_seqscan TO DEFAULT")
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
        tx.observe(store_now);
        let current = match bytes.map(|b| decode(&b)).transpose() {
            Ok(current) => current,
            Err(e) => {
                tx.discard();
                return Err(BeginError::Failed(e));
            }
        };
        if let Err(refusal) = holder.check(current.as_ref(), u64::try_from(store_now).unwrap_or(0))
        {
            tx.rollback().await;
            return Err(BeginError::Refused(refusal));
        }
        Ok(tx)
    }

    /// The key's record as the authority holds it once no transaction that may still
    /// commit a change to it is in flight: the read waits for the row lock a
    /// completion holds until its commit (or rollback).
    ///
    /// On the handlers' pool, whose sessions keep their own settings: sequential scans
    /// are turned off for this read alone, as at [`Self::begin`], so that a plan kept
    /// from a table analysed while empty can't make it read the whole table.
    pub async fn read_settled(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.bounded("a read", async {
            let client = self.pool.get().await.map_err(unavailable)?;
            // Prepared first, so that the pipeline below sends its statements in order.
            let read = client
                .prepare_cached(&self.sql.read_settled)
                .await
                .map_err(unavailable)?;
            let id = key.as_str();
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
            // Pipelined, in this order: one round trip. A failure anywhere leaves the
            // transaction open: the connection is discarded, not returned.
            let read = tokio::try_join!(
                client.batch_execute(
                    "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL enable_seqscan = off"
                ),
                client.query_opt(&read, &params),
                client.batch_execute("COMMIT"),
            );
            match read {
                Ok((_, row, _)) => row.map(|r| decode(r.get::<_, &[u8]>(0))).transpose(),
                Err(e) => {
                    let _ = Object::take(client);
                    Err(unavailable(e))
                }
            }
        })
        .await
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
        match self.write_completion(response, policy).await {
            Ok(record) => {
                let committed = {
                    let client = self.client();
                    self.authority
                        .bounded("COMMIT", async {
                            // The session's own setting back first: deferred
                            // constraints and triggers run at COMMIT, and are the
                            // handler's.
                            let commit = "SET LOCAL enable_seqscan TO DEFAULT; COMMIT";
                            client.batch_execute(commit).await.map_err(unavailable)
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
            Err(CommitError::Refused(refusal)) => {
                self.rollback().await;
                Err(CommitError::Refused(refusal))
            }
            Err(failed) => {
                self.discard();
                Err(failed)
            }
        }
    }

    /// The completion, at the database's time, under the core's precondition: the
    /// record written, or why not (refused, or failed).
    async fn write_completion(
        &self,
        response: StoredResponse,
        policy: &Policy,
    ) -> Result<Record, CommitError> {
        let authority = &self.authority;
        let mut at = Stamp::new(authority.clock.now(), policy);
        for round in 0..MAX_ROUNDS {
            let next = self.holder.completed(response.clone(), at.now, policy);
            let write = run_holder_write(
                self.client(),
                &self.authority.sql,
                &self.key,
                &self.holder,
                &next,
                at,
            );
            // The handler is done with the transaction: idem's statements from here to
            // the COMMIT plan without sequential scans, as on idem's own pools (the
            // session's setting comes back just before the COMMIT). Sent ahead of the
            // first write, in the same round trip (requests go out in polling order).
            let first = round == 0;
            let turn_off = async {
                if first {
                    let set = self
                        .client()
                        .batch_execute("SET LOCAL enable_seqscan = off");
                    set.await.map_err(unavailable)?;
                }
                Ok(())
            };
            let (written, store_now, current) = authority
                .bounded("the completion", async {
                    let ((), written) = tokio::try_join!(turn_off, write)?;
                    Ok(written)
                })
                .await
                .map_err(CommitError::Failed)?;
            let store_now = self.observe(store_now);
            if written {
                return Ok(next);
            }
            if !at.accepted_by(store_now) {
                at = at.at(store_now);
                continue;
            }
            let mut current = current
                .map(|b| decode(&b))
                .transpose()
                .map_err(CommitError::Failed)?;
            if self.holder.check(current.as_ref(), store_now).is_ok() {
                // The statement's snapshot predates the change that refused it (a
                // takeover committed while it waited): look again.
                // (A statement of its own reads a new snapshot.)
                current = authority
                    .bounded(
                        "a read",
                        read_record(self.client(), &self.authority.sql.get, &self.key),
                    )
                    .await
                    .map_err(CommitError::Failed)?;
            }
            return match self.holder.check(current.as_ref(), store_now) {
                Err(refusal) => Err(CommitError::Refused(refusal)),
                // Tokens only grow: the record can't have changed back.
                Ok(()) => Err(CommitError::Failed(StoreError::contention())),
            };
        }
        Err(CommitError::Failed(StoreError::contention()))
    }
}

impl Drop for FencedTransaction {
    fn drop(&mut self) {
        self.discard();
    }
}
