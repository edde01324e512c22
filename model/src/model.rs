//! The model: which steps are possible in a state, and the properties checked.

use crate::config::{Bug, Completion, Config, Deployment};
use crate::state::{Answer, Attempt, Ghost, Pc, State};
use crate::stores::Slot;
use crate::{POLICY, T0, TICK};
use idem_core::{decide, Decision, Fingerprint};
use stateright::{Model, Property};

/// One step of the system.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    /// The true clock advances one tick.
    Tick,
    /// Attempt `i` takes its next step, and every reply arrives.
    Step(usize),
    /// Tiered async with [`Bug::ColdReadWithTheClaim`]: attempt `i`'s cold read reaches
    /// Postgres before its claim reaches Redis (they are sent together; `Step` is the
    /// other order).
    ReadAhead(usize),
    /// Attempt `i`'s next store write lands, but its reply is lost.
    LoseReply(usize),
    /// Attempt `i`'s holder renews its lease.
    Heartbeat(usize),
    /// Attempt `i`'s handler says nothing happened: its holder releases the key.
    Release(usize),
    /// Attempt `i`'s holder sends a heartbeat that has not landed yet.
    SendHeartbeat(usize),
    /// Attempt `i`'s heartbeat in flight lands (its holder may be gone by now).
    LandHeartbeat(usize),
    /// The edge's write for attempt `i` (its completion or release at the edge) is lost:
    /// the edge keeps a claim it lost track of.
    LoseEdgeWrite(usize),
    /// Attempt `i`'s replica dies.
    Crash(usize),
    /// Tiered sync: attempt `i`'s replica mirrors Postgres' record into Redis.
    Mirror(usize),
    /// Tiered async: attempt `i`'s outbox writes its oldest record behind.
    WriteBehind(usize),
    /// The Redis replica catches up with its master.
    Replicate,
    /// The Redis master dies; its replica is promoted.
    Failover,
    /// The edge's Durable Object loses its record.
    LoseEdgeState,
    /// Redis loses its records, every outbox having written behind.
    LoseRedis,
}

/// The claim protocol under one [`Config`].
pub struct ProtocolModel {
    /// What is checked.
    pub config: Config,
}

/// The fingerprint of request `r`.
pub fn fingerprint(request: u8) -> Fingerprint {
    Fingerprint([request + 1; 32])
}

impl ProtocolModel {
    /// The last instant attempts act at.
    pub fn act_until(&self) -> u64 {
        T0 + self.config.act_ticks * TICK
    }

    /// The end of time: a lease and a tick after the attempts stop.
    pub fn horizon(&self) -> u64 {
        self.act_until() + POLICY.lease_ms + TICK
    }

    /// Whether every live holder's lease outlasts the next tick: a holder that does not
    /// pause renews in time (its heartbeat runs every eighth of a lease).
    fn holders_timely(&self, state: &State) -> bool {
        let next = state.main.now(state.now + TICK);
        state.attempts.iter().all(|a| match (&a.pc, a.lease) {
            (
                Pc::Running { .. }
                | Pc::Finishing { .. }
                | Pc::Copying { .. }
                | Pc::ColdRead { .. },
                Some(lease),
            ) => lease > next,
            _ => true,
        })
    }

    /// Whether Postgres holds exactly what Redis holds (tiered): every write Redis
    /// acknowledged was written behind, so Redis losing its records loses nothing.
    fn written_behind(&self, state: &State) -> bool {
        let (redis, pg) = match self.config.deployment {
            Deployment::TieredAsync => (&state.main, &state.other),
            Deployment::TieredSync => (&state.other, &state.main),
            _ => return true,
        };
        redis.bytes.is_some() && redis.bytes == pg.bytes
    }

