//! One conformance suite, run against every store on its real backend: the same
//! protocol, whatever executes it.

use idem::store::postgres::PgOptions;
use idem::store::tiered::outbox::OutboxOptions;
use idem::store::{
    CasRecords, Durability, MemoryStore, PostgresStore, RedisStore, ReplayCache, Stamp, Store,
    Swap, TieredStore,
};
use idem::store::{HolderWrite, StoreExt};
use idem_core::{
    decide, Decision, Fingerprint, IdempotencyKey, Policy, Record, RecordKey, Refusal, Scope,
    StoredResponse,
};
use idem_tests::{redis_cluster_urls, redis_url, TestDb};
use std::sync::Arc;
use std::time::Duration;

const P: Policy = Policy {
    lease_ms: 1_000,
    ttl_ms: 60_000,
};
const FP: Fingerprint = Fingerprint([1; 32]);
const OTHER: Fingerprint = Fingerprint([2; 32]);

fn key(name: &str) -> RecordKey {
    RecordKey::new(
        &Scope::anonymous(),
        &IdempotencyKey::parse(name.as_bytes()).unwrap(),
    )
}

fn response(body: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: body.into(),
    }
}

/// Sleeps `ms` of real time: leases are judged on the store's clock, so the suite lets
/// that clock run rather than passing made-up instants.
async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

fn lease_until(d: &Decision) -> u64 {
    match d {
        Decision::InFlight { lease_until } => *lease_until,
        other => panic!("expected in flight, got {other:?}"),
    }
}

async fn conformance(store: &dyn Store) {
    let now = || store.now();
    let k = key(&format!("conf-{}-{}", store.name(), now()));

    let Decision::Execute(first) = store.claim(&k, &FP, now(), &P).await.unwrap() else {
        panic!("new key executes")
    };
    let Record::InProgress {
        lease_until: first_lease,
        ..
    } = first.record
    else {
        panic!("a claim is in progress")
    };
    assert_eq!(
        lease_until(&store.claim(&k, &FP, now(), &P).await.unwrap()),
        first_lease
    );
    assert_eq!(
        store.claim(&k, &OTHER, now(), &P).await.unwrap(),
        Decision::Mismatch
    );
    sleep_ms(500).await;
    assert_eq!(
        store
            .heartbeat(&k, &first.holder(), now(), &P)
            .await
            .unwrap(),
        HolderWrite::Written
    );
    sleep_ms(600).await; // past the first lease, within the renewed one
    let renewed = lease_until(&store.claim(&k, &FP, now(), &P).await.unwrap());
    assert!(
        renewed >= first_lease + 400,
        "the heartbeat moved the lease"
    );

    // The lease runs out: takeover, and the first holder is fenced out of every write.
    sleep_ms(renewed.saturating_sub(now()) + 50).await;
    let Decision::TakeOver(second) = store.claim(&k, &FP, now(), &P).await.unwrap() else {
        panic!("takeover")
    };
    assert!(second.token > first.token);
    let fenced = HolderWrite::Refused(Refusal::Fenced {
        current: second.token,
    });
    assert_eq!(
        store
            .complete(&k, &first.holder(), response("late"), now(), &P)
            .await
            .unwrap(),
        fenced
    );
    assert_eq!(
        store
            .heartbeat(&k, &first.holder(), now(), &P)
            .await
            .unwrap(),
        fenced
    );
    assert_eq!(
        store.release(&k, &first.holder(), now(), &P).await.unwrap(),
        fenced
    );

    assert_eq!(
        store
            .complete(&k, &second.holder(), response("won"), now(), &P)
            .await
            .unwrap(),
        HolderWrite::Written
    );
    assert_eq!(
        store.claim(&k, &FP, now(), &P).await.unwrap(),
        Decision::Replay(response("won"))
    );
    assert_eq!(
        store.claim(&k, &OTHER, now(), &P).await.unwrap(),
        Decision::Mismatch
    );
    // The same completion sent again (its acknowledgement was lost) landed already: ok.
    assert_eq!(
        store
            .complete(&k, &second.holder(), response("won"), now(), &P)
            .await
            .unwrap(),
        HolderWrite::Written
    );
    assert!(store
        .get(&k)
        .await
        .unwrap()
        .is_some_and(|r| r.is_completed() && r.token() == second.token));

    // A released key is free at once, and its next claim still outranks the releaser.
    let r = key(&format!("conf-release-{}-{}", store.name(), now()));
    let Decision::Execute(c) = store.claim(&r, &FP, now(), &P).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        store.release(&r, &c.holder(), now(), &P).await.unwrap(),
        HolderWrite::Written
    );
    sleep_ms(5).await;
    let Decision::Execute(again) = store.claim(&r, &OTHER, now(), &P).await.unwrap() else {
        panic!("released key is free")
    };
    assert!(again.token > c.token);
    assert_eq!(
        store
            .complete(&r, &c.holder(), response("stale"), now(), &P)
            .await
            .unwrap(),
        HolderWrite::Refused(Refusal::Fenced {
            current: again.token
        })
    );
    store.ping().await.unwrap();
}

