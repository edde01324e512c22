//! The protocol: given what is stored for a key and what just arrived, what to do.

use crate::{Fingerprint, Millis, Record, StoredResponse};

/// Timing parameters of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// How long a holder owns a claim without a heartbeat. After that, the next attempt
    /// takes over (the holder is presumed dead).
    pub lease_ms: u64,
    /// How long a completed response is replayed (and how long an abandoned claim is
    /// kept before it may be swept).
    pub ttl_ms: u64,
}

impl Default for Policy {
    /// 30 s lease, 24 h retention — the usual payment-API choices.
    fn default() -> Self {
        Policy {
            lease_ms: 30_000,
            ttl_ms: 24 * 60 * 60 * 1000,
        }
    }
}

impl Policy {
    /// The shortest lease a claim can run under: below it a claim can't come back in
    /// time to run ([`Self::claim_in_time`]: its round trip plus the clock tolerance, at
    /// least 50 ms, within two thirds of the lease).
    pub const MIN_LEASE_MS: u64 = 250;

    /// The longest lease: a year. (Longer, a claim's lease and expiry could both reach
    /// the end of time and read as a released claim.)
    pub const MAX_LEASE_MS: u64 = 365 * 24 * 60 * 60 * 1000;

    /// Why these timings can't be run under, if they can't: a lease below
    /// [`Self::MIN_LEASE_MS`], or a TTL not longer than the lease (a setting that says
    /// "answers live no longer than a claim" is a mistake: the answer to a request still
    /// running could be forgotten before its retries stop).
    pub fn refusal(&self) -> Option<&'static str> {
        if self.lease_ms > Self::MAX_LEASE_MS {
            Some("the lease must be at most a year: a claim is renewed every eighth of it, and one that outlives that is never taken over")
        } else if self.lease_ms < Self::MIN_LEASE_MS {
            Some("the lease must be at least 250ms: a claim must come back within two thirds of it, less the clock tolerance (50 ms at least)")
        } else if self.ttl_ms <= self.lease_ms {
            Some("the TTL must be longer than the lease: answers must outlive the claims that make them")
        } else {
            None
        }
    }

    /// When an in-progress record written at `now` expires: a lease *and* a whole TTL
    /// later. Until then a retry finds it — running, or abandoned and taken over as an
    /// outcome nobody knows — never a free key: a request that may have been executed
    /// is never executed again within a TTL of its last sign of life, whatever the TTL
    /// and the lease.
    pub fn claim_expires_at(&self, now: Millis) -> Millis {
        // At least a millisecond past the lease: only a released claim has its expiry
        // at its lease's end (`Record::is_released`).
        now.saturating_add(self.lease_ms)
            .saturating_add(self.ttl_ms.max(1))
    }

    /// Whether a claim whose round trip took `round_trip_ms` may still run its handler.
    /// Its lease started when the claim was computed, before it was sent, and may end
    /// a clock tolerance early on the store's clock: a reply that slow may come when
    /// another attempt has already taken the key over. And the holder's first renewal
    /// must still land in time, so a third of the lease is left for it (renewals are
    /// due every eighth of a lease; one overdue is sent at once).
    pub fn claim_in_time(&self, round_trip_ms: u64) -> bool {
        round_trip_ms < self.claim_budget_ms()
    }

    /// The longest a claim's round trip may take for its handler to run
    /// ([`Self::claim_in_time`]): two thirds of the lease, less the clock tolerance.
    pub fn claim_budget_ms(&self) -> u64 {
        let tolerance = crate::Stamp::new(0, self).tolerance;
        (self.lease_ms.saturating_mul(2) / 3).saturating_sub(tolerance)
    }
}

/// The right to execute: the new record to write and how to write it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The fencing token of the new holder; higher than any token the record had.
    pub token: u64,
    /// The in-progress record to store.
    pub record: Record,
    /// `None`: store `record` only if no record exists (insert-if-absent).
    /// `Some(r)`: replace the existing record only if it is still exactly `r`
    /// (compare-and-swap on the whole record, not just its token: a holder that
    /// completed or renewed its lease with the same token since `r` was read must
    /// make the swap fail). A store that can't do this write atomically must report
    /// a conflict and ask again; it must never write blindly.
    pub replaces: Option<Record>,
}

