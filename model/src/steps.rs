//! Each attempt's steps, as the adapters and the layer take them; every decision is
//! the core's.

use crate::config::{Completion, Deployment};
use crate::model::{fingerprint, ProtocolModel};
use crate::state::{Answer, Pc, State};
use crate::stores::{Insert, Slot, Swap, Written};
use crate::POLICY;
use idem_core::contract::edge_ttl_ms;
use idem_core::{
    complete, decide, decide_at_edge, release, Decision, Holder, Millis, OverLostFront, Policy,
    Record, Stamp, StoredResponse, Transition,
};

/// Response `n` of the handler (each execution answers differently, so that a second
/// execution shows in what clients get).
fn response(n: u8) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: Vec::new(),
        body: vec![n],
    }
}

/// Which execution produced a stored response.
fn response_id(r: &StoredResponse) -> u8 {
    r.body[0]
}

/// When a claim's lease ends.
fn lease_of(record: &Record) -> Millis {
    match record {
        Record::InProgress { lease_until, .. } => *lease_until,
        Record::Completed { .. } => 0,
    }
}

fn decode(bytes: &[u8]) -> Record {
    Record::decode(bytes).expect("records the model stored decode")
}

/// What a claim decision answers when it claims nothing.
fn answer(decision: &Decision) -> Answer {
    match decision {
        Decision::Replay { response, .. } => Answer::Replayed(response_id(response)),
        Decision::InFlight { .. } => Answer::Conflict,
        Decision::Mismatch => Answer::Mismatch,
        Decision::Execute(_) | Decision::TakeOver(_) => unreachable!("a claim answers nothing"),
    }
}

