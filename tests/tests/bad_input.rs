//! Bad input gets a clear 4xx problem and changes nothing: no charge, no record.

use idem_tests::{charge_body, client, TestDb, TestOrigin};

async fn origin(db: &TestDb) -> TestOrigin {
    TestOrigin::start(&[
        "--store",
        "postgres",
        "--database-url",
        &db.url,
        "--max-body-bytes",
        "65536",
    ])
    .await
}

async fn assert_untouched(db: &TestDb) {
    assert_eq!(db.charges().await, 0, "no charge");
    assert_eq!(
        db.count("SELECT count(*) FROM idem_records").await,
        0,
        "no record"
    );
}

async fn problem(res: reqwest::Response, status: u16, kind: &str) {
    assert_eq!(res.status().as_u16(), status);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let p: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        p["type"],
        format!("https://github.com/idem-rs/idem/blob/main/docs/problems.md#{kind}")
    );
    assert_eq!(p["status"], status);
    assert!(
        p["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "a detail says what to fix"
    );
}

#[tokio::test]
async fn malformed_keys_are_400_and_change_nothing() {
    let db = TestDb::new("badkey").await;
    let origin = origin(&db).await;
    let http = client();
    let long = "k".repeat(256);
    let long_quoted = format!("\"{}\"", "k".repeat(256));
    let bad: Vec<&[u8]> = vec![
        b"",
        b"   ",
        b"\"\"",
        long.as_bytes(),
        long_quoted.as_bytes(),
        "caf\u{e9}".as_bytes(),
        b"\"caf\xc3\xa9\"",
        b"\"unterminated",
        b"\"bad \\n escape\"",
        b"\"a\" trailing",
        b"two words",
        b"a,b",
    ];
    for key in bad {
        let res = http
            .post(origin.url("/v1/charges"))
            .header(
                "idempotency-key",
                reqwest::header::HeaderValue::from_bytes(key).unwrap(),
            )
            .header("content-type", "application/json")
            .body(charge_body("c", 100, 0))
            .send()
            .await
            .unwrap();
        problem(res, 400, "idempotency-key-malformed").await;
    }
    let two = http
        .post(origin.url("/v1/charges"))
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .header("content-type", "application/json")
        .body(charge_body("c", 100, 0))
        .send()
        .await
        .unwrap();
    problem(two, 400, "idempotency-key-malformed").await;
    assert_untouched(&db).await;
}

#[tokio::test]
async fn oversize_bodies_are_413_with_or_without_a_content_length() {
    let db = TestDb::new("bigbody").await;
    let origin = origin(&db).await;
    let http = client();
    let big = format!(
        "{{\"amount\":1,\"currency\":\"usd\",\"customer\":\"{}\"}}",
        "x".repeat(100_000)
    );
    let res = http
        .post(origin.url("/v1/charges"))
        .header("idempotency-key", "big-1")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    problem(res, 413, "body-too-large").await;
    // Streamed (chunked, no Content-Length): cut off at the limit while reading.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
        .as_bytes()
        .chunks(8192)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let res = http
        .post(origin.url("/v1/charges"))
        .header("idempotency-key", "big-2")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    problem(res, 413, "body-too-large").await;
    assert_untouched(&db).await;
}

#[tokio::test]
async fn invalid_bodies_are_400_no_store_and_leave_no_live_record() {
    let db = TestDb::new("badbody").await;
    let origin = origin(&db).await;
    let http = client();
    let deep = "[".repeat(10_000);
    for (i, body) in [
        "not json",
        "",
        "[]",
        "{\"amount\":\"100\",\"currency\":\"usd\",\"customer\":\"c\"}",
        "{\"amount\":1e400,\"currency\":\"usd\",\"customer\":\"c\"}",
        "{\"amount\":100,\"currency\":\"usd\",\"customer\":\"c\",\"simulate_latency_ms\":-1}",
        deep.as_str(),
        "\u{0}\u{1}\u{2}",
    ]
    .into_iter()
    .enumerate()
    {
        let res = http
            .post(origin.url("/v1/charges"))
            .header("idempotency-key", format!("body-{i}"))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 400, "{body:.40}");
        assert_eq!(res.headers()["cache-control"], "no-store");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
    }
    assert_eq!(db.charges().await, 0);
    assert_eq!(
        db.live_records().await,
        0,
        "rejected requests leave the key free"
    );
}

#[tokio::test]
async fn unknown_routes_are_404_problems() {
    let db = TestDb::new("notfound").await;
    let origin = origin(&db).await;
    let res = client()
        .post(origin.url("/v1/refunds"))
        .header("idempotency-key", "x")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let res = client()
        .get(origin.url("/v1/charges"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400, "listing needs a customer");
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let res = client()
        .get(origin.url("/v1/charges?customer=a&customer=b"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400, "a query that does not deserialize");
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let res = client()
        .put(origin.url("/v1/charges"))
        .header("idempotency-key", "x")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 405);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert_untouched(&db).await;
}

/// `Demo-Fault` is refused — `400`, the key left free, nothing charged — unless the
/// origin runs with `--demo-faults`; an unknown fault is refused even then.
#[tokio::test]
async fn demo_faults_are_refused_unless_enabled() {
    let db = TestDb::new("faults_off").await;
    let origin = origin(&db).await;
    let http = client();
    let send = |url: String, fault: &'static str| {
        http.post(url)
            .header("idempotency-key", "fault-1")
            .header("content-type", "application/json")
            .header("demo-fault", fault)
            .body(charge_body("c", 100, 0))
            .send()
    };
    let res = send(origin.url("/v1/charges"), "abort-after-charge")
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 400);
    let p: serde_json::Value = res.json().await.unwrap();
    assert_eq!(p["type"], "urn:idem:demo:problem:invalid-fault");
    assert!(
        p["detail"].as_str().unwrap().contains("--demo-faults"),
        "{p}"
    );
    let on_db = TestDb::new("faults_on").await;
    let on = TestOrigin::start(&[
        "--store",
        "postgres",
        "--database-url",
        &on_db.url,
        "--demo-faults",
    ])
    .await;
    let res = send(on.url("/v1/charges"), "explode").await.unwrap();
    assert_eq!(res.status().as_u16(), 400);
    let p: serde_json::Value = res.json().await.unwrap();
    assert!(
        p["detail"].as_str().unwrap().contains("unknown Demo-Fault"),
        "{p}"
    );
    for db in [&db, &on_db] {
        assert_eq!(db.charges().await, 0, "no charge");
        assert_eq!(db.live_records().await, 0, "the key was released");
    }
    // The key stayed free: the same key without the header charges once.
    let ok = http
        .post(origin.url("/v1/charges"))
        .header("idempotency-key", "fault-1")
        .header("content-type", "application/json")
        .body(charge_body("c", 100, 0))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 201);
    assert_eq!(db.charges().await, 1);
}
