//! The scale bench (`idem-bench --scale 10k,1m,10m`): the stores filled to each size in
//! turn with records the origin can replay (`preload`), and at each size, for each
//! mode, new keys and replays of preloaded keys picked all over the key space. Also
//! what a record costs in bytes, and the sweeper deleting expired rows under load.
//!
//! The origins run with the replay cache off (`--replay-cache-bytes 0`): replays then
//! read the store, whose behaviour as it grows is what this measures.

use crate::load::{self, Keys, LoadResult};
use crate::mode::{Mode, RedisKind, Targets};
use crate::origin::OriginProcess;
use crate::{backend, preload};
use anyhow::{bail, Context, Result};
use idem_core::{IdempotencyKey, Record, RecordKey, Scope};
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long preloaded records live: longer than any run.
const PRELOADED_TTL_MS: u64 = 24 * 3600 * 1000;

pub struct Settings<'a> {
    pub bin: &'a Path,
    pub targets: &'a Targets,
    pub modes: &'a [Mode],
    /// Records in the store at each measured point, ascending.
    pub sizes: &'a [u64],
    pub concurrency: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Expired rows the sweeper deletes under load (0: no sweep measurement).
    pub sweep_rows: u64,
    pub out: &'a Path,
    pub nonce: u128,
    /// Rounds of each mode's phases at each size (the median round is reported).
    pub rounds: usize,
}

/// One mode's load at one size.
#[derive(Serialize, Clone)]
pub struct ScaleRow {
    pub records: u64,
    pub mode: &'static str,
    pub phase: &'static str,
    pub requests_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub unexpected: u64,
}

/// The stores' size at one point.
#[derive(Serialize, Clone)]
pub struct Footprint {
    pub records: u64,
    /// Seconds to write the records added since the last point.
    pub preload_s: f64,
    pub preloaded: u64,
    pub pg_rows: Option<u64>,
    pub pg_table_bytes: Option<u64>,
    pub pg_index_bytes: Option<u64>,
    pub redis_keys: Option<u64>,
    pub redis_used_memory_delta: Option<u64>,
}

impl Footprint {
    fn pg_per_record(&self) -> Option<f64> {
        let rows = self.pg_rows.filter(|&r| r > 0)?;
        Some((self.pg_table_bytes? + self.pg_index_bytes?) as f64 / rows as f64)
    }
    fn redis_per_record(&self) -> Option<f64> {
        let keys = self.redis_keys.filter(|&k| k > 0)?;
        Some(self.redis_used_memory_delta? as f64 / keys as f64)
    }
}

/// New keys with the sweeper idle, then while it deletes `rows` expired rows.
#[derive(Serialize, Clone)]
pub struct SweepRow {
    pub mode: &'static str,
    pub records: u64,
    pub expired_rows: u64,
    pub without: ScaleRow,
    pub during: ScaleRow,
    /// Expired rows deleted during the measured window.
    pub swept_in_window: u64,
    /// From the origin's start until no expired row was left (None: not within the bound).
    pub all_swept_s: Option<f64>,
}

pub struct Outcome {
    pub rows: Vec<ScaleRow>,
    pub footprints: Vec<Footprint>,
    pub sweeps: Vec<SweepRow>,
}

