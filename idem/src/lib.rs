//! idem: retried HTTP requests that run once. Two retries of one payment, racing
//! each other, charge once, and every retry gets the first attempt's answer.
//!
//! * [`idempotency`] — the tower layer: the HTTP contract, for any tower or axum
//!   service.
//! * [`store`] — where records live: [`store::MemoryStore`] (always), and behind
//!   cargo features `postgres`, `redis` and `tiered` (Redis over the Postgres
//!   authority).
//! * [`limits`] — deadlines on request bodies, for servers that have none.
//! * [`metrics`] — what the layer records through the `metrics` facade.
//! * [`admin`] — the admin API: look up, list and purge records.
//! * [`core`] — the sans-I/O core every decision comes from (`idem-core`).
//!
//! ```
//! use axum::{routing::post, Router};
//! use idem::idempotency::IdempotencyLayer;
//! use idem::store::MemoryStore;
//! use std::sync::Arc;
//!
//! let app: Router = Router::new()
//!     .route("/v1/charges", post(|| async { "charged once" }))
//!     .layer(IdempotencyLayer::new(Arc::new(MemoryStore::new())).require_key_on(["/v1/charges"]));
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
pub mod idempotency;
pub mod limits;
pub mod metrics;
pub mod quota;
pub mod store;

pub use idem_core as core;

/// Wall-clock milliseconds since the Unix epoch: the only clock idem reads.
pub fn now() -> idem_core::Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The README's Rust examples, compiled as doc tests against the library alone (they
/// use the Postgres store).
#[cfg(all(doctest, feature = "postgres"))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
