//! Redis as the hot path, Postgres as the authority.
//!
//! * `sync`: a retry of a known key is answered from Redis (replay, 409, 422). A claim
//!   is made in Postgres (insert-if-absent / CAS) before the handler runs, and every
//!   holder write goes to Postgres first, then to Redis. Redis only ever mirrors
//!   Postgres, so losing Redis loses nothing; while Redis is unreachable, Postgres
//!   alone serves (degraded, but safe).
//! * `async`: Redis alone decides on the hot path; claims and completions reach
//!   Postgres through the [`outbox`]. A Redis failover that loses a claim not yet
//!   replicated nor written behind lets a retry run again: that window is the price.
//!
//! Both: when Redis has no record (evicted, flushed, failed over), Postgres is asked
//! before the handler runs — a completed record found there is written back to Redis
//! and replayed, an in-progress one answers 409 (the cold path). Before any takeover
//! decided on Redis' record, Postgres is asked too (async): Redis may hold a stale one.

pub(crate) mod outbox;

use super::postgres::batched_reads::BatchedReads;
use super::postgres::Authority;
use super::{
    claim_by_cas, CasRecords, Deletion, HolderWrite, Insert, PostgresStore, RedisStore, Stamp,
    Store, StoreError, Swap,
};
use async_trait::async_trait;
use idem_core::{
    decide, Decision, Fingerprint, Holder, Millis, OverLostFront, Policy, Record, RecordKey,
    Refusal, Transition,
};
use outbox::{Outbox, OutboxOptions, Slot};
use std::sync::Arc;
use std::time::Duration;

/// When a claim and a completion reach Postgres.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Before the handler runs / before the answer is returned: a Redis crash loses nothing.
    Sync,
    /// Written behind by a batching outbox: faster, and a Redis crash can lose a claim.
    Async,
}

/// After a purge, its copies are looked for this many times, this far apart: a writer
/// that read the record before the purge writes it back within milliseconds.
const PURGE_SETTLE_ROUNDS: u32 = 3;
const PURGE_SETTLE: std::time::Duration = std::time::Duration::from_millis(50);

/// The tiered [`Store`].
pub struct TieredStore {
    redis: RedisStore,
    pg: Arc<PostgresStore>,
    tier: Tier,
}

/// How the two tiers are kept, by [`Durability`].
enum Tier {
    /// Postgres decides and is written first; Redis is a cache of it.
    Sync,
    /// Redis decides; Postgres is written behind by the outbox, and read by the cold
    /// path, many requests' reads per statement.
    Async {
        outbox: Outbox,
        cold_reads: BatchedReads,
    },
}

impl TieredStore {
    /// Layers `redis` over `pg`.
    pub fn new(
        redis: RedisStore,
        pg: Arc<PostgresStore>,
        durability: Durability,
        outbox: OutboxOptions,
    ) -> Self {
        let tier = match durability {
            Durability::Sync => Tier::Sync,
            Durability::Async => {
                // Leases are renewed in Redis; Postgres learns the records behind.
                pg.retire_renewals();
                Tier::Async {
                    outbox: Outbox::start(pg.clone(), outbox),
                    cold_reads: BatchedReads::start(pg.clone()),
                }
            }
        };
        TieredStore { redis, pg, tier }
    }

    /// `async`: the outbox that writes Postgres behind.
    fn outbox(&self) -> Option<&Outbox> {
        match &self.tier {
            Tier::Sync => None,
            Tier::Async { outbox, .. } => Some(outbox),
        }
    }

    /// `async`: the statements the cold path's batched reads sent so far.
    #[cfg(feature = "testing")]
    pub fn cold_read_statements(&self) -> Option<u64> {
        match &self.tier {
            Tier::Sync => None,
            Tier::Async { cold_reads, .. } => Some(cold_reads.statements()),
        }
    }

    /// The durability mode.
    pub fn durability(&self) -> Durability {
        match self.tier {
            Tier::Sync => Durability::Sync,
            Tier::Async { .. } => Durability::Async,
        }
    }

