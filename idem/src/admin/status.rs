//! The status page's numbers: read from this process's Prometheus exposition (the
//! very text `/metrics` serves, so the page and a scrape agree), with a five-minute
//! history sampled in the background for "over the last minutes".

use crate::idempotency::Executions;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How often the history is sampled, and how far back it goes.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const HISTORY: usize = 61;

/// The outcomes of `idem_requests_total`, in the order the page shows them.
pub(crate) const OUTCOMES: [&str; 6] = [
    "executed",
    "replayed",
    "in_flight",
    "mismatch",
    "invalid",
    "unavailable",
];

/// What the status page reads.
#[derive(Clone)]
pub struct StatusInputs {
    /// This process's metrics in the Prometheus text format (what `/metrics` serves).
    pub metrics: Arc<dyn Fn() -> String + Send + Sync>,
    /// The layer's executions: how many handlers run here now.
    pub executions: Executions,
}

/// One line of the exposition: name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sample {
    /// The metric's name (with `_bucket`, `_sum`, `_count` for histograms).
    pub name: String,
    /// Its labels, in order.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the Prometheus text format's samples (comments and malformed lines skipped).
pub(crate) fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let (series, value) = line.trim().rsplit_once(' ')?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    let (name, labels) = match series.split_once('{') {
        None => (series, Vec::new()),
        Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}')?)?),
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

fn parse_labels(mut rest: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((name.trim_start_matches(',').to_owned(), value));
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some(labels)
}

/// The `q` quantile (0–1) of a histogram's cumulative buckets `(le, count)`, as
/// Prometheus' `histogram_quantile` estimates it: linear within the bucket it falls in.
/// `None` without observations.
pub(crate) fn quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let mut buckets = buckets.to_vec();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut below = (0.0, 0.0);
    for &(le, count) in &buckets {
        if count >= rank {
            if le.is_infinite() {
                // Beyond the last finite bound: that bound is all that is known.
                return Some(below.0);
            }
            let within = count - below.1;
            let fraction = if within > 0.0 {
                (rank - below.1) / within
            } else {
                1.0
            };
            return Some(below.0 + (le - below.0) * fraction);
        }
        below = (le, count);
    }
    Some(below.0)
}

/// The counters the history keeps, by series: outcome names, and `cache_hits`.
type Counters = BTreeMap<String, f64>;

fn counters(samples: &[Sample]) -> Counters {
    let mut out = Counters::new();
    for s in samples {
        match s.name.as_str() {
            "idem_requests_total" => {
                if let Some(outcome) = s.label("outcome") {
                    *out.entry(outcome.to_owned()).or_default() += s.value;
                }
            }
            "idem_replay_cache_hits_total" => {
                *out.entry("cache_hits".into()).or_default() += s.value;
            }
            _ => {}
        }
    }
    out
}

/// Samples of the counters, oldest first: (ms since the history began, counters).
pub(crate) struct History {
    began: std::time::Instant,
    samples: Mutex<VecDeque<(u64, Counters)>>,
}

impl Default for History {
    fn default() -> Self {
        History {
            began: std::time::Instant::now(),
            samples: Mutex::default(),
        }
    }
}

impl History {
    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.began.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn push(&self, at: u64, counters: Counters) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.push_back((at, counters));
        while samples.len() > HISTORY {
            samples.pop_front();
        }
    }

    fn snapshot(&self) -> Vec<(u64, Counters)> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.iter().cloned().collect()
    }
}

/// Samples the counters every [`SAMPLE_EVERY`] for as long as `history` lives.
pub(crate) fn start_sampling(inputs: StatusInputs, history: Weak<History>) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(SAMPLE_EVERY);
        loop {
            ticks.tick().await;
            let Some(history) = history.upgrade() else {
                return;
            };
            let at = history.elapsed_ms();
            history.push(at, counters(&parse(&(inputs.metrics)())));
        }
    });
}

