//! idem's origin: an axum service that runs a side-effecting API (the demo charges
//! API here) behind [`idempotency::IdempotencyLayer`], on a [`store::Store`].
//!
//! * [`idempotency`] — the tower layer: the HTTP contract.
//! * [`store`] — the record stores: memory (embedded default), Postgres, Redis or
//!   Redis Cluster, and tiered (Redis over the Postgres authority).
//! * [`charges`] — the demo business API whose double charges are countable.
//! * [`app`] and [`config`] — wiring, health, metrics and the command line.
#![forbid(unsafe_code)]

pub mod app;
pub mod charges;
pub mod config;
pub mod idempotency;
pub mod metrics;
pub mod store;

pub use idem_core as core;

/// Wall-clock milliseconds since the Unix epoch: the only clock idem reads.
pub fn now() -> idem_core::Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The README's Rust examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