    /// After a purge: deletes from both tiers whatever is exactly one of `copies`.
    async fn delete_copies(&self, key: &RecordKey, copies: &[&Record]) -> Result<(), StoreError> {
        if let Some(r) = self.redis.read(key).await? {
            if copies.contains(&&r) {
                self.redis.delete_if_same(key, &r, 0).await?;
            }
        }
        if let Some(p) = self.pg.get_record(key).await? {
            if copies.contains(&&p) {
                self.pg.delete_if_same(key, &p, 0).await?;
            }
        }
        Ok(())
    }

    fn redis_failed(&self, op: &'static str, e: &StoreError) {
        metrics::counter!("idem_tiered_redis_errors_total", "op" => op).increment(1);
        tracing::warn!(op, error = %e, "redis failed; Postgres decides alone");
    }

    /// Makes Redis hold `record`: swap out the record we saw (`expected`), or else
    /// write it if it supersedes whatever Redis has. Best effort: Redis is a cache here.
    async fn mirror(&self, key: &RecordKey, expected: Option<&Record>, record: &Record, at: Stamp) {
        let swapped = match expected {
            Some(e) => self.redis.replace(key, e, record, at).await.map(|(s, _)| s),
            None => Ok(Swap::Changed),
        };
        let result = match swapped {
            Ok(Swap::Replaced) => Ok(true),
            Ok(_) => self.redis.mirror(key, record).await,
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            self.redis_failed("mirror", &e);
        }
    }

    /// [`Self::mirror`], given up (as a Redis failure) after `budget`: Postgres already
    /// holds the record, and a Redis that hangs must not hold up the caller.
    async fn mirror_within(
        &self,
        budget: Duration,
        key: &RecordKey,
        expected: Option<&Record>,
        record: &Record,
        at: Stamp,
    ) {
        let mirrored = self.mirror(key, expected, record, at);
        if tokio::time::timeout(budget, mirrored).await.is_err() {
            let e = StoreError::unavailable(format!("redis: no answer within {budget:?}"));
            self.redis_failed("mirror", &e);
        }
    }

