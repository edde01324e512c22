//! The results: a table on stdout, CSV and JSON files, and an SVG plot.

use serde::Serialize;
use std::fmt::Write as _;

/// One measured phase of one mode at one concurrency.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub mode: &'static str,
    /// `unique` (a new key per request) or `replay` (keys already completed).
    pub phase: &'static str,
    pub concurrency: usize,
    pub requests: u64,
    /// Requests not answered as expected (they count in `requests` too).
    pub unexpected: u64,
    pub requests_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    /// Postgres statements per request, counted by the server.
    pub pg_round_trips: Option<f64>,
    /// Redis commands per request, counted by the servers.
    pub redis_round_trips: Option<f64>,
    /// The raw backend measured before this concurrency's phases.
    pub raw_backend: Option<&'static str>,
    /// Its round trips per second at the same concurrency.
    pub raw_ops_per_s: Option<f64>,
    /// requests/s ÷ (raw ops/s ÷ round trips per request to that backend).
    pub ratio: Option<f64>,
    /// Which round of `--repeat` this is (from 0).
    pub round: usize,
    /// The ratio's range over the rounds (in the summary rows).
    pub ratio_min: Option<f64>,
    pub ratio_max: Option<f64>,
    /// CPU time of the origin process per request, in µs.
    pub origin_cpu_us: f64,
    /// CPU time of this load generator per request, in µs.
    pub client_cpu_us: f64,
    /// Cores the raw backend's server used during this phase…
    pub backend_cores: Option<f64>,
    /// …and during its raw run.
    pub raw_backend_cores: Option<f64>,
    /// Cores the raw benchmark tool itself used.
    pub raw_tool_cores: Option<f64>,
    /// The ratio per core the backend used (round trips per backend CPU-second, here
    /// ÷ in the raw run): about 1 when idem's round trips cost the backend what the raw
    /// tool's do, and the ratio's shortfall is CPU the backend did not get.
    pub ratio_per_backend_core: Option<f64>,
}

impl Row {
    /// The ratio, when the phase made round trips to the raw backend.
    /// Below 0.01 round trips per request (a cluster client's occasional topology
    /// query while replays come from memory) there is nothing to compare.
    pub fn ratio_of(rps: f64, raw_ops_per_s: Option<f64>, round_trips: Option<f64>) -> Option<f64> {
        match (raw_ops_per_s, round_trips) {
            (Some(raw), Some(rt)) if raw > 0.0 && rt >= 0.01 => Some(rps * rt / raw),
            _ => None,
        }
    }
}

