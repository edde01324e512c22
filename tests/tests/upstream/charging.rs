//! Charged once in the upstream's own database, whatever the race, the answer or the client.

use super::*;

/// 200 keys × 16 concurrent retries through the proxy: 200 charges in the upstream's
/// own database, every retry refused in flight or replayed, and each charge carrying
/// the claim's fencing token and downstream key — never the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_proxy_charges_once_per_key_in_the_upstream_s_own_database() {
    let payments = Payments::start().await;
    let origin = proxy(&payments, &[]).await;
    let url = origin.url("/v1/charges");
    let http = client();
    let barrier = Arc::new(Barrier::new(KEYS * RETRIES));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..KEYS {
        for _ in 0..RETRIES {
            let (http, url, barrier) = (http.clone(), url.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let res = http
                    .post(&url)
                    .header("idempotency-key", format!("px-{i}"))
                    .header("content-type", "application/json")
                    // Forged: the upstream must get idem's token, not this.
                    .header("idem-fencing-token", "1")
                    .body(charge_body(&format!("cus-p{i}"), 100, 200))
                    .send()
                    .await
                    .expect("the proxy answers");
                let replayed = res.headers().contains_key("idempotent-replayed");
                format!(
                    "{} {}",
                    res.status().as_u16(),
                    if replayed { "replayed" } else { "first" }
                )
            }));
        }
    }
    let mut answers = BTreeMap::new();
    for t in tasks {
        *answers.entry(t.await.unwrap()).or_insert(0) += 1;
    }
    let race_time = started.elapsed();
    let charges = payments.count("SELECT count(*) FROM charges");
    let keys = payments.count("SELECT count(DISTINCT idempotency_key) FROM charges");
    let forged = payments.count("SELECT count(*) FROM charges WHERE fencing_token = '1'");
    let fenced = payments.count(
        "SELECT count(*) FROM charges WHERE CAST(fencing_token AS INTEGER) > 1000 AND downstream_key LIKE 'idem_%'",
    );

    // Every retry now replays the first answer, Location included, Set-Cookie not.
    let mut replays = 0;
    let mut cookies = 0;
    for i in (0..KEYS).step_by(20) {
        let res = post(
            &http,
            &url,
            &format!("px-{i}"),
            charge_body(&format!("cus-p{i}"), 100, 200),
        )
        .await;
        assert_eq!(res.status(), 201);
        replays += usize::from(res.headers().contains_key("idempotent-replayed"));
        cookies += res.headers().get_all("set-cookie").iter().count();
        let location = res.headers()["location"].to_str().unwrap().to_owned();
        let id = serde_json::from_str::<serde_json::Value>(&res.text().await.unwrap()).unwrap()
            ["id"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(location, format!("/v1/charges/{id}"));
    }
    report(
        "upstream",
        &format!(
            "{KEYS} keys x {RETRIES} retries through idem-origin --upstream (Python + SQLite) in {race_time:?}: \
             answers {answers:?}; the upstream's database: {charges} charges for {keys} keys, \
             {fenced} with idem's fencing token and downstream key, {forged} with the client's forged token; \
             later retries: {replays}/10 replayed, {cookies} Set-Cookie replayed"
        ),
    );
    assert_eq!(charges, KEYS as i64, "one charge per key: {answers:?}");
    assert_eq!(keys, KEYS as i64);
    assert_eq!(forged, 0);
    assert_eq!(fenced, KEYS as i64);
    let first = answers.get("201 first").copied().unwrap_or(0);
    let refused = answers.get("409 first").copied().unwrap_or(0);
    let replayed = answers.get("201 replayed").copied().unwrap_or(0);
    assert_eq!(first, KEYS, "{answers:?}");
    assert_eq!(first + refused + replayed, KEYS * RETRIES, "{answers:?}");
    assert_eq!(replays, 10);
    assert_eq!(cookies, 0, "Set-Cookie is not replayed unless configured");
}

