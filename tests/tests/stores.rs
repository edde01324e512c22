//! One conformance suite, run against every store on its real backend: the same
//! protocol, whatever executes it.

use idem_core::{
    Decision, Fingerprint, IdempotencyKey, Policy, RecordKey, Refusal, Scope, StoredResponse,
};
use idem_origin::store::postgres::PgOptions;
use idem_origin::store::tiered::outbox::OutboxOptions;
use idem_origin::store::{
    Durability, MemoryStore, PostgresStore, RedisOptions, RedisStore, ReplayCache, Store,
    TieredStore,
};
use idem_tests::{redis_cluster_urls, redis_url, unique_namespace, TestDb};
use std::sync::Arc;

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

async fn conformance(store: &dyn Store) {
    // Tests use real time as the base: Redis expires keys by its own clock.
    let t = idem_origin::now();
    let k = key(&format!("conf-{}-{t}", store.name()));

    let Decision::Execute(first) = store.claim(&k, &FP, t, &P).await.unwrap() else {
        panic!("new key executes")
    };
    assert_eq!(
        store.claim(&k, &FP, t + 10, &P).await.unwrap(),
        Decision::InFlight {
            lease_until: t + 1_000
        }
    );
    assert_eq!(
        store.claim(&k, &OTHER, t + 10, &P).await.unwrap(),
        Decision::Mismatch
    );
    assert_eq!(
        store
            .heartbeat(&k, &first.holder(), t + 500, &P)
            .await
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        store.claim(&k, &FP, t + 1_200, &P).await.unwrap(),
        Decision::InFlight {
            lease_until: t + 1_500
        }
    );

    // The lease runs out: takeover, and the first holder is fenced out of every write.
    let Decision::TakeOver(second) = store.claim(&k, &FP, t + 1_600, &P).await.unwrap() else {
        panic!("takeover")
    };
    assert!(second.token > first.token);
    let fenced = Err(Refusal::Fenced {
        current: second.token,
    });
    assert_eq!(
        store
            .complete(&k, &first.holder(), response("late"), t + 1_700, &P)
            .await
            .unwrap(),
        fenced
    );
    assert_eq!(
        store
            .heartbeat(&k, &first.holder(), t + 1_700, &P)
            .await
            .unwrap(),
        fenced
    );
    assert_eq!(
        store.release(&k, &first.holder(), t + 1_700).await.unwrap(),
        fenced
    );

    assert_eq!(
        store
            .complete(&k, &second.holder(), response("won"), t + 1_800, &P)
            .await
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        store.claim(&k, &FP, t + 1_900, &P).await.unwrap(),
        Decision::Replay(response("won"))
    );
    assert_eq!(
        store.claim(&k, &OTHER, t + 1_900, &P).await.unwrap(),
        Decision::Mismatch
    );
    assert_eq!(
        store
            .complete(&k, &second.holder(), response("again"), t + 2_000, &P)
            .await
            .unwrap(),
        Err(Refusal::AlreadyCompleted)
    );
    assert!(store
        .get(&k)
        .await
        .unwrap()
        .is_some_and(|r| r.is_completed() && r.token() == second.token));

    // A released key is free at once, and its next claim still outranks the releaser.
    let r = key(&format!("conf-release-{}-{t}", store.name()));
    let Decision::Execute(c) = store.claim(&r, &FP, t, &P).await.unwrap() else {
        panic!()
    };
    assert_eq!(store.release(&r, &c.holder(), t + 5).await.unwrap(), Ok(()));
    let Decision::Execute(again) = store.claim(&r, &OTHER, t + 5, &P).await.unwrap() else {
        panic!("released key is free")
    };
    assert!(again.token > c.token);
    assert_eq!(
        store
            .complete(&r, &c.holder(), response("stale"), t + 6, &P)
            .await
            .unwrap(),
        Err(Refusal::Fenced {
            current: again.token
        })
    );
    store.ping().await.unwrap();
}

async fn pg(db: &TestDb) -> Arc<PostgresStore> {
    Arc::new(
        PostgresStore::connect(&db.url, PgOptions::default())
            .await
            .unwrap(),
    )
}

async fn redis(urls: &str) -> RedisStore {
    let options = RedisOptions {
        namespace: unique_namespace("conf"),
        ..RedisOptions::default()
    };
    RedisStore::connect(urls, options).await.unwrap()
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
async fn postgres_advisory_lock() {
    let db = TestDb::new("conf_adv").await;
    let options = PgOptions {
        strategy: idem_origin::store::PgStrategy::AdvisoryLock,
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
    let t = idem_origin::now();
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
        Ok(())
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
    let t = idem_origin::now();
    let big = "x".repeat(10_000);
    let keys: Vec<RecordKey> = (0..20).map(|i| key(&format!("budget-{t}-{i}"))).collect();
    for k in &keys {
        let Decision::Execute(c) = store.claim(k, &FP, t, &P).await.unwrap() else {
            panic!()
        };
        let holder = c.holder();
        let done = store.complete(k, &holder, response(&big), t + 1, &P);
        assert_eq!(done.await.unwrap(), Ok(()));
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
