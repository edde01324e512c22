//! The peer: the `idempotent` crate (0.3, crates.io) and its Valkey/Redis store behind
//! a minimal axum app doing what its README shows — validate the key, fingerprint the
//! body, `try_insert`, run the handler, `complete` — on the same Redis and the same
//! demo charge as idem, measured by the same load in the same run.
//!
//! It does less than idem per request: no caller scope, no canonical fingerprint (an
//! xxHash of the raw bytes), a random 64-bit fencing token instead of a store-ordered
//! one, no lease (a crashed handler's key stays claimed until its TTL), no replay
//! cache, no metrics.

use crate::cpu;
use crate::load::{self, Keys};
use crate::served::{self, Served};
use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use idempotent::entry::ExistingEntry;
use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
use idempotent::store::valkey::ValkeyStore;
use idempotent::store::{IdempotencyStore, InsertResult};
use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Set to `<addr> <redis url> <key prefix>`, this binary serves the peer instead.
pub const SERVE_ENV: &str = "IDEM_BENCH_SERVE_PEER";
/// The peer's program name, for its CPU.
pub const PROGRAM: &str = "bench-peer";
const TTL: Duration = Duration::from_secs(86_400);

struct Peer {
    store: ValkeyStore,
    /// The charges made, as the origin's memory ledger keeps them.
    ledger: Mutex<Vec<Bytes>>,
    next_id: AtomicU64,
}

/// Serves the peer until killed (the peer's process).
pub async fn serve(spec: &str) -> Result<()> {
    let mut parts = spec.split(' ');
    let (Some(addr), Some(url), Some(prefix)) = (parts.next(), parts.next(), parts.next()) else {
        anyhow::bail!("{SERVE_ENV} must be \"<addr> <redis url> <key prefix>\", not {spec:?}");
    };
    let client = redis::Client::open(url).with_context(|| format!("redis URL {url}"))?;
    let store = ValkeyStore::with_prefix(client, Some(prefix))
        .await
        .map_err(|e| anyhow::anyhow!("connecting the peer's store: {e}"))?;
    let peer = Arc::new(Peer {
        store,
        ledger: Mutex::new(Vec::new()),
        next_id: AtomicU64::new(1),
    });
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/v1/charges", post(charge))
        .with_state(peer);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    axum::serve(listener, app).await?;
    Ok(())
}

fn problem(status: StatusCode, detail: impl Into<String>) -> Response {
    (status, detail.into()).into_response()
}

