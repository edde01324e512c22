//! The conformance suite (`idem-testkit`) against every store on its real backend: the
//! same protocol, whatever executes it.

use idem_testkit::conformance::*;

use idem::OutboxOptions;
use idem::{Durability, PostgresStore, RedisStore, ReplayCache, Store, TieredStore};
use idem::{HolderWrite, StoreErrorKind, StoreExt};
use idem::{IdColumn, PgOptions};
use idem_core::{Decision, Record, RecordKey};
use idem_tests::{redis_cluster_urls, redis_url, TestDb};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// A tiered async store on `db` whose Redis records live under a namespace of its own,
/// returned with it (for the tests that write Redis' keys directly).
async fn tiered_async_in(db: &TestDb, label: &str) -> (TieredStore, String) {
    let namespace = idem_tests::unique_namespace(label);
    let options = idem::RedisOptions::default().namespace(namespace.clone());
    let redis = RedisStore::connect(&redis_url(), options).await.unwrap();
    let store = TieredStore::new(
        redis,
        pg(db).await,
        Durability::Async,
        OutboxOptions::default(),
    );
    (store, namespace)
}

/// Waits, 10 s at most, until the count `sql` is above zero (what the outbox writes
/// behind, a session waiting on a lock); fails with `what` otherwise.
async fn until_counted(db: &TestDb, sql: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.count(sql).await == 0 {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `k` claimed on a tiered async `store` over `db`, once the claim is written behind.
async fn claimed_and_written_behind(
    db: &TestDb,
    store: &TieredStore,
    k: &RecordKey,
) -> idem_core::Claim {
    let Decision::Execute(claim) = store.claim(k, &FP, store.now(), &P).await.unwrap() else {
        panic!("a new key executes")
    };
    until_counted(
        db,
        "SELECT count(*) FROM idem_records",
        "the claim was never written behind",
    )
    .await;
    claim
}

/// A session holding Postgres' writes to the records (reads pass) until it commits.
async fn writes_held(db: &TestDb) -> tokio_postgres::Client {
    let locker = db.client().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE idem_records IN EXCLUSIVE MODE")
        .await
        .unwrap();
    locker
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
    let options = PgOptions::default().strategy(idem::PgStrategy::AdvisoryLock);
    let store = PostgresStore::connect(&db.url, options).await.unwrap();
    conformance(&store).await;
    purges_and_listing(&store).await;
}

/// A new table holds each key as its 32 bytes.
#[tokio::test]
async fn postgres_creates_tables_with_binary_keys() {
    let db = TestDb::new("pg_bytes").await;
    let store = pg(&db).await;
    assert_eq!(store.id_column(), IdColumn::Bytes);
    let k = key("bytes-1");
    assert!(matches!(
        store.claim(&k, &FP, store.now(), &P).await.unwrap(),
        Decision::Execute(_)
    ));
    let stored = db
        .client()
        .await
        .query_one(
            "SELECT encode(id, 'hex'), octet_length(id) FROM idem_records",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(stored.get::<_, String>(0), k.as_str());
    assert_eq!(stored.get::<_, i32>(1), 32);
}

/// A table idem 0.1 created keeps its text keys: idem serves it as it is, with either
/// claim strategy and behind Redis. `idem-origin convert-keys` refuses while replicas
/// are connected; forced, it converts, and the same records are served from binary
/// keys, while a replica still using text keys fails closed.
#[tokio::test]
async fn postgres_serves_tables_of_idem_0_1_and_after_their_conversion() {
    let db = TestDb::new("pg_text_ids").await;
    // The schema exactly as idem 0.1 left it: its two migrations, applied.
    db.exec(include_str!(
        "../../idem/src/store/postgres/0001_records.sql"
    ))
    .await;
    db.exec(
        &include_str!("../../idem/src/store/postgres/0002_in_progress.sql")
            .replace(" CONCURRENTLY", ""),
    )
    .await;
    db.exec(
        "CREATE TABLE idem_schema_migrations (
            version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO idem_schema_migrations (version) VALUES (1), (2)",
    )
    .await;
    let text = pg(&db).await;
    assert_eq!(
        text.id_column(),
        IdColumn::Text,
        "not converted behind the operator's back"
    );
    conformance(&*text).await;
    purges_and_listing(&*text).await;
    let advisory = PostgresStore::connect(
        &db.url,
        PgOptions::default().strategy(idem::PgStrategy::AdvisoryLock),
    )
    .await
    .unwrap();
    conformance(&advisory).await;
    let behind = TieredStore::new(
        redis(&redis_url()).await,
        text.clone(),
        Durability::Async,
        OutboxOptions::default(),
    );
    conformance(&behind).await;
    behind.flush().await.unwrap();

    // An answer stored under a text key, then the conversion docs/stores.md gives.
    let k = key("text-then-bytes");
    let Decision::Execute(claim) = text.claim(&k, &FP, text.now(), &P).await.unwrap() else {
        panic!("a new key executes")
    };
    let done = text
        .write_as_holder(
            &k,
            &claim.holder(),
            &idem_core::Transition::Complete(response("{\"n\":1}")),
            text.now(),
            &P,
        )
        .await
        .unwrap();
    assert!(matches!(done, HolderWrite::Written), "{done:?}");
    let before = text.get(&k).await.unwrap().expect("stored");
    let rows = db.count("SELECT count(*) FROM idem_records").await;
    // Refused while replicas are connected: this one's sessions used the table.
    let convert = |force: bool| {
        let mut cmd = std::process::Command::new(idem_tests::OriginProcess::binary());
        cmd.args(["convert-keys", "--database-url", &db.url]);
        if force {
            cmd.arg("--force");
        }
        let out = cmd.output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let (code, _, stderr) = convert(false);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("stop every replica first"), "{stderr}");
    assert_eq!(text.id_column(), IdColumn::Text);
    assert!(text.get(&k).await.unwrap().is_some(), "nothing changed");
    let (code, stdout, stderr) = convert(true);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(&format!(": {rows} records now keyed by 32 bytes")),
        "{stdout}"
    );
    let (code, stdout, _) = convert(false);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("already holds binary keys"), "{stdout}");
    let bytes = pg(&db).await;
    assert_eq!(bytes.id_column(), IdColumn::Bytes);
    assert_eq!(db.count("SELECT count(*) FROM idem_records").await, rows);
    assert_eq!(
        bytes.get(&k).await.unwrap(),
        Some(before),
        "the same record"
    );
    assert!(matches!(
        bytes.claim(&k, &FP, bytes.now(), &P).await.unwrap(),
        Decision::Replay { .. }
    ));
    // The replica that still speaks text keys can neither claim nor read: it answers
    // 503s until it restarts, and never runs a handler unguarded.
    let fresh = key("after-conversion");
    assert!(text.claim(&fresh, &FP, text.now(), &P).await.is_err());
    assert!(text.get(&k).await.is_err());
    conformance(&*bytes).await;
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
    // Postgres holds the authority's copy of the suite's three records.
    assert_eq!(db.count("SELECT count(*) FROM idem_records").await, 3);
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
    // Every store runs the same suite; this one, the last to learn of a release
    // (written behind), stands for them in the Proof table.
    idem_tests::proof::record(
        "faults",
        "late-heartbeat",
        &["Refused(Missing), the corrected request runs (12 of 12 stores)"],
    );
}

/// The cold path's reads go to Postgres many at a time (`batched_reads`): 120 claims at
/// once on a replica whose Redis knows none of the keys (as after a flush) each get
/// their own key's answer from Postgres, and the keys Postgres never saw execute. A
/// record that does not decode fails its own key's claim, not the others read with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_async_cold_reads_answer_each_claim_with_its_own_record() {
    let db = TestDb::new("conf_tasync_cold").await;
    let pg = pg(&db).await;
    let writer = TieredStore::new(
        redis(&redis_url()).await,
        pg.clone(),
        Durability::Async,
        OutboxOptions::default(),
    );
    let keys: Vec<RecordKey> = (0..120).map(|n| key(&format!("cold-{n}"))).collect();
    for (n, k) in keys.iter().enumerate().take(80) {
        let Decision::Execute(claim) = writer.claim(k, &FP, writer.now(), &P).await.unwrap() else {
            panic!("a new key executes")
        };
        let (holder, answer) = (claim.holder(), response(&format!("answer-{n}")));
        let written = writer.complete(k, &holder, answer, writer.now(), &P);
        assert_eq!(written.await.unwrap(), HolderWrite::Written);
    }
    writer.flush().await.unwrap();
    let corrupted = db
        .client()
        .await
        .execute(
            "UPDATE idem_records SET record = '\\x00'::bytea WHERE id = decode($1, 'hex')",
            &[&keys[0].as_str()],
        )
        .await
        .unwrap();
    assert_eq!(corrupted, 1);
    let reader = Arc::new(TieredStore::new(
        redis(&redis_url()).await,
        pg,
        Durability::Async,
        OutboxOptions::default(),
    ));
    let claims: Vec<_> = keys
        .into_iter()
        .enumerate()
        .map(|(n, k)| {
            let reader = reader.clone();
            tokio::spawn(async move { (n, reader.claim(&k, &FP, reader.now(), &P).await) })
        })
        .collect();
    let (mut replayed, mut executed) = (0, 0);
    for claim in claims {
        match claim.await.unwrap() {
            (0, Err(e)) if e.kind() == StoreErrorKind::Corrupt => {}
            (n, Ok(Decision::Replay { response, .. })) if n < 80 => {
                assert_eq!(response.body, format!("answer-{n}").into_bytes(), "key {n}");
                replayed += 1;
            }
            (n, Ok(Decision::Execute(_))) if n >= 80 => executed += 1,
            (n, other) => panic!("key {n}: {other:?}"),
        }
    }
    assert_eq!((replayed, executed), (79, 40));
    // And in fewer statements than claims.
    let sent = reader.cold_read_statements().unwrap();
    assert!(
        (1..60).contains(&sent),
        "{sent} statements for 120 cold reads"
    );
    println!("{sent} statements for 120 cold reads");
}