/// One row per mode, phase and concurrency: the round whose ratio (or, without one,
/// whose requests/s) is the median, with the ratio's range over the rounds.
pub fn medians(rows: &[Row]) -> Vec<Row> {
    let mut groups: Vec<Vec<&Row>> = Vec::new();
    for r in rows {
        let same = |g: &Vec<&Row>| {
            (g[0].mode, g[0].phase, g[0].concurrency) == (r.mode, r.phase, r.concurrency)
        };
        match groups.iter_mut().find(|g| same(g)) {
            Some(g) => g.push(r),
            None => groups.push(vec![r]),
        }
    }
    groups
        .into_iter()
        .map(|mut g| {
            let key = |r: &Row| r.ratio.unwrap_or(r.requests_per_s);
            g.sort_by(|a, b| key(a).total_cmp(&key(b)));
            let ratios: Vec<f64> = g.iter().filter_map(|r| r.ratio).collect();
            let mut median = g[(g.len() - 1) / 2].clone();
            median.ratio_min = ratios.iter().copied().reduce(f64::min);
            median.ratio_max = ratios.iter().copied().reduce(f64::max);
            median
        })
        .collect()
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

/// The table printed at the end of a run.
/// New keys of the demo on Postgres, each charge committed with its answer in one
/// transaction, against the same charge committed on its own first — measured in the
/// same run — per concurrency.
pub fn transactional_cost(rows: &[Row]) -> Option<String> {
    new_key_ratios(
        rows,
        "pg-demo-transactional",
        "pg-demo-separate",
        "transactional completion",
        "separate",
    )
}

/// Tiered async's new keys against the plain Redis Cluster mode's: the hot path is
/// Redis in both, so the ratio is what the write-behind costs.
pub fn tiered_async_vs_cluster(rows: &[Row]) -> Option<String> {
    new_key_ratios(
        rows,
        "tiered-async",
        "redis-cluster",
        "tiered async",
        "redis-cluster",
    )
}

/// "`label`, new keys, N conns: a req/s vs b `versus` = a ÷ b", at each concurrency
/// both modes ran.
fn new_key_ratios(rows: &[Row], a: &str, b: &str, label: &str, versus: &str) -> Option<String> {
    let rps = |mode: &str, c: usize| {
        rows.iter()
            .find(|r| r.mode == mode && r.phase == "unique" && r.concurrency == c)
            .map(|r| r.requests_per_s)
    };
    let mut s = String::new();
    for c in rows
        .iter()
        .filter(|r| r.mode == a && r.phase == "unique")
        .map(|r| r.concurrency)
    {
        if let (Some(x), Some(y)) = (rps(a, c), rps(b, c)) {
            if y > 0.0 {
                let _ = writeln!(
                    s,
                    "{label}, new keys, {c} conns: {x:.0} req/s vs {y:.0} {versus} = {:.2}",
                    x / y
                );
            }
        }
    }
    (!s.is_empty()).then_some(s)
}

pub fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<21} {:<6} {:>5} {:>9} {:>7} {:>7} {:>8} {:>6} {:>6}  {:<34} {:>10} {:>6} {:>11}",
        "mode",
        "phase",
        "conns",
        "req/s",
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "pg RT",
        "rd RT",
        "raw backend",
        "raw ops/s",
        "ratio",
        "range"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<21} {:<6} {:>5} {:>9.0} {:>7.3} {:>7.3} {:>8.3} {:>6} {:>6}  {:<34} {:>10} {:>6} {:>11}{}",
            r.mode,
            r.phase,
            r.concurrency,
            r.requests_per_s,
            r.p50_ms,
            r.p99_ms,
            r.p999_ms,
            opt(r.pg_round_trips, 2),
            opt(r.redis_round_trips, 2),
            r.raw_backend.unwrap_or("-"),
            opt(r.raw_ops_per_s, 0),
            opt(r.ratio, 2),
            match (r.ratio_min, r.ratio_max) {
                (Some(a), Some(b)) if b > a => format!("{a:.2}–{b:.2}"),
                _ => String::new(),
            },
            if r.unexpected > 0 {
                format!("  ({} unexpected answers)", r.unexpected)
            } else {
                String::new()
            }
        );
    }
    s
}

/// Where the CPU went: the explanation of a ratio on a machine whose cores the load,
/// the origin and the backend share.
pub fn cpu_table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<21} {:<6} {:>5} {:>13} {:>13} {:>14} {:>14} {:>10} {:>11}",
        "mode",
        "phase",
        "conns",
        "origin µs/req",
        "client µs/req",
        "backend cores",
        "(in raw run)",
        "raw tool",
        "ratio/core"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<21} {:<6} {:>5} {:>13.1} {:>13.1} {:>14} {:>14} {:>10} {:>11}",
            r.mode,
            r.phase,
            r.concurrency,
            r.origin_cpu_us,
            r.client_cpu_us,
            opt(r.backend_cores, 2),
            opt(r.raw_backend_cores, 2),
            opt(r.raw_tool_cores, 2),
            opt(r.ratio_per_backend_core, 2),
        );
    }
    s
}

pub fn csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "mode,phase,concurrency,requests,unexpected,requests_per_s,p50_ms,p99_ms,p999_ms,\
         pg_round_trips,redis_round_trips,raw_backend,raw_ops_per_s,ratio,round,ratio_min,ratio_max,\
         origin_cpu_us,client_cpu_us,backend_cores,raw_backend_cores,raw_tool_cores,\
         ratio_per_backend_core\n",
    );
    let o = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.4}"));
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:.1},{:.4},{:.4},{:.4},{},{},{},{},{},{},{},{},{:.2},{:.2},{},{},{},{}",
            r.mode,
            r.phase,
            r.concurrency,
            r.requests,
            r.unexpected,
            r.requests_per_s,
            r.p50_ms,
            r.p99_ms,
            r.p999_ms,
            o(r.pg_round_trips),
            o(r.redis_round_trips),
            r.raw_backend.unwrap_or(""),
            o(r.raw_ops_per_s),
            o(r.ratio),
            r.round,
            o(r.ratio_min),
            o(r.ratio_max),
            r.origin_cpu_us,
            r.client_cpu_us,
            o(r.backend_cores),
            o(r.raw_backend_cores),
            o(r.raw_tool_cores),
            o(r.ratio_per_backend_core),
        );
    }
    s
}

