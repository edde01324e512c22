//! A holder that dies mid-handler: after its lease, the retry executes exactly once,
//! under a higher fencing token, and the dead holder's late writes are refused.

use idem::PgOptions;
use idem::{HolderWrite, PostgresStore, StoreExt};
use idem_core::{
    Decision, Fingerprint, IdempotencyKey, Policy, RecordKey, RequestParts, Scope, StoredResponse,
};
use idem_tests::{charge_body, client, post_charge, report, OriginProcess, TestDb, TestOrigin};
use std::time::{Duration, Instant};

async fn record_token(db: &TestDb) -> (i64, i16) {
    let row = db
        .client()
        .await
        .query_one("SELECT token, state FROM idem_records", &[])
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_is_taken_over_after_its_lease_and_charged_once() {
    let db = TestDb::new("kill9").await;
    let (mut holder, holder_url) = OriginProcess::spawn(&[
        "--store",
        "postgres",
        "--database-url",
        &db.url,
        "--lease",
        "1s",
    ])
    .await;
    let body = charge_body("c", 100, 1500);
    let doomed = tokio::spawn({
        let body = body.clone();
        async move {
            post_charge(&client(), &holder_url, Some("to-1"), &body)
                .await
                .status()
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (dead_token, state) = record_token(&db).await;
    assert_eq!(state, 0, "the holder claimed the key");
    holder.kill().unwrap(); // SIGKILL, mid-handler, before it charged
    holder.wait().unwrap();
    assert!(doomed.await.is_err() || db.charges().await == 0);

    let survivor = TestOrigin::start(&[
        "--store",
        "postgres",
        "--database-url",
        &db.url,
        "--lease",
        "1s",
    ])
    .await;
    let http = client();
    let early = post_charge(&http, &survivor.url(""), Some("to-1"), &body).await;
    assert_eq!(early.status(), 409, "the dead holder's lease still runs");

    let started = Instant::now();
    let res = http
        .post(survivor.url("/v1/charges"))
        .header("idempotency-key", "to-1")
        .header("content-type", "application/json")
        .header("prefer", "wait=10")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    assert!(
        res.headers().get("idempotent-replayed").is_none(),
        "the retry executed itself"
    );
    let (token, state) = record_token(&db).await;
    assert_eq!(state, 1);
    assert!(
        token > dead_token,
        "fencing token {token} must exceed the dead holder's {dead_token}"
    );
    assert_eq!(db.charges_for("to-1").await, 1);
    let replay = post_charge(&http, &survivor.url(""), Some("to-1"), &body).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(db.charges_for("to-1").await, 1);
    report(
        "takeover",
        &format!(
            "kill -9 holder (token {dead_token}) mid-handler -> 409 before lease end, takeover after {:?} (token {token}), 1 charge",
            started.elapsed()
        ),
    );
}

#[tokio::test]
async fn a_fenced_holder_cannot_complete_renew_or_release() {
    let db = TestDb::new("fenced").await;
    let store = PostgresStore::connect(&db.url, PgOptions::default())
        .await
        .unwrap();
    let body = charge_body("c", 100, 0);
    let key = IdempotencyKey::parse(b"late-1").unwrap();
    let record_key = RecordKey::new(&Scope::anonymous(), &key);
    let fingerprint = Fingerprint::of(&RequestParts {
        method: "POST",
        path_and_query: "/v1/charges",
        content_type: Some("application/json"),
        body: body.as_bytes(),
    });
    // A holder claims with a short lease, then stalls (a long GC pause, a partition).
    let short = Policy {
        lease_ms: 300,
        ttl_ms: 60_000,
    };
    let Decision::Execute(stale) = store
        .claim(&record_key, &fingerprint, idem::now(), &short)
        .await
        .unwrap()
    else {
        panic!("first claim executes");
    };
    tokio::time::sleep(Duration::from_millis(400)).await;

    let origin = TestOrigin::start(&["--store", "postgres", "--database-url", &db.url]).await;
    let http = client();
    let res = post_charge(&http, &origin.url(""), Some("late-1"), &body).await;
    assert_eq!(res.status(), 201, "the retry took over");
    let winner = res.text().await.unwrap();

    // The stalled holder wakes up and tries to write.
    let late = StoredResponse {
        status: 201,
        headers: vec![],
        body: b"{\"id\":\"from the dead\"}".to_vec(),
    };
    let now = idem::now();
    let refused = store
        .complete(&record_key, &stale.holder(), late, now, &short)
        .await
        .unwrap();
    assert!(
        matches!(
            refused,
            HolderWrite::Refused(idem_core::Refusal::Fenced { .. })
        ),
        "{refused:?}"
    );
    assert!(!store
        .heartbeat(&record_key, &stale.holder(), now, &short)
        .await
        .unwrap()
        .is_written());
    assert!(!store
        .release(&record_key, &stale.holder(), now, &short)
        .await
        .unwrap()
        .is_written());

    let replay = post_charge(&http, &origin.url(""), Some("late-1"), &body).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(
        replay.text().await.unwrap(),
        winner,
        "the late completion changed nothing"
    );
    assert_eq!(db.charges_for("late-1").await, 1);
}

#[tokio::test]
async fn a_live_holder_keeps_its_claim_past_the_lease_by_heartbeats() {
    let db = TestDb::new("heartbeat").await;
    let origin = TestOrigin::start(&[
        "--store",
        "postgres",
        "--database-url",
        &db.url,
        "--lease",
        "600ms",
    ])
    .await;
    let http = client();
    let body = charge_body("c", 100, 2000);
    let first = tokio::spawn({
        let (http, url, body) = (http.clone(), origin.url(""), body.clone());
        async move { post_charge(&http, &url, Some("hb-1"), &body).await.status() }
    });
    // Well past several leases, the holder is alive and renewing: no takeover.
    let mut in_flight = 0;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let s = post_charge(&http, &origin.url(""), Some("hb-1"), &body)
            .await
            .status();
        assert_eq!(s, 409, "a live holder must not be taken over");
        in_flight += 1;
    }
    assert_eq!(first.await.unwrap(), 201);
    assert_eq!(db.charges_for("hb-1").await, 1);
    report("takeover", &format!("live holder, 600 ms lease, 2 s handler: {in_flight} retries over 1.5 s all 409, 1 charge"));
}