/// A cold read waits at most the store's timeout, however long the reads queued before
/// it take: with the table locked, a claim made while another's read is stuck fails
/// within its own timeout (before the bound, it waited for the stuck read first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_async_cold_reads_wait_at_most_the_store_timeout() {
    const TIMEOUT: Duration = Duration::from_secs(2);
    let db = TestDb::new("conf_tasync_cold_wait").await;
    let pg = PostgresStore::connect(&db.url, PgOptions::default().timeout(TIMEOUT))
        .await
        .unwrap();
    let store = Arc::new(TieredStore::new(
        redis(&redis_url()).await,
        Arc::new(pg),
        Durability::Async,
        OutboxOptions::default(),
    ));
    let mut locker = db.client().await;
    let lock = locker.transaction().await.unwrap();
    lock.execute("LOCK TABLE idem_records IN ACCESS EXCLUSIVE MODE", &[])
        .await
        .unwrap();
    let claim = |name: &'static str| {
        let store = store.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let outcome = store.claim(&key(name), &FP, store.now(), &P).await;
            (outcome, started.elapsed())
        })
    };
    let first = claim("cold-wait-first");
    tokio::time::sleep(TIMEOUT / 2).await;
    let (second, waited) = claim("cold-wait-second").await.unwrap();
    assert!(
        matches!(&second, Err(e) if e.kind() == StoreErrorKind::Unavailable),
        "{second:?}"
    );
    assert!(
        waited < TIMEOUT + TIMEOUT / 4,
        "the second claim waited {waited:?} with a {TIMEOUT:?} timeout"
    );
    let (first, _) = first.await.unwrap();
    assert!(
        matches!(&first, Err(e) if e.kind() == StoreErrorKind::Unavailable),
        "{first:?}"
    );
    lock.rollback().await.unwrap();
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

/// idem 0.1 kept each Redis record as a hash (`t`, `s`, `r`); today's store keeps the
/// record itself as a string, which takes ~40 % less memory per record (the bench's
/// `--scale` table). Records of the old layout, as a deployment upgraded in place still
/// holds, are replayed, listed, completed by their holder and purged; a write turns one
/// into today's layout.
#[tokio::test]
async fn redis_serves_and_rewrites_records_of_the_hash_layout() {
    use idem::RedisOptions;
    use idem_core::{Holder, Record};
    for urls in [redis_url(), redis_cluster_urls()] {
        let namespace = idem_tests::unique_namespace("hash-layout");
        let options = RedisOptions::default().namespace(namespace.clone());
        let store = RedisStore::connect(&urls, options).await.unwrap();
        let mut raw = Raw::connect(&urls, store.is_cluster()).await;
        let name = |k: &RecordKey| format!("{namespace}:{{{}}}", k.as_str());
        let now = store.now();
        let tag = format!("{}-{now}", store.name());

        // A completed record: read and replayed as it is.
        let done_key = key(&format!("hash-done-{tag}"));
        let done = Record::Completed {
            fingerprint: FP,
            token: now * idem_core::TOKENS_PER_MS,
            response: response("old layout"),
            expires_at: now + 60_000,
        };
        raw.put_hash(&name(&done_key), &done).await;
        assert_eq!(store.get(&done_key).await.unwrap(), Some(done.clone()));
        match store.claim(&done_key, &FP, store.now(), &P).await.unwrap() {
            Decision::Replay { response: r, .. } => assert_eq!(r.body, b"old layout"),
            other => panic!("a completed hash record replays, got {other:?}"),
        }
        assert_eq!(
            raw.kind(&name(&done_key)).await,
            "hash",
            "reads leave it as it is"
        );

        // An in-progress one, claimed 10 s ago under a live lease: listed, then
        // completed by its holder, which rewrites it as a string.
        let running_key = key(&format!("hash-running-{tag}"));
        let token = (now - 10_000) * idem_core::TOKENS_PER_MS;
        let running = Record::InProgress {
            fingerprint: FP,
            token,
            lease_until: now + 30_000,
            expires_at: now + 60_000,
        };
        raw.put_hash(&name(&running_key), &running).await;
        // Every page: a Redis holding other keys may list ours on any of them.
        let mut listed = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = store
                .in_progress(now - 5_000, cursor.as_deref(), 100)
                .await
                .unwrap();
            listed.extend(page.records); // the namespace is this test's own
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        assert_eq!(
            listed,
            vec![(running_key.clone(), running.clone())],
            "the listing reads the old layout"
        );
        let holder = Holder {
            fingerprint: FP,
            token,
        };
        assert_eq!(
            store
                .complete(&running_key, &holder, response("finished"), store.now(), &P)
                .await
                .unwrap(),
            HolderWrite::Written
        );
        assert_eq!(raw.kind(&name(&running_key)).await, "string");
        assert!(store
            .get(&running_key)
            .await
            .unwrap()
            .unwrap()
            .is_completed());
        // A stale holder of the same key is refused, in the new layout as in the old.
        let stale = Holder {
            fingerprint: FP,
            token: token - 1,
        };
        assert_ne!(
            store
                .complete(&running_key, &stale, response("stale"), store.now(), &P)
                .await
                .unwrap(),
            HolderWrite::Written
        );

        // A purge deletes an old-layout record.
        let purged = store.delete_if_same(&done_key, &done, 0).await.unwrap();
        assert_eq!(purged, idem::Deletion::Deleted);
        assert_eq!(raw.kind(&name(&done_key)).await, "none");

        // New records are strings, expiring with the record.
        let fresh = key(&format!("hash-fresh-{tag}"));
        let Decision::Execute(_) = store.claim(&fresh, &FP, store.now(), &P).await.unwrap() else {
            panic!("a new key executes")
        };
        assert_eq!(raw.kind(&name(&fresh)).await, "string");
        assert!(raw.pttl(&name(&fresh)).await > 0);
    }
}