/// The upstream's 500 and 504 are its answers, replayed, never re-sent; a client that
/// gives up before the upstream answers does not stop the charge, and its retry gets
/// the answer it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_answers_and_a_client_that_leaves_still_gets_its_charge() {
    let payments = Payments::start().await;
    let origin = proxy(&payments, &[]).await;
    let http = client();
    let mut seen = Vec::new();
    for status in [500u16, 504] {
        let key = format!("fail-{status}");
        for _ in 0..2 {
            let res = post(
                &http,
                &origin.url(&format!("/v1/fail/{status}")),
                &key,
                "{}".into(),
            )
            .await;
            seen.push((
                res.status().as_u16(),
                res.headers().contains_key("idempotent-replayed"),
            ));
        }
        seen.push((payments.calls_for(&key) as u16, false));
    }

    // The client's own timeout is 300 ms; the charge takes 1.5 s.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let body = charge_body("c-gone", 100, 1_500);
    let gave_up = impatient
        .post(origin.url("/v1/charges"))
        .header("idempotency-key", "gone-1")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await;
    let timed_out = gave_up.as_ref().is_err_and(reqwest::Error::is_timeout);
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    // (Prefer: wait, in case the charge is still running on a slow machine.)
    let retry = http
        .post(origin.url("/v1/charges"))
        .header("idempotency-key", "gone-1")
        .header("content-type", "application/json")
        .header("prefer", "wait=10")
        .body(body)
        .send()
        .await
        .unwrap();
    let retry_status = retry.status().as_u16();
    let retry_replayed = retry.headers().contains_key("idempotent-replayed");
    let (charges, calls) = (payments.charges_for("gone-1"), payments.calls_for("gone-1"));
    report(
        "upstream",
        &format!(
            "500 then its retry, calls: {:?}; 504: {:?}; a client that gave up after 300 ms on a 1.5 s charge: \
             timed out={timed_out}, its retry 2 s later (Prefer: wait=10) {retry_status} replayed={retry_replayed}, {charges} charge, {calls} call",
            &seen[..3],
            &seen[3..]
        ),
    );
    assert_eq!(
        seen,
        [
            (500, false),
            (500, true),
            (1, false),
            (504, false),
            (504, true),
            (1, false)
        ]
    );
    assert!(timed_out, "the client gave up: {gave_up:?}");
    assert_eq!(
        (retry_status, retry_replayed),
        (201, true),
        "the charge finished without its client"
    );
    assert_eq!((charges, calls), (1, 1));
}

/// Requests idem does not guard pass through, and idem's own routes stay its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_passes_through_what_it_does_not_guard() {
    let payments = Payments::start().await;
    let origin = proxy(&payments, &[]).await;
    let http = client();
    let health = http.get(origin.url("/healthz")).send().await.unwrap();
    let health_body = health.text().await.unwrap();
    let missing = http.get(origin.url("/v1/nowhere")).send().await.unwrap();
    let missing_status = missing.status().as_u16();
    let no_key = http
        .post(origin.url("/v1/charges"))
        .header("content-type", "application/json")
        .body(charge_body("c", 1, 0))
        .send()
        .await
        .unwrap();
    let no_key_status = no_key.status().as_u16();
    let no_key_type = problem_type(&no_key.text().await.unwrap());
    report(
        "upstream",
        &format!(
            "pass-through: /healthz {health_body:?} (idem's), GET /v1/nowhere {missing_status} (the upstream's), \
             POST /v1/charges without a key {no_key_status} {no_key_type}"
        ),
    );
    assert_eq!(health_body, "ok\n", "idem's own /healthz");
    assert_eq!(missing_status, 404, "the upstream's 404");
    assert_eq!(no_key_status, 400);
    assert_eq!(
        no_key_type,
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#idempotency-key-missing"
    );
    assert_eq!(payments.count("SELECT count(*) FROM charges"), 0);
}