pub async fn run(s: &Settings<'_>) -> Result<Outcome> {
    if s.sizes.is_empty() || s.sizes.contains(&0) {
        bail!("--scale needs record counts of at least 1, e.g. 10k,1m,10m");
    }
    let needs_pg = s.modes.iter().any(|m| m.uses_postgres());
    let needs_cluster = s
        .modes
        .iter()
        .any(|m| m.redis() == Some(RedisKind::Cluster));
    if let Some(m) = s
        .modes
        .iter()
        .find(|m| !m.uses_postgres() && m.redis() != Some(RedisKind::Cluster))
    {
        bail!("--scale-modes: {} is not measured at scale (only Postgres, Redis Cluster and tiered modes)", m.name());
    }
    let pg = match needs_pg {
        true => Some(backend::Postgres::connect(&s.targets.database_url).await?),
        false => None,
    };
    let mut masters = match needs_cluster {
        true => Some(backend::Redis::cluster_masters(&s.targets.cluster_urls).await?),
        false => None,
    };
    let cluster = match needs_cluster {
        true => {
            Some(preload::Cluster::connect(&s.targets.cluster_urls, &s.targets.namespace).await?)
        }
        false => None,
    };
    let empty = async |pg: &Option<backend::Postgres>,
                       masters: &mut Option<backend::Redis>|
           -> Result<()> {
        if let Some(pg) = pg {
            pg.truncate_records().await?;
        }
        if let Some(m) = masters {
            m.delete_bench_keys().await?;
        }
        Ok(())
    };
    empty(&pg, &mut masters).await?;
    // What the servers hold besides this run's records (other runs' and tests' keys).
    let redis_baseline = match &mut masters {
        Some(m) => Some((m.used_memory().await?, m.keys().await?)),
        None => None,
    };

    let prefix = format!("p{}", s.nonce);
    let shape = template(s, &cluster, pg.as_ref()).await?;
    let mut outcome = Outcome {
        rows: Vec::new(),
        footprints: Vec::new(),
        sweeps: Vec::new(),
    };
    let mut loaded = 0;
    for &size in s.sizes {
        let started = Instant::now();
        let shape = preload::Shape {
            expires_at: now_ms()? + PRELOADED_TTL_MS,
            ..shape.clone()
        };
        let targets = preload::Targets {
            pg: pg.as_ref().map(|p| p.client()),
            cluster: cluster.as_ref(),
        };
        eprintln!("scale: writing records {loaded}..{size}…");
        preload::write(&targets, &prefix, loaded..size.max(loaded), &shape).await?;
        if let Some(pg) = &pg {
            // As autovacuum would leave a table at rest: hint bits set, statistics fresh.
            pg.client()
                .batch_execute("VACUUM (ANALYZE) idem_records")
                .await?;
        }
        let preload_s = started.elapsed().as_secs_f64();
        let footprint = footprint(
            size,
            size.saturating_sub(loaded),
            preload_s,
            pg.as_ref(),
            &mut masters,
            redis_baseline,
        )
        .await?;
        outcome.footprints.push(footprint);
        loaded = loaded.max(size);
        // Rounds alternate the modes; each phase's row is its median round.
        let mut rounds: Vec<(ScaleRow, ScaleRow)> = Vec::new();
        for round in 0..s.rounds {
            for &mode in s.modes {
                eprintln!(
                    "scale: {size} records, {} (round {})…",
                    mode.name(),
                    round + 1
                );
                let origin =
                    start_origin(s, mode, None, &format!("{}-{size}", mode.name())).await?;
                let unique = Keys::Unique {
                    prefix: format!("s{}-{size}-{}-{round}", s.nonce, mode.name()),
                };
                let new_keys = measure(s, &origin, size, mode, "unique", unique).await?;
                let replay = Keys::Preloaded {
                    prefix: prefix.clone(),
                    count: loaded,
                };
                let replays = measure(s, &origin, size, mode, "replay", replay).await?;
                rounds.push((new_keys, replays));
            }
        }
        for &mode in s.modes {
            let of_mode = || rounds.iter().filter(|r| r.0.mode == mode.name());
            outcome
                .rows
                .push(median_round(of_mode().map(|r| r.0.clone()).collect()));
            outcome
                .rows
                .push(median_round(of_mode().map(|r| r.1.clone()).collect()));
        }
    }
    if s.sweep_rows > 0 {
        for &mode in s.modes.iter().filter(|m| m.uses_postgres()) {
            let pg = pg.as_ref().context("no Postgres connection")?;
            outcome
                .sweeps
                .push(sweep(s, pg, &shape, mode, loaded).await?);
        }
    }
    empty(&pg, &mut masters).await?;
    Ok(outcome)
}

