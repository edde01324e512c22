//! The claim an execution holds: its lease kept by a [`Heartbeat`] while the handler
//! runs, and its final write — completion or release — retried with backoff until it
//! lands or another attempt owns the key.

use super::execution::Unwritten;
use super::Config;
use crate::metrics;
use crate::store::{HolderWrite, StoreExt};
use idem_core::contract::OriginDisposition;
use idem_core::{Holder, Millis, Record, RecordKey, Refusal, StoredResponse, Transition};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The claim an execution holds, from its claim to its final write: while it lives
/// the lease is renewed, and the key is counted as unwritten for a graceful shutdown.
/// The final write ([`ClaimGuard::finish`]) consumes it; dropped on any unwind, it
/// stops renewing and leaves the key to its lease.
pub(super) struct ClaimGuard {
    config: Arc<Config>,
    key: RecordKey,
    holder: Holder,
    heartbeat: Option<Heartbeat>,
    _unwritten: Unwritten,
}

impl ClaimGuard {
    pub(super) fn hold(
        config: &Arc<Config>,
        key: RecordKey,
        holder: Holder,
        lease_lost: CancellationToken,
        claimed_at: Instant,
        idempotency_key: &str,
    ) -> ClaimGuard {
        ClaimGuard {
            _unwritten: config.executions.pending(&key, idempotency_key),
            heartbeat: Some(Heartbeat::start(
                config.clone(),
                key.clone(),
                holder,
                lease_lost,
                claimed_at,
            )),
            config: config.clone(),
            key,
            holder,
        }
    }

    /// Stops renewing the lease before the final write.
    pub(super) fn stop_renewing(&mut self) {
        self.heartbeat.take();
    }

    /// Writes the execution's final record — or takes note of the one its handler's
    /// transaction committed — and gives up the claim.
    pub(super) async fn finish(
        self,
        change: Transition,
        committed: Option<Record>,
        opened: bool,
    ) -> Final {
        let ClaimGuard {
            config,
            key,
            holder,
            ..
        } = &self;
        match &committed {
            // The handler's transaction wrote the completion: the tiers in front of the
            // authority learn it, and nothing is written again.
            Some(record) => {
                if let Err(e) = config.store.committed(key, holder, record).await {
                    tracing::warn!(key = %key.as_str(), error = %e, "the store did not take note of a committed completion");
                }
                Final::Written(OriginDisposition::Stored {
                    expires_at: record.expires_at(),
                    record: key.tag(),
                    fingerprint: None,
                })
            }
            None => {
                // The handler opened a transaction and its answer never came back
                // committed (it was cut off, panicked, or lost the commit's
                // acknowledgement): the authority says whether the commit landed.
                if opened {
                    if let Some(committed) = committed_meanwhile(config, key, holder).await {
                        return committed;
                    }
                }
                let op = if change == Transition::Release {
                    "release"
                } else {
                    "complete"
                };
                write_final(config, key, holder, &change, op).await
            }
        }
    }
}

/// Backoff of the final write: from 25 ms, doubling, at most 2 s between attempts.
const FIRST_BACKOFF: Duration = Duration::from_millis(25);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The holder's own completion, if its handler's transaction committed one; the tiers
/// in front of the authority learn it. `None` when it did not, or the authority can't
/// tell now (the final write then decides: where the completion is written in the
/// authority itself it meets the committed one and is refused; see [`Final::Committed`]).
#[cfg(feature = "postgres")]
async fn committed_meanwhile(config: &Config, key: &RecordKey, holder: &Holder) -> Option<Final> {
    let authority = config.authority.as_ref()?;
    let mut attempts = 0;
    let record = loop {
        match authority.read_settled(key).await {
            Ok(record) => break record,
            Err(e) if attempts < 3 => {
                attempts += 1;
                tracing::warn!(key = %key.as_str(), error = %e, "cannot tell yet whether the handler's transaction committed; asking again");
                tokio::time::sleep(FIRST_BACKOFF * 4 * attempts).await;
            }
            Err(e) => {
                tracing::warn!(key = %key.as_str(), error = %e, "cannot tell whether the handler's transaction committed");
                return None;
            }
        }
    };
    let stored = holder.own_completion(record.as_ref())?.clone();
    let record = record?;
    tracing::info!(key = %key.as_str(), "the handler's transaction had committed its answer; it is the answer");
    if let Err(e) = config.store.committed(key, holder, &record).await {
        tracing::warn!(key = %key.as_str(), error = %e, "the store did not take note of a committed completion");
    }
    Some(Final::Committed(stored, record.expires_at()))
}

