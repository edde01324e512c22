//! Crash-safe handlers, through real processes, counting rows: a replica aborted right
//! after its charge commits, and a replica frozen with SIGSTOP past its lease while its
//! charge is about to commit. Two replicas share one Postgres (and Redis, tiered); the
//! demo's charges are in that Postgres.
//!
//! With the transactional path (the charge and its record commit together) each key is
//! charged once. With `--demo-completion separate` — the charge commits on its own,
//! then idem stores the answer — the same faults charge twice: that run is kept as the
//! proof that these tests can fail.

use idem_tests::{charge_body, client, report, OriginProcess, TestDb};
use std::time::{Duration, Instant};

/// The lease every replica runs with: short, so the tests wait little past it.
const LEASE: &str = "2s";
const LEASE_MS: u64 = 2_000;
const KEYS: usize = 3;

#[derive(Clone, Copy, Debug)]
enum Store {
    Postgres,
    TieredSync,
    TieredAsync,
}

/// Arguments of both replicas: one Postgres schema (and one Redis namespace).
fn replica_args(store: Store, db: &TestDb, completion: &str, label: &str) -> Vec<String> {
    replica_args_with(store, db, completion, label, &[])
}

fn replica_args_with(
    store: Store,
    db: &TestDb,
    completion: &str,
    label: &str,
    extra: &[&str],
) -> Vec<String> {
    let mut args: Vec<String> = [
        "--database-url",
        &db.url,
        "--lease",
        LEASE,
        "--demo-faults",
        "--demo-completion",
        completion,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let tiered = |durability: &str| {
        vec![
            "--store".to_string(),
            "tiered".into(),
            "--redis-url".into(),
            idem_tests::redis_url(),
            "--redis-namespace".into(),
            idem_tests::unique_namespace(label),
            "--durability".into(),
            durability.into(),
        ]
    };
    args.extend(match store {
        Store::Postgres => vec!["--store".to_string(), "postgres".into()],
        Store::TieredSync => tiered("sync"),
        Store::TieredAsync => tiered("async"),
    });
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

async fn spawn(args: &[String]) -> (std::process::Child, String) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    OriginProcess::spawn(&args).await
}

/// One POST; `Err` when the connection broke (the process died).
async fn post(
    base: &str,
    key: &str,
    fault: Option<&str>,
    wait: bool,
) -> Result<(u16, bool, String), String> {
    post_slow(base, key, fault, wait, 0).await
}

/// [`post`] of a charge whose handler sleeps `latency_ms` first (before any
/// transaction; part of the request, so its retries sleep too).
async fn post_slow(
    base: &str,
    key: &str,
    fault: Option<&str>,
    wait: bool,
    latency_ms: u64,
) -> Result<(u16, bool, String), String> {
    let mut req = client()
        .post(format!("{base}/v1/charges"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(charge_body(&format!("cus-{key}"), 100, latency_ms));
    if let Some(fault) = fault {
        req = req.header("demo-fault", fault);
    }
    if wait {
        req = req.header("prefer", "wait=10");
    }
    let res = req.send().await.map_err(|e| e.to_string())?;
    let status = res.status().as_u16();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let body = res.text().await.map_err(|e| e.to_string())?;
    Ok((status, replayed, body))
}

/// Waits for `child` to exit, at most 20 s (a replica that should have aborted and
/// didn't fails the test instead of hanging it).
fn exited(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("replica A did not abort");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &std::process::Child, sig: &str) {
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success());
}

/// What a fault run came to.
struct Run {
    /// Rows in `charges`, per key.
    charges: Vec<i64>,
    /// The retries' answers on the second replica: (status, replayed).
    retries: Vec<(u16, bool)>,
    /// The first attempts' answers (`None`: the connection broke).
    firsts: Vec<Option<(u16, String)>>,
}

impl Run {
    fn total(&self) -> i64 {
        self.charges.iter().sum()
    }
}

/// Each key: replica A charges it and aborts right after the charge commits (a new A
/// per key); then its retry goes to replica B, which waits (`Prefer: wait`) if the
/// claim is still leased.
async fn abort_after_commit(store: Store, completion: &str, label: &str) -> Run {
    let db = TestDb::new(label).await;
    let args = replica_args(store, &db, completion, label);
    let (mut b, b_url) = spawn(&args).await;
    let mut run = Run {
        charges: vec![],
        retries: vec![],
        firsts: vec![],
    };
    for i in 0..KEYS {
        let key = format!("{label}-{i}");
        let (mut a, a_url) = spawn(&args).await;
        let first = post(&a_url, &key, Some("abort-after-charge"), false).await;
        let exit = tokio::task::block_in_place(|| exited(&mut a));
        assert!(!exit.success(), "replica A aborted: {exit}");
        run.firsts.push(first.ok().map(|(s, _, b)| (s, b)));
        let (status, replayed, _) = post(&b_url, &key, None, true).await.unwrap();
        run.retries.push((status, replayed));
        run.charges.push(db.charges_for(&key).await);
    }
    let _ = b.kill();
    let _ = b.wait();
    run
}

/// Every key at once on replica A, which stalls right before its charges commit; A is
/// frozen (SIGSTOP) in that stall, past its lease; the retries go to replica B, which
/// takes over and charges; then A is thawed (SIGCONT) and finishes.
async fn paused_past_the_lease(store: Store, completion: &str, label: &str) -> Run {
    let db = TestDb::new(label).await;
    let args = replica_args(store, &db, completion, label);
    let (mut a, a_url) = spawn(&args).await;
    let (mut b, b_url) = spawn(&args).await;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("{label}-{i}")).collect();
    let firsts: Vec<_> = keys
        .iter()
        .map(|key| {
            let (url, key) = (a_url.clone(), key.clone());
            tokio::spawn(
                async move { post(&url, &key, Some("stall-before-commit=1500"), false).await },
            )
        })
        .collect();
    // Every handler is in its stall (the charge not committed yet): freeze A.
    tokio::time::sleep(Duration::from_millis(600)).await;
    signal(&a, "-STOP");
    let frozen = Instant::now();
    // Past the lease on every clock, with room for the heartbeat that may have just
    // renewed it.
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 1_500)).await;
    let mut retries = Vec::new();
    for key in &keys {
        let (status, replayed, _) = post(&b_url, key, None, true).await.unwrap();
        retries.push((status, replayed));
    }
    signal(&a, "-CONT");
    let thawed_after = frozen.elapsed();
    let mut answers = Vec::new();
    for first in firsts {
        answers.push(first.await.unwrap().ok().map(|(s, _, b)| (s, b)));
    }
    let mut charges = Vec::new();
    for key in &keys {
        charges.push(db.charges_for(key).await);
    }
    let _ = a.kill();
    let _ = b.kill();
    let _ = a.wait();
    let _ = b.wait();
    assert!(thawed_after > Duration::from_millis(LEASE_MS));
    Run {
        charges,
        retries,
        firsts: answers,
    }
}