/// The answer every preloaded record replays: a real one, as the origin stored it for
/// one request of the load generator's.
async fn template(
    s: &Settings<'_>,
    cluster: &Option<preload::Cluster>,
    pg: Option<&backend::Postgres>,
) -> Result<preload::Shape> {
    // An origin on Postgres first, when there is one: it creates the table COPY fills.
    let mode = *s
        .modes
        .iter()
        .find(|m| m.uses_postgres())
        .unwrap_or(&s.modes[0]);
    let origin = start_origin(s, mode, None, "template").await?;
    let prefix = format!("t{}", s.nonce);
    let seed = Keys::Seed {
        prefix: prefix.clone(),
        count: 1,
    };
    let sent = load::seed(origin.addr, 1, seed).await?;
    if sent.ok != 1 {
        bail!(
            "the template request was not answered 201: {}",
            sent.unexpected_sample.unwrap_or_default()
        );
    }
    drop(origin);
    let key = IdempotencyKey::parse(format!("\"{prefix}-0\"").as_bytes())
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let id = RecordKey::new(&Scope::from_authorization(None), &key);
    let bytes = match (mode.redis(), cluster, pg) {
        (Some(RedisKind::Cluster), Some(c), _) => c.read(id.as_str()).await?,
        (_, _, Some(pg)) => pg
            .client()
            .query_opt(
                &pg.id_column()
                    .await?
                    .render("SELECT record FROM idem_records WHERE id = {id}"),
                &[&id.as_str()],
            )
            .await?
            .map(|row| row.get::<_, Vec<u8>>(0)),
        _ => None,
    };
    let bytes = bytes
        .with_context(|| format!("the template's record {} is not in the store", id.as_str()))?;
    let record =
        Record::decode(&bytes).map_err(|e| anyhow::anyhow!("the template's record: {e}"))?;
    match record {
        Record::Completed { response, .. } => Ok(preload::Shape {
            response,
            now: now_ms()?,
            expires_at: 0,
        }),
        Record::InProgress { .. } => bail!("the template's record is still in progress"),
    }
}

async fn start_origin(
    s: &Settings<'_>,
    mode: Mode,
    sweep_every: Option<&str>,
    tag: &str,
) -> Result<OriginProcess> {
    let mut args = mode.origin_args(s.targets);
    if let Some(every) = sweep_every {
        let at = args
            .iter()
            .position(|a| a == "--sweep-interval")
            .context("no --sweep-interval")?;
        args[at + 1] = every.to_string();
    }
    args.extend(["--replay-cache-bytes".into(), "0".into()]);
    let log = s.out.join(format!("origin-scale-{tag}.log"));
    OriginProcess::start(s.bin, &args, log).await
}

async fn measure(
    s: &Settings<'_>,
    origin: &OriginProcess,
    records: u64,
    mode: Mode,
    phase: &'static str,
    keys: Keys,
) -> Result<ScaleRow> {
    let result = load::drive(
        origin.addr,
        s.concurrency,
        keys,
        s.warmup,
        s.duration,
        Arc::new(AtomicU64::new(0)),
    )
    .await?;
    if let Some(sample) = &result.unexpected_sample {
        eprintln!(
            "scale {records} {} {phase}: unexpected answer: {sample}",
            mode.name()
        );
    }
    Ok(row(records, mode, phase, &result))
}

/// The round with the median requests/s.
fn median_round(mut rounds: Vec<ScaleRow>) -> ScaleRow {
    rounds.sort_by(|a, b| a.requests_per_s.total_cmp(&b.requests_per_s));
    rounds.swap_remove(rounds.len() / 2)
}

fn row(records: u64, mode: Mode, phase: &'static str, r: &LoadResult) -> ScaleRow {
    ScaleRow {
        records,
        mode: mode.name(),
        phase,
        requests_per_s: r.requests_per_s(),
        p50_ms: r.quantile_ms(0.5),
        p99_ms: r.quantile_ms(0.99),
        unexpected: r.unexpected,
    }
}

async fn footprint(
    records: u64,
    preloaded: u64,
    preload_s: f64,
    pg: Option<&backend::Postgres>,
    masters: &mut Option<backend::Redis>,
    redis_baseline: Option<(u64, u64)>,
) -> Result<Footprint> {
    let (pg_rows, pg_table_bytes, pg_index_bytes) = match pg {
        Some(pg) => {
            let row = pg
                .client()
                .query_one(
                    "SELECT (SELECT count(*) FROM idem_records)::int8,
                            pg_table_size('idem_records')::int8, pg_indexes_size('idem_records')::int8",
                    &[],
                )
                .await?;
            let get = |i| Some(row.get::<_, i64>(i) as u64);
            (get(0), get(1), get(2))
        }
        None => (None, None, None),
    };
    let (redis_keys, redis_used_memory_delta) = match masters {
        Some(m) => {
            let (memory, keys) = redis_baseline.unwrap_or_default();
            (
                Some(m.keys().await?.saturating_sub(keys)),
                Some(m.used_memory().await?.saturating_sub(memory)),
            )
        }
        None => (None, None),
    };
    Ok(Footprint {
        records,
        preload_s,
        preloaded,
        pg_rows,
        pg_table_bytes,
        pg_index_bytes,
        redis_keys,
        redis_used_memory_delta,
    })
}

