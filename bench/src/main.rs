//! `idem-bench`: the origin on every store, against the raw backend, in one run.
//!
//! For each mode and concurrency: the raw backend first (`redis-benchmark` SET NX or
//! `pgbench` with the store's own claim statements), then the origin over HTTP with a
//! new key per request, then replays of keys already completed. Backend round trips
//! are counted by the servers (`pg_stat_statements`, `INFO commandstats`). Prints a
//! table; writes CSV, JSON and an SVG plot.
//!
//! ```text
//! scripts/bench                      # services, release build, every mode
//! cargo run -p idem-bench --release -- --modes redis-cluster --concurrency 32
//! ```

mod backend;
mod cpu;
mod edge_hash;
mod fingerprint;
mod floor;
mod guard;
mod load;
mod mode;
mod origin;
mod peer;
mod perf;
mod preload;
mod proxy;
mod raw;
mod report;
mod scale;
mod served;

use anyhow::{Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use load::Keys;
use mode::{Mode, Raw, RedisKind, Targets};
use report::Row;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Benchmarks idem's origin on each store against the raw backend.
#[derive(Parser, Debug)]
#[command(name = "idem-bench", version)]
struct Args {
    /// Store modes, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "memory,pg-on-conflict,pg-advisory-lock,redis,redis-cluster,redis-cluster-wait1,tiered-sync,tiered-async,pg-demo-separate,pg-demo-transactional"
    )]
    modes: Vec<Mode>,
    /// Concurrent connections, comma-separated; each mode runs at each.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    concurrency: Vec<usize>,
    /// Measured time of each phase (and of each raw run).
    #[arg(long, default_value = "5s", value_parser = idem_origin::config::parse_duration)]
    duration: Duration,
    /// Unmeasured time before each phase.
    #[arg(long, default_value = "1s", value_parser = idem_origin::config::parse_duration)]
    warmup: Duration,
    /// Rounds per mode and concurrency (raw backend, new keys, replays in each), and of
    /// the comparisons with the `idempotent` crate and with idempotent-proxy (each
    /// server in each round, first in turn). The tables show the round with the
    /// median ratio, and the ratio's range.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Keys completed before the replay phase, then replayed round-robin.
    #[arg(long, default_value_t = 1000)]
    replay_keys: usize,
    /// Proxy mode's cost: the stores `idem-origin --upstream` runs on, each measured
    /// against a plain charges API alone.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "memory,redis-cluster,tiered-async"
    )]
    proxy_modes: Vec<Mode>,
    /// Concurrent connections of the proxy comparison.
    #[arg(long, value_delimiter = ',', default_value = "8,32")]
    proxy_concurrency: Vec<usize>,
    /// The APIs the proxy comparison puts behind idem.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "builtin,python"
    )]
    proxy_upstreams: Vec<proxy::UpstreamKind>,
    /// The Python payments API (the `python` upstream).
    #[arg(long, default_value = "tests/upstream/payments.py")]
    payments_py: PathBuf,
    /// Leave the proxy comparison out.
    #[arg(long)]
    skip_proxy: bool,
    /// idempotent-proxy's server binary (1.2.2; `scripts/bench` installs it): proxy
    /// mode is compared with it in front of the builtin upstream, both on the
    /// standalone Redis. Left out without it.
    #[arg(long, value_name = "BIN")]
    idempotent_proxy: Option<PathBuf>,
    /// nginx (`scripts/bench` installs nginx-light): idempotent-proxy is also measured
    /// behind it, as it is deployed in front of a whole API — nginx sends the guarded
    /// POSTs to it and every other request to the API. Left out without it.
    #[arg(long, value_name = "BIN")]
    nginx: Option<PathBuf>,
    /// Concurrent connections of the comparison with the `idempotent` crate (on the
    /// standalone Redis).
    #[arg(long, value_delimiter = ',', default_value = "8,32")]
    peer_concurrency: Vec<usize>,
    /// Leave the comparison with the `idempotent` crate out.
    #[arg(long)]
    skip_peer: bool,
    /// Measure ceilings beside the `idempotent` crate and idem, in the same rounds:
    /// axum answering a fixed 201 (no server answers faster here), and axum making
    /// exactly idem's two store calls per new key; and beside idempotent-proxy, axum
    /// making those calls around the upstream's (bench/src/floor.rs).
    #[arg(long)]
    floors: bool,
    /// Only the performance guard: idem on the standalone Redis against the
    /// `idempotent` crate, --repeat rounds at each --peer-concurrency, as each server's
    /// CPU per request ÷ the load generator's; exits non-zero when the median round's
    /// idem ÷ peer is above the bound (1.5× on new keys, 1.0× on replays).
    #[arg(long, conflicts_with_all = ["scale", "edge_hash", "fingerprint_only"])]
    guard: bool,
    /// Instead of the store modes: the stores filled to each of these record counts in
    /// turn (e.g. 10k,1m,10m), and at each, new keys and replays of stored keys, bytes
    /// per record, then the sweeper deleting --sweep-rows expired rows under load.
    #[arg(long, value_delimiter = ',', value_parser = scale::parse_count)]
    scale: Vec<u64>,
    /// The modes --scale measures.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "pg-on-conflict,redis-cluster,tiered-async"
    )]
    scale_modes: Vec<Mode>,
    /// Concurrent connections of the --scale runs.
    #[arg(long, default_value_t = 32)]
    scale_concurrency: usize,
    /// Expired rows the sweeper deletes under load after the --scale sizes (0: none).
    #[arg(long, default_value = "1m", value_parser = scale::parse_count)]
    sweep_rows: u64,
    /// A short run of every mode at one concurrency: checks that the bench works.
    #[arg(long)]
    quick: bool,
    /// Postgres for the pg and tiered modes (its database is created when missing).
    #[arg(
        long,
        env = "IDEM_BENCH_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/idem_bench"
    )]
    database_url: String,
    /// Standalone Redis.
    #[arg(
        long,
        env = "IDEM_BENCH_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    redis_url: String,
    /// Redis Cluster seed URLs, comma-separated.
    #[arg(
        long,
        env = "IDEM_BENCH_REDIS_CLUSTER_URLS",
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002"
    )]
    redis_cluster_urls: Vec<String>,
    /// The WASM and native fingerprint programs, as scripts/bench builds them;
    /// the comparison is skipped when the directory is missing.
    #[arg(long, default_value = "target/idem-bench/fingerprint")]
    fingerprint_dir: PathBuf,
    /// Run only the fingerprint comparison (no services needed).
    #[arg(long)]
    fingerprint_only: bool,
    /// Time per fingerprint case, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    fingerprint_ms: u64,
    /// Only the edge's hash under workerd: the built worker (edge/build) under
    /// `wrangler dev`, SHA-256 in WASM vs WebCrypto, by body size.
    #[arg(long, conflicts_with = "scale")]
    edge_hash: bool,
    /// Timed requests per case of --edge-hash (the median is taken).
    #[arg(long, default_value_t = 9)]
    edge_hash_rounds: usize,
    /// The idem-origin binary (default: the one beside this binary); named idem-origin.
    #[arg(long)]
    origin_bin: Option<PathBuf>,
    /// Profiles the origin with `perf record` (call graphs) during each measured
    /// phase, into `<DIR>/<mode>-<phase>-c<conns>.data` (scripts/flamegraph draws them).
    #[arg(long, value_name = "DIR")]
    perf: Option<PathBuf>,
    /// Where results.csv, results.json, results.svg and the logs go.
    #[arg(long, default_value = "target/idem-bench")]
    out: PathBuf,
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // This binary under another name is the peer, or the proxy comparison's upstream.
    if let Ok(spec) = std::env::var(peer::SERVE_ENV) {
        return serve_as(peer::PROGRAM, peer::serve(&spec));
    }
    if let Ok(spec) = std::env::var(floor::SERVE_ENV) {
        let program = spec
            .split(' ')
            .nth(1)
            .and_then(floor::Floor::of_kind)
            .map_or("floor", |f| f.names().1);
        return serve_as(program, floor::serve(&spec));
    }
    if let Ok(addr) = std::env::var(proxy::SERVE_ENV) {
        return serve_as(proxy::PROGRAM, proxy::serve(&addr));
    }
    // Explicit, so that TOKIO_WORKER_THREADS given to the bench reaches the servers it
    // starts (the origin, the peer, the floors), not its own load generator.
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(bench()),
        Err(e) => {
            eprintln!("idem-bench: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `server` on a runtime of its own until it fails (or is killed).
fn serve_as(program: &str, server: impl std::future::Future<Output = Result<()>>) -> ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    match rt
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(server))
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn bench() -> ExitCode {
    let mut args = Args::parse();
    if args.quick {
        args.concurrency = vec![8];
        args.proxy_concurrency = vec![8];
        args.peer_concurrency = vec![8];
        args.duration = Duration::from_secs(1);
        args.warmup = Duration::from_millis(200);
        args.replay_keys = 200;
        args.fingerprint_ms = 100;
        args.scale_concurrency = 8;
        args.edge_hash_rounds = 3;
        args.sweep_rows = args.sweep_rows.min(100_000);
    }
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The connections the bench itself holds to the services.
struct Services {
    pg: Option<backend::Postgres>,
    redis: Option<backend::Redis>,
    cluster: Option<backend::Redis>,
}

async fn run(args: Args) -> Result<()> {
    if args.concurrency.is_empty()
        || args.concurrency.contains(&0)
        || args.proxy_concurrency.contains(&0)
        || args.peer_concurrency.contains(&0)
    {
        anyhow::bail!("--concurrency needs numbers of connections of at least 1");
    }
    if args.replay_keys == 0
        || args.duration.is_zero()
        || args.fingerprint_ms == 0
        || args.repeat == 0
    {
        anyhow::bail!(
            "--replay-keys, --duration, --fingerprint-ms and --repeat must be greater than zero"
        );
    }
    let bin = match &args.origin_bin {
        // Its CPU is read from /proc by the program's name.
        Some(b) if b.file_name().is_none_or(|n| n != "idem-origin") => anyhow::bail!(
            "--origin-bin {}: the binary must be named idem-origin (the bench finds its CPU \
             time by that name); copy it into a directory of its own",
            b.display()
        ),
        Some(b) => b.clone(),
        None => origin::default_binary()?,
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let targets = Targets {
        database_url: args.database_url.clone(),
        redis_url: args.redis_url.clone(),
        cluster_urls: args.redis_cluster_urls.clone(),
        namespace: format!("idem-bench-{nonce}"),
    };
    if !args.scale.is_empty() {
        return run_scale(&args, &bin, &targets, nonce).await;
    }
    if args.guard {
        return run_guard(&args, &bin, &targets, nonce).await;
    }
    if args.edge_hash {
        if args.edge_hash_rounds == 0 {
            anyhow::bail!("--edge-hash-rounds must be at least 1");
        }
        let rows =
            edge_hash::run(&std::env::current_dir()?, &args.out, args.edge_hash_rounds).await?;
        println!("idem-bench --edge-hash {}", date_utc());
        print!("{}", edge_hash::table(&rows));
        let path = args.out.join("edge-hash.json");
        std::fs::write(&path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
        return Ok(());
    }
    let fingerprints = if args.fingerprint_dir.is_dir() {
        eprintln!("fingerprint: native vs WASM under Node…");
        fingerprint::compare(&args.fingerprint_dir, args.fingerprint_ms).await?
    } else {
        eprintln!(
            "fingerprint comparison skipped: {} is missing (scripts/bench builds it)",
            args.fingerprint_dir.display()
        );
        Vec::new()
    };
    if args.fingerprint_only {
        if fingerprints.is_empty() {
            anyhow::bail!(
                "--fingerprint-only, but {} is missing",
                args.fingerprint_dir.display()
            );
        }
        print!("{}", fingerprint::table(&fingerprints));
        return Ok(());
    }
    let mut services = connect_services(&args).await?;
    cleanup(&mut services).await?;

    let steps = (args.modes.len() * args.concurrency.len() * args.repeat) as u64;
    let progress = ProgressBar::new(steps).with_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")?
            .progress_chars("=> "),
    );
    progress.enable_steady_tick(Duration::from_millis(200));
    let mut rows = Vec::new();
    let started = Instant::now();
    for &mode in &args.modes {
        if let Some(pg) = &services.pg {
            pg.truncate_records().await?;
        }
        let log = args.out.join(format!("origin-{}.log", mode.name()));
        let origin = origin::OriginProcess::start(&bin, &mode.origin_args(&targets), log).await?;
        for (&c, round) in args
            .concurrency
            .iter()
            .flat_map(|c| (0..args.repeat).map(move |r| (c, r)))
        {
            progress.set_message(format!("{} c={c}: raw backend", mode.name()));
            let raw = match mode.raw() {
                Some(r) => {
                    let sampler = cpu::Sampler::start(Duration::from_millis(250));
                    let result = measure_raw(r, c, &args, &services).await?;
                    Some((r, result, sampler.stop().await.while_running(r.tool())))
                }
                None => None,
            };
            if let Some(pg) = &services.pg {
                pg.truncate_records().await?;
            }
            let ctx = PhaseCtx {
                mode,
                concurrency: c,
                raw,
                args: &args,
                addr: origin.addr,
                origin_pid: origin.pid(),
                progress: &progress,
            };
            let prefix = format!("{nonce}-{}-{c}-{round}", mode.name());
            let unique = Keys::Unique {
                prefix: format!("u{prefix}"),
            };
            rows.push(Row {
                round,
                ..phase(&ctx, &mut services, "unique", unique).await?
            });
            progress.set_message(format!("{} c={c}: seeding replay keys", mode.name()));
            let seed = Keys::Seed {
                prefix: format!("r{prefix}"),
                count: args.replay_keys,
            };
            let seeded = load::seed(origin.addr, c, seed).await?;
            if seeded.unexpected > 0 {
                anyhow::bail!(
                    "{}: seeding the replay keys got {} unexpected answers, e.g. {}",
                    mode.name(),
                    seeded.unexpected,
                    seeded.unexpected_sample.unwrap_or_default()
                );
            }
            let replay = Keys::Replay {
                prefix: format!("r{prefix}"),
                count: args.replay_keys,
            };
            rows.push(Row {
                round,
                ..phase(&ctx, &mut services, "replay", replay).await?
            });
            progress.inc(1);
        }
        drop(origin);
    }
    progress.finish_and_clear();
    let peered = match args.skip_peer {
        true => Vec::new(),
        false => {
            eprintln!("the idempotent crate, then idem, on the standalone Redis…");
            compare_with_peer(&args, &bin, &targets, nonce).await?
        }
    };
    let proxied = match args.skip_proxy {
        true => Vec::new(),
        false => {
            eprintln!("proxy mode: the upstream alone, then through idem…");
            if let Some(pg) = &services.pg {
                pg.truncate_records().await?;
            }
            proxy::run(&proxy::Settings {
                bin: &bin,
                upstreams: &args.proxy_upstreams,
                payments_py: &args.payments_py,
                targets: &targets,
                modes: &args.proxy_modes,
                concurrency: &args.proxy_concurrency,
                warmup: args.warmup,
                duration: args.duration,
                replay_keys: args.replay_keys,
                out: &args.out,
                nonce,
                idempotent_proxy: args.idempotent_proxy.as_deref(),
                nginx: args.nginx.as_deref(),
                floors: args.floors,
                rounds: args.repeat,
            })
            .await?
        }
    };
    cleanup(&mut services).await?;
    write_outputs(
        &args,
        &rows,
        &peered,
        &proxied,
        &fingerprints,
        started.elapsed(),
    )?;
    let unexpected: u64 = rows.iter().map(|r| r.unexpected).sum::<u64>()
        + peered.iter().map(|r| r.unexpected).sum::<u64>()
        + proxied.iter().map(|r| r.unexpected).sum::<u64>();
    if unexpected > 0 {
        anyhow::bail!("{unexpected} requests were not answered as expected (see the table)");
    }
    if let Some(r) = proxied
        .iter()
        .find(|r| r.phase == "replay" && r.upstream_calls > 0.0)
    {
        anyhow::bail!(
            "proxy {}: replays reached the upstream ({:.3} calls per request)",
            r.path,
            r.upstream_calls
        );
    }
    Ok(())
}

/// `--scale`: its tables printed, and written to scale.json.
async fn run_scale(
    args: &Args,
    bin: &std::path::Path,
    targets: &Targets,
    nonce: u128,
) -> Result<()> {
    let mut sizes = args.scale.clone();
    sizes.sort_unstable();
    sizes.dedup();
    if args.scale_concurrency == 0 {
        anyhow::bail!("--scale-concurrency must be at least 1");
    }
    let started = Instant::now();
    let outcome = scale::run(&scale::Settings {
        bin,
        targets,
        modes: &args.scale_modes,
        sizes: &sizes,
        concurrency: args.scale_concurrency,
        warmup: args.warmup,
        duration: args.duration,
        sweep_rows: args.sweep_rows,
        out: &args.out,
        nonce,
        rounds: args.repeat,
    })
    .await?;
    println!(
        "idem-bench --scale {}, {:?} per phase, took {:.0} s",
        date_utc(),
        args.duration,
        started.elapsed().as_secs_f64()
    );
    if args.repeat > 1 {
        println!(
            "{} rounds each, modes alternating: the median round",
            args.repeat
        );
    }
    print!("{}", scale::tables(&outcome, args.scale_concurrency));
    let json = serde_json::json!({
        "rows": outcome.rows,
        "footprints": outcome.footprints,
        "sweeps": outcome.sweeps,
    });
    let path = args.out.join("scale.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("writing {}", path.display()))?;
    let unexpected: u64 = outcome.rows.iter().map(|r| r.unexpected).sum::<u64>()
        + outcome
            .sweeps
            .iter()
            .map(|w| w.without.unexpected + w.during.unexpected)
            .sum::<u64>();
    if unexpected > 0 {
        anyhow::bail!("{unexpected} requests were not answered as expected (see the table)");
    }
    if let Some(w) = outcome.sweeps.iter().find(|w| w.swept_in_window == 0) {
        anyhow::bail!(
            "{}: the sweeper deleted no expired row while the load ran",
            w.mode
        );
    }
    Ok(())
}

fn date_utc() -> String {
    std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The `idempotent` crate and idem on the same standalone Redis, alternately, each
/// with new keys then replays, at each concurrency and round.
/// The performance guard ([`guard`]): the peer comparison alone, judged.
async fn run_guard(
    args: &Args,
    bin: &std::path::Path,
    targets: &Targets,
    nonce: u128,
) -> Result<()> {
    let mut services = connect_services(args).await?;
    cleanup(&mut services).await?;
    eprintln!(
        "performance guard: the idempotent crate, then idem, on the standalone Redis, {} rounds…",
        args.repeat
    );
    let rows = compare_with_peer(args, bin, targets, nonce).await;
    // Its keys go whatever the outcome: left behind, they slow every SCAN of this Redis.
    cleanup(&mut services).await?;
    let rows = rows?;
    let unexpected: u64 = rows.iter().map(|r| r.unexpected).sum();
    if unexpected > 0 {
        anyhow::bail!("{unexpected} requests were not answered as expected");
    }
    let verdicts = guard::verdicts(&rows);
    print!("{}", peer::table(&rows));
    if let Some(ceilings) = peer::ceilings(&rows) {
        print!("{ceilings}");
    }
    println!();
    print!("{}", guard::table(&rows, &verdicts));
    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join("guard.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&serde_json::json!({ "rows": rows, "verdicts": verdicts }))?,
    )
    .with_context(|| format!("writing {}", path.display()))?;
    let failed: Vec<String> = verdicts
        .iter()
        .filter(|v| !v.passed)
        .map(|v| {
            format!(
                "{} at {} conns: {:.2}× > {:.1}×",
                v.phase, v.concurrency, v.median, v.bound
            )
        })
        .collect();
    if !failed.is_empty() {
        anyhow::bail!(
            "the performance guard failed: idem's CPU per request, relative to the idempotent \
             crate's, is past its bound ({})",
            failed.join("; ")
        );
    }
    Ok(())
}

async fn compare_with_peer(
    args: &Args,
    bin: &std::path::Path,
    targets: &Targets,
    nonce: u128,
) -> Result<Vec<peer::PeerRow>> {
    let peer = peer::start(
        &args.out,
        &args.redis_url,
        &format!("{}-peer", targets.namespace),
    )
    .await?;
    let log = args.out.join("origin-peer-comparison.log");
    let idem = origin::OriginProcess::start(bin, &Mode::Redis.origin_args(targets), log).await?;
    let mut floors = Vec::new();
    if args.floors {
        for floor in [floor::Floor::Http, floor::Floor::Store] {
            let namespace = format!("{}-floor", targets.namespace);
            floors.push((
                floor,
                floor::start(&args.out, floor, &args.redis_url, &namespace, None).await?,
            ));
        }
    }
    let mut servers = vec![
        (peer::PEER, peer.addr, peer::PROGRAM, peer.pid()),
        ("idem", idem.addr, "idem-origin", idem.pid()),
    ];
    for (floor, process) in &floors {
        let (system, program) = floor.names();
        servers.push((system, process.addr, program, process.pid()));
    }
    let mut rows = Vec::new();
    for &c in &args.peer_concurrency {
        for round in 0..args.repeat {
            // Each server first in turn: a later one meets a fuller Redis and a warmer
            // machine.
            let first = round % servers.len();
            let order = servers
                .iter()
                .enumerate()
                .cycle()
                .skip(first)
                .take(servers.len());
            for (i, &(system, addr, program, pid)) in order {
                let perf = args.perf.as_deref().map(|dir| (dir, pid));
                let prefix = format!("p{nonce}-{i}-{c}-{round}");
                let unique = Keys::Unique {
                    prefix: format!("u{prefix}"),
                };
                let (warmup, duration) = (args.warmup, args.duration);
                rows.push(
                    peer::measure(
                        perf, addr, program, system, "unique", c, round, unique, warmup, duration,
                    )
                    .await?,
                );
                let seed = Keys::Seed {
                    prefix: format!("r{prefix}"),
                    count: args.replay_keys,
                };
                load::seed(addr, c, seed).await?;
                let replay = Keys::Replay {
                    prefix: format!("r{prefix}"),
                    count: args.replay_keys,
                };
                rows.push(
                    peer::measure(
                        perf, addr, program, system, "replay", c, round, replay, warmup, duration,
                    )
                    .await?,
                );
            }
        }
    }
    Ok(rows)
}

async fn connect_services(args: &Args) -> Result<Services> {
    let proxied: &[Mode] = if args.skip_proxy {
        &[]
    } else {
        &args.proxy_modes
    };
    let modes = || args.modes.iter().chain(proxied);
    let needs_pg = modes().any(|m| m.uses_postgres());
    let needs_redis = !args.skip_peer || modes().any(|m| m.redis() == Some(RedisKind::Standalone));
    let needs_cluster = modes().any(|m| m.redis() == Some(RedisKind::Cluster));
    Ok(Services {
        pg: match needs_pg {
            true => Some(backend::Postgres::connect(&args.database_url).await?),
            false => None,
        },
        redis: match needs_redis {
            true => Some(backend::Redis::standalone(&args.redis_url).await?),
            false => None,
        },
        cluster: match needs_cluster {
            true => Some(backend::Redis::cluster_masters(&args.redis_cluster_urls).await?),
            false => None,
        },
    })
}

/// Removes what earlier runs left: records, raw keys.
async fn cleanup(s: &mut Services) -> Result<()> {
    if let Some(pg) = &s.pg {
        pg.truncate_records().await?;
    }
    for r in [&mut s.redis, &mut s.cluster].into_iter().flatten() {
        r.delete_bench_keys().await?;
    }
    Ok(())
}

async fn measure_raw(raw: Raw, c: usize, args: &Args, s: &Services) -> Result<raw::RawResult> {
    let host_port = |url: &str| -> Result<(String, u16)> {
        let info = redis::Client::open(url)?.get_connection_info().clone();
        match info.addr() {
            redis::ConnectionAddr::Tcp(h, p) => Ok((h.clone(), *p)),
            other => anyhow::bail!("redis-benchmark needs a TCP address, not {other:?}"),
        }
    };
    match raw {
        Raw::Pgbench(strategy) => {
            let id = match &s.pg {
                Some(pg) => pg.id_column().await?,
                None => anyhow::bail!("pgbench needs the bench's Postgres"),
            };
            raw::pgbench(
                &args.database_url,
                strategy,
                id,
                c,
                args.duration,
                &args.out,
            )
            .await
        }
        Raw::RedisSetNx => {
            let (h, p) = host_port(&args.redis_url)?;
            raw::redis_set_nx(&h, p, false, c, args.duration).await
        }
        Raw::ClusterSetNx => {
            let seed = s
                .cluster
                .as_ref()
                .and_then(|c| c.addresses.first().cloned())
                .context("no cluster master")?;
            let (h, p) = host_port(&seed)?;
            raw::redis_set_nx(&h, p, true, c, args.duration).await
        }
    }
}

struct PhaseCtx<'a> {
    mode: Mode,
    concurrency: usize,
    raw: Option<(Raw, raw::RawResult, cpu::Usage)>,
    args: &'a Args,
    addr: std::net::SocketAddr,
    origin_pid: u32,
    progress: &'a ProgressBar,
}

/// One measured load phase, with the servers' round-trip counts around it.
async fn phase(
    ctx: &PhaseCtx<'_>,
    s: &mut Services,
    name: &'static str,
    keys: Keys,
) -> Result<Row> {
    let sent = Arc::new(AtomicU64::new(0));
    let ticker = {
        let (sent, progress) = (sent.clone(), ctx.progress.clone());
        let label = format!("{} c={}: {name}", ctx.mode.name(), ctx.concurrency);
        tokio::spawn(async move {
            loop {
                progress.set_message(format!(
                    "{label}: {} requests",
                    sent.load(Ordering::Relaxed)
                ));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    // Counters are read after the warm-up, so only the measured window's requests…
    let warmup = ctx.args.warmup;
    let load = {
        let keys = keys.clone();
        let (addr, c, measure, sent) = (ctx.addr, ctx.concurrency, ctx.args.duration, sent.clone());
        tokio::spawn(async move { load::drive(addr, c, keys, warmup, measure, sent).await })
    };
    tokio::time::sleep(warmup).await;
    let profile = match &ctx.args.perf {
        Some(dir) => Some(perf::record(
            dir,
            ctx.origin_pid,
            &format!("{}-{name}-c{}", ctx.mode.name(), ctx.concurrency),
            ctx.args.duration,
        )?),
        None => None,
    };
    let sent_before = sent.load(Ordering::Relaxed);
    let before = counters(ctx.mode, s).await?;
    let cpu_before = cpu::snapshot();
    let result = load.await.context("the load task panicked")??;
    let sent_after = sent.load(Ordering::Relaxed);
    let cpu = cpu_before.until(&cpu::snapshot());
    let after = counters(ctx.mode, s).await?;
    ticker.abort();
    if let Some(profile) = profile {
        profile.finish()?;
    }
    // …and divided by the requests answered between the two readings.
    let answered = sent_after.saturating_sub(sent_before).max(1) as f64;
    let per_request = |b: Option<u64>, a: Option<u64>| match (b, a) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / answered),
        _ => None,
    };
    let pg_rt = per_request(before.0, after.0);
    let redis_rt = per_request(before.1, after.1);
    let rps = result.requests_per_s();
    let raw_kind = ctx.raw.as_ref().map(|r| r.0);
    let primary_rt = match raw_kind {
        Some(r) if r.is_postgres() => pg_rt,
        Some(_) => redis_rt,
        None => None,
    };
    let raw_ops = ctx.raw.as_ref().map(|r| r.1.ops_per_s);
    // CPU: of the origin and of this load generator per request, and of the backend
    // the ratio is against, here and in its raw run.
    let per_request_us = |program: &str| cpu.seconds_of(program) / answered * 1e6;
    let (backend_program, tool_program) = match raw_kind {
        Some(r) => (r.server(), r.tool()),
        None => ("", ""),
    };
    Ok(Row {
        mode: ctx.mode.name(),
        phase: name,
        concurrency: ctx.concurrency,
        requests: result.ok + result.unexpected,
        unexpected: result.unexpected,
        requests_per_s: rps,
        p50_ms: result.quantile_ms(0.5),
        p99_ms: result.quantile_ms(0.99),
        p999_ms: result.quantile_ms(0.999),
        pg_round_trips: pg_rt,
        redis_round_trips: redis_rt,
        raw_backend: ctx.raw.as_ref().map(|r| r.0.describe()),
        raw_ops_per_s: raw_ops,
        ratio: Row::ratio_of(rps, raw_ops, primary_rt),
        round: 0,
        ratio_min: None,
        ratio_max: None,
        origin_cpu_us: per_request_us("idem-origin"),
        client_cpu_us: per_request_us("idem-bench"),
        backend_cores: ctx.raw.as_ref().map(|_| cpu.cores_of(backend_program)),
        raw_backend_cores: ctx.raw.as_ref().map(|r| r.2.cores_of(backend_program)),
        raw_tool_cores: ctx.raw.as_ref().map(|r| r.2.cores_of(tool_program)),
        ratio_per_backend_core: match (&ctx.raw, primary_rt) {
            (Some((_, raw, raw_cpu)), Some(rt)) if rt >= 0.01 => {
                let here = rps * rt / cpu.cores_of(backend_program);
                let there = raw.ops_per_s / raw_cpu.cores_of(backend_program);
                (here.is_finite() && there.is_finite() && there > 0.0).then_some(here / there)
            }
            _ => None,
        },
    })
    .inspect(|row| {
        if let Some(sample) = &result.unexpected_sample {
            eprintln!("{} {}: unexpected answer: {sample}", row.mode, row.phase);
        }
    })
}

/// (Postgres statements, Redis commands) so far, for the backends `mode` uses.
async fn counters(mode: Mode, s: &mut Services) -> Result<(Option<u64>, Option<u64>)> {
    let pg = match (&s.pg, mode.uses_postgres()) {
        (Some(pg), true) => Some(pg.statements().await?),
        _ => None,
    };
    let redis = match mode.redis() {
        Some(RedisKind::Standalone) => match &mut s.redis {
            Some(r) => Some(r.commands().await?),
            None => None,
        },
        Some(RedisKind::Cluster) => match &mut s.cluster {
            Some(r) => Some(r.commands().await?),
            None => None,
        },
        None => None,
    };
    Ok((pg, redis))
}

fn write_outputs(
    args: &Args,
    rows: &[Row],
    peered: &[peer::PeerRow],
    proxied: &[proxy::ProxyRow],
    fingerprints: &[fingerprint::FingerprintRow],
    took: Duration,
) -> Result<()> {
    let date = date_utc();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let title = format!(
        "idem-bench {date}, {cpus} CPUs, {:?} per phase{}",
        args.duration,
        if cfg!(debug_assertions) {
            " (debug build)"
        } else {
            ""
        }
    );
    let all = rows;
    let rows = &report::medians(all);
    println!("{title}, took {:.0} s", took.as_secs_f64());
    if args.repeat > 1 {
        println!(
            "{} rounds each: the round with the median ratio, and the ratio's range",
            args.repeat
        );
    }
    print!("{}", report::table(rows));
    if let Some(cost) = report::transactional_cost(rows) {
        print!("{cost}");
    }
    if let Some(ratio) = report::tiered_async_vs_cluster(rows) {
        print!("{ratio}");
    }
    println!();
    print!("{}", report::cpu_table(rows));
    if !peered.is_empty() {
        println!();
        print!("{}", peer::table(peered));
        if let Some(ceilings) = peer::ceilings(peered) {
            print!("{ceilings}");
        }
    }
    if !proxied.is_empty() {
        println!();
        print!("{}", proxy::table(proxied));
        if let Some(ratios) = proxy::ipx_ratios(proxied) {
            print!("{ratios}");
        }
    }
    if !fingerprints.is_empty() {
        println!();
        print!("{}", fingerprint::table(fingerprints));
    }
    let write = |name: &str, body: String| -> Result<PathBuf> {
        let path = args.out.join(name);
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    };
    write("results.csv", report::csv(rows))?;
    write("rounds.csv", report::csv(all))?;
    let json = serde_json::json!({
        "title": title,
        "rows": rows,
        "rounds": all,
        "peer": peered,
        "proxy": proxied,
        "fingerprint": fingerprints,
    });
    write("results.json", serde_json::to_string_pretty(&json)?)?;
    let svg = write("results.svg", report::svg(rows, &title))?;
    println!(
        "ratio = requests/s ÷ (raw ops/s ÷ round trips per request to that backend); \
         RT = round trips per request counted by the servers"
    );
    println!("wrote {} (and results.csv, results.json)", svg.display());
    Ok(())
}
