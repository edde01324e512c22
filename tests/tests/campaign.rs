//! The fault campaign, in Jepsen's shape: a **workload** (three `idem-origin`
//! replicas behind a client that sends bounded concurrent retries of many keys, some
//! with `Prefer: wait`, to random replicas), a **nemesis** (at random: kill -9 and
//! restart a replica, restart Postgres with `-m immediate`, kill -9 a Redis master,
//! restart a replica with its clock skewed, freeze a replica with SIGSTOP past its
//! lease) and a **checker** that judges the history by counting rows: per key, the
//! executions in the `charges` table and the charge ids of every 2xx answer. A run
//! fails if any key was charged twice, answered with two different charges, or,
//! answered once, is not replayable at the end. The demo commits each charge with its
//! record (its charges are in the records' Postgres), so no crash or pause may leave a
//! second charge — not even a kill -9 right after a charge commits.
//!
//! `scripts/test` runs a short form (`IDEM_CHAOS_SECS`, 25 s per workload);
//! `scripts/chaos` runs longer; `IDEM_CHAOS_COMPLETION=separate` runs it with each
//! charge committed on its own, before its record (the campaign then fails). Every run prints its seed (`IDEM_CHAOS_SEED` replays
//! the nemesis' choices) and one summary line per workload.

use idem_tests::procs::{PgProc, RedisClusterProc};
use idem_tests::{charge_body, client, proof, report, OriginProcess};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const REPLICAS: usize = 3;
const LEASE: &str = "4s";
const LEASE_MS: u64 = 4_000;

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status();
}

/// A small deterministic generator (xorshift64*), so a seed replays a run's choices.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Workload {
    Postgres,
    TieredSync,
    TieredAsync,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Postgres => "postgres on-conflict",
            Workload::TieredSync => "tiered sync (6-node cluster + postgres)",
            Workload::TieredAsync => "tiered async (6-node cluster + postgres)",
        }
    }
}

/// One replica: its port (kept across restarts), its child, its clock skew.
struct Replica {
    port: u16,
    child: Option<Child>,
    skew: Option<String>,
}

struct Cluster {
    pg: PgProc,
    redis: Option<RedisClusterProc>,
    args: Vec<String>,
    replicas: Vec<Replica>,
    faketime: String,
}

impl Cluster {
    async fn start(workload: Workload) -> Cluster {
        let label = format!("chaos-{:?}", workload).to_lowercase();
        let pg = tokio::task::block_in_place(|| PgProc::start(&label));
        let redis = match workload {
            Workload::Postgres => None,
            _ => Some(tokio::task::block_in_place(|| {
                RedisClusterProc::start(&label)
            })),
        };
        let completion =
            std::env::var("IDEM_CHAOS_COMPLETION").unwrap_or_else(|_| "transactional".into());
        let mut args: Vec<String> = [
            "--database-url",
            &pg.url(),
            "--demo-ledger",
            "postgres",
            "--lease",
            LEASE,
            "--store-timeout",
            "1s",
            "--drain-timeout",
            "5s",
            // Each charge with its record; `IDEM_CHAOS_COMPLETION=separate` runs the
            // campaign against charges committed on their own, to see it fail.
            "--demo-completion",
            &completion,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        match workload {
            Workload::Postgres => args.extend(["--store", "postgres"].map(String::from)),
            Workload::TieredSync | Workload::TieredAsync => {
                let durability = if workload == Workload::TieredSync {
                    "sync"
                } else {
                    "async"
                };
                args.extend(
                    [
                        "--store",
                        "tiered",
                        "--durability",
                        durability,
                        "--redis-url",
                        &redis.as_ref().unwrap().urls(),
                    ]
                    .map(String::from),
                );
            }
        }
        let mut cluster = Cluster {
            pg,
            redis,
            args,
            replicas: (0..REPLICAS)
                .map(|_| Replica {
                    port: idem_tests::procs::free_port(),
                    child: None,
                    skew: None,
                })
                .collect(),
            faketime: idem_tests::faketime_lib(),
        };
        for i in 0..REPLICAS {
            cluster.start_replica(i).await;
        }
        cluster
    }

    fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.replicas[i].port)
    }

    /// Starts replica `i` (again), retrying while its stores are still coming back.
    async fn start_replica(&mut self, i: usize) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let r = &self.replicas[i];
        let mut env: Vec<(&str, &str)> = Vec::new();
        if let Some(skew) = &r.skew {
            env.extend([
                ("LD_PRELOAD", self.faketime.as_str()),
                ("FAKETIME", skew.as_str()),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ]);
        }
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            match OriginProcess::try_spawn_at(r.port, &args, &env).await {
                Ok((child, base)) => {
                    self.replicas[i].child = Some(child);
                    if let Some(skew) = &self.replicas[i].skew {
                        // The skew took: a preload that fails does so silently.
                        let secs: i64 = skew
                            .trim_end_matches('s')
                            .parse()
                            .expect("a skew in seconds");
                        idem_tests::assert_clock_ahead(&base, secs).await;
                    }
                    return;
                }
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "replica {i} does not come back: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// kill -9; returns the pid it killed.
    fn kill_replica(&mut self, i: usize) -> Option<u32> {
        let mut child = self.replicas[i].child.take()?;
        let pid = child.id();
        let _ = child.kill();
        let _ = child.wait();
        Some(pid)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..REPLICAS {
            self.kill_replica(i);
        }
    }
}

