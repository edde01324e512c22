//! What is deployed, and which faults the checker may inject.

/// How records are stored and claims decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Deployment {
    /// One process, one mutex: decide and write in one step, on the process clock.
    Memory,
    /// Postgres, `on-conflict`: insert-if-absent, then a compare-and-swap on the whole
    /// record decided at the store's time, each refused beyond the clock tolerance.
    PostgresOnConflict,
    /// Postgres, `advisory-lock`: read, decide at the database's time and write in one
    /// locked transaction.
    PostgresAdvisoryLock,
    /// Redis (standalone or one cluster slot) with the same compare-and-swap scripts,
    /// on the master's `TIME`; its replica is never promoted.
    Redis,
    /// Redis whose master may die: its replica, replicated asynchronously, is promoted
    /// with whatever it had received, and with its own clock.
    RedisFailover,
    /// Tiered, `sync`: Postgres decides every claim and takes every holder write first;
    /// Redis mirrors it (and may fail over).
    TieredSync,
    /// Tiered, `async`: Redis decides; Postgres learns claims and completions behind,
    /// through each replica's outbox; the Redis master may fail over.
    TieredAsync,
    /// The edge's Durable Object in front of an origin on Postgres (`advisory-lock`):
    /// the edge answers replays of what the origin stored and forwards the rest.
    EdgeOverOrigin,
}

/// How a holder's answer is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Completion {
    /// The handler's effect commits on its own; the completion is written after it.
    Separate,
    /// The effect commits in one Postgres transaction with the holder's completion,
    /// whose precondition (`Holder::check`) holds the row until the commit.
    Transactional,
}

/// The faults the checker may inject. Store outages and slow stores need no switch:
/// a step that does not happen while the clock ticks is exactly an outage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Faults {
    /// A replica dies while claiming or holding, before the handler's effect (with a
    /// transactional completion: before its commit) or while recovering from a lost
    /// commit; its client gets no answer, its outbox and mirror writes are lost. With
    /// `pause`, also between the effect and the completion.
    pub crash: bool,
    /// A holder stalls past its lease (GC pause, `SIGSTOP`, an outage longer than the
    /// lease), or dies after its effect and never completes. Without it, a live holder
    /// renews its lease before it runs out.
    pub pause: bool,
    /// A store write lands but its reply is lost (a timeout, a dropped connection).
    pub lost_replies: bool,
    /// The clock offset of the last attempt's replica, in ms.
    pub holder_skew: i64,
    /// The clock offset of the store a failover promotes, in ms.
    pub store_skew: i64,
    /// The Redis master dies once; its replica is promoted.
    pub failover: bool,
    /// The edge's Durable Object loses its stored record.
    pub edge_state_loss: bool,
    /// Redis loses its records once (a restart without persistence, a flush, an
    /// eviction) at a moment when every outbox has written behind: tiered stores must
    /// answer from Postgres through the cold path.
    pub redis_loss: bool,
    /// A handler says that nothing happened (idem's release signal, or in proxy mode a
    /// status the route names): its holder releases the key instead of completing.
    pub releases: bool,
    /// A holder's heartbeat is sent, and lands later in the same instant (within the
    /// clock tolerance: a later one is refused by its stamp) — after its holder's
    /// release, completion or death.
    pub late_heartbeats: bool,
    /// The edge's write of an answer's completion or release never lands (the Durable
    /// Object failed, or the edge was cut off): it keeps a claim it lost track of.
    pub edge_lost_writes: bool,
    /// How far (ms) the last attempt's estimate of the store's clock lags it in its
    /// holder writes: accurate at its claim, drifted since (within the tolerance).
    pub holder_lag: u64,
}

