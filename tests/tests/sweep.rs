//! Expired records are deleted in batches; live ones are kept.

use idem::PgOptions;
use idem::StoreExt;
use idem::{MemoryStore, PostgresStore, Store};
use idem_core::{Decision, Fingerprint, IdempotencyKey, Policy, RecordKey, Scope, StoredResponse};
use idem_tests::TestDb;

async fn fill(store: &dyn Store, n: usize, prefix: &str, now: u64, ttl_ms: u64) {
    // A claim lives a second at least (its lease), so that its completion, stamped
    // `now` however long the filling took, lands on a claim that has not expired; the
    // completed record then expires `ttl_ms` after `now`.
    let policy = Policy {
        lease_ms: 1_000,
        ttl_ms,
    };
    for i in 0..n {
        let key = RecordKey::new(
            &Scope::anonymous(),
            &IdempotencyKey::parse(format!("{prefix}-{i}").as_bytes()).unwrap(),
        );
        let fp = Fingerprint([i as u8; 32]);
        let Decision::Execute(c) = store.claim(&key, &fp, now, &policy).await.unwrap() else {
            panic!("new key executes")
        };
        let done = StoredResponse {
            status: 201,
            headers: vec![],
            body: vec![],
        };
        let written = store
            .complete(&key, &c.holder(), done, now, &policy)
            .await
            .unwrap();
        assert!(written.is_written());
    }
}

/// On the store's clock: records are written at its time, and the sweeper deletes
/// nothing that has not expired there, whatever the caller's clock says.
async fn sweeps_only_expired(store: &dyn Store) {
    let now = store.now();
    fill(store, 25, "old", now, 1_000).await; // expires 1 s from now
    fill(store, 5, "new", now, 3_600_000).await;
    assert_eq!(
        store.sweep(now + 3_600_000 * 2, 10).await.unwrap(),
        0,
        "a caller's clock far ahead deletes nothing the store's clock keeps"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let later = store.now();
    assert_eq!(store.sweep(later, 10).await.unwrap(), 10, "one batch");
    assert_eq!(store.sweep(later, 10).await.unwrap(), 10);
    assert_eq!(store.sweep(later, 10).await.unwrap(), 5);
    assert_eq!(
        store.sweep(later, 10).await.unwrap(),
        0,
        "live records stay"
    );
    let kept = RecordKey::new(
        &Scope::anonymous(),
        &IdempotencyKey::parse(b"new-3").unwrap(),
    );
    assert!(store
        .get(&kept)
        .await
        .unwrap()
        .is_some_and(|r| r.is_completed()));
}

#[tokio::test]
async fn postgres_sweeps_expired_records_in_batches() {
    let db = TestDb::new("sweep").await;
    let store = PostgresStore::connect(&db.url, PgOptions::default())
        .await
        .unwrap();
    sweeps_only_expired(&store).await;
    assert_eq!(db.count("SELECT count(*) FROM idem_records").await, 5);
}

#[tokio::test]
async fn memory_sweeps_expired_records_in_batches() {
    let store = MemoryStore::new();
    sweeps_only_expired(&store).await;
    assert_eq!(store.len(), 5);
}

/// A sweep reads the expiry index only up to the clock: the last batch of a sweep (fewer
/// expired rows than the batch) used to walk the index of every live record, the
/// clock being a volatile call the index could not stop at. Counted by Postgres: index
/// entries read by one sweep of 20 expired records among 2 000 live ones.
#[tokio::test]
async fn postgres_sweep_reads_the_expiry_index_only_up_to_the_clock() {
    let db = TestDb::new("sweep_bound").await;
    let fill_name = format!("idem-sweep-fill-{}", std::process::id());
    let store = PostgresStore::connect(&db.url_named(&fill_name), PgOptions::default())
        .await
        .unwrap();
    let now = store.now();
    fill(&store, 20, "old", now, 1).await;
    fill(&store, 2_000, "live", now, 3_600_000).await;
    drop(store);
    db.wait_sessions_gone(&fill_name).await;
    db.exec("ALTER TABLE idem_records SET (autovacuum_enabled = off); ANALYZE idem_records")
        .await;
    let index = Some("idem_records_expires_at");
    let before = db.table_stat(index, "idx_tup_read").await;

    let sweep_name = format!("idem-sweep-{}", std::process::id());
    let store = PostgresStore::connect(&db.url_named(&sweep_name), PgOptions::default())
        .await
        .unwrap();
    assert_eq!(store.sweep(store.now(), 1_000).await.unwrap(), 20);
    drop(store);
    db.wait_sessions_gone(&sweep_name).await;
    let read = db.table_stat(index, "idx_tup_read").await - before;
    idem_tests::report(
        "postgres-plans",
        &format!(
            "one sweep of 20 expired among 2 000 live records read {read} expiry-index entries"
        ),
    );
    assert!(
        (20..200).contains(&read),
        "one sweep read {read} entries of the expiry index to delete 20 of 2 020 records"
    );
    assert_eq!(db.count("SELECT count(*) FROM idem_records").await, 2_000);
}
