//! Races through the edge: many retries of many keys at once, charged once each, with the edge in front of the origin and of proxy mode.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_edge_charges_once_replays_and_survives_losing_its_state() {
    let db = TestDb::new("edge").await;
    let origin = TestOrigin::start(&["--store", "postgres", "--database-url", &db.url]).await;
    // The edge holds no heartbeat: a forward slower than its lease (800 requests on a
    // loaded 2-core machine can take 5 s) lets a retry claim and forward again, which
    // the origin answers. A lease longer than any forward here makes the edge's own
    // work exact.
    let edge = Edge::start(&origin.url(""), &[("LEASE_MS", "60000")]).await;
    let http = client();
    let started = Instant::now();

    // Race: every key's retries released together, through the edge.
    let race = race_through_edge(&http, &edge.base, "edge-", "cus-e", 300).await;
    let race_time = started.elapsed();
    assert_eq!(
        db.charges().await,
        KEYS as i64,
        "exactly one charge per key through the edge"
    );
    // The edge itself did the work (an edge that forwarded everything would pass the
    // charge count alone: the origin dedups too).
    let EdgeShare {
        forwarded,
        at_edge,
        runtime_own,
    } = EdgeShare::of(&race);
    // With the lease outlasting every forward, a key is forwarded at most once (a
    // forward whose client got the runtime's 503 is counted among those); every
    // answer is accounted for (nothing degraded); most retries end at the edge.
    assert!(forwarded <= KEYS, "{race:?}");
    assert!(forwarded + runtime_own >= KEYS, "{race:?}");
    assert_eq!(
        forwarded + at_edge + runtime_own,
        KEYS * RETRIES,
        "{race:?}"
    );
    assert!(
        at_edge >= KEYS * (RETRIES - 1) / 2,
        "the edge answered the retries: {race:?}"
    );

    // Replays at the edge, with the header; mismatch and malformed keys refused there.
    let mut replays = BTreeMap::new();
    let mut first_ids = Vec::new();
    for i in 0..KEYS {
        let res = post(
            &http,
            &edge.base,
            &format!("edge-{i}"),
            charge_body(&format!("cus-e{i}"), 100, 300),
            true,
        )
        .await;
        assert_eq!(res.status(), 201);
        assert_eq!(res.headers()["idempotent-replayed"], "true");
        tally(&mut replays, &res);
        let json: serde_json::Value = res.json().await.unwrap();
        first_ids.push(json["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        replays.get("201 replayed").copied(),
        Some(KEYS),
        "every retry replayed by the edge: {replays:?}"
    );
    let mismatch = post(
        &http,
        &edge.base,
        "edge-0",
        charge_body("cus-e0", 999, 0),
        false,
    )
    .await;
    assert_eq!(mismatch.status(), 422);
    assert_eq!(
        mismatch.headers()["idem-edge"],
        "refused",
        "a 422 of the edge's own"
    );
    assert_eq!(
        mismatch.headers()["content-type"],
        "application/problem+json"
    );
    let malformed = post(
        &http,
        &edge.base,
        "two words",
        charge_body("c", 1, 0),
        false,
    )
    .await;
    assert_eq!(malformed.status(), 400);
    assert_eq!(
        malformed.headers()["idem-edge"],
        "refused",
        "a 400 of the edge's own"
    );
    let problem: serde_json::Value = malformed.json().await.unwrap();
    assert_eq!(
        problem["type"],
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#idempotency-key-malformed"
    );
    // A 400 the origin released is not kept at the edge: the corrected retry through
    // the edge runs (not a 422 for a different body, not the 400 replayed).
    let bad = post(
        &http,
        &edge.base,
        "edge-fix",
        r#"{"amount":-1,"currency":"usd","customer":"c"}"#.to_owned(),
        false,
    )
    .await;
    assert_eq!(bad.status(), 400);
    assert!(bad.headers().get("idem-disposition").is_none());
    let fixed = post(&http, &edge.base, "edge-fix", charge_body("c", 1, 0), false).await;
    assert_eq!(fixed.status(), 201, "the corrected retry runs");
    assert!(fixed.headers().get("idempotent-replayed").is_none());
    assert_eq!(db.charges_for("edge-fix").await, 1);
    let missing = http
        .post(format!("{}/v1/charges", edge.base))
        .body(charge_body("c", 1, 0))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 400);

    // A new edge with empty state: every retry goes to the origin, which replays. This
    // one stores nothing above 10 bytes, so it keeps sending retries on to the origin.
    drop(edge);
    let fresh = Edge::start(&origin.url(""), &[("MAX_STORED_BODY_BYTES", "10")]).await;
    let mut after = BTreeMap::new();
    for (i, id) in first_ids.iter().enumerate() {
        let res = post(
            &http,
            &fresh.base,
            &format!("edge-{i}"),
            charge_body(&format!("cus-e{i}"), 100, 300),
            true,
        )
        .await;
        assert_eq!(res.status(), 201);
        assert_eq!(
            res.headers()["idempotent-replayed"],
            "true",
            "the origin replays what the edge forgot"
        );
        tally(&mut after, &res);
        let json: serde_json::Value = res.json().await.unwrap();
        assert_eq!(
            json["id"].as_str(),
            Some(id.as_str()),
            "the same charge as before"
        );
    }
    assert_eq!(
        db.charges().await - db.charges_for("edge-fix").await,
        KEYS as i64,
        "still one charge per key"
    );
    let again = post(
        &http,
        &fresh.base,
        "edge-0",
        charge_body("cus-e0", 100, 300),
        false,
    )
    .await;
    assert_eq!(
        again.headers()["idem-edge"],
        "forwarded",
        "a response above the size cap is not kept at the edge"
    );
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    report(
        "edge",
        &format!(
            "{KEYS} keys x {RETRIES} retries through wrangler dev/workerd -> {} charges in {race_time:.1?}; answers {race:?}; retries {replays:?}; after an edge restart with empty state {after:?}; charges still {}",
            KEYS,
            KEYS
        ),
    );
    let doubled = db
        .count("SELECT count(*) FROM (SELECT idempotency_key FROM charges GROUP BY 1 HAVING count(*) > 1) d")
        .await;
    assert_eq!(doubled, 0);
    let tallied = |m: &BTreeMap<String, usize>| proof::counts(m.iter().map(|(k, n)| (k, *n)));
    let answers = format!(
        "{} (status and what the edge did); retries: {}; after an edge restart with empty state: {}",
        tallied(&race),
        tallied(&replays),
        tallied(&after)
    );
    proof::record(
        "race",
        "edge",
        &[&KEYS.to_string(), &doubled.to_string(), &answers],
    );
}

