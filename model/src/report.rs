//! Running the checker on one configuration, and what it found.

use crate::config::Config;
use crate::model::{Action, ProtocolModel};
use crate::state::{Answer, Pc, State};
use stateright::{Checker, Expectation, Model};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

/// What checking one configuration found.
pub struct Outcome {
    /// The configuration.
    pub config: Config,
    /// Distinct states explored.
    pub states: usize,
    /// The deepest path.
    pub depth: usize,
    /// Wall time.
    pub took: Duration,
    /// Whether every reachable state was explored.
    pub complete: bool,
    /// Each property with a discovery: its trace (a counterexample for an invariant, an
    /// example for a `sometimes`).
    pub found: BTreeMap<&'static str, String>,
}

impl Outcome {
    /// Whether `property` has a counterexample (or, for a `sometimes`, an example).
    pub fn found(&self, property: &str) -> bool {
        self.found.contains_key(property)
    }

    /// One line for the report.
    pub fn summary(&self) -> String {
        format!(
            "{:<58} {:>9} states  depth {:>2}  {:>6.1} s{}",
            self.config.name,
            self.states,
            self.depth,
            self.took.as_secs_f64(),
            if self.complete { "" } else { "  (incomplete)" }
        )
    }
}

/// Explores every state of `config`'s model, breadth first, so that each trace found
/// is a shortest one.
pub fn check(config: &Config) -> Outcome {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();
    let model = ProtocolModel {
        config: config.clone(),
    };
    let checker = model.checker().threads(threads).spawn_bfs().join();
    let took = started.elapsed();
    let mut found = BTreeMap::new();
    for (name, path) in checker.discoveries() {
        found.insert(name, trace(checker.model(), name, path.into_vec()));
    }
    Outcome {
        config: config.clone(),
        states: checker.unique_state_count(),
        depth: checker.max_depth(),
        took,
        complete: checker.is_done(),
        found,
    }
}

/// A trace in words, up to the state that decides `property`: each step with the
/// attempt it moved (or the fault), then the stores.
fn trace(model: &ProtocolModel, property: &str, path: Vec<(State, Option<Action>)>) -> String {
    let condition = model
        .properties()
        .into_iter()
        .find(|p| p.name == property)
        .expect("a property of the model");
    let decided = |s: &State| match condition.expectation {
        Expectation::Sometimes => (condition.condition)(model, s),
        _ => !(condition.condition)(model, s),
    };
    let mut out = String::new();
    for (state, action) in path {
        if decided(&state) {
            break;
        }
        let Some(action) = action else { break };
        let next = model
            .next_state(&state, action)
            .expect("a step of the path");
        let what = match action {
            Action::Step(i) | Action::LoseReply(i) | Action::Heartbeat(i) | Action::Crash(i) => {
                let verb = match action {
                    Action::LoseReply(_) => "steps, its write lands, the reply is lost",
                    Action::Heartbeat(_) => "renews its lease",
                    Action::Crash(_) => "dies",
                    _ => "steps",
                };
                format!(
                    "attempt {i} {verb}: {} -> {}",
                    pc(&state.attempts[i].pc),
                    pc(&next.attempts[i].pc)
                )
            }
            Action::ReadAhead(i) => {
                format!("attempt {i} reads Postgres before its claim reaches Redis")
            }
            Action::Mirror(i) => format!("attempt {i}'s replica mirrors Postgres into Redis"),
            Action::Release(i) => format!(
                "attempt {i}'s handler says nothing happened; it releases: {} -> {}",
                pc(&state.attempts[i].pc),
                pc(&next.attempts[i].pc)
            ),
            Action::SendHeartbeat(i) => format!("attempt {i} sends a heartbeat"),
            Action::LandHeartbeat(i) => format!("attempt {i}'s heartbeat in flight lands"),
            Action::LoseEdgeWrite(i) => {
                format!("the edge's write for attempt {i} is lost: it keeps its claim")
            }
            Action::WriteBehind(i) => format!("attempt {i}'s outbox writes behind"),
            Action::Tick => "the clock ticks".to_owned(),
            Action::Replicate => "Redis replicates to its replica".to_owned(),
            Action::Failover => "the Redis master dies; its replica is promoted".to_owned(),
            Action::LoseEdgeState => "the edge's Durable Object loses its record".to_owned(),
            Action::LoseRedis => {
                "Redis loses its records (every outbox had written behind)".to_owned()
            }
        };
        let _ = writeln!(out, "    t+{:<5} {what}", state.now - crate::T0);
        let _ = writeln!(out, "            {}", describe(model, &next));
        if decided(&next) {
            break;
        }
    }
    out
}