/// `--redis-layout hash`, the first step of a rolling upgrade from idem 0.1: the whole
/// protocol works, and every record is written exactly as 0.1 wrote it (`t` the token
/// in decimal, `s` the state, `r` the encoding), so 0.1's replicas keep reading and
/// fencing them; a record a string-writing replica wrote becomes a hash again.
#[tokio::test]
async fn redis_hash_layout_writes_records_as_idem_0_1_did() {
    use idem::{RedisLayout, RedisOptions};
    for urls in [redis_url(), redis_cluster_urls()] {
        let namespace = idem_tests::unique_namespace("hash-writes");
        let connect = |layout| {
            let options = RedisOptions::default()
                .namespace(namespace.clone())
                .layout(layout);
            RedisStore::connect(&urls, options)
        };
        let store = connect(RedisLayout::Hash).await.unwrap();
        let strings = connect(RedisLayout::String).await.unwrap();
        conformance(&store).await;
        let mut raw = Raw::connect(&urls, store.is_cluster()).await;
        let name = |k: &RecordKey| format!("{namespace}:{{{}}}", k.as_str());
        let tag = format!("{}-{}", store.name(), store.now());

        let k = key(&format!("hash-writes-{tag}"));
        let Decision::Execute(claim) = store.claim(&k, &FP, store.now(), &P).await.unwrap() else {
            panic!("a new key executes")
        };
        let fields = |state: &str, record: &idem_core::Record| {
            (claim.token.to_string(), state.to_string(), record.encode())
        };
        assert_eq!(raw.hash_fields(&name(&k)).await, fields("0", &claim.record));
        assert!(raw.pttl(&name(&k)).await > 0);
        assert_eq!(
            store
                .complete(&k, &claim.holder(), response("paid"), store.now(), &P)
                .await
                .unwrap(),
            HolderWrite::Written
        );
        let done = store.get(&k).await.unwrap().unwrap();
        assert!(done.is_completed());
        assert_eq!(raw.hash_fields(&name(&k)).await, fields("1", &done));

        // Written as a string by an upgraded replica, then taken over by a hash writer.
        let k2 = key(&format!("hash-writes-2-{tag}"));
        let Decision::Execute(first) = strings.claim(&k2, &FP, strings.now(), &P).await.unwrap()
        else {
            panic!("a new key executes")
        };
        assert_eq!(raw.kind(&name(&k2)).await, "string");
        assert_eq!(
            store
                .heartbeat(&k2, &first.holder(), store.now(), &P)
                .await
                .unwrap(),
            HolderWrite::Written
        );
        assert_eq!(raw.kind(&name(&k2)).await, "hash");
        assert_eq!(
            strings.get(&k2).await.unwrap(),
            store.get(&k2).await.unwrap(),
            "both layouts read the same record"
        );
    }
}

/// Redis behind the store's back, standalone or cluster.
enum Raw {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    async fn connect(urls: &str, cluster: bool) -> Raw {
        if cluster {
            let client =
                redis::cluster::ClusterClient::new(urls.split(',').collect::<Vec<_>>()).unwrap();
            Raw::Cluster(client.get_async_connection().await.unwrap())
        } else {
            let client = redis::Client::open(urls).unwrap();
            Raw::Single(client.get_multiplexed_async_connection().await.unwrap())
        }
    }

    async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> T {
        match self {
            Raw::Single(c) => cmd.query_async(c).await.unwrap(),
            Raw::Cluster(c) => cmd.query_async(c).await.unwrap(),
        }
    }

    /// As idem 0.1 wrote a record.
    async fn put_hash(&mut self, name: &str, record: &idem_core::Record) {
        let mut hset = redis::cmd("HSET");
        hset.arg(name)
            .arg("t")
            .arg(record.token())
            .arg("s")
            .arg(record.state_code())
            .arg("r")
            .arg(record.encode());
        self.query::<()>(&hset).await;
        let mut expire = redis::cmd("PEXPIREAT");
        expire.arg(name).arg(record.delete_after());
        self.query::<()>(&expire).await;
    }

    async fn kind(&mut self, name: &str) -> String {
        self.query(redis::cmd("TYPE").arg(name)).await
    }

    /// `t`, `s`, `r` of a hash record.
    async fn hash_fields(&mut self, name: &str) -> (String, String, Vec<u8>) {
        self.query(redis::cmd("HMGET").arg(name).arg("t").arg("s").arg("r"))
            .await
    }

    async fn pttl(&mut self, name: &str) -> i64 {
        self.query(redis::cmd("PTTL").arg(name)).await
    }
}

/// idem's statements find rows by index even in a table analysed while empty (after
/// the sweeper emptied it, say). Before the fix a prepared statement planned then kept
/// a sequential scan while the table grew, and every claim, completion and replay read
/// the whole table. Counted by Postgres, per path, after each path's sessions ended:
/// sequential scans of this schema's `idem_records` while 150 keys are claimed,
/// completed and replayed on the Postgres store, and 150 claimed and completed in
/// handler transactions (`Authority`), each then read as a holder whose commit's answer
/// was lost reads it (`read_settled`). (Tiered async's cold reads, on the same pool,
/// did not reproduce at this size; docs/bench/seqscan-2026-12-01.txt has their counts.)
#[tokio::test]
async fn a_table_analysed_empty_is_still_read_by_index() {
    let db = TestDb::new("seqscan").await;
    // Stores whose sessions carry their own name: each count waits until they ended.
    let named = async |db: &TestDb, name: &str| {
        let url = db.url_named(name);
        Arc::new(
            PostgresStore::connect(&url, PgOptions::default())
                .await
                .unwrap(),
        )
    };
    // (sequential scans, index scans) of the table once those sessions have ended.
    let scans_after = async |db: &TestDb, name: &str| -> (i64, i64) {
        db.wait_sessions_gone(name).await;
        let seq = db.table_stat(None, "seq_scan").await;
        (seq, db.table_stat(None, "idx_scan").await)
    };
    let pid = std::process::id();

    // The table (and its indexes) made, then analysed empty.
    let setup = format!("idem-seqscan-setup-{pid}");
    drop(named(&db, &setup).await);
    let mut before = scans_after(&db, &setup).await;
    // Analysed empty once, and not again during the test (autovacuum would, after 50
    // changes, and its new statistics would hide the plans this counts).
    db.exec("ALTER TABLE idem_records SET (autovacuum_enabled = off); ANALYZE idem_records")
        .await;
    let mut counted = Vec::new();

    let name = format!("idem-seqscan-pg-{pid}");
    let store = named(&db, &name).await;
    for n in 0..150 {
        let k = key(&format!("seqscan-pg-{n}"));
        let Decision::Execute(claim) = store.claim(&k, &FP, store.now(), &P).await.unwrap() else {
            panic!("a new key executes")
        };
        let holder = claim.holder();
        let written = store.complete(&k, &holder, response("ok"), store.now(), &P);
        assert_eq!(written.await.unwrap(), HolderWrite::Written);
        let replay = store.claim(&k, &FP, store.now(), &P).await.unwrap();
        assert!(matches!(replay, Decision::Replay { .. }), "{replay:?}");
    }
    drop(store);
    let after = scans_after(&db, &name).await;
    counted.push(("postgres store", after.0 - before.0, after.1 - before.1));
    before = after;

    let name = format!("idem-seqscan-tx-{pid}");
    let store = named(&db, &name).await;
    let authority = store.authority();
    for n in 0..150 {
        let k = key(&format!("seqscan-tx-{n}"));
        let Decision::Execute(claim) = store.claim(&k, &FP, store.now(), &P).await.unwrap() else {
            panic!("a new key executes")
        };
        let tx = authority.begin(&k, &claim.holder(), &P).await.unwrap();
        tx.commit(response("ok"), &P).await.unwrap();
        // The read a holder makes when its commit's answer was lost.
        let settled = authority.read_settled(&k).await.unwrap();
        assert!(settled.is_some_and(|r| r.is_completed()), "{k:?}");
    }
    drop((authority, store));
    let after = scans_after(&db, &name).await;
    counted.push((
        "handler transactions",
        after.0 - before.0,
        after.1 - before.1,
    ));

    assert_eq!(db.live_records().await, 300);
    idem_tests::report(
        "postgres-plans",
        &format!("a table analysed empty, per path (sequential scans, index scans): {counted:?}"),
    );
    // Each path's counts arrived (each key takes several index scans)…
    assert!(
        counted.iter().all(|(_, _, idx)| *idx >= 300),
        "(path, sequential scans, index scans): {counted:?}"
    );
    // …and none was a sequential scan.
    assert!(
        counted.iter().all(|(_, seq, _)| *seq == 0),
        "(path, sequential scans, index scans): {counted:?}"
    );
}