    fn writes(&self, attempt: &Attempt) -> bool {
        let c = &self.config;
        if c.deployment == Deployment::Memory {
            return false; // in-process: no reply to lose
        }
        match attempt.pc {
            Pc::Insert | Pc::InsertAfterRead { .. } | Pc::Replace { .. } | Pc::Finishing { .. } => {
                true
            }
            Pc::Idle => !matches!(
                c.deployment,
                Deployment::TieredSync | Deployment::EdgeOverOrigin
            ),
            Pc::Running { .. } => c.completion == Completion::Transactional,
            _ => false,
        }
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let last = self.config.attempts.len().saturating_sub(1);
        let attempts = self
            .config
            .attempts
            .iter()
            .enumerate()
            .map(|(i, &request)| Attempt {
                request,
                clock: if i == last {
                    self.config.faults.holder_skew
                } else {
                    0
                },
                pc: Pc::Idle,
                lease: None,
                seen: None,
                mirror: None,
                outbox: Vec::new(),
                edge: None,
                late_beat: None,
                sent_at: None,
            })
            .collect();
        vec![State {
            now: T0,
            main: Slot::default(),
            other: Slot::default(),
            replica: self.config.has_redis_replica().then(Slot::default),
            failed_over: false,
            redis_lost: false,
            edge: Slot::default(),
            edge_lost: false,
            attempts,
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let c = &self.config;
        let acting = state.now <= self.act_until();
        if state.now < self.horizon() && (c.faults.pause || !acting || self.holders_timely(state)) {
            actions.push(Action::Tick);
        }
        for (i, a) in state.attempts.iter().enumerate() {
            if a.mirror.is_some() {
                actions.push(Action::Mirror(i));
            }
            if !a.outbox.is_empty() {
                actions.push(Action::WriteBehind(i));
            }
            if a.late_beat.is_some() {
                actions.push(Action::LandHeartbeat(i));
            }
            if !acting {
                continue;
            }
            let live = !matches!(a.pc, Pc::Answered(_) | Pc::Crashed);
            if live || a.edge.is_some() {
                actions.push(Action::Step(i));
            }
            if matches!(a.pc, Pc::Idle | Pc::Insert)
                && c.deployment == Deployment::TieredAsync
                && c.bug == Some(Bug::ColdReadWithTheClaim)
            {
                actions.push(Action::ReadAhead(i));
            }
            if live && c.faults.lost_replies && self.writes(a) {
                actions.push(Action::LoseReply(i));
            }
            if matches!(
                a.pc,
                Pc::Running { .. } | Pc::Finishing { .. } | Pc::Copying { .. }
            ) {
                actions.push(Action::Heartbeat(i));
                if c.faults.late_heartbeats && a.late_beat.is_none() {
                    actions.push(Action::SendHeartbeat(i));
                }
            }
            if c.faults.releases && matches!(a.pc, Pc::Running { .. }) {
                actions.push(Action::Release(i));
            }
            if c.faults.edge_lost_writes
                && c.deployment == Deployment::EdgeOverOrigin
                && a.edge.is_some()
                && matches!(a.pc, Pc::Answered(_))
            {
                actions.push(Action::LoseEdgeWrite(i));
            }
            // A crash between the effect and the completion is a holder that never comes
            // back after its effect: the pause class.
            let crashable = match a.pc {
                Pc::Idle | Pc::Answered(_) | Pc::Crashed => false,
                Pc::Finishing { .. } | Pc::Copying { .. } => c.faults.pause,
                _ => true,
            };
            if crashable && c.faults.crash {
                actions.push(Action::Crash(i));
            }
        }
        if let Some(replica) = &state.replica {
            if replica.bytes != self.redis(state).bytes {
                actions.push(Action::Replicate);
            }
            if !state.failed_over {
                actions.push(Action::Failover);
            }
        }
        if c.faults.redis_loss && !state.redis_lost && self.written_behind(state) {
            actions.push(Action::LoseRedis);
        }
        if c.faults.edge_state_loss && !state.edge_lost && state.edge.bytes.is_some() {
            actions.push(Action::LoseEdgeState);
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = state.clone();
        match action {
            Action::Tick => next.now += TICK,
            Action::Step(i) => self.step(&mut next, i, false),
            Action::LoseReply(i) => self.step(&mut next, i, true),
            Action::ReadAhead(i) => {
                let authority = next.other.bytes.clone();
                next.attempts[i].pc = Pc::InsertAfterRead { authority };
            }
            Action::Heartbeat(i) => self.heartbeat(&mut next, i),
            Action::Release(i) => self.handler_release(&mut next, i),
            Action::SendHeartbeat(i) => self.send_heartbeat(&mut next, i),
            Action::LandHeartbeat(i) => self.land_heartbeat(&mut next, i),
            Action::LoseEdgeWrite(i) => next.attempts[i].edge = None,
            Action::Crash(i) => {
                let a = &mut next.attempts[i];
                a.pc = Pc::Crashed;
                a.mirror = None;
                a.outbox.clear();
            }
            Action::Mirror(i) => self.mirror(&mut next, i),
            Action::WriteBehind(i) => {
                let record = next.attempts[i].outbox.remove(0);
                let record = idem_core::Record::decode(&record).expect("queued records decode");
                next.other.write_behind(&record);
            }
            Action::Replicate => {
                let bytes = self.redis(&next).bytes.clone();
                next.replica.as_mut().expect("a replica").bytes = bytes;
            }
            Action::Failover => {
                let promoted = next.replica.clone().expect("a replica");
                let skew = self.config.faults.store_skew;
                let redis = self.redis_mut(&mut next);
                redis.bytes = promoted.bytes;
                redis.offset = skew;
                next.failed_over = true;
            }
            Action::LoseRedis => {
                self.redis_mut(&mut next).bytes = None;
                if let Some(replica) = next.replica.as_mut() {
                    replica.bytes = None;
                }
                next.redis_lost = true;
            }
            Action::LoseEdgeState => {
                next.edge.bytes = None;
                next.edge_lost = true;
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AT_MOST_ONCE, |_, s: &State| s.ghost.executions.len() <= 1),
            Property::always(ONE_ANSWER, |_, s: &State| {
                (0..2).all(|r| {
                    let mut seen = s
                        .attempts
                        .iter()
                        .filter(|a| a.request == r)
                        .filter_map(response);
                    match seen.next() {
                        Some(first) => seen.all(|n| n == first),
                        None => true,
                    }
                })
            }),
            Property::always(MISMATCH_NEVER_REPLAYS, |_, s: &State| {
                s.attempts.iter().all(|a| match a.pc {
                    Pc::Answered(Answer::Replayed(n)) => {
                        s.ghost.executions.get(usize::from(n) - 1) == Some(&a.request)
                    }
                    _ => true,
                })
            }),
            Property::always(FENCED_NEVER_COMPLETES, |_, s: &State| {
                !s.ghost.fenced_completed
            }),
            Property::always(TOKENS_INCREASE, |_, s: &State| !s.ghost.token_regressed),
            Property::always(NO_UNBOUND_REFUSAL, |_, s: &State| !s.ghost.unbound_refusal),
            Property::always(NO_KEY_STUCK, |m: &ProtocolModel, s: &State| {
                if s.now < m.horizon() {
                    return true;
                }
                let free = |slot: &Slot| {
                    let fp = fingerprint(0);
                    !matches!(
                        decide(slot.record().as_ref(), &fp, slot.now(s.now), &POLICY),
                        Decision::InFlight { .. }
                    )
                };
                free(&s.main) && free(&s.edge)
            }),
            Property::sometimes(A_RETRY_REPLAYS, |_, s: &State| {
                s.attempts
                    .iter()
                    .any(|a| matches!(a.pc, Pc::Answered(Answer::Replayed(_))))
            }),
        ]
    }
}

/// The response a client was answered with, if it was one.
fn response(a: &Attempt) -> Option<u8> {
    match a.pc {
        Pc::Answered(Answer::Executed { response, .. })
        | Pc::Answered(Answer::Replayed(response)) => Some(response),
        _ => None,
    }
}

pub use properties::*;

/// The properties' names.
pub mod properties {
    /// At most one execution per (scope, key) within the TTL.
    pub const AT_MOST_ONCE: &str = "at most one execution";
    /// Every client answered with a response gets the same one.
    pub const ONE_ANSWER: &str = "every client gets the same answer";
    /// A different request under the key never gets this request's answer.
    pub const MISMATCH_NEVER_REPLAYS: &str = "a mismatch never replays";
    /// A holder whose claim was taken over never completes.
    pub const FENCED_NEVER_COMPLETES: &str = "a fenced holder never completes";
    /// Each claim a holder gets carries a higher token than every earlier one.
    pub const TOKENS_INCREASE: &str = "tokens strictly increase";
    /// Another request is refused (422) only while a claim or an answer of a request
    /// binds the key — never over a claim its holder released.
    pub const NO_UNBOUND_REFUSAL: &str = "a released key refuses no request";
    /// Once its holders are gone, the key does not answer 409 past their lease.
    pub const NO_KEY_STUCK: &str = "no key stays in progress once its holders are gone";
    /// A retry is replayed (the model is not vacuous).
    pub const A_RETRY_REPLAYS: &str = "sometimes: a retry is replayed";
}

/// Every safety and liveness property, in report order.
pub const PROPERTIES: [&str; 7] = [
    AT_MOST_ONCE,
    ONE_ANSWER,
    MISMATCH_NEVER_REPLAYS,
    FENCED_NEVER_COMPLETES,
    TOKENS_INCREASE,
    NO_KEY_STUCK,
    NO_UNBOUND_REFUSAL,
];