/// `s.sweep_rows` expired rows added to Postgres; new keys measured with the sweeper
/// idle, then with it running (its first sweep as the measured window opens); then how
/// long until no expired row is left.
async fn sweep(
    s: &Settings<'_>,
    pg: &backend::Postgres,
    shape: &preload::Shape,
    mode: Mode,
    records: u64,
) -> Result<SweepRow> {
    let now = now_ms()?;
    let expired = preload::Shape {
        now: now - 3 * 3600 * 1000,
        expires_at: now - 2 * 3600 * 1000,
        ..shape.clone()
    };
    eprintln!(
        "scale: {} expired rows for {}'s sweeper…",
        s.sweep_rows,
        mode.name()
    );
    let targets = preload::Targets {
        pg: Some(pg.client()),
        cluster: None,
    };
    preload::write(
        &targets,
        &format!("x{}-{}", s.nonce, mode.name()),
        0..s.sweep_rows,
        &expired,
    )
    .await?;
    pg.client()
        .batch_execute("VACUUM (ANALYZE) idem_records")
        .await?;
    let count_expired = async || -> Result<u64> {
        let row = pg
            .client()
            .query_one(
                "SELECT count(*)::int8 FROM idem_records WHERE expires_at < $1",
                &[&(i64::try_from(now)? - 3_600_000)],
            )
            .await?;
        Ok(row.get::<_, i64>(0) as u64)
    };
    let expired_rows = count_expired().await?;

    let tag = |what: &str| format!("s{}-{what}-{}", s.nonce, mode.name());
    let origin = start_origin(s, mode, None, &format!("{}-nosweep", mode.name())).await?;
    let without = measure(
        s,
        &origin,
        records,
        mode,
        "unique",
        Keys::Unique {
            prefix: tag("idle"),
        },
    )
    .await?;
    drop(origin);
    if count_expired().await? != expired_rows {
        bail!("expired rows were deleted with the sweeper idle");
    }

    let started = Instant::now();
    let first_sweep = format!("{}ms", s.warmup.as_millis().max(1));
    let origin = start_origin(
        s,
        mode,
        Some(&first_sweep),
        &format!("{}-sweep", mode.name()),
    )
    .await?;
    let load = {
        let (addr, c, warmup, duration) = (origin.addr, s.concurrency, s.warmup, s.duration);
        let keys = Keys::Unique {
            prefix: tag("sweep"),
        };
        tokio::spawn(async move {
            load::drive(addr, c, keys, warmup, duration, Arc::new(AtomicU64::new(0))).await
        })
    };
    tokio::time::sleep(s.warmup).await;
    let left_before = count_expired().await?;
    let result = load.await.context("the load task panicked")??;
    let left_after = count_expired().await?;
    let during = row(records, mode, "unique", &result);
    if left_before == 0 {
        eprintln!(
            "scale: {}'s sweeper finished before the measured window; raise --sweep-rows",
            mode.name()
        );
    }
    let bound = Duration::from_secs(600);
    let mut all_swept_s = None;
    while started.elapsed() < bound {
        if count_expired().await? == 0 {
            all_swept_s = Some(started.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    drop(origin);
    // Whatever the sweeper left, so that the next mode starts from the same table.
    pg.client()
        .execute(
            "DELETE FROM idem_records WHERE expires_at < $1",
            &[&(i64::try_from(now)? - 3_600_000)],
        )
        .await?;
    Ok(SweepRow {
        mode: mode.name(),
        records,
        expired_rows,
        without,
        during,
        swept_in_window: left_before.saturating_sub(left_after),
        all_swept_s,
    })
}

fn now_ms() -> Result<u64> {
    Ok(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64)
}

/// `10k`, `1m`, `10M`, `250000`: a record count.
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, factor) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1_000),
        Some((i, 'm' | 'M')) => (&t[..i], 1_000_000),
        _ => (t, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("{s:?} is not a count of records (e.g. 10000, 10k, 1m)"))
}