/// What the clients saw, per key: the charge ids of 2xx answers, and a tally.
#[derive(Default)]
struct History {
    answered: BTreeMap<String, BTreeSet<String>>,
    statuses: BTreeMap<u16, usize>,
    /// Each key's request body (its latency is the key's own).
    bodies: BTreeMap<String, String>,
}

async fn attempt(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    body: &str,
    wait: bool,
) -> Option<(u16, Option<String>, bool)> {
    // A client gives up on a replica that does not answer (frozen, say) and retries
    // elsewhere, as real ones do: that is what lets a takeover race a paused holder.
    let mut req = http
        .post(format!("{base}/v1/charges"))
        .timeout(Duration::from_secs(4))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if wait {
        req = req.header("prefer", "wait=3");
    }
    let res = req.send().await.ok()?;
    let status = res.status().as_u16();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    let id = if (200..300).contains(&status) {
        res.json::<serde_json::Value>()
            .await
            .ok()
            .and_then(|v| v["id"].as_str().map(str::to_owned))
    } else {
        None
    };
    Some((status, id, replayed))
}

/// One key's client: a few concurrent duplicates to random replicas, then retries
/// with backoff until it has an answer or the run ends.
async fn client_for(
    key: String,
    urls: Vec<String>,
    mut rng: Rng,
    until: Instant,
    history: Arc<Mutex<History>>,
) {
    let http = client();
    let latency = rng.between(0, 400);
    let body = charge_body(&format!("cus-{key}"), 100, latency);
    history
        .lock()
        .unwrap()
        .bodies
        .insert(key.clone(), body.clone());
    let mut backoff = 100u64;
    while Instant::now() < until {
        let burst = rng.between(1, 3);
        let mut tasks = Vec::new();
        for _ in 0..burst {
            let base = urls[rng.below(urls.len() as u64) as usize].clone();
            let wait = rng.below(3) == 0;
            let (http, key, body) = (http.clone(), key.clone(), body.clone());
            tasks.push(tokio::spawn(async move {
                attempt(&http, &base, &key, &body, wait).await
            }));
        }
        let mut done = false;
        for t in tasks {
            let Some((status, id, _)) = t.await.unwrap() else {
                continue;
            };
            let mut h = history.lock().unwrap();
            *h.statuses.entry(status).or_insert(0) += 1;
            if let Some(id) = id {
                h.answered.entry(key.clone()).or_default().insert(id);
                done = true;
            }
        }
        if done && rng.below(2) == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(backoff)).await;
        backoff = (backoff * 2).min(2_000);
    }
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    KillReplica,
    RestartPostgres,
    KillRedisMaster,
    SkewReplica,
    PauseReplica,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::KillReplica => "kill",
            Fault::RestartPostgres => "postgres",
            Fault::KillRedisMaster => "redis",
            Fault::SkewReplica => "skew",
            Fault::PauseReplica => "pause",
        }
    }
}