fn token(t: u64) -> String {
    match t % 1024 {
        0 => format!("@{}", t / 1024 - crate::T0),
        n => format!("@{}+{n}", t / 1024 - crate::T0),
    }
}

fn pc(pc: &Pc) -> String {
    match pc {
        Pc::Idle => "sends".to_owned(),
        Pc::Insert => "claiming".to_owned(),
        Pc::ColdRead { .. } => "claimed in Redis, reading Postgres".to_owned(),
        Pc::InsertAfterRead { .. } => "Postgres read, claiming in Redis".to_owned(),
        Pc::Replace { .. } => "swapping in a claim".to_owned(),
        Pc::Running { token: t } => format!("holds token{}", token(*t)),
        Pc::Finishing { token: t, response } => {
            format!("effect #{response} done, completing token{}", token(*t))
        }
        Pc::Copying { token: t, .. } => {
            format!(
                "token{} read Postgres, copying its completion into Redis",
                token(*t)
            )
        }
        Pc::Recovering { .. } => "reading its commit".to_owned(),
        Pc::Answered(a) => match a {
            Answer::Executed { response, stored } => {
                format!(
                    "answered #{response} ({})",
                    if *stored { "stored" } else { "not stored" }
                )
            }
            Answer::Replayed(r) => format!("answered #{r} (replayed)"),
            Answer::Conflict => "answered 409".to_owned(),
            Answer::Mismatch => "answered 422".to_owned(),
            Answer::Unavailable => "answered 503".to_owned(),
            Answer::Released => "answered the handler's 4xx (released)".to_owned(),
        },
        Pc::Crashed => "dead".to_owned(),
    }
}

fn describe(model: &ProtocolModel, s: &State) -> String {
    let record = |slot: &crate::stores::Slot| match slot.record() {
        None => "none".to_owned(),
        Some(idem_core::Record::InProgress {
            token: t,
            lease_until,
            ..
        }) => format!(
            "in progress, token{}, lease to {}",
            token(t),
            lease_until.saturating_sub(crate::T0)
        ),
        Some(idem_core::Record::Completed {
            token: t, response, ..
        }) => format!("completed #{}, token{}", response.body[0], token(t)),
    };
    let names = match model.config.deployment {
        crate::Deployment::TieredSync => ("postgres", "redis"),
        crate::Deployment::TieredAsync => ("redis", "postgres"),
        crate::Deployment::EdgeOverOrigin => ("origin", ""),
        crate::Deployment::Memory => ("memory", ""),
        crate::Deployment::Redis | crate::Deployment::RedisFailover => ("redis", ""),
        _ => ("postgres", ""),
    };
    let mut out = format!("{}: {}", names.0, record(&s.main));
    if !names.1.is_empty() {
        let _ = write!(out, "; {}: {}", names.1, record(&s.other));
    }
    if let Some(replica) = &s.replica {
        let _ = write!(out, "; redis replica: {}", record(replica));
    }
    if model.config.deployment == crate::Deployment::EdgeOverOrigin {
        let _ = write!(out, "; edge: {}", record(&s.edge));
    }
    let _ = write!(out, "; effects {}", s.ghost.executions.len());
    out
}