/// One configuration of the checker.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    /// A name for reports.
    pub name: &'static str,
    /// What is deployed.
    pub deployment: Deployment,
    /// How answers are stored.
    pub completion: Completion,
    /// The faults injected.
    pub faults: Faults,
    /// The attempts, by the request they send: 0 is the request, 1 another request
    /// under the same key (a client's bug, or a key reused).
    pub attempts: Vec<u8>,
    /// The last instant at which attempts act, in ticks after [`crate::T0`]; the clock
    /// then runs a lease further so that a key left behind shows.
    pub act_ticks: u64,
    /// A bug put back on purpose, to show the checker finds it.
    pub bug: Option<Bug>,
}

impl Config {
    /// A configuration with no faults, two retries of one request, and five ticks.
    pub fn new(name: &'static str, deployment: Deployment) -> Config {
        Config {
            name,
            deployment,
            completion: Completion::Separate,
            faults: Faults::default(),
            attempts: vec![0, 0],
            act_ticks: 5,
            bug: None,
        }
    }

    /// The same with `faults`.
    pub fn faults(mut self, faults: Faults) -> Config {
        self.faults = faults;
        self
    }

    /// The same with the attempts given.
    pub fn attempts(mut self, attempts: &[u8]) -> Config {
        self.attempts = attempts.to_vec();
        self
    }

    /// The same with a transactional completion.
    pub fn transactional(mut self) -> Config {
        self.completion = Completion::Transactional;
        self
    }

    /// The same with `ticks` of activity.
    pub fn ticks(mut self, ticks: u64) -> Config {
        self.act_ticks = ticks;
        self
    }

    /// The same with `bug` put back.
    pub fn with_bug(mut self, bug: Bug) -> Config {
        self.bug = Some(bug);
        self
    }

    /// Whether stores judge time on their own clock (all but [`Bug::ReplicaClock`]).
    pub fn store_clock(&self) -> bool {
        self.bug != Some(Bug::ReplicaClock)
    }

    /// Whether Redis, as a store that can fail over, is part of this deployment.
    pub fn has_redis_replica(&self) -> bool {
        self.faults.failover
            && matches!(
                self.deployment,
                Deployment::RedisFailover | Deployment::TieredSync | Deployment::TieredAsync
            )
    }
}

/// Bugs idem had or could have, put back into the model to show the checker finds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// Before issue 11: a replica decides over an existing record at its own clock, and
    /// stores take a record computed at any time.
    ReplicaClock,
    /// A takeover's compare-and-swap compares the token only, not the whole record: a
    /// holder's completion (or renewal) under the same token since the read is lost.
    TokenOnlySwap,
    /// Holder writes without their precondition (`token = $t AND state = in-progress`).
    UnguardedHolderWrite,
    /// Before this model: in tiered async, a holder's write refused by a newer claim in
    /// Redis gave up, even when that claim was a retry's provisional one, made after Redis
    /// lost the holder's record, that the authority would have replaced.
    FencedByProvisionalClaim,
    /// A speed-up tried and not kept (2026-11-30): in tiered async, the cold path's read
    /// of Postgres sent together with the claim to Redis rather than after Redis
    /// answered. The read may then predate a write-behind that lands, and a loss of
    /// Redis' records, before the claim reaches Redis.
    ColdReadWithTheClaim,
    /// Before issue 35: in tiered async, a holder's write refused as missing in Redis,
    /// and allowed by Postgres, counted as written whether its copy landed in Redis or
    /// Redis refused it for a newer record (a retry's claim since the loss).
    RefusedCopyCounted,
    /// Before d306f92: a holder write needs its token on a claim in progress, not an
    /// unexpired one: a heartbeat sent before its holder's release and landing after it
    /// renews the released claim, and binds the key to a request that never ran.
    HolderWriteOverExpired,
    /// Before ba39cc2: the edge decides over its own record alone: a claim whose release
    /// (or completion) it never wrote binds the key at the edge for the key's TTL, where
    /// the origin released it.
    EdgeBindsLostClaim,
    /// Before e57a685: in tiered async, a holder refused in Redis goes over whatever
    /// holds the key there — a takeover's completed answer too — while Postgres shows
    /// its claim live at the holder's own estimate of the clock, which may lag.
    ReplaceAnyFront,
}
