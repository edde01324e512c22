//! The checked state: the clock, the stores, the attempts, and what was observed.

use crate::stores::Slot;
use idem_core::Millis;

/// What a client was answered.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Answer {
    /// Its own attempt ran the handler, which produced response `response`; `stored`
    /// when the completion was written (otherwise the client still gets the handler's
    /// answer, unstored, as the layer does when its holder was fenced).
    Executed { response: u8, stored: bool },
    /// A stored response, replayed.
    Replayed(u8),
    /// `409`: the same request is in flight (or its holder was fenced).
    Conflict,
    /// `422`: the key belongs to another request.
    Mismatch,
    /// `503`: a store failed (or its reply was lost).
    Unavailable,
    /// The handler's own answer that nothing happened (a 4xx it names), not stored: the
    /// key was released.
    Released,
}

/// Where an attempt is.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Pc {
    /// Not sent yet.
    Idle,
    /// Claiming by compare-and-swap: insert-if-absent of a fresh claim next.
    Insert,
    /// Tiered async: our claim is in Redis; Postgres is read next (the cold path).
    ColdRead { ours: Vec<u8> },
    /// Tiered async with [`crate::config::Bug::ColdReadWithTheClaim`]: Postgres was read
    /// (`authority`, what it held) before the claim reached Redis; insert-if-absent next.
    InsertAfterRead { authority: Option<Vec<u8>> },
    /// Claiming by compare-and-swap: swap `expected` for `record`, decided at the store's
    /// time `at`.
    Replace {
        expected: Vec<u8>,
        record: Vec<u8>,
        at: Millis,
    },
    /// Holding the claim with `token`; the handler has not committed its effect.
    Running { token: u64 },
    /// The handler's effect committed and produced `response`; the completion is
    /// written next, again until it is written or refused.
    Finishing { token: u64, response: u8 },
    /// Tiered async: Redis refused the completion `record` as missing, Postgres still
    /// gives the holder the key; the copy into Redis is sent next — written only if it
    /// lands, else the completion is written again.
    Copying {
        token: u64,
        response: u8,
        record: Vec<u8>,
    },
    /// Transactional: the commit's reply was lost; the holder reads what it committed.
    Recovering { token: u64 },
    /// The client has its answer.
    Answered(Answer),
    /// The replica died holding this attempt; its client has no answer.
    Crashed,
}

/// One client's attempt and the replica serving it.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Attempt {
    /// The request sent: 0, or 1 for another request under the same key.
    pub request: u8,
    /// This replica's estimate of the deciding store's clock, minus the true clock.
    pub clock: i64,
    /// Where it is.
    pub pc: Pc,
    /// While it holds a claim: when its lease ends (on the store's clock) by its last
    /// claim or renewal that landed. A holder that does not pause renews before then.
    pub lease: Option<Millis>,
    /// Tiered sync: the record Redis held (or our provisional claim) when the claim began.
    pub seen: Option<Vec<u8>>,
    /// Tiered sync: a mirror write to Redis still to be made — swap out the record seen,
    /// else write the new one if it supersedes Redis' (best effort, as the store does).
    pub mirror: Option<(Option<Vec<u8>>, Vec<u8>)>,
    /// Tiered async: this replica's outbox, oldest first.
    pub outbox: Vec<Vec<u8>>,
    /// The edge: the Durable Object's claim token while the origin is asked.
    pub edge: Option<u64>,
    /// A heartbeat sent and not landed yet: the holder's token, and its estimate of the
    /// store's clock when it was computed.
    pub late_beat: Option<(u64, Millis)>,
    /// When the claim was sent to the store that decides it (true time): a claim whose
    /// round trip outlasts the claim budget does not run ([`idem_core::Policy::claim_in_time`]).
    pub sent_at: Option<Millis>,
}

/// What the checker watches, apart from the system (a ghost: no step reads it).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Ghost {
    /// The request each execution of the handler ran (its response is its index + 1).
    pub executions: Vec<u8>,
    /// The highest token a claim that landed carried.
    pub max_claim: u64,
    /// A claim landed with a token not above an earlier one.
    pub token_regressed: bool,
    /// A completion landed under a token below a claim that landed earlier.
    pub fenced_completed: bool,
    /// The tokens of claims their holders released (nothing happened under them).
    pub released: Vec<u64>,
    /// A request was refused as another's (422) while nothing bound the key to another
    /// request: no claim or answer of one, only released claims.
    pub unbound_refusal: bool,
}

/// The whole state.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    /// The true clock.
    pub now: Millis,
    /// The store that decides claims: memory, Postgres (also tiered sync's, and the
    /// origin's behind the edge), or the Redis master (redis, tiered async).
    pub main: Slot,
    /// Tiered: the other tier (sync: Redis; async: Postgres).
    pub other: Slot,
    /// The Redis replica, in configurations whose master may fail over.
    pub replica: Option<Slot>,
    /// Whether the failover happened.
    pub failed_over: bool,
    /// Whether Redis lost its records already.
    pub redis_lost: bool,
    /// The edge's Durable Object.
    pub edge: Slot,
    /// Whether the Durable Object lost its state already.
    pub edge_lost: bool,
    /// The attempts.
    pub attempts: Vec<Attempt>,
    /// What was observed.
    pub ghost: Ghost,
}