impl Claim {
    /// What the holder keeps to renew, complete or release its claim.
    pub fn holder(&self) -> Holder {
        Holder {
            fingerprint: *self.record.fingerprint(),
            token: self.token,
        }
    }
}

/// What an attempt should do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No live record: run the handler under this claim.
    Execute(Claim),
    /// The previous holder's lease expired: run the handler under this claim, which
    /// fences the previous holder out.
    TakeOver(Claim),
    /// The same request completed: answer with its response.
    Replay {
        /// The stored response.
        response: StoredResponse,
        /// When its record expires: how long a copy of it (the edge's) may be kept.
        expires_at: Millis,
    },
    /// The same request is running elsewhere and its holder is alive.
    InFlight {
        /// When the running holder's lease ends unless it renews it.
        lease_until: Millis,
    },
    /// The key was used for a different request.
    Mismatch,
}

impl Decision {
    /// The response to replay, if this is a replay.
    pub fn replayed(&self) -> Option<&StoredResponse> {
        match self {
            Decision::Replay { response, .. } => Some(response),
            _ => None,
        }
    }
}

/// Decides what an attempt with `fingerprint`, arriving at `now`, should do given the
/// `existing` record for its key.
///
/// Order matters: an expired completed record is as good as none; otherwise the
/// fingerprint is checked first, so a different request never replays, never waits
/// and never takes over another request's key.
pub fn decide(
    existing: Option<&Record>,
    fingerprint: &Fingerprint,
    now: Millis,
    policy: &Policy,
) -> Decision {
    let Some(record) = existing else {
        return Decision::Execute(new_claim(None, fingerprint, now, policy));
    };
    // A release is stamped within the clock tolerance of the store's time, so its
    // expiry may lie that far ahead of `now`: released is released. A record whose lease
    // and expiry are one instant further ahead is no release of this version's — a
    // claim written by an older idem configured with a TTL equal to its lease — and is
    // judged as a claim.
    let released = record.is_released()
        && record.expires_at() <= now.saturating_add(crate::Stamp::new(now, policy).tolerance);
    if now >= record.expires_at() || released {
        // Expired (completed past its TTL, or abandoned past its retention), or released:
        // the key is free.
        return Decision::Execute(new_claim(Some(record), fingerprint, now, policy));
    }
    if record.fingerprint() != fingerprint {
        return Decision::Mismatch;
    }
    match record {
        Record::Completed {
            response,
            expires_at,
            ..
        } => Decision::Replay {
            response: response.clone(),
            expires_at: *expires_at,
        },
        Record::InProgress { lease_until, .. } if now < *lease_until => Decision::InFlight {
            lease_until: *lease_until,
        },
        Record::InProgress { .. } => {
            Decision::TakeOver(new_claim(Some(record), fingerprint, now, policy))
        }
    }
}

/// [`decide`] as the edge makes it, in front of the origin; `None`: send the request
/// on without a claim, and keep nothing of its answer. A request that differs from the
/// edge's claim on its key — in flight, or past its lease — goes to the origin, which
/// alone knows what the key is bound to: the edge fingerprints whole requests, the
/// origin's route may leave fields out (a retry with a new timestamp is then the same
/// request, to wait for or replay, not a `422`); a claim past its lease may be an
/// attempt whose completion or release the edge never learnt, or one still running at
/// the origin (the edge does not renew its claims). The edge's record stays as it is,
/// for the attempt that may still complete it. A completed copy at the edge binds the
/// key as at the origin: the edge keeps only answers stored under its own fingerprint.
pub fn decide_at_edge(
    existing: Option<&Record>,
    fingerprint: &Fingerprint,
    now: Millis,
    policy: &Policy,
) -> Option<Decision> {
    match (existing, decide(existing, fingerprint, now, policy)) {
        (Some(Record::InProgress { .. }), Decision::Mismatch) => None,
        (_, decision) => Some(decision),
    }
}