async fn charge(State(peer): State<Arc<Peer>>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(raw) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return problem(StatusCode::BAD_REQUEST, "Idempotency-Key is required");
    };
    let key = match IdempotencyKey::new(raw.trim_matches('"')) {
        Ok(key) => key,
        Err(e) => return problem(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let fingerprint = DefaultFingerprintStrategy.compute("POST /v1/charges", &body);
    let entry = IdempotencyEntry::new(fingerprint, TTL);
    match peer.store.try_insert(&key, entry.clone()).await {
        Ok(InsertResult::Claimed { fencing_token }) => {
            let new = match idem_origin::charges::validate(&body) {
                Ok(new) => new,
                // (The crate has no release: the key stays claimed until its TTL.)
                Err(detail) => return problem(StatusCode::BAD_REQUEST, detail),
            };
            let id = peer.next_id.fetch_add(1, Ordering::Relaxed);
            let answer = Bytes::from(
                serde_json::json!({
                    "id": format!("ch_{id:024x}"),
                    "amount": new.amount,
                    "currency": new.currency,
                    "customer": new.customer,
                    "created": std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                })
                .to_string(),
            );
            peer.ledger.lock().unwrap().push(answer.clone());
            let response = CachedResponse {
                status_code: 201,
                metadata: Default::default(),
                body: answer.clone(),
            };
            match peer
                .store
                .complete(&key, entry.complete(response), fencing_token)
                .await
            {
                Ok(()) => (StatusCode::CREATED, answer).into_response(),
                Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            }
        }
        Ok(InsertResult::Exists(ExistingEntry::Completed(done))) => {
            if !done.fingerprint_matches(fingerprint) {
                return problem(StatusCode::UNPROCESSABLE_ENTITY, "another request's key");
            }
            let cached = done.into_response();
            let status = StatusCode::from_u16(cached.status_code).unwrap_or(StatusCode::OK);
            (status, [("idempotent-replayed", "true")], cached.body).into_response()
        }
        Ok(InsertResult::Exists(ExistingEntry::Processing(_))) => {
            problem(StatusCode::CONFLICT, "in progress")
        }
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Starts the peer on `redis_url`, its keys under `prefix`.
pub async fn start(out: &Path, redis_url: &str, prefix: &str) -> Result<Served> {
    let addr = served::free_addr()?;
    let mut cmd = served::as_program(out, PROGRAM)?;
    cmd.env(SERVE_ENV, format!("{addr} {redis_url} {prefix}"));
    Served::start(cmd, addr, "the peer").await
}

/// One measured phase of the peer comparison.
#[derive(Clone, Debug, Serialize)]
pub struct PeerRow {
    /// `idem` or `idempotent 0.3`.
    pub system: &'static str,
    /// `unique` or `replay`.
    pub phase: &'static str,
    pub concurrency: usize,
    pub round: usize,
    pub requests_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// CPU of the server (idem-origin or the peer) per request, µs.
    pub server_cpu_us: f64,
    /// CPU of the load generator (this process) per request, µs: the same work for
    /// either server, so the server's ÷ this cancels the shared machine's speed.
    pub loader_cpu_us: f64,
    /// CPU of the Redis servers per request, µs: what each server's store calls cost
    /// the store, on the same two cores.
    pub redis_cpu_us: f64,
    pub unexpected: u64,
}

/// Measures one phase against `addr`; `program` is the server's name, for its CPU.
/// With `perf`, the server (its pid) is profiled into that directory meanwhile.
#[allow(clippy::too_many_arguments)]
pub async fn measure(
    perf: Option<(&Path, u32)>,
    addr: SocketAddr,
    program: &str,
    system: &'static str,
    phase: &'static str,
    concurrency: usize,
    round: usize,
    keys: Keys,
    warmup: Duration,
    duration: Duration,
) -> Result<PeerRow> {
    let sent = Arc::new(AtomicU64::new(0));
    let load = tokio::spawn(load::drive(
        addr,
        concurrency,
        keys,
        warmup,
        duration,
        sent.clone(),
    ));
    tokio::time::sleep(warmup).await;
    let profile = match perf {
        Some((dir, pid)) => Some(crate::perf::record(
            dir,
            pid,
            &format!("{}-{phase}-c{concurrency}", program),
            duration,
        )?),
        None => None,
    };
    let before = sent.load(Ordering::Relaxed);
    let cpu_before = cpu::snapshot();
    let result = load.await.context("the load task panicked")??;
    let cpu = cpu_before.until(&cpu::snapshot());
    if let Some(profile) = profile {
        profile.finish()?;
    }
    let answered = sent.load(Ordering::Relaxed).saturating_sub(before).max(1) as f64;
    if let Some(sample) = &result.unexpected_sample {
        eprintln!("{system} {phase}: unexpected answer: {sample}");
    }
    Ok(PeerRow {
        system,
        phase,
        concurrency,
        round,
        requests_per_s: result.requests_per_s(),
        p50_ms: result.quantile_ms(0.5),
        p99_ms: result.quantile_ms(0.99),
        server_cpu_us: cpu.seconds_of(program) / answered * 1e6,
        loader_cpu_us: cpu.seconds_of("idem-bench") / answered * 1e6,
        redis_cpu_us: cpu.seconds_of("redis-server") / answered * 1e6,
        unexpected: result.unexpected,
    })
}

/// `system`'s round with the median requests per second at `concurrency` and `phase`.
fn median_round<'a>(
    rows: &'a [PeerRow],
    system: &str,
    concurrency: usize,
    phase: &str,
) -> Option<&'a PeerRow> {
    let mut of: Vec<&PeerRow> = rows
        .iter()
        .filter(|r| r.system == system && r.concurrency == concurrency && r.phase == phase)
        .collect();
    of.sort_by(|a, b| a.requests_per_s.total_cmp(&b.requests_per_s));
    of.get(of.len() / 2).copied()
}

/// The table: per concurrency and phase, the median round of each, and idem ÷ peer.
pub fn table(rows: &[PeerRow]) -> String {
    let mut out = String::from(
        "idem vs the idempotent crate 0.3 (its Valkey store behind axum), standalone Redis, same run\n\
         phase   conns  idem req/s  peer req/s  idem ÷ peer  idem p99 ms  peer p99 ms  idem µs/req  peer µs/req  Redis µs/req (idem, peer)\n",
    );
    let mut keys: Vec<(usize, &str)> = rows.iter().map(|r| (r.concurrency, r.phase)).collect();
    keys.sort();
    keys.dedup();
    for (c, phase) in keys {
        let median = |system: &str| median_round(rows, system, c, phase);
        if let (Some(idem), Some(peer)) = (median("idem"), median(PEER)) {
            out.push_str(&format!(
                "{phase:<7} {c:>5}  {:>10.0}  {:>10.0}  {:>10.2}×  {:>11.2}  {:>11.2}  {:>11.1}  {:>11.1}  {:>11.1}, {:.1}\n",
                idem.requests_per_s,
                peer.requests_per_s,
                idem.requests_per_s / peer.requests_per_s,
                idem.p99_ms,
                peer.p99_ms,
                idem.server_cpu_us,
                peer.server_cpu_us,
                idem.redis_cpu_us,
                peer.redis_cpu_us,
            ));
        }
    }
    out
}

/// The ceilings measured beside them (`--floors`), each ÷ the peer in its median
/// round; `None` when none was.
pub fn ceilings(rows: &[PeerRow]) -> Option<String> {
    let mut systems: Vec<&'static str> = rows
        .iter()
        .map(|r| r.system)
        .filter(|s| s.starts_with("ceiling"))
        .collect();
    systems.sort();
    systems.dedup();
    if systems.is_empty() {
        return None;
    }
    systems.insert(0, "idem");
    let mut out = String::from(
        "ceilings, same run (bench/src/floor.rs): servers doing less than any idempotency layer; \
         ÷ the idempotent crate in the same round, the median round and the range\n\
         phase   conns  system                        req/s  ÷ peer per round        server µs/req  Redis µs/req\n",
    );
    let mut keys: Vec<(usize, &str)> = rows.iter().map(|r| (r.concurrency, r.phase)).collect();
    keys.sort();
    keys.dedup();
    for (c, phase) in keys {
        let of = |system: &str, round: usize| {
            rows.iter().find(|r| {
                r.system == system && r.concurrency == c && r.phase == phase && r.round == round
            })
        };
        for system in &systems {
            let Some(r) = median_round(rows, system, c, phase) else {
                continue;
            };
            let mut paired: Vec<f64> = rows
                .iter()
                .filter(|p| p.system == PEER && p.concurrency == c && p.phase == phase)
                .filter_map(|p| Some(of(system, p.round)?.requests_per_s / p.requests_per_s))
                .collect();
            paired.sort_by(f64::total_cmp);
            let (Some(low), Some(high)) = (paired.first(), paired.last()) else {
                continue;
            };
            let median = paired[paired.len() / 2];
            out.push_str(&format!(
                "{phase:<7} {c:>5}  {system:<28} {:>6.0}  {:>5.2}× ({low:.2}–{high:.2})  {:>13.1}  {:>12.1}\n",
                r.requests_per_s, median, r.server_cpu_us, r.redis_cpu_us,
            ));
        }
    }
    Some(out)
}

/// How the peer is named in rows.
pub const PEER: &str = "idempotent 0.3";

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &'static str, round: usize, requests_per_s: f64) -> PeerRow {
        PeerRow {
            system,
            phase: "replay",
            concurrency: 32,
            round,
            requests_per_s,
            p50_ms: 0.0,
            p99_ms: 0.0,
            server_cpu_us: 10.0,
            loader_cpu_us: 8.0,
            redis_cpu_us: 0.5,
            unexpected: 0,
        }
    }

    #[test]
    fn a_ceiling_is_shown_as_its_median_round_over_the_peer_s() {
        let mut rows = vec![
            row(PEER, 0, 40_000.0),
            row(PEER, 1, 50_000.0),
            row(PEER, 2, 60_000.0),
        ];
        assert_eq!(ceilings(&rows), None, "no ceiling measured, no table");
        let http = "ceiling: HTTP alone";
        rows.extend([
            row(http, 0, 90_000.0),
            row(http, 1, 100_000.0),
            row(http, 2, 400_000.0),
        ]);
        let table = ceilings(&rows).unwrap();
        let line = table.lines().find(|l| l.contains(http)).unwrap();
        // Paired by round: 90/40, 100/50, 400/60 → 2.25 (2.00–6.67); the median round
        // of its own is the 100 000 one.
        assert!(
            line.contains("100000") && line.contains("2.25× (2.00–6.67)"),
            "{line}"
        );
    }
}
