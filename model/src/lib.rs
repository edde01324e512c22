//! A model of idem's claim protocol, checked by [`stateright`] over every interleaving.
//!
//! Actors: clients' attempts (retries of one request under one key, and optionally a
//! different request under the same key), the origin replicas that hold claims and run
//! the handler, and the stores. Every transition that decides anything calls the real
//! core — [`idem_core::decide`], [`idem_core::Holder::check`] through `complete`,
//! `heartbeat` and `release`, `already_wrote`, `own_completion`, `claim_outlived`,
//! [`idem_core::Stamp`], [`idem_core::Record::supersedes`] and the record's binary
//! encoding (stores hold bytes). The model only sequences the steps the adapters take
//! (the compare-and-swap claim, the write-behind outbox, the edge's Durable Object) and
//! injects faults between them.
//!
//! Time runs in ticks of [`TICK`] on a true clock; each store and each replica reads it
//! with its own offset. A replica's first estimate of a store's clock is its own clock;
//! every reply from the store corrects it (the origin's `StoreClock`).

mod config;
mod model;
mod report;
mod state;
mod steps;
mod stores;

pub use config::{Bug, Completion, Config, Deployment, Faults};
pub use model::{properties, Action, ProtocolModel, PROPERTIES};
pub use report::{check, Outcome};
pub use state::{Answer, Attempt, Ghost, Pc, State};

use idem_core::{Millis, Policy};

/// One step of the true clock.
pub const TICK: Millis = 500;
/// Where time starts (tokens carry their claim's instant).
pub const T0: Millis = 1_000_000;
/// The protocol's timing in the model: a lease of two ticks, a TTL beyond the horizon
/// (so "within the TTL" is the whole run), and the store's clock tolerance that follows
/// from them ([`idem_core::Stamp::new`]: a tenth of the lease, at least 50 ms).
pub const POLICY: Policy = Policy {
    lease_ms: 1_000,
    ttl_ms: 60_000,
};
/// A clock difference the protocol tolerates ([`idem_core::Stamp`]'s tolerance).
pub const SKEW_WITHIN: i64 = 100;
/// A clock difference beyond it: more than a lease.
pub const SKEW_BEYOND: i64 = 1_500;
