//! idem: retried HTTP requests that run once. Two retries of one payment, racing
//! each other, charge once, and every retry gets the first attempt's answer.
//!
//! * [`IdempotencyLayer`] — the tower layer: the HTTP contract, for any tower or axum
//!   service; handlers read their claim from [`IdempotencyContext`].
//! * [`Store`] — where records live: [`MemoryStore`] (always), and behind cargo
//!   features `postgres`, `redis` and `tiered` (Redis over the Postgres authority)
//!   `PostgresStore`, `RedisStore` and `TieredStore`.
//! * [`BodyDeadlineLayer`] — deadlines on request bodies, for servers that have none.
//! * [`metrics`] — what the layer records through the `metrics` facade.
//! * [`admin`] — the admin API: look up, list and purge records.
//! * [`core`] — the sans-I/O core every decision comes from (`idem-core`).
//!
//! ```
//! use axum::{routing::post, Router};
//! use idem::{IdempotencyLayer, MemoryStore};
//! use std::sync::Arc;
//!
//! let app: Router = Router::new()
//!     .route("/v1/charges", post(|| async { "charged once" }))
//!     .layer(IdempotencyLayer::new(Arc::new(MemoryStore::new())).require_key_on(["/v1/charges"]));
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
mod idempotency;
mod limits;
pub mod metrics;
mod quota;
mod store;

pub use idem_core as core;
/// The type of [`IdempotencyContext::lease_lost`], so that a handler can name it
/// without depending on `tokio-util` itself.
pub use tokio_util::sync::CancellationToken;

pub use idempotency::{
    problem_response, problem_response_under, release, Executions, IdempotencyContext,
    IdempotencyLayer, IdempotencyService, DEFAULT_BUFFERED_BODY_BYTES, DEFAULT_MAX_IN_PROGRESS,
};
#[cfg(feature = "postgres")]
pub use idempotency::{Transaction, TransactionError, TransactionsUnsupported};
pub use limits::{BodyDeadline, BodyDeadlineLayer, BodyTimeout, DeadlineBody};
pub use quota::{NewKeys, ScopeQuota};
#[cfg(feature = "postgres")]
pub use store::postgres::{
    convert_keys, deadpool_postgres, tokio_postgres, Authority, BeginError, CommitError, Converted,
    FencedTransaction, IdColumn, PgOptions, PgStrategy, PostgresStore,
};
#[cfg(feature = "redis")]
pub use store::redis::{RedisLayout, RedisOptions, RedisStore};
#[cfg(feature = "tiered")]
pub use store::tiered::{outbox::OutboxOptions, Durability, TieredStore};
pub use store::{
    spawn_sweeper, Deletion, HolderWrite, InProgressPage, MemoryStore, PurgeChannel, Purged,
    ReplayCache, Store, StoreError, StoreErrorKind, StoreExt,
};

/// Hooks for idem's own tests and benchmarks. Not part of the API: anything here may
/// change or go in any release. (Always compiled: the `testing` feature only adds to it.)
#[doc(hidden)]
pub mod internal {
    pub use crate::store::cache::STALENESS_BOUND;
    #[cfg(feature = "postgres")]
    pub use crate::store::postgres::id_column;
    #[cfg(all(feature = "postgres", feature = "testing"))]
    pub use crate::store::postgres::{claim_statements, completion_statement};
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub use crate::store::tls;
    pub use crate::store::{CasRecords, Insert, Stamp, Swap};
}

/// Wall-clock milliseconds since the Unix epoch: the only clock idem reads.
pub fn now() -> idem_core::Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The Rust examples of the README and the book, compiled as doc tests against the
/// library alone (they use the Postgres store).
#[cfg(all(doctest, feature = "postgres"))]
mod book_examples {
    #[doc = include_str!("../../README.md")]
    struct Readme;
    #[doc = include_str!("../../docs/guide/library.md")]
    struct Library;
    #[doc = include_str!("../../docs/guide/crash-safe.md")]
    struct CrashSafe;
}