fn statuses(run: &Run) -> Vec<Option<u16>> {
    run.firsts
        .iter()
        .map(|f| f.as_ref().map(|(s, _)| *s))
        .collect()
}

async fn crash_after_commit_replays(store: Store, label: &str) {
    let run = abort_after_commit(store, "transactional", label).await;
    report(
        "crash_safe",
        &format!(
            "{store:?}, transactional, abort right after the charge commits, {KEYS} keys: {} charges; retries on B {:?}",
            run.total(),
            run.retries
        ),
    );
    assert_eq!(run.charges, vec![1; KEYS], "one charge per key");
    assert!(
        run.retries.iter().all(|r| *r == (201, true)),
        "every retry replays the committed charge: {:?}",
        run.retries
    );
}

async fn paused_holder_is_refused(store: Store, label: &str) {
    let run = paused_past_the_lease(store, "transactional", label).await;
    report(
        "crash_safe",
        &format!(
            "{store:?}, transactional, holder frozen past its lease before its commit, {KEYS} keys: {} charges; B {:?}; A's clients {:?}",
            run.total(),
            run.retries,
            statuses(&run)
        ),
    );
    assert_eq!(run.charges, vec![1; KEYS], "one charge per key");
    assert!(
        run.retries.iter().all(|r| *r == (201, false)),
        "B took over and charged: {:?}",
        run.retries
    );
    for first in &run.firsts {
        let (status, body) = first.as_ref().expect("A answered after the thaw");
        assert_eq!(*status, 409, "{body}");
        assert!(
            body.contains("https://github.com/idem-rs/idem/blob/main/docs/problems.md#fenced"),
            "{body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crash_after_commit_replays_the_charge() {
    crash_after_commit_replays(Store::Postgres, "cs_abort_pg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_sync_crash_after_commit_replays_the_charge() {
    crash_after_commit_replays(Store::TieredSync, "cs_abort_sync").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_async_crash_after_commit_replays_the_charge() {
    crash_after_commit_replays(Store::TieredAsync, "cs_abort_async").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_paused_holder_s_charge_is_rolled_back() {
    paused_holder_is_refused(Store::Postgres, "cs_pause_pg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_sync_paused_holder_s_charge_is_rolled_back() {
    paused_holder_is_refused(Store::TieredSync, "cs_pause_sync").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_async_paused_holder_s_charge_is_rolled_back() {
    paused_holder_is_refused(Store::TieredAsync, "cs_pause_async").await;
}

/// The proof that the two tests above can fail: the same faults without the
/// transactional path charge every key twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_transaction_the_same_faults_charge_twice() {
    let crash = abort_after_commit(Store::Postgres, "separate", "cs_abort_sep").await;
    let pause = paused_past_the_lease(Store::Postgres, "separate", "cs_pause_sep").await;
    report(
        "crash_safe",
        &format!(
            "Postgres, separate (no transaction), {KEYS} keys: abort after the charge → {} charges, retries {:?}; frozen past the lease → {} charges, A's clients {:?}",
            crash.total(),
            crash.retries,
            pause.total(),
            statuses(&pause)
        ),
    );
    assert_eq!(crash.charges, vec![2; KEYS]);
    assert_eq!(pause.charges, vec![2; KEYS]);
}

/// The downstream key a processor would get is the same for both executions of a key
/// (the takeover's retry of an external call is deduplicated downstream), and differs
/// between keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downstream_keys_survive_a_takeover() {
    let run_db_label = "cs_downstream";
    let db = TestDb::new(run_db_label).await;
    let args = replica_args(Store::Postgres, &db, "separate", run_db_label);
    let (mut b, b_url) = spawn(&args).await;
    for i in 0..2 {
        let key = format!("ds-{i}");
        let (mut a, a_url) = spawn(&args).await;
        let _ = post(&a_url, &key, Some("abort-after-charge"), false).await;
        tokio::task::block_in_place(|| exited(&mut a));
        let (status, _, _) = post(&b_url, &key, None, true).await.unwrap();
        assert_eq!(status, 201);
    }
    let _ = b.kill();
    let _ = b.wait();
    let rows = db
        .client()
        .await
        .query(
            "SELECT idempotency_key, count(*), count(DISTINCT processor_key), count(DISTINCT fencing_token), min(processor_key)
             FROM charges GROUP BY idempotency_key ORDER BY idempotency_key",
            &[],
        )
        .await
        .unwrap();
    let seen: Vec<(String, i64, i64, i64, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    report(
        "crash_safe",
        &format!(
            "downstream keys across a takeover: {:?}",
            seen.iter()
                .map(|s| (&s.0, s.1, s.2, s.3))
                .collect::<Vec<_>>()
        ),
    );
    assert_eq!(seen.len(), 2);
    for (key, executions, processor_keys, tokens, _) in &seen {
        assert_eq!(
            (*executions, *processor_keys, *tokens),
            (2, 1, 2),
            "{key}: two executions under two tokens, one processor key"
        );
    }
    assert_ne!(
        seen[0].4, seen[1].4,
        "different keys, different processor keys"
    );
}

/// A handler cut off by `--max-execution` right after its charge and answer
/// committed: the committed answer is the request's result — for its client and for
/// every retry — not a `502` "outcome unknown" stored over it.
async fn cut_off_after_commit(store: Store, label: &str) {
    let db = TestDb::new(label).await;
    let args = replica_args_with(
        store,
        &db,
        "transactional",
        label,
        &["--max-execution", "1s"],
    );
    let (mut a, a_url) = spawn(&args).await;
    let mut firsts = Vec::new();
    let mut retries = Vec::new();
    let mut charges = Vec::new();
    for i in 0..KEYS {
        let key = format!("{label}-{i}");
        let (status, _, _) = post(&a_url, &key, Some("stall-after-commit=3000"), false)
            .await
            .unwrap();
        firsts.push(status);
        // Past the lease, so a stale in-progress record would have been taken over.
        tokio::time::sleep(Duration::from_millis(LEASE_MS + 500)).await;
        let (status, replayed, _) = post(&a_url, &key, None, true).await.unwrap();
        retries.push((status, replayed));
        charges.push(db.charges_for(&key).await);
    }
    let _ = a.kill();
    let _ = a.wait();
    report(
        "crash_safe",
        &format!("{store:?}, transactional, handler cut off by --max-execution right after its commit, {KEYS} keys: {} charges; first answers {firsts:?}; retries {retries:?}", charges.iter().sum::<i64>()),
    );
    assert_eq!(charges, vec![1; KEYS]);
    assert_eq!(firsts, vec![201; KEYS], "the committed answer, not a 502");
    assert!(retries.iter().all(|r| *r == (201, true)), "{retries:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_cut_off_after_commit_answers_the_committed_charge() {
    cut_off_after_commit(Store::Postgres, "cs_cut_pg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_sync_cut_off_after_commit_answers_the_committed_charge() {
    cut_off_after_commit(Store::TieredSync, "cs_cut_sync").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_async_cut_off_after_commit_answers_the_committed_charge() {
    cut_off_after_commit(Store::TieredAsync, "cs_cut_async").await;
}

/// Tiered async, a holder frozen for longer than the TTL — inside its transaction, or
/// before it opened one: the retry takes over and charges, its record expires and is
/// swept; when the holder thaws, it finds no claim of its own (nor may it write its
/// claim back behind) and nothing it did is kept.
async fn paused_past_the_ttl(label: &str, in_transaction: bool) {
    let db = TestDb::new(label).await;
    let args = replica_args_with(
        Store::TieredAsync,
        &db,
        "transactional",
        label,
        &["--ttl", "3s", "--sweep-interval", "1s"],
    );
    let (mut a, a_url) = spawn(&args).await;
    let (mut b, b_url) = spawn(&args).await;
    let key = format!("{label}-0");
    // Frozen 600 ms in: in the stall right before its commit, or in its handler's
    // latency before it opened its transaction.
    let (fault, latency) = match in_transaction {
        true => (Some("stall-before-commit=1500"), 0),
        false => (None, 1_500),
    };
    let first = tokio::spawn({
        let (url, key) = (a_url.clone(), key.clone());
        async move { post_slow(&url, &key, fault, false, latency).await }
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    signal(&a, "-STOP");
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 1_500)).await;
    let (status, _, _) = post_slow(&b_url, &key, None, true, latency).await.unwrap();
    // B's completion expires (TTL 3 s) and is swept (every second) from Postgres.
    let swept = Instant::now();
    while db.count("SELECT count(*) FROM idem_records").await > 0 {
        assert!(swept.elapsed() < Duration::from_secs(15), "the sweeper ran");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    signal(&a, "-CONT");
    let answer = first.await.unwrap();
    let charges = db.charges_for(&key).await;
    let _ = a.kill();
    let _ = b.kill();
    let _ = a.wait();
    let _ = b.wait();
    report(
        "crash_safe",
        &format!("TieredAsync, transactional, holder frozen past the TTL {} (its takeover's record swept): {charges} charges; B {status}; A's client {:?}", if in_transaction { "inside its transaction" } else { "before its transaction" }, answer.as_ref().map(|a| a.0)),
    );
    assert_eq!(status, 201);
    assert_eq!(charges, 1, "one charge");
    assert_eq!(answer.map(|a| a.0), Ok(409));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_async_holder_paused_past_the_ttl_in_its_transaction_is_refused() {
    paused_past_the_ttl("cs_ttl_tx", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_async_holder_paused_past_the_ttl_before_its_transaction_is_refused() {
    paused_past_the_ttl("cs_ttl_pre", false).await;
}
