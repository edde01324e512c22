//! The lifecycle around the claim, under the faults a payment API meets: the store
//! down while handlers finish, a replica whose clock runs ahead, SIGTERM with a client
//! gone, a body that panics, a handler that never ends, a stale Redis record. Each
//! test counts charges and fails on the code before its fix (see the closing notes).

use idem_origin::idempotency::IdempotencyLayer;
use idem_origin::store::postgres::PgOptions;
use idem_origin::store::{PostgresStore, Store};
use idem_tests::procs::PgProc;
use idem_tests::{charge_body, client, post_charge, report, OriginProcess, TestDb, TestOrigin};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn tally(statuses: &[u16]) -> BTreeMap<u16, usize> {
    let mut t = BTreeMap::new();
    for s in statuses {
        *t.entry(*s).or_insert(0) += 1;
    }
    t
}

/// Defect 1: Postgres stopped (immediate) just as 40 handlers finish, their charges
/// kept outside Postgres, lease 8 s, outage 4 s; retries until well after the lease.
/// Before the fix the completions were abandoned after < 1 s and every retry after the
/// lease ran the handler again: 80 charges.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_outage_while_handlers_finish_charges_each_key_once() {
    let pg = PgProc::start("outage-finish");
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect(
            &pg.url(),
            PgOptions {
                timeout: Duration::from_secs(1),
                ..PgOptions::default()
            },
        )
        .await
        .unwrap(),
    );
    let ledger = Arc::new(idem_origin::charges::MemoryLedger::default());
    let layer = IdempotencyLayer::new(store.clone())
        .require_key_on(["/v1/charges"])
        .lease(Duration::from_secs(8));
    let router = idem_origin::app::router(layer, store.clone(), ledger.clone());
    let origin = TestOrigin::serve_router(router, store).await;
    let http = client();
    let keys: Vec<String> = (0..40).map(|i| format!("outage-{i}")).collect();
    let send = |key: String| {
        let (http, url) = (http.clone(), origin.url(""));
        tokio::spawn(async move {
            let body = charge_body(&format!("cus-{key}"), 100, 1_500);
            post_charge(&http, &url, Some(&key), &body)
                .await
                .status()
                .as_u16()
        })
    };
    let started = Instant::now();
    let first: Vec<_> = keys.iter().map(|k| send(k.clone())).collect();
    // Every claim is made; the handlers are sleeping. Postgres goes down before they finish.
    tokio::time::sleep(Duration::from_millis(800)).await;
    pg.stop();
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    pg.restart();
    let mut answers = Vec::new();
    for t in first {
        answers.push(t.await.unwrap());
    }
    // Retry every key until well past the lease (8 s from the last renewal).
    let mut retries = Vec::new();
    while started.elapsed() < Duration::from_secs(16) {
        let wave: Vec<_> = keys.iter().map(|k| send(k.clone())).collect();
        for t in wave {
            retries.push(t.await.unwrap());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let charges: usize = keys.iter().map(|k| ledger.count_for_key(k)).sum();
    let doubled = keys.iter().filter(|k| ledger.count_for_key(k) > 1).count();
    report(
        "lifecycle",
        &format!(
            "Postgres down 4 s while 40 handlers finish (lease 8 s): {charges} charges, {doubled} keys charged twice; first answers {:?}, retries {:?}",
            tally(&answers),
            tally(&retries)
        ),
    );
    assert_eq!(answers, vec![201; 40], "every first attempt answered");
    assert_eq!(charges, 40, "each key charged exactly once");
    // At the end every key is a replay of its answer.
    for k in &keys {
        let res = post_charge(
            &http,
            &origin.url(""),
            Some(k),
            &charge_body(&format!("cus-{k}"), 100, 1_500),
        )
        .await;
        assert_eq!(res.status(), 201);
        assert_eq!(
            res.headers()["idempotent-replayed"],
            "true",
            "{k} is replayable"
        );
    }
}

fn faketime_lib() -> String {
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ] {
        let lib = format!("{dir}/faketime/libfaketimeMT.so.1");
        if std::path::Path::new(&lib).exists() {
            return lib;
        }
    }
    panic!("libfaketime is missing: apt-get install faketime (scripts/test installs it)")
}

/// Defect 2: two replicas on one Postgres, one with its clock 60 s ahead. A long
/// handler runs on the normal one; its retries go to the skewed one, which must answer
/// 409 (never take over). Before the fix every key was charged twice.
#[tokio::test]
async fn a_replica_whose_clock_runs_ahead_never_takes_over_a_live_holder() {
    let db = TestDb::new("skew").await;
    let args = [
        "--store",
        "postgres",
        "--database-url",
        &db.url,
        "--lease",
        "3s",
    ];
    let (mut normal, normal_url) = OriginProcess::spawn(&args).await;
    let lib = faketime_lib();
    let (mut ahead, ahead_url) = OriginProcess::spawn_env(
        &args,
        &[
            ("LD_PRELOAD", &lib),
            ("FAKETIME", "+60s"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    )
    .await;
    let http = client();
    let keys: Vec<String> = (0..5).map(|i| format!("skew-{i}")).collect();
    let firsts: Vec<_> = keys
        .iter()
        .map(|k| {
            let (http, url, k) = (http.clone(), normal_url.clone(), k.clone());
            tokio::spawn(async move {
                let body = charge_body(&format!("cus-{k}"), 100, 4_000);
                post_charge(&http, &url, Some(&k), &body)
                    .await
                    .status()
                    .as_u16()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut retries = Vec::new();
    for _ in 0..3 {
        // Each wave: every key's retry at once, to the replica that is ahead.
        let wave: Vec<_> = keys
            .iter()
            .map(|k| {
                let (http, url, k) = (http.clone(), ahead_url.clone(), k.clone());
                tokio::spawn(async move {
                    let body = charge_body(&format!("cus-{k}"), 100, 4_000);
                    post_charge(&http, &url, Some(&k), &body)
                        .await
                        .status()
                        .as_u16()
                })
            })
            .collect();
        for t in wave {
            retries.push(t.await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    let mut firsts_done = Vec::new();
    for t in firsts {
        firsts_done.push(t.await.unwrap());
    }
    let charges = db.charges().await;
    report(
        "lifecycle",
        &format!(
            "replica clock +60 s, 5 keys with 4 s handlers on the other, 3 waves of retries to it: {charges} charges; retries {:?}",
            tally(&retries)
        ),
    );
    let _ = normal.kill();
    let _ = ahead.kill();
    assert_eq!(charges, 5, "one charge per key");
    assert!(retries.iter().all(|s| *s == 409), "{retries:?}");
    assert_eq!(firsts_done, vec![201; 5]);
}
