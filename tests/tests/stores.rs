//! The conformance suite (`idem/tests/conformance`) against every store on its real
//! backend: the same protocol, whatever executes it.

#[path = "../../idem/tests/conformance/mod.rs"]
mod conformance;

use conformance::*;

use idem::store::postgres::PgOptions;
use idem::store::tiered::outbox::OutboxOptions;
use idem::store::{Durability, PostgresStore, RedisStore, ReplayCache, Store, TieredStore};
use idem::store::{HolderWrite, StoreExt};
use idem_core::{Decision, RecordKey};
use idem_tests::{redis_cluster_urls, redis_url, TestDb};
use std::sync::Arc;

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
async fn postgres() {
    let db = TestDb::new("conf_pg").await;
    let store = pg(&db).await;
    conformance(&*store).await;
    purges_and_listing(&*store).await;
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
    let store = PostgresStore::connect(&db.url, options).await.unwrap();
    conformance(&store).await;
    purges_and_listing(&store).await;
}

#[tokio::test]
async fn redis_standalone() {
    let store = redis(&redis_url()).await;
    assert!(!store.is_cluster());
    conformance(&store).await;
    purges_and_listing(&store).await;
}

#[tokio::test]
async fn redis_cluster() {
    let store = redis(&redis_cluster_urls()).await;
    assert!(store.is_cluster());
    conformance(&store).await;
    purges_and_listing(&store).await;
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
    purges_and_listing(&store).await;
}

/// Apart from `tiered_async`, which counts the rows it wrote behind.
#[tokio::test]
async fn tiered_async_purges_and_listing() {
    let db = TestDb::new("conf_tasync_admin").await;
    let store = TieredStore::new(
        redis(&redis_url()).await,
        pg(&db).await,
        Durability::Async,
        OutboxOptions::default(),
    );
    purges_and_listing(&store).await;
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
    let cache = ReplayCache::new(pg(&db).await, 1 << 20);
    conformance(&cache).await;
    purges_and_listing(&cache).await;
}

#[tokio::test]
async fn replay_cache_over_redis_cluster() {
    let inner = Arc::new(redis(&redis_cluster_urls()).await);
    let cache = ReplayCache::new(inner, 1 << 20);
    conformance(&cache).await;
    purges_and_listing(&cache).await;
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
        cache.claim(&k, &FP, t + 4, &P).await.unwrap().replayed(),
        Some(&response("done"))
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
    serving(&cache).await;
    for k in &keys {
        assert_eq!(
            cache.claim(k, &FP, t + 2, &P).await.unwrap().replayed(),
            Some(&response(&big))
        );
    }
    db.exec("DELETE FROM idem_records").await;
    let mut from_memory = 0;
    for k in &keys {
        match cache.claim(k, &FP, t + 3, &P).await.unwrap() {
            Decision::Replay { response: r, .. } => {
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

/// Waits (at most 5 s) until `cache` hears its store's purge channel and serves.
async fn serving(cache: &ReplayCache) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !cache.is_serving() {
        assert!(
            std::time::Instant::now() < deadline,
            "the cache never heard its purge channel"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