/// What the nemesis did: a line per fault, and the processes it killed with -9.
#[derive(Default)]
struct Faults {
    log: Vec<String>,
    /// Processes killed with -9, and when (ms since the epoch, this machine's clock —
    /// the clock of the Postgres that stamps the claims).
    killed: BTreeMap<i32, u64>,
}

impl Faults {
    fn killed(&mut self, pid: Option<u32>) {
        if let Some(pid) = pid {
            self.killed.insert(pid as i32, idem::now());
        }
    }
}

async fn nemesis(cluster: &mut Cluster, rng: &mut Rng, until: Instant, faults: &mut Faults) {
    let t0 = Instant::now();
    while Instant::now() + Duration::from_secs(3) < until {
        tokio::time::sleep(Duration::from_millis(rng.between(1_500, 4_000))).await;
        let mut choices = vec![
            Fault::KillReplica,
            Fault::RestartPostgres,
            Fault::SkewReplica,
            Fault::PauseReplica,
        ];
        if cluster.redis.is_some() {
            choices.push(Fault::KillRedisMaster);
        }
        // `IDEM_CHAOS_FAULTS=pause` (or `kill`, `postgres`, `skew`, `redis`, comma-
        // separated) narrows the nemesis to those faults.
        if let Ok(only) = std::env::var("IDEM_CHAOS_FAULTS") {
            let wanted: Vec<&str> = only.split(',').map(str::trim).collect();
            choices.retain(|f| wanted.contains(&f.name()));
            assert!(
                !choices.is_empty(),
                "IDEM_CHAOS_FAULTS={only} names no fault"
            );
        }
        let fault = choices[rng.below(choices.len() as u64) as usize];
        let at = t0.elapsed().as_secs_f32();
        match fault {
            Fault::KillReplica => {
                let i = rng.below(REPLICAS as u64) as usize;
                faults.killed(cluster.kill_replica(i));
                tokio::time::sleep(Duration::from_millis(rng.between(200, 1_500))).await;
                cluster.start_replica(i).await;
                faults
                    .log
                    .push(format!("{at:.1}s kill -9 replica {i}, restarted"));
            }
            Fault::RestartPostgres => {
                let down = rng.between(300, 2_500);
                tokio::task::block_in_place(|| cluster.pg.stop());
                tokio::time::sleep(Duration::from_millis(down)).await;
                tokio::task::block_in_place(|| cluster.pg.restart());
                faults.log.push(format!(
                    "{at:.1}s postgres stopped (immediate) for {down} ms"
                ));
            }
            Fault::KillRedisMaster => {
                let redis = cluster.redis.as_mut().unwrap();
                let victim = tokio::task::block_in_place(|| redis.a_master());
                redis.nodes[victim].kill();
                tokio::task::block_in_place(|| {
                    redis.wait_failover(victim, Duration::from_secs(20));
                    redis.nodes[victim].restart();
                    redis.wait_ok(Duration::from_secs(20));
                });
                faults.log.push(format!(
                    "{at:.1}s kill -9 redis master {victim}, failed over, restarted as a replica"
                ));
            }
            Fault::PauseReplica => {
                let i = rng.below(REPLICAS as u64) as usize;
                // Past the lease: its holders' claims are taken over while it sleeps.
                let paused = rng.between(LEASE_MS + 1_000, LEASE_MS + 5_000);
                if let Some(child) = &cluster.replicas[i].child {
                    signal(child.id(), "-STOP");
                    tokio::time::sleep(Duration::from_millis(paused)).await;
                    signal(child.id(), "-CONT");
                    faults.log.push(format!(
                        "{at:.1}s replica {i} frozen (SIGSTOP) for {paused} ms, thawed"
                    ));
                }
            }
            Fault::SkewReplica => {
                let i = rng.below(REPLICAS as u64) as usize;
                let secs = rng.between(5, 90) as i64 * if rng.below(2) == 0 { 1 } else { -1 };
                let skew = format!("{secs:+}s");
                faults.killed(cluster.kill_replica(i));
                cluster.replicas[i].skew = Some(skew.clone());
                cluster.start_replica(i).await;
                faults.log.push(format!(
                    "{at:.1}s replica {i} killed -9, restarted with its clock {skew}"
                ));
            }
        }
    }
}