/// An origin slower than the edge's lease: a retry past the lease takes the key over at
/// the edge and reaches the origin, which refuses it (409, its own lease is live) and
/// charges once; the first holder's late completion is fenced out at the edge, the key
/// is freed, and the next retry is replayed — by the origin, then by the edge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_origin_past_the_edge_lease_still_charges_once() {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let (origin, ledger) = TestOrigin::demo_on(store).await;
    let edge = Edge::start(&origin.url(""), &[("LEASE_MS", "1000")]).await;
    let http = client();
    let body = charge_body("cus-slow", 100, 5_000);
    let first = {
        let (http, base, body) = (http.clone(), edge.base.clone(), body.clone());
        tokio::spawn(async move { post(&http, &base, "slow-1", body, false).await })
    };
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let mut answers = Vec::new();
    let mut seen = |res: &reqwest::Response| {
        answers.push(format!(
            "{} {} {}",
            res.status().as_u16(),
            res.headers()["idem-edge"].to_str().unwrap(),
            res.headers()
                .get("idempotent-replayed")
                .map_or("first", |_| "replayed")
        ))
    };
    let past_lease = post(&http, &edge.base, "slow-1", body.clone(), false).await;
    seen(&past_lease);
    let first = first.await.unwrap();
    seen(&first);
    for _ in 0..2 {
        let retry = post(&http, &edge.base, "slow-1", body.clone(), false).await;
        seen(&retry);
    }
    let charges = ledger.len();
    report(
        "edge",
        &format!("an origin taking 5 s behind a 1 s edge lease: {answers:?}; {charges} charge"),
    );
    assert_eq!(
        answers,
        [
            "409 forwarded first",
            "201 forwarded first",
            "201 forwarded replayed",
            "201 replayed replayed"
        ]
    );
    assert_eq!(charges, 1);
}

/// The whole chain, in front of an API that knows nothing about idempotency: the
/// worker under workerd → `idem-origin --upstream` → the Python payments API. 100 keys
/// × 8 concurrent retries through the edge: 100 rows in the upstream's own database,
/// every retry answered at the edge, then replayed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_edge_and_the_proxy_charge_once_in_front_of_any_api() {
    let (payments, origin) = proxy_to_payments(&[]).await;
    let edge = Edge::start(&origin.url(""), &[("LEASE_MS", "60000")]).await;
    let http = client();
    let race = race_through_edge(&http, &edge.base, "chain-", "cus-c", 200).await;
    let charges = payments.count("SELECT count(*) FROM charges");
    let keys = payments.count("SELECT count(DISTINCT idempotency_key) FROM charges");
    let calls = payments.count("SELECT count(*) FROM calls");
    let mut replays = BTreeMap::new();
    for i in 0..KEYS {
        let res = post(
            &http,
            &edge.base,
            &format!("chain-{i}"),
            charge_body(&format!("cus-c{i}"), 100, 200),
            false,
        )
        .await;
        tally(&mut replays, &res);
    }
    let calls_after = payments.count("SELECT count(*) FROM calls");
    report(
        "edge",
        &format!(
            "edge -> idem-origin --upstream -> Python payments API, {KEYS} keys x {RETRIES} retries: \
             answers {race:?}; the upstream's database: {charges} charges for {keys} keys, {calls} calls; \
             retries after: {replays:?}, calls then {calls_after}"
        ),
    );
    assert_eq!(charges, KEYS as i64, "one charge per key: {race:?}");
    assert_eq!(keys, KEYS as i64);
    assert_eq!(calls, KEYS as i64, "the upstream saw each key once");
    let EdgeShare {
        forwarded,
        at_edge,
        runtime_own,
    } = EdgeShare::of(&race);
    assert!(forwarded <= KEYS, "{race:?}");
    assert_eq!(
        forwarded + at_edge + runtime_own,
        KEYS * RETRIES,
        "{race:?}"
    );
    assert!(at_edge >= KEYS * (RETRIES - 1) / 2, "{race:?}");
    assert_eq!(
        replays.get("201 replayed").copied(),
        Some(KEYS),
        "every retry replayed by the edge: {replays:?}"
    );
    assert_eq!(calls_after, calls, "replays never reach the upstream");
}
