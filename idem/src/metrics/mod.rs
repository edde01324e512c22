//! The metrics idem records, through the `metrics` facade: install any recorder (the
//! `idem-origin` binary installs a Prometheus exporter and serves it at `/metrics`).
//!
//! Every metric is declared once, in [`CATALOG`] (the book's metrics table is
//! checked against it); [`describe`] gives each its help text and unit.

mod catalog;
mod handles;

pub use catalog::{describe, markdown_table, register_counters, Kind, Metric, CATALOG};

use std::future::Future;
use std::time::Instant;

/// What idem did with a guarded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The handler ran.
    Executed,
    /// The stored answer was returned.
    Replayed,
    /// 409: another attempt is running.
    InFlight,
    /// 422: the key was reused for a different request.
    Mismatch,
    /// 4xx: a bad key or body.
    Invalid,
    /// 503: the store did not answer.
    Unavailable,
    /// 503: the server's limit of bodies buffered at once was reached.
    Busy,
    /// 503: the store is at its capacity.
    StoreFull,
    /// 429: the caller is at its quota.
    ScopeQuota,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::Replayed => "replayed",
            Outcome::InFlight => "in_flight",
            Outcome::Mismatch => "mismatch",
            Outcome::Invalid => "invalid",
            Outcome::Unavailable => "unavailable",
            Outcome::Busy => "busy",
            Outcome::StoreFull => "store_full",
            Outcome::ScopeQuota => "scope_quota",
        }
    }
}

pub(crate) fn outcome(o: Outcome) {
    handles::counter("idem_requests_total", [("outcome", o.as_str()), ("", "")]).increment(1);
    tracing::Span::current().record("idem.outcome", o.as_str());
}

/// A guarded request's time to its answer, by the answer's status class.
pub(crate) fn request_duration(status: u16, took: std::time::Duration) {
    let class = status_class(status);
    handles::histogram(
        "idem_request_duration_seconds",
        [("class", class), ("", "")],
    )
    .record(took.as_secs_f64());
}

/// `2xx`…`5xx` (`other` outside them).
pub fn status_class(status: u16) -> &'static str {
    match status {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    }
}

pub(crate) fn replay_cache_hit() {
    metrics::counter!("idem_replay_cache_hits_total").increment(1);
}

pub(crate) fn takeover() {
    metrics::counter!("idem_takeovers_total").increment(1);
}

pub(crate) fn released() {
    metrics::counter!("idem_released_total").increment(1);
}

pub(crate) fn fenced(op: &'static str) {
    metrics::counter!("idem_fenced_writes_total", "op" => op).increment(1);
}

pub(crate) fn write_lost(op: &'static str) {
    metrics::counter!("idem_lost_writes_total", "op" => op).increment(1);
}

pub(crate) fn lease_lost() {
    metrics::counter!("idem_leases_lost_total").increment(1);
}

pub(crate) fn final_write_retried(op: &'static str) {
    metrics::counter!("idem_final_write_retries_total", "op" => op).increment(1);
}

pub(crate) fn execution_timed_out() {
    metrics::counter!("idem_executions_timed_out_total").increment(1);
}

pub(crate) fn swept(n: u64) {
    metrics::counter!("idem_swept_records_total").increment(n);
}

/// Awaits `fut`, recording its latency as a store round trip.
pub(crate) async fn timed<T>(
    store: &'static str,
    op: &'static str,
    fut: impl Future<Output = T>,
) -> T {
    let start = Instant::now();
    // A child of the request's span (see `idempotency::trace`); none outside one (the
    // sweeper's rounds are no request's).
    let span = match tracing::Span::current().is_disabled() {
        true => tracing::Span::none(),
        false => {
            tracing::debug_span!(
                "idem.store",
                otel.name = %format_args!("idem.store {op}"),
                otel.kind = "client",
                db.system.name = db_system(store),
                db.operation.name = op,
                idem.store = store,
                idem.op = op
            )
        }
    };
    let out = tracing::Instrument::instrument(fut, span).await;
    handles::histogram(
        "idem_store_duration_seconds",
        [("store", store), ("op", op)],
    )
    .record(start.elapsed().as_secs_f64());
    out
}

/// OpenTelemetry's `db.system.name` of a store: the database its round trips go to
/// (the tiered store's go to Redis first); none for the memory store, which has none.
fn db_system(store: &str) -> Option<&'static str> {
    match store {
        s if s.starts_with("postgres") => Some("postgresql"),
        s if s.starts_with("redis") || s.starts_with("tiered") => Some("redis"),
        _ => None,
    }
}
