//! Running the checker on one configuration, and what it found.

use crate::config::Config;
use crate::model::{Action, ProtocolModel};
use crate::state::State;
use stateright::{Checker, Model};
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
        found.insert(name, trace(checker.model(), path.into_vec()));
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

/// A trace in words: each step, then what it left in the stores and the attempts.
fn trace(model: &ProtocolModel, path: Vec<(State, Option<Action>)>) -> String {
    let mut out = String::new();
    for (state, action) in path {
        let Some(action) = action else {
            let _ = writeln!(out, "  end: {}", describe(model, &state));
            break;
        };
        let _ = writeln!(out, "  t+{:>4} ms  {:?}", state.now - crate::T0, action);
        let _ = writeln!(
            out,
            "             -> {}",
            describe(
                model,
                &model
                    .next_state(&state, action)
                    .expect("a step of the path")
            )
        );
    }
    out
}

fn describe(model: &ProtocolModel, s: &State) -> String {
    let record = |slot: &crate::stores::Slot| match slot.record() {
        None => "-".to_owned(),
        Some(idem_core::Record::InProgress {
            token, lease_until, ..
        }) => {
            format!(
                "in-progress(token {}, lease to t+{})",
                token - crate::T0 * 1024,
                lease_until.saturating_sub(crate::T0)
            )
        }
        Some(idem_core::Record::Completed {
            token, response, ..
        }) => {
            format!(
                "completed(token {}, response #{})",
                token - crate::T0 * 1024,
                response.body[0]
            )
        }
    };
    let mut out = format!("main {}", record(&s.main));
    if model.config.deployment == crate::Deployment::TieredSync
        || model.config.deployment == crate::Deployment::TieredAsync
    {
        let _ = write!(out, ", other {}", record(&s.other));
    }
    if let Some(replica) = &s.replica {
        let _ = write!(out, ", replica {}", record(replica));
    }
    if model.config.deployment == crate::Deployment::EdgeOverOrigin {
        let _ = write!(out, ", edge {}", record(&s.edge));
    }
    let _ = write!(
        out,
        "; attempts {:?}; executions {:?}",
        s.attempts.iter().map(|a| &a.pc).collect::<Vec<_>>(),
        s.ghost.executions
    );
    out
}