const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// Four panels — unique and replay, throughput and p99 — against concurrency, one
/// line per mode.
pub fn svg(rows: &[Row], title: &str) -> String {
    let mut modes: Vec<&str> = Vec::new();
    let mut conns: Vec<usize> = Vec::new();
    for r in rows {
        if !modes.contains(&r.mode) {
            modes.push(r.mode);
        }
        if !conns.contains(&r.concurrency) {
            conns.push(r.concurrency);
        }
    }
    conns.sort_unstable();
    let (pw, ph) = (420.0, 260.0);
    let (width, height) = (2.0 * pw + 200.0, 2.0 * ph + 60.0);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="white"/>
<text x="10" y="20" font-size="14">{}</text>
"#,
        escape(title)
    );
    type Panel = (&'static str, &'static str, fn(&Row) -> f64);
    let panels: [Panel; 4] = [
        ("unique", "unique keys: requests/s", |r| r.requests_per_s),
        ("unique", "unique keys: p99 latency (ms)", |r| r.p99_ms),
        ("replay", "replays: requests/s", |r| r.requests_per_s),
        ("replay", "replays: p99 latency (ms)", |r| r.p99_ms),
    ];
    for (i, (phase, label, value)) in panels.iter().enumerate() {
        let x0 = 10.0 + (i % 2) as f64 * pw;
        let y0 = 40.0 + (i / 2) as f64 * ph;
        let points: Vec<&Row> = rows.iter().filter(|r| r.phase == *phase).collect();
        let max = points.iter().map(|r| value(r)).fold(0.0, f64::max);
        panel(&mut s, x0, y0, pw, ph, label, &conns, max, |plot| {
            for (m, mode) in modes.iter().enumerate() {
                let line: Vec<(usize, f64)> = points
                    .iter()
                    .filter(|r| r.mode == *mode)
                    .map(|r| (r.concurrency, value(r)))
                    .collect();
                plot(line, COLOURS[m % COLOURS.len()]);
            }
        });
    }
    for (m, mode) in modes.iter().enumerate() {
        let y = 60.0 + m as f64 * 18.0;
        let x = 2.0 * pw + 30.0;
        let _ = writeln!(
            s,
            r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            x + 20.0,
            COLOURS[m % COLOURS.len()],
            x + 26.0,
            y + 4.0,
            escape(mode)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[allow(clippy::too_many_arguments)]
fn panel(
    s: &mut String,
    x0: f64,
    y0: f64,
    w: f64,
    h: f64,
    label: &str,
    conns: &[usize],
    max: f64,
    lines: impl FnOnce(&mut dyn FnMut(Vec<(usize, f64)>, &str)),
) {
    let (left, bottom, top, right) = (60.0, 30.0, 20.0, 20.0);
    let (px, py, pw, ph) = (x0 + left, y0 + top, w - left - right, h - top - bottom);
    let max = if max > 0.0 { nice_ceiling(max) } else { 1.0 };
    let _ = writeln!(
        s,
        r#"<text x="{px}" y="{}" font-weight="bold">{}</text>"#,
        y0 + 12.0,
        escape(label)
    );
    let _ = writeln!(
        s,
        r##"<rect x="{px}" y="{py}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>"##
    );
    for t in 0..=4 {
        let v = max * t as f64 / 4.0;
        let y = py + ph - ph * t as f64 / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{px}" y1="{y}" x2="{}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            px + pw,
            px - 4.0,
            y + 4.0,
            short(v)
        );
    }
    let x_of = |c: usize| {
        let i = conns.iter().position(|&k| k == c).unwrap_or(0);
        if conns.len() == 1 {
            px + pw / 2.0
        } else {
            px + pw * i as f64 / (conns.len() - 1) as f64
        }
    };
    for &c in conns {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{c}</text>"#,
            x_of(c),
            py + ph + 14.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">connections</text>"#,
        px + pw / 2.0,
        py + ph + 27.0
    );
    let mut plot = |points: Vec<(usize, f64)>, colour: &str| {
        if points.is_empty() {
            return;
        }
        let path: Vec<String> = points
            .iter()
            .map(|&(c, v)| format!("{:.1},{:.1}", x_of(c), py + ph - ph * v / max))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for p in &path {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(s, r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#);
        }
    };
    lines(&mut plot);
}

/// 1, 2 or 5 times a power of ten, at least `v`.
fn nice_ceiling(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|&c| c >= v)
        .unwrap_or(10.0 * p)
}

fn short(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: &'static str, phase: &'static str, c: usize, rps: f64) -> Row {
        Row {
            mode,
            phase,
            concurrency: c,
            requests: 100,
            unexpected: 0,
            requests_per_s: rps,
            p50_ms: 0.5,
            p99_ms: 2.0,
            p999_ms: 3.0,
            pg_round_trips: Some(2.0),
            redis_round_trips: None,
            raw_backend: Some("pgbench: on-conflict claim"),
            raw_ops_per_s: Some(10_000.0),
            ratio: Row::ratio_of(rps, Some(10_000.0), Some(2.0)),
            round: 0,
            ratio_min: None,
            ratio_max: None,
            origin_cpu_us: 40.0,
            client_cpu_us: 20.0,
            backend_cores: Some(1.2),
            raw_backend_cores: Some(1.7),
            raw_tool_cores: Some(0.2),
            ratio_per_backend_core: Some(1.1),
        }
    }

    #[test]
    fn ratio_divides_raw_ops_by_round_trips() {
        assert_eq!(Row::ratio_of(4000.0, Some(10_000.0), Some(2.0)), Some(0.8));
        assert_eq!(Row::ratio_of(4000.0, Some(10_000.0), Some(0.0)), None);
        assert_eq!(Row::ratio_of(90_000.0, Some(10_000.0), Some(0.0004)), None);
        assert_eq!(Row::ratio_of(4000.0, None, Some(2.0)), None);
    }

    #[test]
    fn medians_pick_the_middle_round_and_keep_the_range() {
        let rounds: Vec<Row> = [4000.0, 2000.0, 3000.0]
            .into_iter()
            .enumerate()
            .map(|(i, rps)| Row {
                round: i,
                ..row("pg-on-conflict", "unique", 8, rps)
            })
            .chain([row("memory", "replay", 8, 9.0)])
            .collect();
        let m = medians(&rounds);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].round, m[0].ratio), (2, Some(0.6)));
        assert_eq!((m[0].ratio_min, m[0].ratio_max), (Some(0.4), Some(0.8)));
        assert!(table(&m).contains("0.40–0.80"), "{}", table(&m));
    }

    #[test]
    fn outputs_hold_every_row() {
        let rows = [
            row("pg-on-conflict", "unique", 8, 4000.0),
            row("pg-on-conflict", "unique", 32, 5000.0),
            row("memory", "replay", 8, 30_000.0),
        ];
        let t = table(&rows);
        assert_eq!(t.lines().count(), 4);
        assert!(t.contains("0.80"), "{t}");
        let c = csv(&rows);
        assert_eq!(c.lines().count(), 4);
        assert!(
            c.lines()
                .nth(1)
                .unwrap()
                .ends_with(",0.8000,0,,,40.00,20.00,1.2000,1.7000,0.2000,1.1000"),
            "{c}"
        );
        assert!(cpu_table(&rows).contains("40.0"));
        let svg = svg(&rows, "a < b");
        assert_eq!(
            svg.matches("<polyline").count(),
            4,
            "one line per mode and panel with data"
        );
        assert!(svg.contains("a &lt; b"));
        assert_eq!(nice_ceiling(4300.0), 5000.0);
        assert_eq!(nice_ceiling(0.7), 1.0);
    }
}
