//! N keys × M concurrent retries through the real HTTP server on real Postgres: every
//! safe strategy charges exactly once per key; `naive` charges more (which is what
//! shows the test can fail).

use idem_tests::{
    charge_body, client, post_charge, proof, redis_cluster_urls, redis_url, report,
    unique_namespace, TestDb, TestOrigin,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tokio::sync::Barrier;

const KEYS: usize = 200;
const RETRIES: usize = 16;
/// Keys raced at once; all their retries are released together by a barrier.
const WAVE: usize = 25;
const LATENCY_MS: u64 = 150;

struct Race {
    charges: i64,
    double_charged_keys: i64,
    statuses: BTreeMap<u16, usize>,
    /// Distinct charge ids answered with 201 per key.
    ids: HashMap<String, Vec<String>>,
}

async fn race(db: &TestDb, origin: &TestOrigin, label: &str) -> Race {
    let http = client();
    let base = origin.url("");
    let mut statuses = BTreeMap::new();
    let mut ids: HashMap<String, Vec<String>> = HashMap::new();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("race-{label}-{i}")).collect();
    for wave in keys.chunks(WAVE) {
        let barrier = Arc::new(Barrier::new(wave.len() * RETRIES));
        let mut tasks = Vec::new();
        for key in wave {
            for _ in 0..RETRIES {
                let (http, base, key, barrier) =
                    (http.clone(), base.clone(), key.clone(), barrier.clone());
                tasks.push(tokio::spawn(async move {
                    let body = charge_body(&format!("cus-{key}"), 1000, LATENCY_MS);
                    barrier.wait().await;
                    let res = post_charge(&http, &base, Some(&format!("\"{key}\"")), &body).await;
                    let status = res.status().as_u16();
                    let json: serde_json::Value = res.json().await.unwrap_or_default();
                    (key, status, json["id"].as_str().map(str::to_owned))
                }));
            }
        }
        for t in tasks {
            let (key, status, id) = t.await.unwrap();
            *statuses.entry(status).or_insert(0) += 1;
            if let (201, Some(id)) = (status, id) {
                let seen = ids.entry(key).or_default();
                if !seen.contains(&id) {
                    seen.push(id);
                }
            }
        }
    }
    let charges = db.charges().await;
    let double_charged_keys =
        db.count("SELECT count(*) FROM (SELECT idempotency_key FROM charges GROUP BY 1 HAVING count(*) > 1) d").await;
    report(
        "race",
        &format!(
            "{label:>13}: {KEYS} keys x {RETRIES} retries -> {charges} charges, {double_charged_keys} keys charged more than once, answers {statuses:?}"
        ),
    );
    Race {
        charges,
        double_charged_keys,
        statuses,
        ids,
    }
}

/// Races an origin built from `args` (plus the test database) and checks that every
/// key was charged exactly once and every answer for a key carried that one charge.
async fn exactly_once(label: &str, args: &[&str]) -> (TestDb, TestOrigin) {
    let db = TestDb::new(&label.replace('-', "_")).await;
    // The claim race alone: a charge committed with its record would hide much of a
    // broken claim protocol.
    let mut all = vec![
        "--database-url",
        db.url.as_str(),
        "--pg-pool-size",
        "24",
        "--demo-completion",
        "separate",
    ];
    all.extend_from_slice(args);
    let origin = TestOrigin::start(&all).await;
    let r = race(&db, &origin, label).await;
    assert_eq!(
        r.charges, KEYS as i64,
        "{label}: exactly one charge per key"
    );
    assert_eq!(r.double_charged_keys, 0);
    assert_eq!(r.statuses.values().sum::<usize>(), KEYS * RETRIES);
    assert!(
        r.statuses.keys().all(|s| *s == 201 || *s == 409),
        "{label}: only 201 and 409 expected, got {:?}",
        r.statuses
    );
    // Every 201 for a key carried the same charge.
    assert_eq!(r.ids.len(), KEYS);
    assert!(
        r.ids.values().all(|ids| ids.len() == 1),
        "{label}: a key answered with two different charges"
    );

    // Every key retried once more, waiting if needed: all replay the one charge.
    let http = client();
    for (key, ids) in &r.ids {
        let body = charge_body(&format!("cus-{key}"), 1000, LATENCY_MS);
        let res = http
            .post(origin.url("/v1/charges"))
            .header("idempotency-key", format!("\"{key}\""))
            .header("content-type", "application/json")
            .header("prefer", "wait=10")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        assert_eq!(res.headers()["idempotent-replayed"], "true");
        let json: serde_json::Value = res.json().await.unwrap();
        assert_eq!(json["id"].as_str(), Some(ids[0].as_str()));
    }
    assert_eq!(db.charges().await, KEYS as i64);
    record_race(label, &r);
    (db, origin)
}