/// The status as JSON: request outcomes (in all, over the last minute and the last
/// five, and per interval), executions running here, store latency percentiles by
/// operation, the outbox's depth, and the replay cache's hit rate.
pub(crate) fn status(inputs: &StatusInputs, history: &History, store: &str) -> Value {
    let samples = parse(&(inputs.metrics)());
    let now = counters(&samples);
    let past = history.snapshot();
    let now_at = history.elapsed_ms();
    let latest_at = past.last().map_or(0, |(at, _)| *at);
    // The change since the newest sample at least `ms` old (the oldest one while the
    // history is younger than that: counters start at 0 with the process).
    let since = |name: &str, ms: u64| -> f64 {
        let base = past
            .iter()
            .rev()
            .find(|(at, _)| at + ms <= now_at)
            .or(past.first())
            .and_then(|(_, c)| c.get(name).copied())
            .unwrap_or(0.0);
        now.get(name).copied().unwrap_or(0.0) - base
    };
    let outcomes: Vec<Value> = OUTCOMES
        .iter()
        .map(|outcome| {
            json!({
                "outcome": outcome,
                "total": now.get(*outcome).copied().unwrap_or(0.0),
                "last_1m": since(outcome, 60_000),
                "last_5m": since(outcome, 300_000),
            })
        })
        .collect();
    // Per sampling interval, for the chart: each outcome's increase.
    let intervals: Vec<Value> = past
        .windows(2)
        .map(|w| {
            let (a, b) = (&w[0].1, &w[1].1);
            let mut counts = Map::new();
            for outcome in OUTCOMES {
                let d = b.get(outcome).unwrap_or(&0.0) - a.get(outcome).unwrap_or(&0.0);
                counts.insert(outcome.into(), json!(d.max(0.0)));
            }
            json!({ "ended_ms_ago": now_at.saturating_sub(w[1].0), "counts": counts })
        })
        .collect();
    let mut latency = Map::new();
    let mut ops: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut observed: BTreeMap<String, f64> = BTreeMap::new();
    for s in &samples {
        let Some(op) = s.label("op") else { continue };
        match s.name.as_str() {
            "idem_store_duration_seconds_bucket" => {
                let le = match s.label("le") {
                    Some("+Inf") => f64::INFINITY,
                    Some(le) => le.parse().unwrap_or(f64::NAN),
                    None => continue,
                };
                ops.entry(op.into()).or_default().push((le, s.value));
            }
            "idem_store_duration_seconds_count" => {
                *observed.entry(op.into()).or_default() += s.value;
            }
            _ => {}
        }
    }
    for (op, buckets) in &ops {
        let ms = |q| quantile(q, buckets).map(|s| s * 1000.0);
        latency.insert(
            op.clone(),
            json!({
                "count": observed.get(op).copied().unwrap_or(0.0),
                "p50_ms": ms(0.5),
                "p99_ms": ms(0.99),
            }),
        );
    }
    let gauge = |name: &str| samples.iter().find(|s| s.name == name).map(|s| s.value);
    // A cache hit is a replay or a mismatch decided on a cached record.
    let on_completed =
        now.get("replayed").copied().unwrap_or(0.0) + now.get("mismatch").copied().unwrap_or(0.0);
    let hits = now.get("cache_hits").copied().unwrap_or(0.0);
    let build = samples
        .iter()
        .find(|s| s.name == "idem_build_info")
        .map(|s| {
            json!({
                "version": s.label("version"),
                "store": s.label("store"),
                "mode": s.label("mode"),
            })
        });
    json!({
        "store": store,
        "build": build,
        "history_ms": latest_at.saturating_sub(past.first().map_or(0, |(at, _)| *at)),
        "uptime_ms": now_at,
        "sample_every_ms": SAMPLE_EVERY.as_millis() as u64,
        "outcomes": outcomes,
        "intervals": intervals,
        "running_here": inputs.executions.running(),
        "store_latency": latency,
        "outbox_depth": gauge("idem_outbox_depth"),
        "replay_cache": {
            "hits": hits,
            "decisions_on_completed_records": on_completed,
            // Of the replays and mismatches, those answered from memory.
            "hit_rate": (on_completed > 0.0).then(|| (hits / on_completed).min(1.0)),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_exposition() {
        let text = "# HELP x y\nidem_requests_total{outcome=\"executed\"} 3\nidem_outbox_depth 0\nidem_build_info{version=\"0.1.0\",store=\"a\\\"b\",mode=\"demo\"} 1\nbad line here x\n";
        let s = parse(text);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].label("outcome"), Some("executed"));
        assert_eq!(s[0].value, 3.0);
        assert_eq!(s[2].label("store"), Some("a\"b"));
        assert_eq!(s[2].label("mode"), Some("demo"));
    }

    #[test]
    fn quantiles_as_prometheus_estimates_them() {
        // 10 observations ≤ 1, 10 more ≤ 2: the median is at the first bound, p75 halfway up the second.
        let b = [(1.0, 10.0), (2.0, 20.0), (f64::INFINITY, 20.0)];
        assert_eq!(quantile(0.5, &b), Some(1.0));
        assert_eq!(quantile(0.75, &b), Some(1.5));
        assert_eq!(quantile(0.5, &[(1.0, 0.0), (f64::INFINITY, 0.0)]), None);
        // Everything above the last finite bound: that bound.
        assert_eq!(
            quantile(0.99, &[(1.0, 0.0), (f64::INFINITY, 5.0)]),
            Some(1.0)
        );
    }
}