/// Tokens grow by at least one per claim, and are never below `now × 1024`: a claim
/// made after its key's record was deleted still fences out every earlier holder.
fn next_token(previous: Option<u64>, now: Millis) -> u64 {
    let floor = now.saturating_mul(crate::record::TOKENS_PER_MS);
    match previous {
        Some(t) => t.saturating_add(1).max(floor),
        None => floor.max(1),
    }
}

fn new_claim(
    replaces: Option<&Record>,
    fingerprint: &Fingerprint,
    now: Millis,
    policy: &Policy,
) -> Claim {
    let token = next_token(replaces.map(Record::token), now);
    let record = Record::InProgress {
        fingerprint: *fingerprint,
        token,
        lease_until: now.saturating_add(policy.lease_ms),
        expires_at: policy.claim_expires_at(now),
    };
    Claim {
        token,
        record,
        replaces: replaces.cloned(),
    }
}

/// The holder of a claim: enough to renew, complete or release it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The fingerprint of the request being executed.
    pub fingerprint: Fingerprint,
    /// The holder's fencing token.
    pub token: u64,
}

/// Why a holder's write was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The record is gone (expired and swept).
    Missing,
    /// Another holder took over: the record now carries a different token.
    Fenced {
        /// The token now stored.
        current: u64,
    },
    /// The record is already completed.
    AlreadyCompleted,
}

impl core::fmt::Display for Refusal {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Refusal::Missing => f.write_str("the record no longer exists"),
            Refusal::Fenced { current } => {
                write!(f, "fenced: the record now belongs to token {current}")
            }
            Refusal::AlreadyCompleted => f.write_str("the record is already completed"),
        }
    }
}

impl Holder {
    /// When this holder claimed the key (store time, ms), read off its token.
    pub fn claimed_at(&self) -> Millis {
        self.token / crate::record::TOKENS_PER_MS
    }

    /// The precondition of every holder write at `now` (the store's time): the record
    /// is in progress, still carries this holder's token, and has not expired. An
    /// expired claim is no claim — a released one (expired at once), or one kept past
    /// its retention — so a heartbeat that lands after its holder's release can't lock
    /// the freed key again. (SQL and Lua adapters express exactly this as
    /// `token = $token AND state = in-progress AND expires_at > now`.)
    pub fn check(&self, existing: Option<&Record>, now: Millis) -> Result<(), Refusal> {
        match existing {
            None => Err(Refusal::Missing),
            Some(r) if r.token() != self.token => Err(Refusal::Fenced { current: r.token() }),
            Some(Record::Completed { .. }) => Err(Refusal::AlreadyCompleted),
            // Released is released, whatever the stamps: a heartbeat stamped before its
            // holder's release must not renew the freed key when it lands after it.
            Some(r) if r.is_released() => Err(Refusal::Missing),
            Some(Record::InProgress { expires_at, .. }) if now >= *expires_at => {
                Err(Refusal::Missing)
            }
            Some(Record::InProgress { .. }) => Ok(()),
        }
    }

    /// Whether `change` already took effect: its completion is the record stored
    /// (this holder's token, completed, with this very response). A completion whose
    /// acknowledgement was lost and that is sent again is refused as
    /// [`Refusal::AlreadyCompleted`], yet it landed: only this holder could complete
    /// under its token. A completion under this token with *another* response was
    /// written by the handler's own transaction (the origin's transactional
    /// completion): that one is the answer, see [`Holder::own_completion`].
    ///
    /// Likewise a release sent again: this holder's claim, released (its lease and its
    /// expiry one instant), is what the first one left — whatever the time now.
    pub fn already_wrote(
        &self,
        existing: Option<&Record>,
        change: &Transition,
        _now: Millis,
    ) -> bool {
        match (existing, change) {
            (
                Some(Record::Completed {
                    token, response, ..
                }),
                Transition::Complete(ours),
            ) => *token == self.token && response == ours,
            (Some(r @ Record::InProgress { token, .. }), Transition::Release) => {
                *token == self.token && r.is_released()
            }
            _ => false,
        }
    }