/// An operator purges an orphan claim (its lease ran out: its holder looks gone), and
/// the holder, only paused, wakes up and commits its charge with its answer while the
/// purge is deleting. Postgres makes the interleaving exact: the holder's transaction
/// holds the row lock, the purge's compare-and-delete waits on it, then finds the row
/// changed. Before the fix the purge read again, decided afresh on the completed record
/// and deleted it: the client had its answer, and its retry charged a second time. The
/// purge must refuse instead (the record is not the one it decided on), and the retry
/// replay. Charges = the handler's executions: the holder's, plus the retry's if it ran.
#[tokio::test]
async fn a_purge_does_not_delete_a_completion_that_landed_while_it_was_deleting() {
    use idem::Purged;
    let db = TestDb::new("purge_race").await;
    let name = format!("idem-purge-race-{}", std::process::id());
    let store = Arc::new(
        PostgresStore::connect(&db.url_named(&name), PgOptions::default())
            .await
            .unwrap(),
    );
    let short = idem_core::Policy {
        lease_ms: 200,
        ttl_ms: 60_000,
    };
    let k = key("purged-while-completing");
    let Decision::Execute(claim) = store.claim(&k, &FP, store.now(), &short).await.unwrap() else {
        panic!("a new key executes")
    };
    let mut charges = 1;
    // The holder pauses past its lease; then its transaction takes the row's lock.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let authority = store.authority();
    let tx = authority.begin(&k, &claim.holder(), &short).await.unwrap();
    tx.client()
        .batch_execute("SELECT 1 FROM idem_records FOR UPDATE")
        .await
        .unwrap();
    // The operator's purge: the orphan's lease is over, so it deletes — and waits.
    let purging = tokio::spawn({
        let store = store.clone();
        let k = k.clone();
        async move { store.purge(&k, store.now(), false).await }
    });
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}' \
         AND wait_event_type = 'Lock'"
    );
    until_counted(&db, &waiting, "the purge never waited on the row").await;
    // The holder commits its charge's answer; the purge's delete then finds it.
    tx.commit(response("charge 1"), &short).await.unwrap();
    let purged = purging.await.unwrap().unwrap();
    let retry = store.claim(&k, &FP, store.now(), &short).await.unwrap();
    if matches!(retry, Decision::Execute(_)) {
        charges += 1;
    }
    idem_tests::report(
        "purge-race",
        &format!(
            "a purge whose delete waited on a completing holder: {}; the retry {}; {charges} charge(s)",
            match &purged {
                Purged::Deleted(_) => "deleted the completion",
                Purged::Changed(_) => "refused, the record changed",
                other => panic!("{other:?}"),
            },
            match &retry {
                Decision::Replay { .. } => "replayed",
                Decision::Execute(_) => "ran the handler",
                _ => "other",
            }
        ),
    );
    assert!(
        matches!(&purged, Purged::Changed(r) if r.is_completed()),
        "{purged:?}"
    );
    assert_eq!(retry.replayed(), Some(&response("charge 1")), "{retry:?}");
    assert_eq!(charges, 1);
}