/// Proxy mode keeps to its own tables: the database is the user's, and the demo's
/// `charges` table (and its readiness check) has no place in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_mode_leaves_the_user_s_database_alone() {
    let payments = Payments::start().await;
    let db = idem_tests::TestDb::new("proxy_tables").await;
    let origin = proxy(
        &payments,
        &["--store", "postgres", "--database-url", &db.url],
    )
    .await;
    let ready: serde_json::Value = client()
        .get(origin.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tables = db
        .count(&format!(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{}' AND table_name = 'charges'",
            db.schema
        ))
        .await;
    report(
        "upstream",
        &format!("proxy mode on Postgres: a charges table in the user's schema: {tables}; /readyz {ready}"),
    );
    assert_eq!(tables, 0, "no demo table in the user's database");
    assert!(ready.get("ledger").is_none(), "{ready}");
    assert_eq!(ready["ready"], true);
}

/// What the upstream refused before acting frees the key: a charge that failed its
/// validation (400) is corrected and sent again with the same key, and runs; a rate
/// limit (429) is not replayed; a 500 stays the request's result. With
/// `--release-on none` the 400 is stored as before, and the correction gets 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_s_refusals_free_the_key_and_its_failures_stay() {
    let payments = Payments::start().await;
    let http = client();
    let replayed = |res: &reqwest::Response| res.headers().contains_key("idempotent-replayed");
    let mut seen = BTreeMap::new();
    for (label, extra) in [
        ("default", &[][..]),
        ("none", &["--release-on", "none"][..]),
    ] {
        let origin = proxy(&payments, extra).await;
        let key = format!("fix-{label}");
        let invalid = post(
            &http,
            &origin.url("/v1/charges"),
            &key,
            charge_body(label, -5, 0),
        )
        .await;
        let invalid = invalid.status().as_u16();
        let corrected = post(
            &http,
            &origin.url("/v1/charges"),
            &key,
            charge_body(label, 500, 0),
        )
        .await;
        let corrected = (corrected.status().as_u16(), replayed(&corrected));
        let again = post(
            &http,
            &origin.url("/v1/charges"),
            &key,
            charge_body(label, 500, 0),
        )
        .await;
        let again = (again.status().as_u16(), replayed(&again));
        let mut limited = Vec::new();
        for _ in 0..2 {
            let key = format!("rate-{label}");
            let res = post(&http, &origin.url("/v1/fail/429"), &key, "{}".into()).await;
            limited.push((res.status().as_u16(), replayed(&res)));
        }
        let mut failed = Vec::new();
        for _ in 0..2 {
            let key = format!("crash-{label}");
            let res = post(&http, &origin.url("/v1/fail/500"), &key, "{}".into()).await;
            failed.push((res.status().as_u16(), replayed(&res)));
        }
        let counts = (
            payments.charges_for(&key),
            payments.calls_for(&key),
            payments.calls_for(&format!("rate-{label}")),
            payments.calls_for(&format!("crash-{label}")),
        );
        report(
            "upstream",
            &format!(
                "release on ({label}): invalid charge {invalid}, corrected with the same key {corrected:?}, \
                 again {again:?}; 429 twice {limited:?}; 500 twice {failed:?}; \
                 (charges, calls) for the key {:?}, 429 calls {}, 500 calls {}",
                (counts.0, counts.1),
                counts.2,
                counts.3
            ),
        );
        seen.insert(label, (invalid, corrected, again, limited, failed, counts));
    }
    assert_eq!(
        seen["default"],
        (
            400,
            (201, false),
            (201, true),
            vec![(429, false), (429, false)],
            vec![(500, false), (500, true)],
            (1, 2, 2, 1)
        ),
        "by default the 400 and the 429 free the key; the 500 is stored"
    );
    assert_eq!(
        seen["none"],
        (
            400,
            (422, false),
            (422, false),
            vec![(429, false), (429, true)],
            vec![(500, false), (500, true)],
            (0, 1, 1, 1)
        ),
        "--release-on none stores every answer"
    );
}