    /// The response this holder's own completion stored, when the record is one: a
    /// handler that committed its answer in a transaction, then failed to return it
    /// (it panicked, or lost the commit's acknowledgement), is answered with it.
    pub fn own_completion<'r>(&self, existing: Option<&'r Record>) -> Option<&'r StoredResponse> {
        match existing {
            Some(Record::Completed {
                token, response, ..
            }) if *token == self.token => Some(response),
            _ => None,
        }
    }

    /// What this holder's write does when the front (tiered async's Redis) refused it
    /// as [`Refusal::Missing`] — the front lost the record — judged on the authority's
    /// record: [`OverLostFront::Landed`] when the authority has the write already (a
    /// completion its transaction committed; copying it into the front is best
    /// effort), [`OverLostFront::CopyIn`] when the authority still gives this holder
    /// the key — the write counts only once its copy is in the front, which may hold a
    /// newer record by then (a retry's claim, made after the loss: a record nobody
    /// renews, that a later retry takes over and runs again) — else the refusal.
    pub fn over_lost_front(
        &self,
        authority: Option<&Record>,
        change: &Transition,
        now: Millis,
    ) -> OverLostFront {
        if self.already_wrote(authority, change, now) {
            return OverLostFront::Landed;
        }
        match self.check(authority, now) {
            Ok(()) => OverLostFront::CopyIn,
            Err(refusal) => OverLostFront::Refused(refusal),
        }
    }

    /// Whether the authority — the store every takeover asks first (tiered async's
    /// Postgres, before any takeover decided on Redis' record) — still gives this holder
    /// the key at `now`: it holds this holder's claim, in progress, under a lease that
    /// has not ended. Then no takeover can have been decided over this claim, and another
    /// claim found in front of the authority was made after the front lost this holder's
    /// record (a retry's provisional claim on the cold path): this holder's write goes
    /// over it rather than giving up its key to it.
    pub fn holds_in_authority(&self, authority: Option<&Record>, now: Millis) -> bool {
        self.check(authority, now).is_ok()
            && matches!(authority, Some(Record::InProgress { lease_until, .. }) if now < *lease_until)
    }

    /// Whether this holder's write, refused in front of the authority because `front`
    /// holds another attempt's record, goes over it: only a claim in progress (a retry's
    /// provisional claim on the cold path) — never a completed answer, which a takeover
    /// stored and its client was given — and only while the authority gives this holder
    /// the key ([`Self::holds_in_authority`]) a clock tolerance past `now`: `now` is
    /// the caller's estimate, which may run that far behind the clock that ends leases.
    pub fn may_replace_front(
        &self,
        front: &Record,
        authority: Option<&Record>,
        now: Millis,
        policy: &Policy,
    ) -> bool {
        let tolerance = crate::Stamp::new(0, policy).tolerance;
        front.token() != self.token
            && matches!(front, Record::InProgress { .. })
            && self.holds_in_authority(authority, now.saturating_add(tolerance))
    }

    /// Whether this holder's claim is older than a lease and a whole TTL at `now`, the
    /// soonest its record can expire ([`Policy::claim_expires_at`]; tokens carry
    /// their claim's instant, see `next_token`). Such a claim must not be written again
    /// into a store that learns claims behind the one that made them: by then its
    /// record may have expired and been swept everywhere, after a takeover completed —
    /// writing it back would resurrect it.
    pub fn claim_outlived(&self, now: Millis, policy: &Policy) -> bool {
        let claimed_by = self.token / crate::record::TOKENS_PER_MS;
        now > policy.claim_expires_at(claimed_by)
    }

    /// The record after a heartbeat at `now`: the lease runs `lease_ms` from now.
    pub fn renewed(&self, now: Millis, policy: &Policy) -> Record {
        let lease_until = now.saturating_add(policy.lease_ms);
        Record::InProgress {
            fingerprint: self.fingerprint,
            token: self.token,
            lease_until,
            expires_at: policy.claim_expires_at(now),
        }
    }

    /// The record after releasing at `now`: expired at once, kept only for its token.
    pub fn released(&self, now: Millis) -> Record {
        Record::InProgress {
            fingerprint: self.fingerprint,
            token: self.token,
            lease_until: now,
            expires_at: now,
        }
    }

    /// The record after completing with `response` at `now`.
    pub fn completed(&self, response: StoredResponse, now: Millis, policy: &Policy) -> Record {
        Record::Completed {
            fingerprint: self.fingerprint,
            token: self.token,
            response,
            expires_at: now.saturating_add(policy.ttl_ms),
        }
    }
}