/// The takeover's compare-and-swap, with the interleavings forced: between the read
/// that decided a takeover and the swap, the slow holder completes — or renews its
/// lease — under the same token. The swap must fail (it compares the whole record),
/// or the holder's answer is destroyed and the handler runs a second time.
async fn takeover_swap_sees_the_holder_finish(store: &(impl Store + CasRecords)) {
    let now = || store.now();
    for interleaved in ["complete", "heartbeat"] {
        let k = key(&format!("cas-{interleaved}-{}-{}", store.name(), now()));
        let Decision::Execute(slow) = store.claim(&k, &FP, now(), &P).await.unwrap() else {
            panic!("new key executes")
        };
        sleep_ms(P.lease_ms + 50).await;
        // The retry reads the record and the core decides: the lease has ended.
        let seen = store.get(&k).await.unwrap();
        let Decision::TakeOver(retry) = decide(seen.as_ref(), &FP, now(), &P) else {
            panic!("the lease ended: takeover")
        };
        // The slow holder, still alive, writes under its token in between.
        let holder = slow.holder();
        let wrote = match interleaved {
            "complete" => store.complete(&k, &holder, response("slow"), now(), &P),
            _ => store.heartbeat(&k, &holder, now(), &P),
        };
        assert_eq!(wrote.await.unwrap(), HolderWrite::Written);
        let expected = retry.replaces.as_ref().expect("takeover names the record");
        let (swap, _) = store
            .replace(&k, expected, &retry.record, Stamp::new(now(), &P))
            .await
            .unwrap();
        assert_eq!(
            swap,
            Swap::Changed,
            "{interleaved}: the swap must see the change"
        );
        // And the retry, asking again, replays the slow holder's answer or waits.
        let again = store.claim(&k, &FP, now(), &P).await.unwrap();
        match interleaved {
            "complete" => assert_eq!(again, Decision::Replay(response("slow"))),
            _ => assert!(matches!(again, Decision::InFlight { .. }), "{again:?}"),
        }
    }
}

async fn pg(db: &TestDb) -> Arc<PostgresStore> {
    Arc::new(
        PostgresStore::connect(&db.url, PgOptions::default())
            .await
            .unwrap(),
    )
}

async fn redis(urls: &str) -> RedisStore {
    idem_tests::redis_store(urls, "conf").await
}

#[tokio::test]
async fn memory() {
    conformance(&MemoryStore::new()).await;
}

#[tokio::test]
async fn postgres() {
    let db = TestDb::new("conf_pg").await;
    conformance(&*pg(&db).await).await;
}

#[tokio::test]
async fn postgres_takeover_swap() {
    let db = TestDb::new("cas_pg").await;
    takeover_swap_sees_the_holder_finish(&*pg(&db).await).await;
    idem_tests::proof::record(
        "faults",
        "swap-race",
        &["the swap fails and the holder's answer stays (completion and renewal, each interleaved)"],
    );
}

#[tokio::test]
async fn redis_takeover_swap() {
    takeover_swap_sees_the_holder_finish(&redis(&redis_url()).await).await;
    takeover_swap_sees_the_holder_finish(&redis(&redis_cluster_urls()).await).await;
    idem_tests::proof::record(
        "faults",
        "swap-race-redis",
        &["the swap fails and the holder's answer stays (completion and renewal, each interleaved)"],
    );
}

#[tokio::test]
async fn postgres_advisory_lock() {
    let db = TestDb::new("conf_adv").await;
    let options = PgOptions {
        strategy: idem::store::PgStrategy::AdvisoryLock,
        ..PgOptions::default()
    };
    conformance(&PostgresStore::connect(&db.url, options).await.unwrap()).await;
}

#[tokio::test]
async fn redis_standalone() {
    let store = redis(&redis_url()).await;
    assert!(!store.is_cluster());
    conformance(&store).await;
}

#[tokio::test]
async fn redis_cluster() {
    let store = redis(&redis_cluster_urls()).await;
    assert!(store.is_cluster());
    conformance(&store).await;
}

#[tokio::test]
async fn redis_cluster_detected_from_one_node() {
    let first = redis_cluster_urls().split(',').next().unwrap().to_owned();
    assert!(
        redis(&first).await.is_cluster(),
        "INFO cluster says it is one"
    );
}

