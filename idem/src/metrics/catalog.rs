//! The metrics idem records, declared once: name, type, labels, meaning. The book's
//! metrics table (`docs/operations.md`) is this catalog (a test keeps them equal), and [`describe`] gives
//! every metric its help text at start-up.

/// A metric's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution of observations.
    Histogram,
}

impl Kind {
    /// As Prometheus names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    /// Its name.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// The names of its labels.
    pub labels: &'static [&'static str],
    /// The values its last label takes, as the book shows them (empty: any).
    pub values: &'static str,
    /// What it counts.
    pub help: &'static str,
}

const fn metric(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    values: &'static str,
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind,
        labels,
        values,
        help,
    }
}

use Kind::{Counter, Gauge, Histogram};

/// Every metric idem records.
pub const CATALOG: &[Metric] = &[
    metric("idem_requests_total", Counter, &["outcome"], "`executed`, `replayed`, `in_flight`, `mismatch`, `invalid`, `unavailable`, `busy`, `store_full`, `scope_quota`", "guarded requests by what idem did"),
    metric("idem_request_duration_seconds", Histogram, &["class"], "`2xx`, `3xx`, `4xx`, `5xx`", "guarded requests, from the layer taking them to their answer's head (replays, refusals and executions), by the answer's status class"),
    metric("idem_upstream_duration_seconds", Histogram, &["result"], "`2xx`, `3xx`, `4xx`, `5xx`, `unreachable`, `lost`", "proxy mode: requests sent to the upstream, from sending to its answer's head, by what came back"),
    metric("idem_takeovers_total", Counter, &[], "", "executions that took over an expired lease"),
    metric("idem_released_total", Counter, &[], "", "executions whose handler freed the key with the release signal"),
    metric("idem_fenced_writes_total", Counter, &["op"], "`heartbeat`, `complete`, `release`", "holder writes refused because another attempt took over"),
    metric("idem_lost_writes_total", Counter, &["op"], "`shutdown`", "records still unwritten when the shutdown drain deadline passed (each logged with its key)"),
    metric("idem_final_write_retries_total", Counter, &["op"], "`complete`, `release`", "failed attempts of a final write, retried while the lease is kept alive"),
    metric("idem_leases_lost_total", Counter, &[], "", "executions whose lease was lost while running (fenced out, or not renewed for a whole lease)"),
    metric("idem_executions_timed_out_total", Counter, &[], "", "handlers stopped by `--max-execution` (stored as a 502 problem)"),
    metric("idem_store_duration_seconds", Histogram, &["store", "op"], "`claim`, `heartbeat`, `complete`, `release`, `sweep`", "store round-trip latency"),
    metric("idem_swept_records_total", Counter, &[], "", "expired records deleted by the sweeper"),
    metric("idem_replay_cache_hits_total", Counter, &[], "", "decisions made on a cached completed record, without the store"),
    metric("idem_tiered_redis_errors_total", Counter, &["op"], "", "tiered sync: Redis failures that Postgres absorbed"),
    metric("idem_tiered_cold_path_hits_total", Counter, &[], "", "Redis had no record, Postgres had one"),
    metric("idem_tiered_cold_reads_total", Counter, &[], "", "tiered async: Postgres reads of the cold path (a new key in Redis)"),
    metric("idem_tiered_cold_read_statements_total", Counter, &[], "", "the statements those reads were sent in (batched: reads ÷ statements is the batch size)"),
    metric("idem_outbox_depth", Gauge, &[], "", "records queued for Postgres (tiered async)"),
    metric("idem_outbox_written_total", Counter, &[], "", "records written behind (tiered async)"),
    metric("idem_outbox_batches_total", Counter, &[], "", "batches written behind (tiered async)"),
    metric("idem_outbox_failures_total", Counter, &[], "", "failed batch writes (retried)"),
    metric("idem_outbox_rejected_total", Counter, &[], "", "reservations refused because the queue stayed full (→ 503)"),
    metric("idem_outbox_skipped_heartbeats_total", Counter, &[], "", "heartbeats not written behind because the queue was full"),
    metric("idem_outbox_lost_total", Counter, &[], "", "records not written before the shutdown drain deadline"),
    metric("idem_redis_cluster_reconnects_total", Counter, &[], "", "cluster connections rebuilt after repeated failures"),
    metric("idem_server_busy_total", Counter, &[], "", "requests the listener turned away at `--max-requests` (503 `server-busy`)"),
    metric("idem_build_info", Gauge, &["version", "store", "mode"], "`demo`, `proxy`", "1, from start-up: the running build's version, its store and its mode"),
];

/// Gives every metric of [`CATALOG`] its help text (and the latency its unit) in the
/// installed recorder; call it once the recorder is installed.
pub fn describe() {
    for m in CATALOG {
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, m.help),
            Kind::Gauge => metrics::describe_gauge!(m.name, m.help),
            Kind::Histogram => {
                metrics::describe_histogram!(m.name, metrics::Unit::Seconds, m.help)
            }
        }
    }
}

/// Registers every counter of [`CATALOG`] at 0 — once per value of its label where
/// the catalog lists them — so that dashboards and alerts on `rate(…)` see the series
/// from the first scrape, not from the first request that moves them. Counters whose
/// label values can't be known in advance appear when first recorded.
pub fn register_counters() {
    for m in CATALOG.iter().filter(|m| m.kind == Kind::Counter) {
        let values = m
            .values
            .split(", ")
            .map(|v| v.trim_matches('`'))
            .filter(|v| !v.is_empty());
        match m.labels {
            [] => metrics::counter!(m.name).increment(0),
            [label] => {
                for value in values {
                    metrics::counter!(m.name, *label => value).increment(0);
                }
            }
            _ => {}
        }
    }
}

/// The catalog as a Markdown table (the book's metrics table).
pub fn markdown_table() -> String {
    let mut out = String::from("| metric | type | labels | meaning |\n|---|---|---|---|\n");
    for m in CATALOG {
        let labels = if m.labels.is_empty() {
            "—".to_owned()
        } else {
            let names: Vec<String> = m.labels.iter().map(|l| format!("`{l}`")).collect();
            match m.values {
                "" => names.join(", "),
                values => format!("{} = {values}", names.join(", ")),
            }
        };
        out.push_str(&format!(
            "| `{}` | {} | {labels} | {} |\n",
            m.name,
            m.kind.as_str(),
            m.help
        ));
    }
    out
}