/// A database whose default isolation is repeatable read (or serializable): the
/// holder's heartbeat updates its record's row while the handler's transaction is open,
/// and before the fix the completion's update of that row then failed ("could not
/// serialize access due to concurrent update"): every transactional handler that ran
/// longer than a heartbeat answered 503 and its charge was rolled back. The handler's
/// transaction is read committed now, and commits.
#[tokio::test]
async fn a_handler_transaction_commits_on_a_database_defaulting_to_repeatable_read() {
    let db = TestDb::new("rr_default").await;
    let url = db.url.replace(
        "options=-c%20search_path",
        "options=-c%20default_transaction_isolation%3Drepeatable%5C%20read%20-c%20search_path",
    );
    assert_ne!(url, db.url);
    let store = PostgresStore::connect(&url, PgOptions::default())
        .await
        .unwrap();
    let session = store.pool().get().await.unwrap();
    let default: String = session
        .query_one("SHOW default_transaction_isolation", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(default, "repeatable read", "the session's default took");
    drop(session);
    let k = key("rr-default");
    let Decision::Execute(claim) = store.claim(&k, &FP, store.now(), &P).await.unwrap() else {
        panic!("a new key executes")
    };
    let authority = store.authority();
    let tx = authority.begin(&k, &claim.holder(), &P).await.unwrap();
    tx.client()
        .batch_execute("SELECT count(*) FROM idem_records")
        .await
        .unwrap();
    // The heartbeat, from its own connection, while the handler runs.
    let beat = store.heartbeat(&k, &claim.holder(), store.now(), &P).await;
    assert_eq!(beat.unwrap(), HolderWrite::Written);
    let committed = tx.commit(response("charged"), &P).await;
    idem_tests::report(
        "isolation",
        &format!("a handler transaction on a repeatable-read database, heartbeat mid-handler: commit {committed:?}"),
    );
    committed.unwrap();
    let replay = store.claim(&k, &FP, store.now(), &P).await.unwrap();
    assert_eq!(replay.replayed(), Some(&response("charged")), "{replay:?}");
}

/// Tiered async: a holder releases its claim (nothing happened) while Postgres is slow
/// to write (a lock holds the outbox's writes; reads pass). Its client, told the key is
/// free, sends the corrected request (another body) at once. Before the fix the
/// release was answered before Postgres had it: the corrected claim's cold path found
/// the pre-release claim in Postgres, put it back into Redis, and the corrected request
/// was refused 422 — and went on being refused after Postgres caught up, since Redis
/// then held that claim until it expired. Now a release is answered once Postgres has
/// it. Executions of the corrected request: 0 before, 1 after.
#[tokio::test]
async fn tiered_async_a_corrected_request_runs_after_a_release_while_postgres_lags() {
    use idem_core::Fingerprint;
    let db = TestDb::new("tasync_release").await;
    let store = Arc::new(TieredStore::new(
        redis(&redis_url()).await,
        pg(&db).await,
        Durability::Async,
        OutboxOptions::default(),
    ));
    let corrected_fp = Fingerprint([2; 32]);
    let k = key(&format!("release-lag-{}", store.now()));
    let claim = claimed_and_written_behind(&db, &store, &k).await;
    // Postgres takes 600 ms to accept writes.
    let locker = writes_held(&db).await;
    let client = tokio::spawn({
        let (store, k, holder) = (store.clone(), k.clone(), claim.holder());
        async move {
            let released = store.release(&k, &holder, store.now(), &P).await;
            // The corrected request, sent on the release's answer.
            let corrected = store.claim(&k, &corrected_fp, store.now(), &P).await;
            (released, corrected)
        }
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    locker.batch_execute("COMMIT").await.unwrap();
    let (released, corrected) = client.await.unwrap();
    assert_eq!(released.unwrap(), HolderWrite::Written);
    let corrected = corrected.unwrap();
    let mut executions = u32::from(matches!(corrected, Decision::Execute(_)));
    let said = |d: &Decision| match d {
        Decision::Execute(_) => "executed",
        Decision::Mismatch => "refused 422 (another body's claim)",
        _ => "other",
    };
    // Once Postgres has caught up, the corrected request sent again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = match executions {
        0 => {
            let again = store
                .claim(&k, &corrected_fp, store.now(), &P)
                .await
                .unwrap();
            executions += u32::from(matches!(again, Decision::Execute(_)));
            said(&again)
        }
        _ => "-",
    };
    idem_tests::report(
        "release-lag",
        &format!("tiered async, a corrected request sent on a release's answer while Postgres lagged 600 ms: {}; sent again after: {again}; executions of the corrected request: {executions}", said(&corrected)),
    );
    assert!(matches!(corrected, Decision::Execute(_)), "{corrected:?}");
    assert_eq!(executions, 1);
}

/// Tiered async: a holder whose lease ran out writes its completion late, from a
/// replica whose clock runs 80 ms behind (within the 100 ms tolerance), after another
/// attempt took over and completed, while Postgres lags (a lock holds the write-behind;
/// reads pass). Redis refuses it as fenced; Postgres, the authority, still shows the
/// holder's claim, its lease ended on Redis' clock but not on the holder's. Before the
/// fix the holder's completion replaced the takeover's completed answer in Redis: the
/// takeover's client had been told its answer was stored, and retries replayed the
/// other one. A completed record in front is never replaced now, and the authority's
/// lease must outlast the caller's clock by the tolerance.
#[tokio::test]
async fn tiered_async_a_late_holder_never_replaces_a_completed_takeover() {
    let db = TestDb::new("tasync_late_holder").await;
    let store = Arc::new(TieredStore::new(
        redis(&redis_url()).await,
        pg(&db).await,
        Durability::Async,
        OutboxOptions::default(),
    ));
    let k = key(&format!("late-holder-{}", store.now()));
    let first = claimed_and_written_behind(&db, &store, &k).await;
    // The lease ends (on Redis' clock), and Postgres stops taking writes.
    tokio::time::sleep(Duration::from_millis(P.lease_ms + 20)).await;
    let locker = writes_held(&db).await;
    let Decision::TakeOver(second) = store.claim(&k, &FP, store.now(), &P).await.unwrap() else {
        panic!("the lease ran out: a retry takes over")
    };
    let stored = store
        .complete(&k, &second.holder(), response("second"), store.now(), &P)
        .await
        .unwrap();
    assert_eq!(stored, HolderWrite::Written);
    let late = store
        .complete(&k, &first.holder(), response("first"), store.now() - 80, &P)
        .await;
    let retry = store.claim(&k, &FP, store.now(), &P).await.unwrap();
    locker.batch_execute("COMMIT").await.unwrap();
    let replayed = match retry.replayed() {
        Some(r) if *r == response("second") => "the takeover's answer",
        Some(r) if *r == response("first") => "the late holder's answer",
        _ => "no answer",
    };
    idem_tests::report(
        "late-holder",
        &format!("tiered async, a holder 80 ms behind completes after a takeover completed, Postgres lagging: its write {late:?}; the retry replayed {replayed}"),
    );
    assert_eq!(replayed, "the takeover's answer", "{retry:?}");
    assert!(
        matches!(late, Ok(HolderWrite::Refused(_))),
        "the late completion is refused: {late:?}"
    );
}

/// Tiered async: Redis decides (its clock says when an answer expires); Postgres, whose
/// clock here runs 2 s behind Redis', only stores what is written behind. A completion
/// C expires at E; a request N reuses the key 0.5 s after E (Redis' time), runs and
/// completes. Before the fix the write-behind judged C's expiry on Postgres' clock, for
/// which C still had 1.5 s to live, and silently skipped N's claim and completion:
/// Postgres kept C. Redis then loses N's record (a flush, a restart without
/// persistence), the sweeper deletes C, and N's retry, through the cold path, finds no
/// trace of N and runs it again. The write-behind now judges C's expiry at N's own claim time (its token, on
/// the clock that decided). Executions of N: 2 before, 1 after.
#[tokio::test]
async fn tiered_async_writes_behind_a_reuse_when_postgres_clock_runs_behind() {
    use idem::RedisOptions;
    use idem_core::{Fingerprint, Policy};
    // A Postgres of its own, its clock 2 s behind the machine's (and Redis').
    let behind = idem_tests::procs::PgProc::start_skewed("reuse-behind", "-2s");
    let namespace = idem_tests::unique_namespace("reuse");
    let options = RedisOptions::default().namespace(namespace.clone());
    let redis = RedisStore::connect(&redis_url(), options).await.unwrap();
    let pg = PostgresStore::connect(&behind.url(), PgOptions::default())
        .await
        .unwrap();
    let store = TieredStore::new(
        redis,
        Arc::new(pg),
        Durability::Async,
        OutboxOptions::default(),
    );
    let db = idem_tests::connect(&behind.url()).await;
    let pg_now: i64 = db
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        (pg_now as u64) < idem::now() - 1_500,
        "Postgres' clock runs behind: {pg_now} vs {}",
        idem::now()
    );
    let policy = Policy {
        lease_ms: 30_000,
        ttl_ms: 3_000,
    };
    let k = key("reused");
    let Decision::Execute(c) = store.claim(&k, &FP, store.now(), &policy).await.unwrap() else {
        panic!("a new key executes")
    };
    let holder = c.holder();
    let done = store.complete(&k, &holder, response("C"), store.now(), &policy);
    assert_eq!(done.await.unwrap(), HolderWrite::Written);
    let in_postgres = async |token: u64, within: Duration| {
        let sql = format!("SELECT count(*) FROM idem_records WHERE token = {token} AND state = 1");
        let deadline = Instant::now() + within;
        loop {
            let found: i64 = db.query_one(&sql, &[]).await.unwrap().get(0);
            if found == 1 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    assert!(in_postgres(c.token, Duration::from_secs(5)).await);
    let expires_at = store.get(&k).await.unwrap().unwrap().expires_at();
    // 0.5 s past C's expiry on Redis' clock (1.5 s before it on Postgres').
    let until = (expires_at + 500).saturating_sub(store.now());
    tokio::time::sleep(Duration::from_millis(until)).await;
    let n_fp = Fingerprint([2; 32]);
    let mut executions = 0;
    let decided = store.claim(&k, &n_fp, store.now(), &policy).await.unwrap();
    let Decision::Execute(n) = decided else {
        panic!("C has expired: {decided:?}")
    };
    executions += 1;
    let holder = n.holder();
    let done = store.complete(&k, &holder, response("N"), store.now(), &policy);
    assert_eq!(done.await.unwrap(), HolderWrite::Written);
    let written_behind = in_postgres(n.token, Duration::from_secs(1)).await;
    // Redis loses N's record; once C has expired on both clocks and the sweeper ran,
    // N's retry comes.
    let mut raw = Raw::connect(&redis_url(), false).await;
    let _: i64 = raw
        .query(redis::cmd("DEL").arg(format!("{namespace}:{{{}}}", k.as_str())))
        .await;
    let until = (expires_at + 2_200).saturating_sub(idem::now());
    tokio::time::sleep(Duration::from_millis(until)).await;
    // The sweeper deletes what has expired on Postgres' clock: C, if it is still there.
    store.sweep(idem::now(), 100).await.unwrap();
    let retry = store.claim(&k, &n_fp, store.now(), &policy).await.unwrap();
    executions += u32::from(matches!(retry, Decision::Execute(_)));
    let retry_said = match &retry {
        Decision::Execute(_) => "ran N again",
        Decision::Replay { .. } => "replayed N's answer",
        _ => "other",
    };
    idem_tests::report(
        "reuse-write-behind",
        &format!("tiered async, Postgres' clock 2 s behind Redis', a key reused 0.5 s after its answer expired: N's completion written behind: {written_behind}; after Redis lost it, N's retry {retry_said}; executions of N: {executions}"),
    );
    assert!(written_behind, "N's completion reached Postgres");
    assert_eq!(retry.replayed(), Some(&response("N")), "{retry:?}");
    assert_eq!(executions, 1);
}

/// Tiered async: an answer has expired and Redis has dropped it (a second after its
/// expiry), but Postgres still holds it until the sweeper's next pass. A request that
/// reuses the key then runs. Before the fix the cold path put the expired record back
/// into Redis, with an expiry already past, so Redis dropped it at once; the claim went
/// round until it gave up (contention: a 503), every time until the sweep.
#[tokio::test]
async fn tiered_async_reuses_a_key_whose_expired_answer_postgres_still_holds() {
    use idem_core::{Fingerprint, Policy};
    let db = TestDb::new("tasync_expired").await;
    let store = TieredStore::new(
        redis(&redis_url()).await,
        pg(&db).await,
        Durability::Async,
        OutboxOptions::default(),
    );
    let policy = Policy {
        lease_ms: 30_000,
        ttl_ms: 500,
    };
    let k = key(&format!("expired-in-postgres-{}", store.now()));
    let Decision::Execute(c) = store.claim(&k, &FP, store.now(), &policy).await.unwrap() else {
        panic!("a new key executes")
    };
    let holder = c.holder();
    let done = store.complete(&k, &holder, response("old"), store.now(), &policy);
    assert_eq!(done.await.unwrap(), HolderWrite::Written);
    until_counted(
        &db,
        "SELECT count(*) FROM idem_records WHERE state = 1",
        "the completion was never written behind",
    )
    .await;
    // Past the expiry and Redis' grace after it; no sweep has run.
    tokio::time::sleep(Duration::from_millis(500 + 1_000 + 300)).await;
    assert_eq!(db.count("SELECT count(*) FROM idem_records").await, 1);
    let mut outcomes = Vec::new();
    for fp in [FP, Fingerprint([2; 32])] {
        let k = k.clone();
        let claimed = store.claim(&k, &fp, store.now(), &policy).await;
        outcomes.push(match &claimed {
            Ok(Decision::Execute(_)) => "executed".to_string(),
            Ok(other) => format!("{other:?}"),
            Err(e) => format!("error: {e}"),
        });
        if let Ok(Decision::Execute(c)) = claimed {
            let holder = c.holder();
            let released = store.release(&k, &holder, store.now(), &policy);
            assert_eq!(released.await.unwrap(), HolderWrite::Written);
        }
    }
    idem_tests::report(
        "expired-in-postgres",
        &format!("tiered async, a key reused after its answer expired, Redis having dropped it and Postgres not yet swept: {outcomes:?}"),
    );
    assert_eq!(outcomes, ["executed", "executed"]);
}

/// The replay cache keeps a completion with the expiry the store gave it. A holder's
/// completion lands but its reply is lost (here: written on the store behind the
/// cache, which never hears of it); the layer writes again 1.5 s later, and the store
/// answers that it already holds it. Before the fix the cache kept the record with an
/// expiry made from that second write's time, 1.5 s later than the store's: once the
/// answer had expired in the store (where another replica would run the key afresh),
/// this replica went on replaying it from memory.
#[tokio::test]
async fn the_replay_cache_never_outlives_the_stored_answer() {
    use idem_core::Policy;
    let db = TestDb::new("cache_expiry").await;
    let inner = pg(&db).await;
    let cache = ReplayCache::new(inner.clone(), 1 << 20);
    let policy = Policy {
        lease_ms: 30_000,
        ttl_ms: 3_000,
    };
    let k = key("cache-expiry");
    let Decision::Execute(c) = cache.claim(&k, &FP, cache.now(), &policy).await.unwrap() else {
        panic!("a new key executes")
    };
    let holder = c.holder();
    // The write that landed, its reply lost.
    let landed = inner.complete(&k, &holder, response("first"), inner.now(), &policy);
    assert_eq!(landed.await.unwrap(), HolderWrite::Written);
    let expires_at = inner.get(&k).await.unwrap().unwrap().expires_at();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let again = cache.complete(&k, &holder, response("first"), cache.now(), &policy);
    assert_eq!(
        again.await.unwrap(),
        HolderWrite::Written,
        "already written"
    );
    // Past the stored answer's expiry (by the store's clock).
    let until = (expires_at + 300).saturating_sub(inner.now());
    tokio::time::sleep(Duration::from_millis(until)).await;
    let through_cache = cache.claim(&k, &FP, cache.now(), &policy).await.unwrap();
    let said = match &through_cache {
        Decision::Replay { .. } => "replayed from the cache",
        Decision::Execute(_) => "ran afresh",
        _ => "other",
    };
    idem_tests::report(
        "cache-expiry",
        &format!("replay cache, a completion re-written 1.5 s after it landed, asked 0.3 s after the stored answer expired: {said}"),
    );
    assert!(
        matches!(through_cache, Decision::Execute(_)),
        "{through_cache:?}"
    );
}

/// Tiered async: Redis holds an older record of the key than Postgres (a failover to a
/// replica that missed the last writes): an earlier attempt's claim, its lease over,
/// while Postgres holds the live claim of the attempt that took over. An operator
/// purges what the listing showed. Before the fix the purge deleted, besides Redis'
/// record, whatever Postgres held — the live holder's claim — and a retry then ran the
/// handler beside it. A copy in Postgres newer than the purged record is not a copy of
/// it: it stays, and the retry finds the live claim. Executions: the holder's, plus the
/// retry's if it ran.
#[tokio::test]
async fn tiered_async_a_purge_of_a_stale_redis_record_keeps_the_newer_claim_in_postgres() {
    use idem::Purged;
    use idem_core::Record;
    let db = TestDb::new("tasync_purge_stale").await;
    let (store, namespace) = tiered_async_in(&db, "purge-stale").await;
    let k = key("purge-stale");
    let Decision::Execute(live) = store.claim(&k, &FP, store.now(), &P).await.unwrap() else {
        panic!("a new key executes")
    };
    let mut executions = 1;
    let sql = format!(
        "SELECT count(*) FROM idem_records WHERE token = {}",
        live.token
    );
    until_counted(&db, &sql, "the claim was never written behind").await;
    // Redis, failed over, holds an earlier attempt's claim whose lease is over.
    let now = store.now();
    let stale = Record::InProgress {
        fingerprint: FP,
        token: live.token - 5_000 * idem_core::TOKENS_PER_MS,
        lease_until: now - 1_000,
        expires_at: now + 60_000,
    };
    let mut raw = Raw::connect(&redis_url(), false).await;
    let name = format!("{namespace}:{{{}}}", k.as_str());
    let _: i64 = raw.query(redis::cmd("DEL").arg(&name)).await;
    raw.put_hash(&name, &stale).await;
    let purged = store.purge(&k, store.now(), false).await.unwrap();
    assert!(
        matches!(&purged, Purged::Deleted(r) if *r == stale),
        "{purged:?}"
    );
    let left = db.count(&sql).await;
    let retry = store.claim(&k, &FP, store.now(), &P).await.unwrap();
    executions += u32::from(matches!(retry, Decision::Execute(_)));
    idem_tests::report(
        "purge-stale-redis",
        &format!("tiered async, a purge of Redis' stale record while Postgres holds the live claim: the live claim left in Postgres: {left}; the retry {}; executions {executions}", match &retry {
            Decision::Execute(_) => "ran the handler",
            Decision::InFlight { .. } => "was told the key is in flight (409)",
            _ => "other",
        }),
    );
    assert_eq!(left, 1, "the live claim stays");
    assert!(matches!(retry, Decision::InFlight { .. }), "{retry:?}");
    assert_eq!(executions, 1);
}

/// Tiered sync, Redis cut off from this replica while it keeps its records: a purge
/// then deletes nothing and says the store is unavailable, until it can delete both
/// tiers' copies. Before the fix the first purge deleted Postgres' row and failed on
/// Redis (503), the operator's second one found only Postgres (Redis unread) and said
/// the key held no record (404) — and once Redis was back its copy came back with it,
/// answering a corrected request 422 for the record's whole TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_sync_a_purge_while_redis_is_cut_off_deletes_nothing() {
    use idem::Purged;
    let db = TestDb::new("tsync_purge_cut").await;
    let redis_addr: std::net::SocketAddr =
        redis_url().trim_start_matches("redis://").parse().unwrap();
    let gate = idem_tests::Proxy::start(redis_addr).await;
    let namespace = idem_tests::unique_namespace("purge-cut");
    let options = idem::RedisOptions::default()
        .namespace(namespace.clone())
        .timeout(Duration::from_millis(300));
    let redis = RedisStore::connect(&format!("redis://{}", gate.addr), options)
        .await
        .unwrap();
    let store = TieredStore::new(
        redis,
        pg(&db).await,
        Durability::Sync,
        OutboxOptions::default(),
    );
    let k = key("purge-cut");
    let Decision::Execute(c) = store.claim(&k, &FP, store.now(), &P).await.unwrap() else {
        panic!("a new key executes")
    };
    let written = store
        .complete(&k, &c.holder(), response("first"), store.now(), &P)
        .await
        .unwrap();
    assert_eq!(written, HolderWrite::Written);
    let mut raw = Raw::connect(&redis_url(), false).await;
    let name = format!("{namespace}:{{{}}}", k.as_str());
    gate.take_down();
    // The proxy cuts its open connections within 20 ms.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut while_cut = Vec::new();
    for _ in 0..2 {
        while_cut.push(match store.purge(&k, store.now(), false).await {
            Ok(Purged::Absent) => "no record (404)".to_owned(),
            Ok(Purged::Deleted(_)) => "deleted".to_owned(),
            Ok(other) => format!("{other:?}"),
            Err(e) => format!(
                "unavailable ({})",
                e.to_string().chars().take(40).collect::<String>()
            ),
        });
    }
    let rows_while_cut = db.count("SELECT count(*) FROM idem_records").await;
    let kept_in_redis: i64 = raw.query(redis::cmd("EXISTS").arg(&name)).await;
    gate.bring_up();
    // The first commands after the cut may still fail while the client reconnects.
    let mut after = store.purge(&k, store.now(), false).await;
    for _ in 0..50 {
        if after.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = store.purge(&k, store.now(), false).await;
    }
    let after = after.unwrap();
    let in_redis: i64 = raw.query(redis::cmd("EXISTS").arg(&name)).await;
    let corrected = store.claim(&k, &OTHER, store.now(), &P).await.unwrap();
    idem_tests::report(
        "purge-stale-redis",
        &format!("tiered sync, two purges while Redis is cut off: {while_cut:?}, Postgres rows then {rows_while_cut}, Redis' {kept_in_redis}; once Redis is back a purge: {}, Redis' copies left {in_redis}; a corrected request then: {}", match &after {
            Purged::Deleted(_) => "deleted",
            Purged::Absent => "no record",
            _ => "other",
        }, match &corrected {
            Decision::Execute(_) => "runs",
            Decision::Mismatch => "refused 422 (the record came back)",
            _ => "other",
        }),
    );
    assert!(
        while_cut.iter().all(|w| w.starts_with("unavailable")),
        "{while_cut:?}"
    );
    assert_eq!(rows_while_cut, 1, "nothing deleted while Redis is cut off");
    assert!(matches!(after, Purged::Deleted(_)), "{after:?}");
    assert_eq!(in_redis, 0, "Redis' copy went with it");
    assert!(matches!(corrected, Decision::Execute(_)), "{corrected:?}");
}

/// Tiered async: Redis lost the renewals of a live claim (failed over to a replica
/// that missed them, or restored from a snapshot) and holds the same attempt's claim
/// with its lease over, while Postgres holds it renewed. An operator purges without
/// force what the listing (Redis') shows as abandoned. Before the fix the purge judged
/// the lease on Redis' copy alone and deleted Postgres' as a copy of it (same token,
/// same state), and a retry ran the handler beside the live holder. The lease Postgres
/// holds now holds the purge back: refused as live, and the retry is told the key is in
/// flight.
#[tokio::test]
async fn tiered_async_an_unforced_purge_respects_the_lease_postgres_holds() {
    use idem::Purged;
    use idem_core::{Policy, Record};
    const LONG: Policy = Policy {
        lease_ms: 20_000,
        ttl_ms: 60_000,
    };
    let db = TestDb::new("tasync_purge_lease").await;
    let (store, namespace) = tiered_async_in(&db, "purge-lease").await;
    let k = key("purge-lease");
    let Decision::Execute(live) = store.claim(&k, &FP, store.now(), &LONG).await.unwrap() else {
        panic!("a new key executes")
    };
    let mut executions = 1;
    let sql = format!(
        "SELECT count(*) FROM idem_records WHERE token = {} AND state = 0",
        live.token
    );
    until_counted(&db, &sql, "the claim was never written behind").await;
    let Record::InProgress { expires_at, .. } = live.record else {
        panic!("a claim is in progress")
    };
    let lapsed = Record::InProgress {
        fingerprint: FP,
        token: live.token,
        lease_until: store.now() - 1_000,
        expires_at,
    };
    let mut raw = Raw::connect(&redis_url(), false).await;
    let name = format!("{namespace}:{{{}}}", k.as_str());
    let _: i64 = raw.query(redis::cmd("DEL").arg(&name)).await;
    raw.put_hash(&name, &lapsed).await;
    let purged = store.purge(&k, store.now(), false).await.unwrap();
    let left = db.count(&sql).await;
    let retry = store.claim(&k, &FP, store.now(), &LONG).await.unwrap();
    executions += u32::from(matches!(retry, Decision::Execute(_)));
    idem_tests::report(
        "purge-stale-redis",
        &format!("tiered async, an unforced purge of Redis' copy of a live claim whose renewals Redis lost: {}; the live claim left in Postgres: {left}; the retry {}; executions {executions}", match &purged {
            Purged::Deleted(_) => "deleted",
            Purged::LeaseLive(_) => "refused, the lease is live",
            _ => "other",
        }, match &retry {
            Decision::Execute(_) => "ran the handler",
            Decision::InFlight { .. } => "was told the key is in flight (409)",
            _ => "other",
        }),
    );
    assert!(matches!(purged, Purged::LeaseLive(_)), "{purged:?}");
    assert_eq!(left, 1, "the live claim stays");
    assert!(!matches!(retry, Decision::Execute(_)), "{retry:?}");
    assert_eq!(executions, 1);
}

/// Tiered async: Redis holds the next attempt's claim while Postgres still holds the
/// holder's (its release not written behind yet: the corrected request claimed after
/// the release emptied Redis, or after Redis lost the record), and the holder's release
/// is written again (the layer's retry of a final write whose answer was lost). The
/// write is refused as fenced. Before the fix the store, seeing Postgres give the
/// holder its lease, put the released record in place of the next attempt's live
/// claim, which Redis then dropped: a third request would have run beside the second.
/// A release protects nothing; it never goes over another claim.
#[tokio::test]
async fn tiered_async_a_release_never_replaces_the_next_claim() {
    use idem_core::{Fingerprint, Record};
    let db = TestDb::new("tasync_release_next").await;
    let (store, namespace) = tiered_async_in(&db, "release-next").await;
    let k = key("release-next");
    let Decision::Execute(a) = store.claim(&k, &FP, store.now(), &P).await.unwrap() else {
        panic!("a new key executes")
    };
    until_counted(
        &db,
        "SELECT count(*) FROM idem_records",
        "the claim was never written behind",
    )
    .await;
    // The next attempt's claim in Redis, Postgres not told yet.
    let now = store.now();
    let next = Record::InProgress {
        fingerprint: Fingerprint([2; 32]),
        token: a.token + 1_000 * idem_core::TOKENS_PER_MS,
        lease_until: now + 30_000,
        expires_at: now + 60_000,
    };
    let mut raw = Raw::connect(&redis_url(), false).await;
    let name = format!("{namespace}:{{{}}}", k.as_str());
    let _: i64 = raw.query(redis::cmd("DEL").arg(&name)).await;
    raw.put_hash(&name, &next).await;
    let holder = a.holder();
    let released = store.release(&k, &holder, store.now(), &P).await;
    let in_redis = store.get(&k).await.unwrap();
    idem_tests::report(
        "release-next",
        &format!("tiered async, a holder's release while Redis holds the next claim and Postgres the holder's: {released:?}; Redis then holds the next claim: {}", in_redis.as_ref() == Some(&next)),
    );
    assert_eq!(
        in_redis.as_ref(),
        Some(&next),
        "the next attempt's claim stays"
    );
    assert!(
        matches!(released, Ok(HolderWrite::Refused(_))),
        "{released:?}"
    );
    // Postgres, which still held the holder's claim, learns the release all the same
    // (a corrected request would otherwise find that claim there later).
    let sql = format!(
        "SELECT count(*) FROM idem_records WHERE token = {} \
         AND expires_at <= (extract(epoch FROM clock_timestamp()) * 1000)::int8",
        a.token
    );
    until_counted(&db, &sql, "Postgres never learnt the release").await;
}

/// The operator's own delay: an orphan claim is listed (its lease over), its holder
/// wakes up and completes it, then the operator purges what the listing showed. A
/// purge that names it (`token` and `state`, as the admin API and CLI take them) finds
/// the attempt completed since and deletes nothing; the retry replays. Without the
/// names the purge deletes the completion, and the retry runs again: the counts of
/// both are reported. Executions: the holder's, plus each retry's that ran.
#[tokio::test]
async fn a_purge_of_what_the_listing_showed_refuses_what_completed_since() {
    use idem::Purged;
    use idem_core::{Policy, PurgeTarget};
    let db = TestDb::new("purge_expect").await;
    let store = pg(&db).await;
    let short = Policy {
        lease_ms: 200,
        ttl_ms: 60_000,
    };
    let mut outcomes = Vec::new();
    for named in [true, false] {
        let k = key(&format!("listed-then-completed-{named}"));
        let Decision::Execute(c) = store.claim(&k, &FP, store.now(), &short).await.unwrap() else {
            panic!("a new key executes")
        };
        let mut executions = 1;
        tokio::time::sleep(Duration::from_millis(400)).await;
        let listed = store.get(&k).await.unwrap().unwrap();
        assert!(!listed.is_completed());
        let holder = c.holder();
        let done = store.complete(&k, &holder, response("charged"), store.now(), &short);
        assert_eq!(done.await.unwrap(), HolderWrite::Written);
        let target = named.then(|| PurgeTarget::of(&listed));
        let purged = store
            .purge_expecting(&k, store.now(), false, target)
            .await
            .unwrap();
        let retry = store.claim(&k, &FP, store.now(), &short).await.unwrap();
        executions += u32::from(matches!(retry, Decision::Execute(_)));
        outcomes.push((named, purged, retry, executions));
    }
    let said: Vec<String> = outcomes
        .iter()
        .map(|(named, purged, _, executions)| {
            let purged = match purged {
                Purged::Changed(_) => "refused, the record changed",
                Purged::Deleted(_) => "deleted the completion",
                _ => "other",
            };
            format!("named {named}: {purged}, {executions} execution(s)")
        })
        .collect();
    idem_tests::report(
        "purge-expect",
        &format!("a purge of an orphan listed before its holder completed it: {said:?}"),
    );
    let (_, purged, retry, executions) = &outcomes[0];
    assert!(
        matches!(purged, Purged::Changed(r) if r.is_completed()),
        "{purged:?}"
    );
    assert_eq!(retry.replayed(), Some(&response("charged")));
    assert_eq!(*executions, 1);
    // Unnamed, the operator asked for the key whatever it holds: deleted, and it runs again.
    assert!(matches!(outcomes[1].1, Purged::Deleted(_)));
    assert_eq!(outcomes[1].3, 2);
}

/// Tiered async, Redis lost a claim written behind. The holder's completion is
/// refused in Redis as missing; while it reads Postgres (held there by a lock), a
/// retry's claim lands in Redis (planted: a later token, a live lease), so the
/// holder's copy into Redis is refused. The completion must not count as written until
/// its copy is in Redis: counted so (before the fix), Redis kept the retry's claim,
/// which nobody renews, and with the outbox behind a later retry took it over once its
/// lease ran out — a second execution.
#[tokio::test]
async fn tiered_async_a_completion_redis_refused_is_not_reported_written() {
    let db = TestDb::new("refused_copy").await;
    let app = format!("refused-copy-{}", std::process::id());
    let namespace = idem_tests::unique_namespace("refused-copy");
    let redis = RedisStore::connect(
        &redis_url(),
        idem::RedisOptions::default().namespace(namespace.clone()),
    )
    .await
    .unwrap();
    let pg = PostgresStore::connect(&db.url_named(&app), PgOptions::default())
        .await
        .unwrap();
    let store = Arc::new(TieredStore::new(
        redis,
        Arc::new(pg),
        Durability::Async,
        OutboxOptions::default(),
    ));
    let k = key(&format!("refused-copy-{}", store.now()));
    let first = claimed_and_written_behind(&db, &store, &k).await;
    let mut executions = 1;
    let mut raw = Raw::connect(&redis_url(), false).await;
    let name = format!("{namespace}:{{{}}}", k.as_str());
    raw.query::<()>(redis::cmd("DEL").arg(&name)).await;
    // Reads of Postgres wait: the holder's read of the authority is held between
    // Redis' refusal and its copy into Redis.
    let reads_held = db.client().await;
    reads_held
        .batch_execute("BEGIN; LOCK TABLE idem_records IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let completing = tokio::spawn({
        let (store, k, holder) = (store.clone(), k.clone(), first.holder());
        async move {
            store
                .complete(&k, &holder, response("first"), store.now(), &P)
                .await
        }
    });
    let waiting = |name: String| {
        format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}' \
             AND wait_event_type = 'Lock'"
        )
    };
    until_counted(&db, &waiting(app.clone()), "the holder never read Postgres").await;
    // A retry's claim lands in Redis meanwhile.
    let now = store.now();
    let retry_claim = Record::InProgress {
        fingerprint: FP,
        token: first.token + 100 * idem_core::TOKENS_PER_MS,
        lease_until: now + P.lease_ms,
        expires_at: P.claim_expires_at(now),
    };
    raw.put_hash(&name, &retry_claim).await;
    // The outbox stays behind from here on: writes wait on a lock queued now.
    let writes = idem_tests::connect(&db.url_named(&format!("{app}-writes"))).await;
    let writes_held = tokio::spawn(async move {
        writes
            .batch_execute("BEGIN; LOCK TABLE idem_records IN EXCLUSIVE MODE")
            .await
            .unwrap();
        writes
    });
    until_counted(
        &db,
        &waiting(format!("{app}-writes")),
        "the writes' lock was never queued",
    )
    .await;
    reads_held.batch_execute("COMMIT").await.unwrap();
    let mut outcomes = vec![format!("{:?}", completing.await.unwrap())];
    // The layer writes again on contention; so does this test.
    while outcomes.last().is_some_and(|o| o.contains("Contention")) && outcomes.len() < 6 {
        let again = store
            .complete(&k, &first.holder(), response("first"), store.now(), &P)
            .await;
        outcomes.push(format!("{again:?}"));
    }
    let writes = writes_held.await.unwrap();
    let in_redis = store.get(&k).await.unwrap();
    // Past the lease of whatever Redis holds, Postgres still behind.
    sleep_ms(P.lease_ms + 200).await;
    let later = store.claim(&k, &FP, store.now(), &P).await.unwrap();
    if matches!(later, Decision::Execute(_) | Decision::TakeOver(_)) {
        executions += 1;
    }
    writes.batch_execute("COMMIT").await.unwrap();
    idem_tests::report(
        "stores",
        &format!(
            "tiered async, a completion whose copy Redis refused: writes {outcomes:?}, Redis then holds a completion: {}; a retry past the lease: {}; {executions} executions",
            in_redis.as_ref().is_some_and(Record::is_completed),
            match &later {
                Decision::Replay { .. } => "replayed",
                Decision::TakeOver(_) => "took over",
                Decision::Execute(_) => "executed",
                _ => "other",
            }
        ),
    );
    assert_eq!(executions, 1, "a retry ran the handler again: {later:?}");
    assert!(
        in_redis.as_ref().is_some_and(Record::is_completed),
        "the holder's completion is in Redis: {in_redis:?}"
    );
    assert_eq!(later.replayed(), Some(&response("first")));
    idem_tests::proof::record(
        "faults",
        "refused-copy",
        &[&format!(
            "{}, the completion in Redis, a retry past the lease replayed, {executions} execution",
            outcomes.join(" then ")
        )],
    );
}

/// In `async` mode leases are renewed in Redis: the Postgres store's renewal
/// connections (a quarter of its pool, at least two: 4 here) are closed, not kept
/// open for nothing.
#[tokio::test]
async fn the_async_tiered_store_keeps_no_renewal_connections() {
    let db = TestDb::new("renewals_async").await;
    let name = format!("{}-sessions", db.schema);
    let sessions =
        format!("SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}'");
    let pg = Arc::new(
        PostgresStore::connect(&db.url_named(&name), PgOptions::default())
            .await
            .unwrap(),
    );
    let alone = db.count(&sessions).await;
    let store = TieredStore::new(
        redis(&redis_url()).await,
        pg,
        Durability::Async,
        OutboxOptions::default(),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut tiered = db.count(&sessions).await;
    while tiered > alone - 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        tiered = db.count(&sessions).await;
    }
    idem_tests::report(
        "stores",
        &format!(
            "Postgres sessions of the store: {alone} alone, {tiered} under a tiered async store"
        ),
    );
    assert_eq!(tiered, alone - 4, "the 4 renewal connections are closed");
    drop(store);
}