/// What a holder's write does after the front refused it as missing
/// ([`Holder::over_lost_front`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverLostFront {
    /// The authority has it already: written (its copy into the front is best effort).
    Landed,
    /// Written only if its copy lands in the front; if the front holds a newer record,
    /// write again (the front's refusal as fenced then decides).
    CopyIn,
    /// Refused, as the authority's record says.
    Refused(Refusal),
}

/// A holder's write: what it does to its in-progress record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Renew the lease (a heartbeat).
    Renew,
    /// Store the final response.
    Complete(StoredResponse),
    /// Free the key: the handler never started, or said that nothing happened.
    Release,
}

impl Transition {
    /// Whether this write ends the holder's claim.
    pub fn is_final(&self) -> bool {
        !matches!(self, Transition::Renew)
    }

    /// The record `holder` writes at `now` (the store's clock).
    pub fn record(&self, holder: &Holder, now: Millis, policy: &Policy) -> Record {
        match self {
            Transition::Renew => holder.renewed(now, policy),
            Transition::Complete(response) => holder.completed(response.clone(), now, policy),
            Transition::Release => holder.released(now),
        }
    }
}

/// Renews `holder`'s lease: the record to write, or why not.
pub fn heartbeat(
    existing: Option<&Record>,
    holder: &Holder,
    now: Millis,
    policy: &Policy,
) -> Result<Record, Refusal> {
    holder.check(existing, now)?;
    Ok(holder.renewed(now, policy))
}

/// Completes `holder`'s claim with `response`: the record to write, or why not. A
/// holder that was fenced out is refused, so a late completion can never overwrite the
/// answer of the attempt that took over.
pub fn complete(
    existing: Option<&Record>,
    holder: &Holder,
    response: StoredResponse,
    now: Millis,
    policy: &Policy,
) -> Result<Record, Refusal> {
    holder.check(existing, now)?;
    Ok(holder.completed(response, now, policy))
}