impl ProtocolModel {
    /// The Redis whose master may fail over.
    pub(crate) fn redis<'s>(&self, state: &'s State) -> &'s Slot {
        match self.config.deployment {
            Deployment::TieredSync => &state.other,
            _ => &state.main,
        }
    }

    pub(crate) fn redis_mut<'s>(&self, state: &'s mut State) -> &'s mut Slot {
        match self.config.deployment {
            Deployment::TieredSync => &mut state.other,
            _ => &mut state.main,
        }
    }

    /// The attempt's estimate of the deciding store's clock, as a stamp.
    fn stamp(&self, state: &State, i: usize) -> Stamp {
        Stamp::new(
            state.now.saturating_add_signed(state.attempts[i].clock),
            &POLICY,
        )
    }

    /// The attempt's estimate of the store's clock in its holder writes: the last
    /// attempt's lags by [`crate::Faults::holder_lag`] (its estimate drifted since its
    /// claim's reply; within the tolerance, the store accepts its writes).
    fn holder_stamp(&self, state: &State, i: usize) -> Stamp {
        let stamp = self.stamp(state, i);
        match i + 1 == state.attempts.len() && self.config.faults.holder_lag != 0 {
            true => Stamp::new(
                stamp.now.saturating_sub(self.config.faults.holder_lag),
                &POLICY,
            ),
            false => stamp,
        }
    }

    /// The time a decision over an existing record is made at: the store's own (the
    /// time its statement returned), or, in the code before that, the replica's.
    fn decision_time(&self, state: &State, i: usize) -> Millis {
        match self.config.store_clock() {
            true => state.main.now(state.now),
            false => self.stamp(state, i).now,
        }
    }

    /// The replica learns the deciding store's clock from a reply.
    fn observe(&self, state: &mut State, i: usize) {
        if self.config.store_clock() {
            state.attempts[i].clock = state.main.offset;
        }
    }

    /// A holder got its claim — unless its round trip outlasted the claim budget: the
    /// layer then runs nothing and answers 503 (the claim is left to its lease).
    fn claimed(state: &mut State, i: usize, record: &Record) {
        // Forgotten once it served (fewer distinct states).
        let sent_at = state.attempts[i].sent_at.take().unwrap_or(state.now);
        if !POLICY.claim_in_time(state.now - sent_at) {
            state.attempts[i].pc = Pc::Answered(Answer::Unavailable);
            return;
        }
        let token = record.token();
        let ghost = &mut state.ghost;
        ghost.token_regressed |= token <= ghost.max_claim && ghost.max_claim != 0;
        ghost.max_claim = ghost.max_claim.max(token);
        state.attempts[i].pc = Pc::Running { token };
        state.attempts[i].lease = Some(lease_of(record));
    }

    /// Tiered: what a new holder's claim leaves to do behind the deciding store.
    fn behind(&self, state: &mut State, i: usize, record: &Record) {
        let a = &mut state.attempts[i];
        match self.config.deployment {
            Deployment::TieredSync => a.mirror = Some((a.seen.take(), record.encode())),
            Deployment::TieredAsync => Self::enqueue(a, record),
            _ => {}
        }
    }

    /// Tiered async: queue `record` to be written behind. The writer coalesces a key's
    /// records by supersession; so does this queue (one key, so at most one entry).
    fn enqueue(a: &mut crate::state::Attempt, record: &Record) {
        a.outbox
            .retain(|queued| !record.supersedes(&decode(queued)));
        a.outbox.push(record.encode());
    }

    pub(crate) fn step(&self, state: &mut State, i: usize, lose_reply: bool) {
        match state.attempts[i].pc.clone() {
            Pc::Idle => self.begin(state, i, lose_reply),
            Pc::Insert => self.claim(state, i, lose_reply, None),
            Pc::InsertAfterRead { authority } => {
                let authority = authority.as_deref().map(decode);
                self.claim(state, i, lose_reply, Some(authority))
            }
            Pc::ColdRead { ours } => {
                let authority = state.other.record();
                self.cold_read(state, i, &decode(&ours), authority)
            }
            Pc::Replace {
                expected,
                record,
                at,
            } => self.replace(
                state,
                i,
                &decode(&expected),
                &decode(&record),
                at,
                lose_reply,
            ),
            Pc::Running { token } => match self.config.completion {
                Completion::Separate => {
                    // The handler's effect commits on its own.
                    state.ghost.executions.push(state.attempts[i].request);
                    let n = state.ghost.executions.len() as u8;
                    state.attempts[i].pc = Pc::Finishing { token, response: n };
                }
                Completion::Transactional => self.commit(state, i, token, lose_reply),
            },
            Pc::Finishing { token, response: n } => {
                let change = Transition::Complete(response(n));
                match self.holder_write(state, i, token, &change, lose_reply) {
                    // Written, but the reply was lost: the layer writes it again.
                    _ if lose_reply => {}
                    Some(Ok(())) => {
                        state.attempts[i].pc = Pc::Answered(Answer::Executed {
                            response: n,
                            stored: true,
                        })
                    }
                    Some(Err(current)) => {
                        let holder = self.holder(state, i, token);
                        let answer = match holder.own_completion(current.as_ref()) {
                            Some(committed) => Answer::Executed {
                                response: response_id(committed),
                                stored: true,
                            },
                            // Fenced: the client still gets the handler's answer, unstored.
                            None => Answer::Executed {
                                response: n,
                                stored: false,
                            },
                        };
                        state.attempts[i].pc = Pc::Answered(answer);
                    }
                    None => {}
                }
            }
            Pc::Copying {
                token,
                response: n,
                record,
            } => {
                let record = decode(&record);
                if state.main.mirror(&record) || self.copy_counted() {
                    self.after_write(state, i, &record);
                    state.attempts[i].pc = Pc::Answered(Answer::Executed {
                        response: n,
                        stored: true,
                    });
                } else {
                    // A newer record in Redis: the completion is written again.
                    state.attempts[i].pc = Pc::Finishing { token, response: n };
                }
            }
            Pc::Recovering { token } => {
                let holder = self.holder(state, i, token);
                let current = state.main.record();
                let answer = match holder.own_completion(current.as_ref()) {
                    Some(committed) => Answer::Executed {
                        response: response_id(committed),
                        stored: true,
                    },
                    None => Answer::Unavailable,
                };
                state.attempts[i].pc = Pc::Answered(answer);
            }
            Pc::Answered(answer) => self.edge_finish(state, i, answer),
            Pc::Crashed => {}
        }
    }

    fn holder(&self, state: &State, i: usize, token: u64) -> Holder {
        Holder {
            fingerprint: fingerprint(state.attempts[i].request),
            token,
        }
    }

    /// The first step: at the edge, the Durable Object's claim; in tiered sync, Redis'
    /// look; otherwise the claim itself.
    fn begin(&self, state: &mut State, i: usize, lose_reply: bool) {
        let fp = fingerprint(state.attempts[i].request);
        // The edge's request to the origin starts the origin's claim later.
        if self.config.deployment != Deployment::EdgeOverOrigin {
            state.attempts[i].sent_at = Some(state.now);
        }
        match self.config.deployment {
            Deployment::EdgeOverOrigin => {
                let now = state.edge.now(state.now);
                let edge_record = state.edge.record();
                let decision = match self.config.bug {
                    Some(crate::config::Bug::EdgeBindsLostClaim) => {
                        Some(decide(edge_record.as_ref(), &fp, now, &POLICY))
                    }
                    _ => decide_at_edge(edge_record.as_ref(), &fp, now, &POLICY),
                };
                let Some(decision) = decision else {
                    // Sent on unclaimed: the origin decides, the edge keeps nothing.
                    state.attempts[i].edge = None;
                    state.attempts[i].pc = Pc::Insert;
                    return;
                };
                match decision {
                    Decision::Execute(c) | Decision::TakeOver(c) => {
                        state.edge.put(&c.record);
                        state.attempts[i].edge = Some(c.token);
                        state.attempts[i].pc = Pc::Insert;
                    }
                    other => self.refuse(state, i, &other),
                }
            }
            Deployment::TieredSync => {
                let at = self.stamp(state, i);
                let Decision::Execute(provisional) = decide(None, &fp, at.now, &POLICY) else {
                    unreachable!("no record always executes")
                };
                let now = state.now;
                let bug = self.config.bug;
                let seen = match state
                    .other
                    .insert_if_absent(&provisional.record, at, now, bug)
                {
                    Insert::Existing(record) => {
                        // Only a completed record answers from Redis.
                        if record.is_completed() {
                            let redis_now = state.other.now(now);
                            let decision = decide(Some(&record), &fp, redis_now, &POLICY);
                            if !matches!(decision, Decision::Execute(_) | Decision::TakeOver(_)) {
                                self.refuse(state, i, &decision);
                                return;
                            }
                        }
                        Some(record.encode())
                    }
                    Insert::Stored => Some(provisional.record.encode()),
                    Insert::Skewed => None,
                };
                state.attempts[i].seen = seen;
                state.attempts[i].pc = Pc::Insert;
            }
            _ => {
                state.attempts[i].pc = Pc::Insert;
                self.claim(state, i, lose_reply, None);
            }
        }
    }

    /// The claim: atomic where the store decides under a lock, else insert-if-absent.
    /// `read_ahead`: tiered async, what Postgres held when it was read before this
    /// insert (else Postgres is read after it).
    fn claim(
        &self,
        state: &mut State,
        i: usize,
        lose_reply: bool,
        read_ahead: Option<Option<Record>>,
    ) {
        let fp = fingerprint(state.attempts[i].request);
        let a = &mut state.attempts[i];
        a.sent_at = a.sent_at.or(Some(state.now));
        let atomic = matches!(
            self.config.deployment,
            Deployment::Memory | Deployment::PostgresAdvisoryLock | Deployment::EdgeOverOrigin
        );
        if atomic {
            let now = self.decision_time(state, i);
            let decision = decide(state.main.record().as_ref(), &fp, now, &POLICY);
            match &decision {
                Decision::Execute(c) | Decision::TakeOver(c) => {
                    state.main.put(&c.record);
                    if lose_reply {
                        state.attempts[i].pc = Pc::Answered(Answer::Unavailable);
                    } else {
                        Self::claimed(state, i, &c.record);
                    }
                }
                other => self.refuse(state, i, other),
            }
            return;
        }
        let at = self.stamp(state, i);
        let Decision::Execute(fresh) = decide(None, &fp, at.now, &POLICY) else {
            unreachable!("no record always executes")
        };
        let now = state.now;
        let found = state
            .main
            .insert_if_absent(&fresh.record, at, now, self.config.bug);
        if lose_reply {
            self.failed_claim(state, i);
            return;
        }
        self.observe(state, i);
        match found {
            Insert::Stored if self.config.deployment == Deployment::TieredAsync => {
                state.attempts[i].lease = Some(lease_of(&fresh.record));
                match read_ahead {
                    Some(authority) => self.cold_read(state, i, &fresh.record, authority),
                    None => {
                        state.attempts[i].pc = Pc::ColdRead {
                            ours: fresh.record.encode(),
                        }
                    }
                }
            }
            Insert::Stored => {
                Self::claimed(state, i, &fresh.record);
                self.behind(state, i, &fresh.record);
            }
            Insert::Existing(existing) => self.decide_over(state, i, &existing),
            Insert::Skewed => {}
        }
    }

    /// A claim whose reply was lost: the client gets 503. (Tiered sync releases a
    /// provisional record it left in Redis.)
    fn failed_claim(&self, state: &mut State, i: usize) {
        if let Some(seen) = state.attempts[i].seen.take() {
            let seen = decode(&seen);
            let holder = Holder {
                fingerprint: *seen.fingerprint(),
                token: seen.token(),
            };
            let now = state.other.now(state.now);
            if let Ok(released) = release(state.other.record().as_ref(), &holder, now) {
                state.other.put(&released);
            }
        }
        state.attempts[i].pc = Pc::Answered(Answer::Unavailable);
        state.attempts[i].sent_at = None;
    }

    /// The core decides over the record a store returned, at the decision time.
    fn decide_over(&self, state: &mut State, i: usize, existing: &Record) {
        let fp = fingerprint(state.attempts[i].request);
        let at = self.decision_time(state, i);
        match decide(Some(existing), &fp, at, &POLICY) {
            Decision::Execute(c) | Decision::TakeOver(c) => {
                state.attempts[i].pc = Pc::Replace {
                    expected: existing.encode(),
                    record: c.record.encode(),
                    at,
                }
            }
            other => {
                if self.config.deployment == Deployment::TieredSync {
                    let a = &mut state.attempts[i];
                    a.mirror = Some((a.seen.take(), existing.encode()));
                }
                self.refuse(state, i, &other);
            }
        }
    }

    /// Tiered async: our claim is in Redis; Postgres, read before or after it, held
    /// `authority`.
    fn cold_read(&self, state: &mut State, i: usize, ours: &Record, authority: Option<Record>) {
        let Some(found) = authority else {
            Self::claimed(state, i, ours);
            self.behind(state, i, ours);
            return;
        };
        let at = self.stamp(state, i);
        let now = state.now;
        let swapped = state.main.replace(ours, &found, at, now, self.config.bug);
        self.observe(state, i);
        match swapped {
            Swap::Replaced => self.decide_over(state, i, &found),
            _ => state.attempts[i].pc = Pc::Insert,
        }
    }

    fn replace(
        &self,
        state: &mut State,
        i: usize,
        expected: &Record,
        record: &Record,
        at: Millis,
        lose_reply: bool,
    ) {
        let stamp = Stamp::new(at, &POLICY);
        let now = state.now;
        let bug = self.config.bug;
        if self.config.deployment == Deployment::TieredAsync {
            // The authority is asked before any takeover decided on Redis' record.
            if let Some(found) = state.other.record() {
                let live = !matches!(
                    decide(Some(&found), record.fingerprint(), at, &POLICY),
                    Decision::Execute(_) | Decision::TakeOver(_)
                );
                if found != *expected && live {
                    state.main.replace(expected, &found, stamp, now, bug);
                    self.observe(state, i);
                    state.attempts[i].pc = Pc::Insert;
                    return;
                }
            }
        }
        let swapped = state.main.replace(expected, record, stamp, now, bug);
        if lose_reply {
            self.failed_claim(state, i);
            return;
        }
        self.observe(state, i);
        if swapped == Swap::Replaced {
            Self::claimed(state, i, record);
            self.behind(state, i, record);
        } else {
            state.attempts[i].pc = Pc::Insert;
        }
    }

    /// A holder write on the deciding store, at the replica's estimate of its clock:
    /// `Some(Ok)` written (or an earlier send of it was), `Some(Err(current))` refused,
    /// `None` to be sent again (skewed; the replica now knows the store's clock).
    fn holder_write(
        &self,
        state: &mut State,
        i: usize,
        token: u64,
        change: &Transition,
        lose_reply: bool,
    ) -> Option<Result<(), Option<Record>>> {
        let holder = self.holder(state, i, token);
        let at = self.holder_stamp(state, i);
        let next = change.record(&holder, at.now, &POLICY);
        let now = state.now;
        let written = state
            .main
            .holder_write(&holder, &next, at, now, self.config.bug);
        if lose_reply {
            if matches!(written, Written::Done) {
                self.after_write(state, i, &next);
            }
            return None;
        }
        self.observe(state, i);
        match written {
            Written::Done => {
                self.after_write(state, i, &next);
                Some(Ok(()))
            }
            Written::Skewed => None,
            Written::Refused(current) => {
                if holder.already_wrote(current.as_ref(), change, at.now) {
                    return Some(Ok(()));
                }
                let fenced = current.as_ref().is_some_and(|c| c.token() != token);
                if fenced && self.config.deployment == Deployment::TieredAsync && !self.old_tiered()
                {
                    // Another claim in Redis: a takeover, or a retry's provisional claim
                    // after Redis lost ours. The authority tells them apart.
                    let front = current.clone().expect("fenced by a record");
                    let authority = state.other.record();
                    let goes_over = match self.config.bug {
                        // Before e57a685: over anything, while the authority shows a live
                        // lease at the holder's own estimate.
                        Some(crate::config::Bug::ReplaceAnyFront) => {
                            holder.holds_in_authority(authority.as_ref(), at.now)
                        }
                        _ => holder.may_replace_front(&front, authority.as_ref(), at.now, &POLICY),
                    };
                    if goes_over {
                        let current = front;
                        let now = state.now;
                        let swapped = state
                            .main
                            .replace(&current, &next, at, now, self.config.bug);
                        if swapped != Swap::Replaced {
                            return None; // changed meanwhile: written again
                        }
                        self.after_write(state, i, &next);
                        return Some(Ok(()));
                    }
                }
                let missing = current.is_none();
                if missing && self.config.deployment == Deployment::TieredAsync {
                    // Redis lost the record: the authority decides whether this holder
                    // still owns the key.
                    let authority = state.other.record();
                    match holder.over_lost_front(authority.as_ref(), change, at.now) {
                        OverLostFront::Landed => {
                            state.main.mirror(&next);
                            self.after_write(state, i, &next);
                            return Some(Ok(()));
                        }
                        OverLostFront::CopyIn => {
                            // The copy into Redis is a step of its own: a retry's claim
                            // may land in Redis between the read and the copy.
                            let completing = matches!(change, Transition::Complete(_));
                            if let (true, Pc::Finishing { response: n, .. }) =
                                (completing, &state.attempts[i].pc)
                            {
                                let n = *n;
                                state.attempts[i].pc = Pc::Copying {
                                    token,
                                    response: n,
                                    record: next.encode(),
                                };
                                return None;
                            }
                            if state.main.mirror(&next) || self.copy_counted() {
                                self.after_write(state, i, &next);
                                return Some(Ok(()));
                            }
                            return None; // written again: Redis' refusal decides
                        }
                        OverLostFront::Refused(_) => return Some(Err(authority)),
                    }
                }
                Some(Err(current))
            }
        }
    }

    /// Whether this is tiered async as it was before a copy Redis refused made a holder
    /// write again ([`crate::config::Bug::RefusedCopyCounted`]).
    fn copy_counted(&self) -> bool {
        self.config.bug == Some(crate::config::Bug::RefusedCopyCounted)
    }

    /// Whether this is tiered async as it was before a holder fenced by a provisional
    /// claim asked the authority.
    fn old_tiered(&self) -> bool {
        self.config.bug == Some(crate::config::Bug::FencedByProvisionalClaim)
    }

    /// What follows a landed holder write: the ghost's check of completions, and the
    /// tiers behind the deciding store.
    fn after_write(&self, state: &mut State, i: usize, written: &Record) {
        if written.is_completed() {
            let ghost = &mut state.ghost;
            ghost.fenced_completed |= written.token() < ghost.max_claim;
        }
        match self.config.deployment {
            Deployment::TieredSync => state.attempts[i].mirror = Some((None, written.encode())),
            Deployment::TieredAsync => Self::enqueue(&mut state.attempts[i], written),
            _ => {}
        }
    }

    pub(crate) fn heartbeat(&self, state: &mut State, i: usize) {
        let token = match state.attempts[i].pc {
            Pc::Running { token } | Pc::Finishing { token, .. } | Pc::Copying { token, .. } => {
                token
            }
            _ => return,
        };
        // A refused heartbeat only tells the handler its lease is lost, and stops.
        let holder = self.holder(state, i, token);
        let renewed = holder.renewed(self.holder_stamp(state, i).now, &POLICY);
        match self.holder_write(state, i, token, &Transition::Renew, false) {
            Some(Ok(())) => state.attempts[i].lease = Some(lease_of(&renewed)),
            Some(Err(_)) => state.attempts[i].lease = None,
            None => {}
        }
    }

    /// Transactional: the effect and the completion commit together, under the
    /// completion's precondition; refused, both roll back and the client gets 409.
    fn commit(&self, state: &mut State, i: usize, token: u64, lose_reply: bool) {
        let holder = self.holder(state, i, token);
        let at = self.holder_stamp(state, i);
        let n = state.ghost.executions.len() as u8 + 1;
        let current = state.main.record();
        match complete(current.as_ref(), &holder, response(n), at.now, &POLICY) {
            Ok(record) => {
                if self.config.store_clock() && !at.accepted_by(state.main.now(state.now)) {
                    // Recomputed at the store's time, within the same transaction.
                    self.observe(state, i);
                    return;
                }
                state.main.put(&record);
                state.ghost.executions.push(state.attempts[i].request);
                self.after_write(state, i, &record);
                state.attempts[i].pc = match lose_reply {
                    true => Pc::Recovering { token },
                    false => Pc::Answered(Answer::Executed {
                        response: n,
                        stored: true,
                    }),
                };
            }
            Err(_) => state.attempts[i].pc = Pc::Answered(Answer::Conflict),
        }
    }

    /// The edge, once the origin answered: keep a copy of what the origin stored, with
    /// the origin's expiry, else release the edge's claim.
    fn edge_finish(&self, state: &mut State, i: usize, answer: Answer) {
        let Some(token) = state.attempts[i].edge.take() else {
            return;
        };
        let holder = self.holder(state, i, token);
        let now = state.edge.now(state.now);
        let stored = state.edge.record();
        let origin_now = state.main.now(state.now);
        let kept = match answer {
            Answer::Executed {
                response: n,
                stored: true,
            }
            | Answer::Replayed(n) => {
                // The origin's disposition: stored until its record expires.
                let expires_at = match state.main.record() {
                    Some(origin @ Record::Completed { .. }) => origin.expires_at(),
                    _ => origin_now + POLICY.ttl_ms,
                };
                edge_ttl_ms(Some(expires_at), now, u64::MAX).and_then(|ttl_ms| {
                    let policy = Policy { ttl_ms, ..POLICY };
                    complete(stored.as_ref(), &holder, response(n), now, &policy).ok()
                })
            }
            _ => None,
        };
        if let Some(record) = kept.or_else(|| release(stored.as_ref(), &holder, now).ok()) {
            state.edge.put(&record);
        }
    }

    /// A claim decision that claims nothing answers the client. A 422 is checked against
    /// what binds the key: some store's claim or answer of another request, not
    /// released by its holder, or the edge's live claim or answer of one.
    fn refuse(&self, state: &mut State, i: usize, decision: &Decision) {
        let answered = answer(decision);
        if answered == Answer::Mismatch {
            let fp = fingerprint(state.attempts[i].request);
            let released = &state.ghost.released;
            // A store's: neither released nor revived after its holder released it.
            let binds = |record: Option<Record>| {
                record.is_some_and(|r| {
                    r.fingerprint() != &fp && !r.is_released() && !released.contains(&r.token())
                })
            };
            // The edge's: an answer, or a claim within its lease (its attempt may not
            // have told the edge yet that the origin released the key). Its tokens are
            // its own, unrelated to the origin's.
            let edge_now = state.edge.now(state.now);
            let edge_binds = state.edge.record().is_some_and(|r| {
                r.fingerprint() != &fp
                    && match r {
                        Record::InProgress { lease_until, .. } => edge_now < lease_until,
                        Record::Completed { .. } => true,
                    }
            });
            let bound = binds(state.main.record()) || binds(state.other.record()) || edge_binds;
            state.ghost.unbound_refusal |= !bound;
        }
        state.attempts[i].pc = Pc::Answered(answered);
        state.attempts[i].sent_at = None;
    }

    /// The handler says nothing happened: its holder releases the key, and the client
    /// gets the handler's answer whether the release was written or refused (fenced).
    pub(crate) fn handler_release(&self, state: &mut State, i: usize) {
        let Pc::Running { token } = state.attempts[i].pc else {
            return;
        };
        match self.holder_write(state, i, token, &Transition::Release, false) {
            Some(Ok(())) => {
                state.ghost.released.push(token);
                state.attempts[i].pc = Pc::Answered(Answer::Released);
            }
            Some(Err(_)) => state.attempts[i].pc = Pc::Answered(Answer::Released),
            None => {} // skewed: sent again, now at the store's clock
        }
    }

    /// A heartbeat leaves, computed at the holder's estimate of the store's clock.
    pub(crate) fn send_heartbeat(&self, state: &mut State, i: usize) {
        let token = match state.attempts[i].pc {
            Pc::Running { token } | Pc::Finishing { token, .. } | Pc::Copying { token, .. } => {
                token
            }
            _ => return,
        };
        let at = self.holder_stamp(state, i).now;
        state.attempts[i].late_beat = Some((token, at));
    }

    /// The heartbeat in flight lands on the deciding store, whatever became of its
    /// holder; nobody reads its reply.
    pub(crate) fn land_heartbeat(&self, state: &mut State, i: usize) {
        let Some((token, at)) = state.attempts[i].late_beat.take() else {
            return;
        };
        let holder = self.holder(state, i, token);
        let renewed = holder.renewed(at, &POLICY);
        let now = state.now;
        state.main.holder_write(
            &holder,
            &renewed,
            Stamp::new(at, &POLICY),
            now,
            self.config.bug,
        );
    }

    /// Tiered sync: Redis mirrors what Postgres holds (best effort).
    pub(crate) fn mirror(&self, state: &mut State, i: usize) {
        let Some((seen, record)) = state.attempts[i].mirror.take() else {
            return;
        };
        let record = decode(&record);
        let at = Stamp::new(state.other.now(state.now), &POLICY);
        let now = state.now;
        let swapped = seen
            .map(|seen| {
                state.other.replace(&decode(&seen), &record, at, now, None) == Swap::Replaced
            })
            .unwrap_or(false);
        if !swapped {
            state.other.mirror(&record);
        }
    }
}