/// The proof chapter's row for this race, recorded once its assertions held.
fn record_race(label: &str, r: &Race) {
    let answers = proof::counts(r.statuses.iter().map(|(s, n)| (s, *n)));
    proof::record(
        "race",
        label,
        &[
            &r.charges.to_string(),
            &r.double_charged_keys.to_string(),
            &answers,
        ],
    );
}

async fn safe_strategy(strategy: &str) {
    exactly_once(
        strategy,
        &["--store", "postgres", "--pg-strategy", strategy],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_conflict_charges_exactly_once_per_key() {
    safe_strategy("on-conflict").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn advisory_lock_charges_exactly_once_per_key() {
    safe_strategy("advisory-lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_charges_exactly_once_per_key() {
    // The embedded default, raced the same way; its charges go to the memory ledger,
    // counted through the API.
    let origin = TestOrigin::start(&[]).await;
    let db = TestDb::new("memory_unused").await;
    let http = client();
    let base = origin.url("");
    let mut tasks = Vec::new();
    let barrier = Arc::new(Barrier::new(50 * RETRIES));
    for i in 0..50 {
        for _ in 0..RETRIES {
            let (http, base, barrier) = (http.clone(), base.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let body = charge_body(&format!("mem-{i}"), 1, 50);
                barrier.wait().await;
                post_charge(&http, &base, Some(&format!("mem-{i}")), &body)
                    .await
                    .status()
                    .as_u16()
            }));
        }
    }
    let mut statuses = BTreeMap::new();
    for t in tasks {
        *statuses.entry(t.await.unwrap()).or_insert(0usize) += 1;
    }
    let mut charges = 0;
    let mut doubled = 0;
    for i in 0..50 {
        let list: serde_json::Value = http
            .get(origin.url(&format!("/v1/charges?customer=mem-{i}")))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let n = list["data"].as_array().unwrap().len();
        assert_eq!(n, 1, "mem-{i}: exactly one charge");
        charges += n;
        doubled += usize::from(n > 1);
    }
    drop(db);
    report(
        "race",
        &format!(
            "{:>13}: 50 keys x {RETRIES} retries -> {charges} charges, answers {statuses:?}",
            "memory"
        ),
    );
    assert_eq!(charges, 50);
    assert_eq!(statuses.values().sum::<usize>(), 50 * RETRIES);
    assert!(
        statuses.keys().all(|s| *s == 201 || *s == 409),
        "memory: only 201 and 409 expected, got {statuses:?}"
    );
    let answers = proof::counts(statuses.iter().map(|(s, n)| (s, *n)));
    proof::record(
        "race",
        "memory",
        &[&charges.to_string(), &doubled.to_string(), &answers],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn naive_double_charges() {
    let db = TestDb::new("naive").await;
    let origin = TestOrigin::start(&[
        "--store",
        "postgres",
        "--database-url",
        &db.url,
        "--pg-strategy",
        "naive",
        "--pg-pool-size",
        "24",
        "--naive-window",
        "30ms",
        "--demo-completion",
        "separate",
    ])
    .await;
    let r = race(&db, &origin, "naive").await;
    assert!(
        r.charges > KEYS as i64,
        "naive SELECT-then-INSERT should double-charge, got {} charges",
        r.charges
    );
    assert!(r.double_charged_keys > 0);
    record_race("naive", &r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_standalone_charges_exactly_once_per_key() {
    let ns = unique_namespace("race");
    exactly_once(
        "redis",
        &[
            "--store",
            "redis",
            "--redis-url",
            &redis_url(),
            "--redis-namespace",
            &ns,
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_charges_exactly_once_per_key() {
    let ns = unique_namespace("race");
    let urls = redis_cluster_urls();
    exactly_once(
        "redis-cluster",
        &[
            "--store",
            "redis",
            "--redis-url",
            &urls,
            "--redis-namespace",
            &ns,
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tiered_sync_charges_exactly_once_per_key_and_postgres_holds_every_answer() {
    let ns = unique_namespace("race");
    let urls = redis_cluster_urls();
    let (db, _origin) = exactly_once(
        "tiered-sync",
        &[
            "--store",
            "tiered",
            "--redis-url",
            &urls,
            "--redis-namespace",
            &ns,
        ],
    )
    .await;
    assert_eq!(
        db.count("SELECT count(*) FROM idem_records WHERE state = 1")
            .await,
        KEYS as i64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tiered_async_charges_exactly_once_per_key_and_writes_every_answer_behind() {
    let ns = unique_namespace("race");
    let urls = redis_cluster_urls();
    let (db, origin) = exactly_once(
        "tiered-async",
        &[
            "--store",
            "tiered",
            "--durability",
            "async",
            "--redis-url",
            &urls,
            "--redis-namespace",
            &ns,
        ],
    )
    .await;
    origin.flush().await;
    assert_eq!(
        db.count("SELECT count(*) FROM idem_records WHERE state = 1")
            .await,
        KEYS as i64
    );
}