/// Releases `holder`'s claim so a retry may run: the record to write, or why not.
///
/// The key is freed by writing an already-expired record rather than deleting it, so
/// the token survives and the next claim's token is still higher.
pub fn release(existing: Option<&Record>, holder: &Holder, now: Millis) -> Result<Record, Refusal> {
    holder.check(existing, now)?;
    Ok(holder.released(now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use wasm_bindgen_test::wasm_bindgen_test;

    const P: Policy = Policy {
        lease_ms: 1_000,
        ttl_ms: 10_000,
    };
    const FP: Fingerprint = Fingerprint([1; 32]);
    const OTHER: Fingerprint = Fingerprint([2; 32]);

    fn claim(d: Decision) -> Claim {
        match d {
            Decision::Execute(c) | Decision::TakeOver(c) => c,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    fn ok_response() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![],
            body: b"{}".to_vec(),
        }
    }

    // The tests from here to `first_attempt_executes…` kill mutants cargo-mutants
    // found alive (docs/mutants.md): each pins a bound or a value exactly.

    #[wasm_bindgen_test(unsupported = test)]
    fn timings_are_refused_exactly_at_their_bounds() {
        let refused = |lease_ms, ttl_ms| Policy { lease_ms, ttl_ms }.refusal().is_some();
        assert_eq!(Policy::MAX_LEASE_MS, 31_536_000_000, "a year, in ms");
        assert!(!refused(Policy::MAX_LEASE_MS, Policy::MAX_LEASE_MS + 1));
        assert!(refused(Policy::MAX_LEASE_MS + 1, u64::MAX));
        assert!(!refused(Policy::MIN_LEASE_MS, Policy::MIN_LEASE_MS + 1));
        assert!(refused(Policy::MIN_LEASE_MS - 1, 60_000));
        assert!(refused(1_000, 1_000), "a TTL equal to the lease");
        assert!(!refused(1_000, 1_001));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_holder_write_needs_an_unreleased_unexpired_claim_whatever_its_stamp() {
        let c = claim(decide(None, &FP, 0, &P));
        let h = c.holder();
        let released = release(Some(&c.record), &h, 400).unwrap();
        // Stamped before the release (expiry still ahead of it): released all the same.
        assert_eq!(h.check(Some(&released), 399), Err(Refusal::Missing));
        // Kept past its retention, never released: expired at its expiry, not before.
        let expires_at = c.record.expires_at();
        assert_eq!(h.check(Some(&c.record), expires_at - 1), Ok(()));
        assert_eq!(h.check(Some(&c.record), expires_at), Err(Refusal::Missing));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn small_readings_of_decisions_holders_and_transitions() {
        let replay = Decision::Replay {
            response: ok_response(),
            expires_at: 5,
        };
        assert_eq!(replay.replayed(), Some(&ok_response()));
        assert_eq!(Decision::Mismatch.replayed(), None);
        let h = Holder {
            fingerprint: FP,
            token: 1_000 * crate::record::TOKENS_PER_MS + 3,
        };
        assert_eq!(h.claimed_at(), 1_000);
        assert!(!Transition::Renew.is_final());
        assert!(Transition::Release.is_final());
        assert!(Transition::Complete(ok_response()).is_final());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn first_attempt_executes_with_insert_if_absent() {
        let c = claim(decide(None, &FP, 100, &P));
        assert_eq!(c.replaces, None);
        assert_eq!(
            c.record,
            Record::InProgress {
                fingerprint: FP,
                token: c.token,
                lease_until: 1_100,
                expires_at: 11_100
            }
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn retry_while_running_is_in_flight_then_takes_over() {
        let c = claim(decide(None, &FP, 0, &P));
        assert_eq!(
            decide(Some(&c.record), &FP, 999, &P),
            Decision::InFlight { lease_until: 1_000 }
        );
        assert_eq!(decide(Some(&c.record), &OTHER, 999, &P), Decision::Mismatch);
        let t = match decide(Some(&c.record), &FP, 1_000, &P) {
            Decision::TakeOver(t) => t,
            other => panic!("{other:?}"),
        };
        assert_eq!(t.replaces.as_ref().map(Record::token), Some(c.token));
        assert!(t.token > c.token);
        // The dead holder's late completion is refused.
        let late = complete(Some(&t.record), &c.holder(), ok_response(), 1_500, &P);
        assert_eq!(late, Err(Refusal::Fenced { current: t.token }));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn completed_replays_until_expiry() {
        let c = claim(decide(None, &FP, 0, &P));
        let done = complete(Some(&c.record), &c.holder(), ok_response(), 500, &P).unwrap();
        assert_eq!(
            decide(Some(&done), &FP, 10_499, &P),
            Decision::Replay {
                response: ok_response(),
                expires_at: done.expires_at()
            }
        );
        assert_eq!(decide(Some(&done), &OTHER, 10_499, &P), Decision::Mismatch);
        let again = claim(decide(Some(&done), &OTHER, 10_500, &P));
        assert_eq!(again.replaces, Some(done.clone()));
        assert!(again.token > c.token);
        assert_eq!(
            complete(Some(&done), &c.holder(), ok_response(), 600, &P),
            Err(Refusal::AlreadyCompleted)
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn holder_writes_need_the_current_token() {
        let c = claim(decide(None, &FP, 0, &P));
        let renewed = heartbeat(Some(&c.record), &c.holder(), 900, &P).unwrap();
        assert_eq!(
            decide(Some(&renewed), &FP, 1_500, &P),
            Decision::InFlight { lease_until: 1_900 }
        );
        assert_eq!(release(None, &c.holder(), 900), Err(Refusal::Missing));
        let stranger = Holder {
            fingerprint: FP,
            token: c.token + 1,
        };
        assert_eq!(
            release(Some(&renewed), &stranger, 900),
            Err(Refusal::Fenced { current: c.token })
        );
        let released = release(Some(&renewed), &c.holder(), 900).unwrap();
        // The key is free at once, and the next claim still outranks the old holder.
        let next = claim(decide(Some(&released), &OTHER, 900, &P));
        assert_eq!(next.replaces, Some(released.clone()));
        assert!(next.token > c.token);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_completion_already_written_is_recognised_only_with_its_own_response() {
        let c = claim(decide(None, &FP, 0, &P));
        let h = c.holder();
        let done = h.completed(ok_response(), 100, &P);
        assert!(h.already_wrote(Some(&done), &Transition::Complete(ok_response()), 10));
        // Another answer under the same token was committed by the handler's own
        // transaction: not this write's, and it is the answer.
        let other = StoredResponse {
            status: 503,
            headers: vec![],
            body: vec![],
        };
        assert!(!h.already_wrote(Some(&done), &Transition::Complete(other), 10));
        assert!(!h.already_wrote(Some(&done), &Transition::Release, 10));
        assert_eq!(h.own_completion(Some(&done)), Some(&ok_response()));
        let stranger = Holder {
            fingerprint: FP,
            token: c.token + 1,
        };
        assert_eq!(stranger.own_completion(Some(&done)), None);
        assert_eq!(h.own_completion(Some(&c.record)), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_authority_tells_a_live_holder_from_a_taken_over_one() {
        let c = claim(decide(None, &FP, 0, &P));
        let h = c.holder();
        assert!(h.holds_in_authority(Some(&c.record), 999));
        assert!(
            !h.holds_in_authority(Some(&c.record), 1_000),
            "the lease ended"
        );
        assert!(!h.holds_in_authority(None, 0), "the authority never saw it");
        let done = h.completed(ok_response(), 10, &P);
        assert!(!h.holds_in_authority(Some(&done), 10), "completed");
        let next = claim(decide(Some(&c.record), &FP, 1_000, &P));
        assert!(
            !h.holds_in_authority(Some(&next.record), 1_001),
            "taken over"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_edge_sends_on_another_request_over_its_claim() {
        let other = Fingerprint([9; 32]);
        let c = claim(decide(None, &FP, 0, &P));
        // Within the lease: sent on unclaimed; the origin knows its route's fingerprint.
        assert_eq!(decide_at_edge(Some(&c.record), &other, 999, &P), None);
        // Past it: sent on unclaimed, and the origin decides.
        assert_eq!(decide_at_edge(Some(&c.record), &other, 1_000, &P), None);
        assert_eq!(
            decide(Some(&c.record), &other, 1_000, &P),
            Decision::Mismatch
        );
        // A completed answer binds the key at the edge as at the origin.
        let done = c.holder().completed(ok_response(), 10, &P);
        assert_eq!(
            decide_at_edge(Some(&done), &other, 5_000, &P),
            Some(Decision::Mismatch)
        );
        // Anything else is the core's decision.
        for now in [500, 1_500] {
            assert_eq!(
                decide_at_edge(Some(&c.record), &FP, now, &P),
                Some(decide(Some(&c.record), &FP, now, &P))
            );
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_released_claim_takes_no_more_holder_writes() {
        let c = claim(decide(None, &FP, 0, &P));
        let h = c.holder();
        let released = release(Some(&c.record), &h, 400).unwrap();
        // A heartbeat sent before the release, landing after it, renews nothing.
        assert_eq!(
            heartbeat(Some(&released), &h, 400, &P),
            Err(Refusal::Missing)
        );
        assert_eq!(
            heartbeat(Some(&released), &h, 401, &P),
            Err(Refusal::Missing)
        );
        assert_eq!(release(Some(&released), &h, 450), Err(Refusal::Missing));
        // …yet a release sent again (its first reply lost) knows it landed.
        assert!(h.already_wrote(Some(&released), &Transition::Release, 450));
        assert!(!h.already_wrote(Some(&c.record), &Transition::Release, 450));
        // A live claim past its lease (no takeover yet) still takes its holder's writes.
        assert!(heartbeat(Some(&c.record), &h, 1_500, &P).is_ok());
        // The key is free for the corrected request, another body.
        assert!(matches!(
            decide(Some(&released), &Fingerprint([9; 32]), 401, &P),
            Decision::Execute(_)
        ));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_holder_goes_over_a_provisional_claim_never_over_an_answer() {
        // Lease 1 s, tolerance 100 ms.
        let c = claim(decide(None, &FP, 0, &P));
        let h = c.holder();
        let provisional = claim(decide(None, &FP, 500, &P)).record;
        assert!(h.may_replace_front(&provisional, Some(&c.record), 899, &P));
        assert!(
            !h.may_replace_front(&provisional, Some(&c.record), 900, &P),
            "the lease may have ended on the store's clock"
        );
        let takeover = claim(decide(Some(&c.record), &FP, 1_000, &P)).holder();
        let answered = takeover.completed(ok_response(), 1_010, &P);
        assert!(
            !h.may_replace_front(&answered, Some(&c.record), 800, &P),
            "a completed answer stays, whatever the authority still shows"
        );
        assert!(
            !h.may_replace_front(&c.record, Some(&c.record), 0, &P),
            "its own"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_claim_that_came_back_after_its_lease_does_not_run() {
        // lease 1 s, tolerance 100 ms: a reply within 565 ms runs, leaving a third.
        assert!(P.claim_in_time(0) && P.claim_in_time(565));
        assert!(!P.claim_in_time(566) && !P.claim_in_time(u64::MAX));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_claim_outlives_its_ttl() {
        let c = claim(decide(None, &FP, 5_000, &P));
        let h = c.holder();
        assert!(!h.claim_outlived(5_000 + P.lease_ms + P.ttl_ms, &P));
        assert!(h.claim_outlived(5_001 + P.lease_ms + P.ttl_ms, &P));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_abandoned_claim_is_taken_over_for_a_whole_ttl_after_its_lease() {
        // Whatever the TTL is next to the lease, even one the configurations refuse:
        // the retry of a request that may have run learns so, and never runs it anew.
        for ttl_ms in [500, 1_000, 10_000] {
            let policy = Policy { ttl_ms, ..P };
            let c = claim(decide(None, &FP, 5_000, &policy));
            let renewed = c.holder().renewed(5_400, &policy);
            for at in [6_400, 6_400 + ttl_ms - 1] {
                assert!(
                    matches!(
                        decide(Some(&renewed), &FP, at, &policy),
                        Decision::TakeOver(_)
                    ),
                    "ttl {ttl_ms}, at {at}"
                );
            }
            assert!(matches!(
                decide(Some(&renewed), &FP, 6_400 + ttl_ms, &policy),
                Decision::Execute(_)
            ));
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_claim_of_an_older_idem_with_its_expiry_at_its_lease_s_end_is_no_release() {
        // Written before claims expired a TTL past their lease, with TTL = lease.
        let old = Record::InProgress {
            fingerprint: FP,
            token: 5_000 * crate::record::TOKENS_PER_MS,
            lease_until: 6_000,
            expires_at: 6_000,
        };
        assert!(old.is_released(), "it reads as one");
        assert!(
            matches!(
                decide(Some(&old), &FP, 5_100, &P),
                Decision::InFlight { .. }
            ),
            "a live claim, not a free key"
        );
        assert_eq!(decide(Some(&old), &OTHER, 5_100, &P), Decision::Mismatch);
        // A release stamped a tolerance ahead of the deciding clock is one.
        let h = claim(decide(None, &FP, 5_000, &P)).holder();
        let released = h.released(5_150);
        assert!(matches!(
            decide(Some(&released), &OTHER, 5_100, &P),
            Decision::Execute(_)
        ));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn timings_that_cannot_be_run_under_are_refused() {
        let endless = Policy {
            lease_ms: u64::MAX,
            ttl_ms: u64::MAX,
        };
        assert!(endless.refusal().unwrap().contains("at most a year"));
        assert_eq!(P.refusal(), None);
        let equal = Policy {
            ttl_ms: 1_000,
            lease_ms: 1_000,
        };
        assert!(equal
            .refusal()
            .unwrap()
            .contains("TTL must be longer than the lease"));
        let short = Policy {
            ttl_ms: 10_000,
            lease_ms: 249,
        };
        assert!(short.refusal().unwrap().contains("at least 250ms"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn tokens_survive_deletion() {
        // A record deleted and re-created later still gets a higher token.
        let first = claim(decide(None, &FP, 5, &P));
        let second = claim(decide(None, &FP, 6, &P));
        assert!(second.token > first.token);
    }
}