struct Verdict {
    keys: usize,
    executions: i64,
    duplicated: usize,
    divergent: usize,
    unreplayable: usize,
    faults: usize,
    /// The run in one line, for the proof chapter.
    summary: String,
}

/// The nemesis' seed: `IDEM_CHAOS_SEED` (a positive integer) to replay a run, else
/// the clock's. A seed the generator can't use is refused, not replaced.
fn seed() -> u64 {
    match std::env::var("IDEM_CHAOS_SEED") {
        Err(_) => idem::now() | 1,
        Ok(s) => match s.trim().parse::<u64>() {
            Ok(0) => panic!("IDEM_CHAOS_SEED=0: xorshift never leaves 0; give a positive seed"),
            Ok(seed) => seed,
            Err(e) => panic!("IDEM_CHAOS_SEED={s:?} is not a seed ({e}): give a positive integer"),
        },
    }
}

/// Each key's charge ids in the demo's table.
async fn charge_ids(db: &tokio_postgres::Client) -> BTreeMap<String, BTreeSet<String>> {
    let mut ids: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in db
        .query("SELECT idempotency_key, id FROM charges", &[])
        .await
        .unwrap()
    {
        ids.entry(r.get(0)).or_default().insert(r.get(1));
    }
    ids
}

async fn run(workload: Workload) -> Verdict {
    let secs: u64 = std::env::var("IDEM_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(25);
    let seed = seed();
    // Said before anything can fail: a panic or the script's timeout must not lose it.
    eprintln!(
        "campaign {}: IDEM_CHAOS_SEED={seed} replays this run's choices",
        workload.name()
    );
    report(
        "campaign",
        &format!("{}: seed={seed} (starting)", workload.name()),
    );
    let mut rng = Rng(seed);
    let mut cluster = Cluster::start(workload).await;
    let urls: Vec<String> = (0..REPLICAS).map(|i| cluster.url(i)).collect();
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    let history = Arc::new(Mutex::new(History::default()));
    // Keys start over the run: about eight a second, each with its own client.
    let n_keys = (secs * 8) as usize;
    let keys: Vec<String> = (0..n_keys).map(|i| format!("chaos-{seed}-{i}")).collect();
    let mut clients = Vec::new();
    for key in &keys {
        let offset = Duration::from_millis(rng.below(secs * 1_000 * 4 / 5));
        let (key, urls, history) = (key.clone(), urls.clone(), history.clone());
        let key_rng = Rng(rng.next() | 1);
        clients.push(tokio::spawn(async move {
            tokio::time::sleep(offset).await;
            client_for(key, urls, key_rng, until, history).await;
        }));
    }
    let mut faults = Faults::default();
    nemesis(&mut cluster, &mut rng, until, &mut faults).await;
    for c in clients {
        c.await.unwrap();
    }
    // Heal: every replica up (clocks stay skewed), past a lease, then judge.
    for i in 0..REPLICAS {
        if cluster.replicas[i].child.is_none() {
            cluster.start_replica(i).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(5)).await;

    let db = idem_tests::connect(&cluster.pg.url()).await;
    let history = std::mem::take(&mut *history.lock().unwrap());
    // Every key, answered during the run or not, has a definite answer now, from any
    // replica: one answered replays that answer; one charged but never answered (its
    // client gave up, or its replica died after the charge) replays that charge; one
    // never charged runs now. A key still in progress, or answered with another
    // charge, is unreplayable.
    let charged = charge_ids(&db).await;
    let http = client();
    let mut unreplayable = Vec::new();
    let mut unanswered = 0;
    for (i, key) in keys.iter().enumerate() {
        let body = &history.bodies[key];
        let answered = history.answered.get(key);
        unanswered += usize::from(answered.is_none());
        let mut ok = false;
        for attempt_no in 0..5 {
            let base = &urls[(i + attempt_no) % REPLICAS];
            match attempt(&http, base, key, body, true).await {
                Some((s, Some(id), replayed)) if (200..300).contains(&s) => {
                    ok = match (answered, charged.get(key)) {
                        (Some(ids), _) => replayed && ids.contains(&id),
                        (None, Some(charges)) => replayed && charges.contains(&id),
                        (None, None) => true,
                    };
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        if !ok {
            unreplayable.push(key.clone());
        }
    }
    // Per key, its executions in order of fencing token: (token, process) — counted
    // after the check, so that an execution the check caused counts too.
    let rows = db
        .query(
            "SELECT idempotency_key, fencing_token, executed_by FROM charges ORDER BY idempotency_key, fencing_token",
            &[],
        )
        .await
        .unwrap();
    let mut executions: BTreeMap<String, Vec<(i64, i32)>> = BTreeMap::new();
    for r in rows {
        executions
            .entry(r.get(0))
            .or_default()
            .push((r.get(1), r.get(2)));
    }
    let total: i64 = executions.values().map(|e| e.len() as i64).sum();
    // A key charged twice is a failure. Each charge commits with its record, so not
    // even a process killed right after its charge committed (and before its answer
    // reached anyone) may leave a second one. Such keys are still told apart in the
    // report (`crash_window`: every charge before the last ran in a process the nemesis
    // killed with -9 after that charge's claim; tokens carry their claim's instant, at
    // least ms × 1024), as the gap this design closes.
    let mut duplicated = Vec::new();
    let mut crash_window = Vec::new();
    for (key, runs) in &executions {
        if runs.len() < 2 {
            continue;
        }
        let died_in_between = runs.windows(2).all(|w| {
            let ((t1, pid), (t2, _)) = (w[0], w[1]);
            let claimed_at = |t: i64| u64::try_from(t).unwrap_or(0) / 1024;
            faults
                .killed
                .get(&pid)
                .is_some_and(|&k| claimed_at(t1) <= k && k <= claimed_at(t2))
        });
        if died_in_between {
            crash_window.push(key.clone());
        }
        duplicated.push(key.clone());
    }
    let divergent: Vec<&String> = history
        .answered
        .iter()
        .filter(|(_, ids)| ids.len() > 1)
        .map(|(k, _)| k)
        .collect();
    let summary = format!(
        "{}: seed={seed} {secs}s keys={} (unanswered during the run {unanswered}) executions={total} duplicated={} divergent={} unreplayable={} faults={} crash_window={}",
        workload.name(),
        keys.len(),
        duplicated.len(),
        divergent.len(),
        unreplayable.len(),
        faults.log.len(),
        crash_window.len(),
    );
    let line = format!("{summary}; answers {:?}", history.statuses);
    let verdict = Verdict {
        keys: keys.len(),
        executions: total,
        duplicated: duplicated.len(),
        divergent: divergent.len(),
        unreplayable: unreplayable.len(),
        faults: faults.log.len(),
        summary,
    };
    report("campaign", &line);
    for l in &faults.log {
        report("campaign", &format!("  {}: nemesis: {l}", workload.name()));
    }
    if !duplicated.is_empty()
        || !divergent.is_empty()
        || !unreplayable.is_empty()
        || !crash_window.is_empty()
    {
        eprintln!("  duplicated: {duplicated:?}\n  divergent: {divergent:?}\n  unreplayable: {unreplayable:?}\n  crash window: {crash_window:?}");
    }
    verdict
}

/// Asserts the verdict, then records it as the proof chapter's row `id`.
fn assert_exactly_once(v: &Verdict, id: &str) {
    assert!(v.faults > 0, "the nemesis did something");
    assert!(v.executions > 0, "the workload ran");
    assert!(v.keys > 0, "keys were sent");
    assert_eq!(
        (v.duplicated, v.divergent, v.unreplayable),
        (0, 0, 0),
        "duplicated, divergent, unreplayable keys"
    );
    proof::record("campaign", id, &[&v.summary]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn campaign_postgres() {
    assert_exactly_once(&run(Workload::Postgres).await, "postgres");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn campaign_tiered_sync() {
    assert_exactly_once(&run(Workload::TieredSync).await, "tiered-sync");
}

/// Async mode's window (a claim lost with a Redis master before replication and
/// write-behind) can let a second attempt run; its charge then meets the first one's
/// completion in Postgres at commit and is rolled back, so it is held to the same
/// standard.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn campaign_tiered_async() {
    assert_exactly_once(&run(Workload::TieredAsync).await, "tiered-async");
}