    async fn claim_sync(
        &self,
        key: &RecordKey,
        fp: &Fingerprint,
        now: Millis,
        policy: &Policy,
    ) -> Result<(Decision, Option<Record>), StoreError> {
        let Decision::Execute(provisional) = decide(None, fp, now, policy) else {
            unreachable!("no record always executes")
        };
        let at = Stamp::new(now, policy);
        // 1. Redis: a retry of a key it knows is answered without touching Postgres.
        // (Redis' clock judges here only answers that run nothing: a replay, a 409, a
        // 422. Whether anything runs is Postgres' decision, on Postgres' clock.) Redis is
        // a cache here, so it gets a quarter of the claim's time at most: a Redis that
        // hangs (a master failing over) must not use up the budget the layer checks
        // before it runs the handler, or every claim meanwhile would answer 503.
        let redis_budget = Duration::from_millis(policy.claim_budget_ms() / 4);
        let asked = self.redis.insert_if_absent(key, &provisional.record, at);
        let answered = tokio::time::timeout(redis_budget, asked)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::unavailable(format!(
                    "redis: no answer within {redis_budget:?} (a quarter of the claim's time)"
                )))
            });
        let seen = match answered {
            Ok((Insert::Existing(record), redis_now)) => {
                // Only a completed record answers from Redis (a replay, or a 422 against
                // it): it never changes. An in-progress one may be stale — a release or
                // a completion whose mirror failed — so Postgres decides on it.
                if record.is_completed() {
                    let decision = decide(Some(&record), fp, redis_now, policy);
                    if !matches!(decision, Decision::Execute(_) | Decision::TakeOver(_)) {
                        return Ok((decision, Some(record)));
                    }
                }
                Some(record)
            }
            Ok((Insert::Stored, _)) => Some(provisional.record.clone()),
            Ok((Insert::NotYetVisible | Insert::Skewed, _)) => None,
            Err(e) => {
                self.redis_failed("claim", &e);
                None
            }
        };
        // 2. Postgres, the authority, decides and claims.
        let (decision, record) = match claim_by_cas(&*self.pg, key, fp, now, policy).await {
            Ok(done) => done,
            Err(e) => {
                // Don't leave our provisional record answering 409 for a claim that never happened.
                if seen.as_ref() == Some(&provisional.record) {
                    let _ = self
                        .redis
                        .holder_write(
                            key,
                            &provisional.holder(),
                            &Transition::Release,
                            now,
                            policy,
                        )
                        .await;
                }
                return Err(e);
            }
        };
        // 3. Redis mirrors what Postgres now holds (this is also the cold path's write-back),
        // within the same quarter of the claim's time: a stale Redis record is harmless
        // here (an in-progress one is never trusted, a completed one never changes).
        if let Some(record) = &record {
            self.mirror_within(redis_budget, key, seen.as_ref(), record, at)
                .await;
        }
        Ok((decision, record))
    }

    async fn holder_write(
        &self,
        key: &RecordKey,
        holder: &Holder,
        change: &Transition,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        match &self.tier {
            Tier::Sync => {
                self.holder_write_sync(key, holder, change, now, policy)
                    .await
            }
            Tier::Async { outbox, .. } => {
                self.holder_write_async(outbox, key, holder, change, now, policy)
                    .await
            }
        }
    }

    /// `sync`: written in Postgres, then copied to Redis.
    async fn holder_write_sync(
        &self,
        key: &RecordKey,
        holder: &Holder,
        change: &Transition,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        let written = self
            .pg
            .holder_write(key, holder, change, now, policy)
            .await?;
        if written.is_written() {
            // Postgres has it; Redis, a cache here, gets a twenty-fourth of the
            // lease at most, so that a Redis that hangs can't make a heartbeat miss
            // its deadline (a twelfth of the lease) nor hold up a completion's answer.
            let budget = Duration::from_millis(policy.lease_ms / 24);
            let at = Stamp::new(now, policy);
            let next = change.record(holder, now, policy);
            self.mirror_within(budget, key, None, &next, at).await;
        }
        Ok(written)
    }

    /// `async`: written in Redis — reconciled with Postgres when Redis refused it for
    /// a claim Postgres may not know, or lost the record — then written behind.
    async fn holder_write_async(
        &self,
        outbox: &Outbox,
        key: &RecordKey,
        holder: &Holder,
        change: &Transition,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        let next = change.record(holder, now, policy);
        let slot = if change.is_final() {
            // The claim parked a slot for its final write; fall back to waiting for one.
            match outbox.take_parked(key, holder.token) {
                Some(slot) => Some(slot),
                None => Some(outbox.reserve().await?),
            }
        } else {
            // A heartbeat queues only if there is room; see the outbox docs.
            outbox.try_reserve()
        };
        // A final write the layer will send again keeps its slot for it.
        let park = |slot: Option<Slot>| {
            if let (true, Some(slot)) = (change.is_final(), slot) {
                outbox.park(key.clone(), holder.token, slot, crate::now());
            }
        };
        let mut written = match self
            .redis
            .holder_write(key, holder, change, now, policy)
            .await
        {
            Ok(w) => w,
            Err(e) => {
                park(slot);
                return Err(e);
            }
        };
        let releasing = matches!(change, Transition::Release);
        let reconciled = match written {
            // Not a release: it protects nothing, and would remove a claim that may be
            // the next attempt's, which Postgres does not know yet.
            HolderWrite::Refused(Refusal::Fenced { .. }) if !releasing => {
                self.over_other_claim(key, holder, &next, written, now, policy)
                    .await?
            }
            HolderWrite::Refused(Refusal::Missing) => {
                self.over_lost_record(key, holder, change, &next, now)
                    .await?
            }
            _ => Some(written),
        };
        match reconciled {
            Some(w) => written = w,
            None => {
                // It changed meanwhile: the layer writes again and sees.
                park(slot);
                return Err(StoreError::contention());
            }
        }
        self.write_behind(key, next, written, releasing, slot).await;
        Ok(written)
    }

    /// A holder's write (not a release) that Redis refused for another claim: a
    /// takeover (final), or a retry's provisional claim made after Redis lost this
    /// holder's record, on its way to being replaced by the authority's. Giving up to
    /// the latter would stop this live holder's heartbeats and let a retry run the
    /// handler again once the lease ran out (found by the model checker). The authority
    /// tells them apart; the holder's write goes over a provisional claim. `None`: Redis
    /// changed meanwhile.
    async fn over_other_claim(
        &self,
        key: &RecordKey,
        holder: &Holder,
        next: &Record,
        refused: HolderWrite,
        now: Millis,
        policy: &Policy,
    ) -> Result<Option<HolderWrite>, StoreError> {
        let authority = self.pg.get_record(key).await?;
        if !holder.holds_in_authority(authority.as_ref(), now) {
            return Ok(Some(refused));
        }
        let replaced = match self.redis.get(key).await? {
            Some(current)
                if holder.may_replace_front(&current, authority.as_ref(), now, policy) =>
            {
                let at = Stamp::new(now, policy);
                let (swap, _) = self.redis.replace(key, &current, next, at).await?;
                Some(swap == Swap::Replaced)
            }
            // Another attempt's answer, or a lease that may have ended on the clock
            // that ends leases: the refusal stands.
            Some(current) if current.token() != holder.token => None,
            _ => Some(false),
        };
        Ok(match replaced {
            Some(false) => None,
            Some(true) => {
                metrics::counter!("idem_tiered_cold_path_hits_total").increment(1);
                Some(HolderWrite::Written)
            }
            None => Some(refused),
        })
    }

    /// Redis lost the record (failover, flush) after it was written behind: the
    /// authority decides whether this holder still owns the key. (A refusal as fenced
    /// is final: the newer claim may be a legitimate one not yet written behind, which
    /// Postgres can't tell from a stale one.) `None`: Redis changed meanwhile.
    async fn over_lost_record(
        &self,
        key: &RecordKey,
        holder: &Holder,
        change: &Transition,
        next: &Record,
        now: Millis,
    ) -> Result<Option<HolderWrite>, StoreError> {
        let authority = self.pg.get_record(key).await?;
        Ok(
            match holder.over_lost_front(authority.as_ref(), change, now) {
                OverLostFront::Refused(refusal) => Some(HolderWrite::Refused(refusal)),
                OverLostFront::Landed => {
                    metrics::counter!("idem_tiered_cold_path_hits_total").increment(1);
                    self.redis.mirror(key, next).await?;
                    Some(HolderWrite::Written)
                }
                OverLostFront::CopyIn => {
                    metrics::counter!("idem_tiered_cold_path_hits_total").increment(1);
                    // A newer record in Redis (a retry's claim since the loss): counted as
                    // written, this holder's record would be in the outbox only, and Redis
                    // would keep a claim nobody renews — a later retry takes it over and
                    // runs again. Write again: Redis' refusal as fenced decides.
                    if !self.redis.mirror(key, next).await? {
                        return Ok(None);
                    }
                    Some(HolderWrite::Written)
                }
            },
        )
    }

    /// Writes the holder's record behind, in `slot`.
    async fn write_behind(
        &self,
        key: &RecordKey,
        next: Record,
        written: HolderWrite,
        releasing: bool,
        slot: Option<Slot>,
    ) {
        let slot = match (releasing, written, slot) {
            // Refused in Redis, which holds another claim (the next attempt's,
            // or a retry's provisional one made after Redis lost this holder's
            // record): Redis is left alone, but Postgres, which may still hold
            // this holder's claim, learns the release — applied there only over
            // this holder's own claim (the write-behind rule), so that a
            // corrected request is not refused on it later.
            (true, HolderWrite::Refused(Refusal::Fenced { .. }), Some(slot)) => {
                slot.send(key.clone(), next.clone());
                None
            }
            (_, _, slot) => slot,
        };
        match (written.is_written(), slot) {
            // A release is answered once Postgres has it, if it comes in time.
            // Until then Postgres holds the claim as it was, and a corrected
            // retry (another body) sent on the release's answer would find it
            // there through the cold path, put it back into Redis and be refused
            // 422 until the record expired. Releases are rare (nothing happened):
            // the wait is cheap. Past the store's timeout the release counts as
            // written all the same (the outbox delivers it in order): an error
            // would make the layer write it again, over what may by then be the
            // next attempt's claim.
            (true, Some(slot)) if releasing => {
                let heard = slot.send_acknowledged(key.clone(), next);
                let timeout = self.pg.timeout();
                if !matches!(tokio::time::timeout(timeout, heard).await, Ok(Ok(()))) {
                    tracing::warn!(key = %key.as_str(), ?timeout, "a release is not in Postgres yet; answered all the same");
                }
            }
            (true, Some(slot)) => slot.send(key.clone(), next),
            (true, None) => metrics::counter!("idem_outbox_skipped_heartbeats_total").increment(1),
            _ => {}
        }
    }
}