/// The tables the scale bench prints.
pub fn tables(o: &Outcome, concurrency: usize) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "Scale: records stored beforehand, then new keys and replays of stored keys picked at random ({concurrency} connections, replay cache off)");
    let _ = writeln!(
        out,
        "{:>10}  {:<15} {:>10} {:>8} {:>10} {:>8}   {:>14} {:>14}",
        "records",
        "mode",
        "new keys/s",
        "p99 ms",
        "replays/s",
        "p99 ms",
        "new vs first",
        "replay vs first"
    );
    for r in o.rows.iter().filter(|r| r.phase == "unique") {
        let replay = o
            .rows
            .iter()
            .find(|x| x.phase == "replay" && x.mode == r.mode && x.records == r.records);
        let first = |phase: &str| o.rows.iter().find(|x| x.phase == phase && x.mode == r.mode);
        let versus = |phase: &str, this: Option<&ScaleRow>| match (first(phase), this) {
            (Some(f), Some(t)) if f.requests_per_s > 0.0 && f.p99_ms > 0.0 => {
                format!(
                    "{:.2}× / {:.2}×",
                    t.requests_per_s / f.requests_per_s,
                    t.p99_ms / f.p99_ms
                )
            }
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:>10}  {:<15} {:>10.0} {:>8.2} {:>10} {:>8}   {:>14} {:>14}",
            r.records,
            r.mode,
            r.requests_per_s,
            r.p99_ms,
            replay.map_or("-".into(), |x| format!("{:.0}", x.requests_per_s)),
            replay.map_or("-".into(), |x| format!("{:.2}", x.p99_ms)),
            versus("unique", Some(r)),
            versus("replay", replay),
        );
    }
    let _ = writeln!(
        out,
        "(vs first: req/s ratio / p99 ratio against the smallest size, same mode)"
    );
    let _ = writeln!(out);
    let _ = writeln!(out, "Bytes per record");
    let _ = writeln!(
        out,
        "{:>10}  {:>10} {:>12} {:>12} {:>10}   {:>10} {:>14} {:>10}",
        "records",
        "written",
        "write s",
        "PG table+idx",
        "PG B/rec",
        "Redis keys",
        "used_memory Δ",
        "Redis B/rec"
    );
    for f in &o.footprints {
        let mb = |b: Option<u64>| b.map_or("-".into(), |b| format!("{:.1} MB", b as f64 / 1e6));
        let _ = writeln!(
            out,
            "{:>10}  {:>10} {:>12.1} {:>12} {:>10} {:>10} {:>14} {:>10}",
            f.records,
            f.preloaded,
            f.preload_s,
            mb(f.pg_table_bytes.zip(f.pg_index_bytes).map(|(t, i)| t + i)),
            f.pg_per_record().map_or("-".into(), |b| format!("{b:.0}")),
            f.redis_keys.map_or("-".into(), |k| k.to_string()),
            mb(f.redis_used_memory_delta),
            f.redis_per_record()
                .map_or("-".into(), |b| format!("{b:.0}")),
        );
    }
    if !o.sweeps.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "The sweeper under load: new keys with it idle, then while it deletes expired rows"
        );
        let _ = writeln!(
            out,
            "{:<15} {:>10} {:>10}   {:>10} {:>8}   {:>10} {:>8}   {:>14} {:>12}",
            "mode",
            "records",
            "expired",
            "idle req/s",
            "p99 ms",
            "sweep req/s",
            "p99 ms",
            "swept in window",
            "all swept s"
        );
        for w in &o.sweeps {
            let _ = writeln!(
                out,
                "{:<15} {:>10} {:>10}   {:>10.0} {:>8.2}   {:>10.0} {:>8.2}   {:>14} {:>12}",
                w.mode,
                w.records,
                w.expired_rows,
                w.without.requests_per_s,
                w.without.p99_ms,
                w.during.requests_per_s,
                w.during.p99_ms,
                w.swept_in_window,
                w.all_swept_s.map_or("-".into(), |s| format!("{s:.1}")),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_parse_with_suffixes_and_refuse_nonsense() {
        assert_eq!(parse_count("10k"), Ok(10_000));
        assert_eq!(parse_count("1m"), Ok(1_000_000));
        assert_eq!(parse_count("10M"), Ok(10_000_000));
        assert_eq!(parse_count("2500"), Ok(2500));
        for bad in ["", "k", "1.5m", "-3", "ten", "99999999999999999999m"] {
            assert!(parse_count(bad).is_err(), "{bad:?}");
        }
    }
}
