//! The performance guard: idem against the `idempotent` crate on the same Redis, in the
//! same run, as each server's CPU per request ÷ the load generator's. The load is the
//! same for both, so the quotient cancels how fast the shared machine is this minute;
//! each round measures both back to back, and the median round's idem ÷ peer is
//! checked against the bounds.

use crate::peer::{PeerRow, PEER};
use serde::Serialize;

/// idem's quotient may be at most this many times the peer's on new keys. idem does
/// more per new key than the peer — a caller scope, a canonical fingerprint, a lease
/// and a store-ordered fencing token, a heartbeat, metrics — so it costs more; a bound
/// tighter than this would fail on the machine's noise (a quotient moves ±15% between
/// rounds here) rather than on a regression.
pub const NEW_KEYS_BOUND: f64 = 1.5;
/// …and at most the peer's on replays, where idem answers from its replay cache.
pub const REPLAYS_BOUND: f64 = 1.0;

/// One phase's verdict.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub phase: &'static str,
    pub concurrency: usize,
    /// idem's quotient ÷ the peer's, per round.
    pub rounds: Vec<f64>,
    /// The median round.
    pub median: f64,
    pub bound: f64,
    pub passed: bool,
}

/// Pairs each round's idem and peer rows by phase and concurrency.
pub fn verdicts(rows: &[PeerRow]) -> Vec<Verdict> {
    let quotient = |r: &PeerRow| r.server_cpu_us / r.loader_cpu_us.max(f64::MIN_POSITIVE);
    let mut keys: Vec<(&'static str, usize)> =
        rows.iter().map(|r| (r.phase, r.concurrency)).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|(phase, concurrency)| {
            let of = |system: &str, round: usize| {
                rows.iter().find(|r| {
                    r.system == system
                        && r.phase == phase
                        && r.concurrency == concurrency
                        && r.round == round
                })
            };
            let mut rounds: Vec<f64> = (0..)
                .map_while(|round| Some((of("idem", round)?, of(PEER, round)?)))
                .map(|(idem, peer)| quotient(idem) / quotient(peer))
                .collect();
            let mut sorted = rounds.clone();
            sorted.sort_by(f64::total_cmp);
            let median = sorted
                .get(sorted.len() / 2)
                .copied()
                .unwrap_or(f64::INFINITY);
            let bound = match phase {
                "replay" => REPLAYS_BOUND,
                _ => NEW_KEYS_BOUND,
            };
            rounds
                .iter_mut()
                .for_each(|r| *r = (*r * 1000.0).round() / 1000.0);
            Verdict {
                phase,
                concurrency,
                rounds,
                median,
                bound,
                passed: median <= bound,
            }
        })
        .collect()
}

/// The verdicts as a table.
pub fn table(rows: &[PeerRow], verdicts: &[Verdict]) -> String {
    let mut out = String::from(
        "performance guard: server CPU per request ÷ the load generator's, idem ÷ the idempotent crate 0.3, same Redis, same run\n\
         phase   conns  idem µs/req  peer µs/req  loader µs/req (idem, peer)  idem ÷ peer per round   median  bound  verdict\n",
    );
    for v in verdicts {
        let median_of = |system: &str, f: fn(&PeerRow) -> f64| {
            let mut xs: Vec<f64> = rows
                .iter()
                .filter(|r| {
                    r.system == system && r.phase == v.phase && r.concurrency == v.concurrency
                })
                .map(f)
                .collect();
            xs.sort_by(f64::total_cmp);
            xs.get(xs.len() / 2).copied().unwrap_or(0.0)
        };
        let rounds: Vec<String> = v.rounds.iter().map(|r| format!("{r:.2}")).collect();
        out.push_str(&format!(
            "{:<7} {:>5}  {:>11.1}  {:>11.1}  {:>12.1}, {:<12.1}  {:<21}  {:>5.2}×  {:>4.1}×  {}\n",
            v.phase,
            v.concurrency,
            median_of("idem", |r| r.server_cpu_us),
            median_of(PEER, |r| r.server_cpu_us),
            median_of("idem", |r| r.loader_cpu_us),
            median_of(PEER, |r| r.loader_cpu_us),
            rounds.join(" "),
            v.median,
            v.bound,
            if v.passed { "pass" } else { "FAIL" },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        system: &'static str,
        phase: &'static str,
        round: usize,
        server: f64,
        loader: f64,
    ) -> PeerRow {
        PeerRow {
            system,
            phase,
            concurrency: 32,
            round,
            requests_per_s: 1.0,
            p50_ms: 0.0,
            p99_ms: 0.0,
            server_cpu_us: server,
            loader_cpu_us: loader,
            redis_cpu_us: 0.0,
            unexpected: 0,
        }
    }

    #[test]
    fn the_median_round_s_quotients_are_held_to_the_bounds() {
        // New keys: idem 45 µs, peer 30 µs at the same loader cost: 1.5× (passes);
        // a round on a slow minute doubles both, which cancels.
        let mut rows = vec![
            row("idem", "unique", 0, 45.0, 10.0),
            row(PEER, "unique", 0, 30.0, 10.0),
            row("idem", "unique", 1, 90.0, 20.0),
            row(PEER, "unique", 1, 60.0, 20.0),
            row("idem", "unique", 2, 50.0, 10.0),
            row(PEER, "unique", 2, 30.0, 10.0),
        ];
        // Replays: idem above the peer in two rounds of three: fails.
        rows.extend([
            row("idem", "replay", 0, 21.0, 10.0),
            row(PEER, "replay", 0, 20.0, 10.0),
            row("idem", "replay", 1, 19.0, 10.0),
            row(PEER, "replay", 1, 20.0, 10.0),
            row("idem", "replay", 2, 22.0, 10.0),
            row(PEER, "replay", 2, 20.0, 10.0),
        ]);
        let v = verdicts(&rows);
        let replay = v.iter().find(|v| v.phase == "replay").unwrap();
        let unique = v.iter().find(|v| v.phase == "unique").unwrap();
        assert_eq!(unique.rounds, [1.5, 1.5, 1.667]);
        assert!((unique.median - 1.5).abs() < 1e-9 && unique.passed);
        assert!((replay.median - 1.05).abs() < 1e-9 && !replay.passed);
        assert!(table(&rows, &v).contains("FAIL"));
    }
}