/// The `async` hot path: Redis, with the cold path folded into insert-if-absent.
struct ColdPath<'a>(&'a TieredStore, &'a Policy);

#[async_trait]
impl CasRecords for ColdPath<'_> {
    async fn insert_if_absent(
        &self,
        key: &RecordKey,
        record: &Record,
        at: Stamp,
    ) -> Result<(Insert, Millis), StoreError> {
        let tiered = self.0;
        let (found, redis_now) = tiered.redis.insert_if_absent(key, record, at).await?;
        match found {
            Insert::Stored => {}
            other => return Ok((other, redis_now)),
        }
        // Redis had nothing. Postgres may still know the key (Redis lost it). Read only
        // now, not together with the insert: an earlier read may predate a holder's
        // claim written behind just before Redis lost it (the model checker's trace,
        // docs/guarantee.md). Batched with other requests' reads.
        let authority = match &tiered.tier {
            Tier::Async { cold_reads, .. } => cold_reads.get(key).await,
            Tier::Sync => tiered.pg.get_record(key).await,
        };
        let authority = match authority {
            Ok(found) => found,
            Err(e) => {
                let holder = Holder {
                    fingerprint: *record.fingerprint(),
                    token: record.token(),
                };
                let _ = tiered
                    .redis
                    .holder_write(key, &holder, &Transition::Release, redis_now, self.1)
                    .await;
                return Err(e);
            }
        };
        match authority {
            None => Ok((Insert::Stored, redis_now)),
            // Expired (past its TTL, or released), and not yet swept from Postgres: as
            // good as none. The claim Redis stored is the very one the core makes over
            // it (its token's floor is above the expired record's), so it stands.
            // Putting the record back first would not do: Redis drops a record past its
            // expiry at once, and the claim would go round until it gave up (a 503).
            Some(found)
                if redis_now >= found.expires_at()
                    && matches!(
                        decide(Some(&found), record.fingerprint(), at.now, self.1),
                        Decision::Execute(c) if c.record == *record
                    ) =>
            {
                Ok((Insert::Stored, redis_now))
            }
            Some(found) => {
                metrics::counter!("idem_tiered_cold_path_hits_total").increment(1);
                // Put the authority's record back in place of ours; the core decides on it.
                let (swap, redis_now) = tiered.redis.replace(key, record, &found, at).await?;
                if swap == Swap::Replaced {
                    Ok((Insert::Existing(found), redis_now))
                } else {
                    Ok((Insert::NotYetVisible, redis_now))
                }
            }
        }
    }

    /// Before any takeover or reclaim decided on Redis' record, the authority is
    /// asked: after a failover or restart Redis may hold a stale record — an
    /// in-progress claim whose completion Postgres holds, or a provisional claim left
    /// by an attempt that failed half-way (its token is higher than the real holder's,
    /// so tokens can't tell). The core decides on the authority's record: if it is live
    /// (a completion to replay, a claim still running), it goes back into Redis in
    /// place of the stale one and the claim is decided again.
    async fn replace(
        &self,
        key: &RecordKey,
        expected: &Record,
        record: &Record,
        at: Stamp,
    ) -> Result<(Swap, Millis), StoreError> {
        let tiered = self.0;
        if let Some(found) = tiered.pg.get_record(key).await? {
            let live = !matches!(
                decide(Some(&found), record.fingerprint(), at.now, self.1),
                Decision::Execute(_) | Decision::TakeOver(_)
            );
            if found != *expected && live {
                metrics::counter!("idem_tiered_cold_path_hits_total").increment(1);
                let (_, redis_now) = tiered.redis.replace(key, expected, &found, at).await?;
                return Ok((Swap::Changed, redis_now));
            }
        }
        tiered.redis.replace(key, expected, record, at).await
    }
}