#[tokio::test]
async fn tiered_sync() {
    let db = TestDb::new("conf_tsync").await;
    let store = TieredStore::new(
        redis(&redis_cluster_urls()).await,
        pg(&db).await,
        Durability::Sync,
        OutboxOptions::default(),
    );
    conformance(&store).await;
    // Postgres holds the authority's copy of both records.
    assert_eq!(db.count("SELECT count(*) FROM idem_records").await, 2);
}

#[tokio::test]
async fn tiered_async() {
    let db = TestDb::new("conf_tasync").await;
    let store = TieredStore::new(
        redis(&redis_url()).await,
        pg(&db).await,
        Durability::Async,
        OutboxOptions::default(),
    );
    conformance(&store).await;
    store.flush().await.unwrap();
    assert_eq!(
        db.count("SELECT count(*) FROM idem_records WHERE state = 1")
            .await,
        1,
        "the completion was written behind"
    );
}

#[tokio::test]
async fn replay_cache_over_postgres() {
    let db = TestDb::new("conf_cache_pg").await;
    conformance(&ReplayCache::new(pg(&db).await, 1 << 20)).await;
}

#[tokio::test]
async fn replay_cache_over_redis_cluster() {
    let inner = Arc::new(redis(&redis_cluster_urls()).await);
    conformance(&ReplayCache::new(inner, 1 << 20)).await;
}

/// What the cache answers without the store, and what it must not.
#[tokio::test]
async fn replay_cache_answers_completed_keys_until_they_expire() {
    let db = TestDb::new("cache_pg").await;
    let cache = ReplayCache::new(pg(&db).await, 1 << 20);
    let t = idem::now();
    let k = key(&format!("cache-{t}"));
    let Decision::Execute(c) = cache.claim(&k, &FP, t, &P).await.unwrap() else {
        panic!("new key executes")
    };
    // In progress: never cached. The row goes, and the store's answer follows at once.
    db.exec("DELETE FROM idem_records").await;
    assert!(matches!(
        cache.claim(&k, &FP, t + 1, &P).await.unwrap(),
        Decision::Execute(_)
    ));
    db.exec("DELETE FROM idem_records").await;
    let Decision::Execute(c2) = cache.claim(&k, &FP, t + 2, &P).await.unwrap() else {
        panic!()
    };
    assert!(c2.token > c.token);
    assert_eq!(
        cache
            .complete(&k, &c2.holder(), response("done"), t + 3, &P)
            .await
            .unwrap(),
        HolderWrite::Written
    );
    // Completed: answered from memory — with the row gone from Postgres, still replayed,
    // and a different request with the key still refused.
    db.exec("DELETE FROM idem_records").await;
    assert_eq!(
        cache.claim(&k, &FP, t + 4, &P).await.unwrap(),
        Decision::Replay(response("done"))
    );
    assert_eq!(
        cache.claim(&k, &OTHER, t + 4, &P).await.unwrap(),
        Decision::Mismatch
    );
    assert_eq!(db.count("SELECT count(*) FROM idem_records").await, 0);
    // Expired: the cache steps aside and the store decides (a new execution).
    assert!(matches!(
        cache.claim(&k, &FP, t + 3 + P.ttl_ms, &P).await.unwrap(),
        Decision::Execute(_)
    ));
    assert_eq!(db.count("SELECT count(*) FROM idem_records").await, 1);
}

/// A replay decided by the store fills the cache too (another process completed it),
/// and the cache holds no more than its byte budget.
#[tokio::test]
async fn replay_cache_learns_from_the_store_and_stays_within_its_budget() {
    let db = TestDb::new("cache_budget").await;
    let store = pg(&db).await;
    let t = idem::now();
    let big = "x".repeat(10_000);
    let keys: Vec<RecordKey> = (0..20).map(|i| key(&format!("budget-{t}-{i}"))).collect();
    for k in &keys {
        let Decision::Execute(c) = store.claim(k, &FP, t, &P).await.unwrap() else {
            panic!()
        };
        let holder = c.holder();
        let done = store.complete(k, &holder, response(&big), t + 1, &P);
        assert_eq!(done.await.unwrap(), HolderWrite::Written);
    }
    // 50 kB: room for four of the twenty 10 kB answers, not for all of them.
    let cache = ReplayCache::new(store, 50_000);
    for k in &keys {
        assert_eq!(
            cache.claim(k, &FP, t + 2, &P).await.unwrap(),
            Decision::Replay(response(&big))
        );
    }
    db.exec("DELETE FROM idem_records").await;
    let mut from_memory = 0;
    for k in &keys {
        match cache.claim(k, &FP, t + 3, &P).await.unwrap() {
            Decision::Replay(r) => {
                assert_eq!(r, response(&big));
                from_memory += 1;
            }
            Decision::Execute(_) => {}
            other => panic!("{other:?}"),
        }
    }
    assert!(
        (1..=4).contains(&from_memory),
        "{from_memory} of 20 answers of 10 kB were still cached in a 50 kB cache"
    );
}