/// Without Postgres there is no handler transaction whose commit could have landed.
#[cfg(not(feature = "postgres"))]
async fn committed_meanwhile(_: &Config, _: &RecordKey, _: &Holder) -> Option<Final> {
    None
}

/// How a final write ended.
pub(super) enum Final {
    /// Written; what the origin tells the edge about it.
    Written(OriginDisposition),
    /// Refused: another attempt owns the key.
    Fenced,
    /// Refused because the record already holds this holder's own completion with
    /// another answer — committed by the handler's transaction — and its expiry.
    Committed(StoredResponse, Millis),
}

/// Writes the holder's final record until it lands or is refused. Until then the key
/// stays claimed and the heartbeat keeps its lease: nobody else runs the handler.
async fn write_final(
    config: &Config,
    key: &RecordKey,
    holder: &Holder,
    change: &Transition,
    op: &'static str,
) -> Final {
    let store = &config.store;
    let mut backoff = FIRST_BACKOFF;
    let mut failures = 0u64;
    loop {
        let now = store.now();
        let write = store.write_as_holder(key, holder, change, now, &config.policy);
        match metrics::timed(store.name(), op, write).await {
            Ok(HolderWrite::Written) => {
                if failures > 0 {
                    tracing::info!(key = %key.as_str(), failures, "{op} written after retries");
                }
                return Final::Written(match change {
                    Transition::Release => OriginDisposition::Released,
                    // The stored record expires at its write's time plus the TTL, and
                    // that write may be an earlier one whose reply was lost: the claim's
                    // time bounds it from below, so the edge never outlives it.
                    _ => OriginDisposition::Stored {
                        expires_at: holder.claimed_at().saturating_add(config.policy.ttl_ms),
                        record: key.tag(),
                        fingerprint: None,
                    },
                });
            }
            Ok(HolderWrite::Refused(Refusal::AlreadyCompleted)) => {
                // This holder's own completion (another's token is refused as fenced),
                // committed by its handler's transaction: its answer is the one to give.
                // Read a few times: a single failed read gave the client the handler's
                // own answer, which its retries never get.
                let mut record = store.get(key).await;
                for _ in 0..3 {
                    let Err(e) = &record else { break };
                    tracing::warn!(key = %key.as_str(), error = %e, "{op} refused as completed; reading the completion again");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    record = store.get(key).await;
                }
                let record = record.ok().flatten();
                if let Some(stored) = holder.own_completion(record.as_ref()) {
                    let expires_at = record.as_ref().map_or(0, |r| r.expires_at());
                    tracing::info!(key = %key.as_str(), "{op} refused: the handler's transaction had committed the answer; it is the answer");
                    return Final::Committed(stored.clone(), expires_at);
                }
                metrics::fenced(op);
                tracing::warn!(key = %key.as_str(), "{op} refused: the record is completed");
                return Final::Fenced;
            }
            Ok(HolderWrite::Refused(refusal)) => {
                metrics::fenced(op);
                tracing::warn!(key = %key.as_str(), %refusal, "{op} refused: another attempt owns this key");
                return Final::Fenced;
            }
            Err(e) => {
                failures += 1;
                metrics::final_write_retried(op);
                // Every failure of a long outage would flood the log: the first, then every 10th.
                if failures == 1 || failures % 10 == 0 {
                    tracing::warn!(key = %key.as_str(), error = %e, failures, "{op} failed; retrying while the lease is kept alive");
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The lease's keeper: renews it every eighth of the lease (sooner after a failure)
/// until dropped, and tells the handler — through `lease_lost` — when the lease is
/// lost: fenced out, or not renewed by the time it may end on the store's clock.
///
/// A task of its own, not a future polled beside the handler: a handler that blocks
/// its thread (synchronous work in an async handler) must not stop the renewals, or
/// its lease could end under it and a retry run it a second time. (The execution
/// yields once after starting it, so that it leaves the worker it was spawned on.)
struct Heartbeat(tokio::task::JoinHandle<()>);

impl Heartbeat {
    fn start(
        config: Arc<Config>,
        key: RecordKey,
        holder: Holder,
        lease_lost: CancellationToken,
        claimed_at: Instant,
    ) -> Heartbeat {
        Heartbeat(tokio::spawn(tracing::Instrument::in_current_span(
            keep_alive(config, key, holder, lease_lost, claimed_at),
        )))
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn keep_alive(
    config: Arc<Config>,
    key: RecordKey,
    holder: Holder,
    lease_lost: CancellationToken,
    claimed_at: Instant,
) {
    let lease = Duration::from_millis(config.policy.lease_ms);
    // The cadence bounds the store outage a holder survives. An outage may begin just
    // before a renewal was due (an eighth of the lease since the last one); once the
    // store is back, the attempt hanging at that moment is given up after a twelfth
    // and the next follows a twenty-fourth later; and the lease may end a tenth early
    // on the store's clock (the tolerance). 1 − 1/8 − 1/12 − 1/24 − 1/10 = 0.65 of the
    // lease, as the book promises (docs/guarantee.md). (Every third, a sixth and a twelfth left 0.32:
    // a 0.63-lease outage starting just before a renewal let retries take over.)
    let every = (lease / 8).max(Duration::from_millis(1));
    let after_failure = (lease / 24).max(Duration::from_millis(5));
    // A heartbeat that doesn't answer within this is given up and sent again.
    let attempt_timeout = (lease / 12).max(Duration::from_millis(20));
    // The lease may end this much early on the store's clock (the clock tolerance):
    // the handler is told before then, whatever the attempts are doing.
    let margin = crate::store::Stamp::new(0, &config.policy).tolerance;
    let told_after = lease.saturating_sub(Duration::from_millis(margin));
    // The lease runs from when the claim was sent, not from when its reply came.
    let mut renewed_at = claimed_at;
    let mut wait = every.saturating_sub(claimed_at.elapsed());
    loop {
        let store = &config.store;
        let beat = async {
            tokio::time::sleep(wait).await;
            let sent = Instant::now();
            let beat = store.heartbeat(&key, &holder, store.now(), &config.policy);
            let outcome = tokio::time::timeout(
                attempt_timeout,
                metrics::timed(store.name(), "heartbeat", beat),
            )
            .await;
            (sent, outcome)
        };
        let deadline = tokio::time::Instant::from_std(renewed_at + told_after);
        let (sent, outcome) = tokio::select! {
            done = beat => done,
            _ = tokio::time::sleep_until(deadline), if !lease_lost.is_cancelled() => {
                metrics::lease_lost();
                lease_lost.cancel();
                tracing::error!(key = %key.as_str(), "the lease was not renewed in time: another attempt may take over");
                wait = after_failure;
                continue;
            }
        };
        match outcome {
            Ok(Ok(HolderWrite::Written)) => {
                renewed_at = sent;
                wait = every;
            }
            // This holder's own completion landed (the handler's transaction): done.
            Ok(Ok(HolderWrite::Refused(Refusal::AlreadyCompleted))) => return,
            Ok(Ok(HolderWrite::Refused(refusal))) => {
                metrics::fenced("heartbeat");
                if !lease_lost.is_cancelled() {
                    metrics::lease_lost();
                    lease_lost.cancel();
                }
                tracing::warn!(key = %key.as_str(), token = holder.token, %refusal, "lost the claim while the handler runs");
                return;
            }
            failed => {
                if let Ok(Err(e)) = failed {
                    tracing::warn!(key = %key.as_str(), error = %e, "heartbeat failed; retrying");
                } else {
                    tracing::warn!(key = %key.as_str(), "heartbeat timed out; retrying");
                }
                wait = after_failure;
            }
        }
    }
}