#[async_trait]
impl Store for TieredStore {
    fn name(&self) -> &'static str {
        match self.durability() {
            Durability::Sync => "tiered-sync",
            Durability::Async => "tiered-async",
        }
    }

    /// Postgres' clock in `sync` mode (it decides every claim), Redis' in `async`.
    fn now(&self) -> Millis {
        match self.tier {
            Tier::Sync => self.pg.now(),
            Tier::Async { .. } => self.redis.now(),
        }
    }

    /// Postgres, the authority; in `async` mode it learns claims behind Redis.
    fn authority(&self) -> Option<Authority> {
        let authority = self.pg.authority();
        Some(match self.tier {
            Tier::Sync => authority,
            Tier::Async { .. } => authority.written_behind(),
        })
    }

    /// Redis learns the completion Postgres committed. In `async` mode nothing is
    /// written behind: the outbox slot parked for this holder's final write goes
    /// unused. (If Redis misses it, a retry finds the claim in progress, and once its
    /// lease is over the cold path finds the completion in Postgres.)
    async fn committed(
        &self,
        key: &RecordKey,
        holder: &Holder,
        record: &Record,
    ) -> Result<(), StoreError> {
        if let Some(outbox) = self.outbox() {
            drop(outbox.take_parked(key, holder.token));
        }
        match self.redis.mirror(key, record).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.redis_failed("mirror", &e);
                Ok(())
            }
        }
    }

    async fn claim_with_record(
        &self,
        key: &RecordKey,
        fp: &Fingerprint,
        now: Millis,
        policy: &Policy,
    ) -> Result<(Decision, Option<Record>), StoreError> {
        let Some(outbox) = self.outbox() else {
            return self.claim_sync(key, fp, now, policy).await;
        };
        // Reserve before writing anything: a full outbox refuses the claim cleanly.
        let (claim_slot, final_slot) = outbox.reserve_pair().await?;
        let (decision, record) =
            claim_by_cas(&ColdPath(self, policy), key, fp, now, policy).await?;
        if let (Decision::Execute(c) | Decision::TakeOver(c), Some(record)) = (&decision, &record) {
            claim_slot.send(key.clone(), record.clone());
            outbox.park(key.clone(), c.token, final_slot, now);
        }
        Ok((decision, record))
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

    /// Redis' record when it is completed (it never changes) or, in `async` mode,
    /// whatever Redis holds (Postgres lags behind it); Postgres' otherwise.
    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        match self.redis.read(key).await {
            Ok(Some(record)) if record.is_completed() || self.outbox().is_some() => {
                Ok(Some(record))
            }
            Ok(Some(_)) => self.pg.get_record(key).await,
            Ok(None) => self.pg.get_record(key).await,
            Err(e) if self.outbox().is_none() => {
                self.redis_failed("get", &e);
                self.pg.get_record(key).await
            }
            Err(e) => Err(e),
        }
    }

    /// A compare-and-delete, on its clock, in the tier that decides — Postgres in
    /// `sync` mode, Redis in `async` mode — of `expected`, which [`Store::get`] read
    /// from it. Then every copy of that record, or of what Postgres held, goes from both
    /// tiers — and again a moment later, twice: writers that read one before the purge
    /// may write it back after it (a retry's cold path or mirror, a holder's committed
    /// copy, a completion the outbox writes behind). A copy is deleted only if it is
    /// exactly one of those records, never a claim made since.
    async fn delete_if_same(
        &self,
        key: &RecordKey,
        expected: &Record,
        not_before: Millis,
    ) -> Result<Deletion, StoreError> {
        let in_pg = self.pg.get_record(key).await?;
        let deleted = if self.outbox().is_none() {
            // Both tiers' copies go, or neither: with Redis unreadable here (while it
            // keeps its copy, served again once it is back), deleting Postgres' alone
            // would undo the purge and leave the tiers disagreeing for the TTL.
            let in_redis = self.redis.read(key).await?;
            match in_pg {
                Some(_) => {
                    // Redis' copy of an answer first: a failure after it leaves
                    // Postgres' record, which the next claim mirrors back; the other
                    // way round, Redis' copy would outlive the purge. (A claim's copy
                    // waits for Postgres' verdict: its lease may be live.)
                    if in_redis.as_ref() == Some(expected) && expected.is_completed() {
                        self.redis.delete_if_same(key, expected, 0).await?;
                    }
                    self.pg.delete_if_same(key, expected, not_before).await?
                }
                // Postgres has nothing (expired and swept): Redis' copy decides.
                None => self.redis.delete_if_same(key, expected, not_before).await?,
            }
        } else {
            // Postgres may hold the attempt's lease renewed, where Redis lost renewals.
            let not_before = in_pg.as_ref().map_or(not_before, |p| {
                idem_core::purge_not_before_given_copy(expected, p, not_before)
            });
            match self.redis.read(key).await? {
                Some(_) => self.redis.delete_if_same(key, expected, not_before).await?,
                // Redis lost it (or never had it): Postgres' copy decides.
                None if in_pg.as_ref() == Some(expected) => {
                    self.pg.delete_if_same(key, expected, not_before).await?
                }
                None => Deletion::Changed,
            }
        };
        if deleted != Deletion::Deleted {
            return Ok(deleted);
        }
        // Postgres' record goes too, unless it is further along than the one purged (a
        // Redis that failed over to a replica missing the last writes holds an older
        // one): a live holder's claim, or its completion, is not a copy of it.
        let in_pg = in_pg.filter(|p| !p.is_newer_than(expected));
        let copies: Vec<&Record> = [Some(expected), in_pg.as_ref()]
            .into_iter()
            .flatten()
            .collect();
        for round in 0..PURGE_SETTLE_ROUNDS {
            if round > 0 {
                tokio::time::sleep(PURGE_SETTLE).await;
            }
            self.delete_copies(key, &copies).await?;
        }
        // Listeners hear Postgres' channel; Redis' script announced on its own.
        self.pg.publish(key.as_str()).await?;
        Ok(deleted)
    }

    /// Postgres' in sync mode (it holds every claim); Redis' in async mode, where a
    /// claim whose replica crashed may never have been written behind.
    async fn in_progress(
        &self,
        claimed_before: Millis,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<super::InProgressPage, StoreError> {
        match self.tier {
            Tier::Async { .. } => self.redis.in_progress(claimed_before, cursor, limit).await,
            Tier::Sync => self.pg.in_progress(claimed_before, cursor, limit).await,
        }
    }

    fn purge_channel(&self) -> Option<Arc<dyn super::PurgeChannel>> {
        self.pg.purge_channel()
    }

    async fn sweep(&self, now: Millis, batch: usize) -> Result<u64, StoreError> {
        if let Some(outbox) = self.outbox() {
            outbox.purge_parked(now);
        }
        self.pg.sweep(now, batch).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.pg.ping().await?;
        match self.redis.ping().await {
            // In sync mode Postgres alone can serve: not ready only if it is down.
            Err(e) if self.outbox().is_none() => {
                self.redis_failed("ping", &e);
                Ok(())
            }
            other => other,
        }
    }

    async fn flush(&self) -> Result<(), StoreError> {
        if let Some(outbox) = self.outbox() {
            outbox.flush().await;
        }
        Ok(())
    }
}
