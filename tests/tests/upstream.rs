//! Proxy mode end to end: `idem-origin --upstream` in front of a payments API written
//! in Python (standard library and SQLite: tests/upstream/payments.py) that knows
//! nothing about idempotency. Every count is read from the upstream's own database.

use idem_tests::{charge_body, client, proof, raw_request, report, Payments, TestOrigin};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;

/// idem in front of `payments`, a key required on `/v1/*`. Its callers send no
/// identity, so they share the anonymous scope unless `extra` says otherwise.
async fn proxy(payments: &Payments, extra: &[&str]) -> TestOrigin {
    let url = payments.url();
    let mut args = vec!["--upstream", url.as_str(), "--require-key-on", "/v1/*"];
    if !extra.contains(&"--store") {
        args.extend_from_slice(&["--store", "memory"]);
    }
    if !extra
        .iter()
        .any(|a| *a == "--anonymous" || *a == "--scope-from")
    {
        args.extend_from_slice(&["--anonymous", "scoped"]);
    }
    args.extend_from_slice(extra);
    TestOrigin::start(&args).await
}

async fn post(http: &reqwest::Client, url: &str, key: &str, body: String) -> reqwest::Response {
    idem_tests::post_json(http, url, key, body).await
}

fn problem_type(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body).unwrap_or_default()["type"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

const KEYS: usize = 200;
const RETRIES: usize = 16;

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

/// What the upstream did, and what the client and its retry see: a 5xx is the answer
/// (stored); the private release header frees the key (and never reaches the client);
/// an upstream that cannot be reached releases the key; one that took the request
/// and then went silent (killed, or slower than --upstream-timeout) is stored as an
/// unknown outcome and never sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_proxy_stores_what_the_upstream_did_and_never_resends_an_unknown_outcome() {
    let mut payments = Payments::start().await;
    let origin = proxy(&payments, &["--upstream-timeout", "1500ms"]).await;
    let http = client();
    let mut seen = Vec::new();

    // A 503 from the upstream is its answer.
    for _ in 0..2 {
        let res = post(&http, &origin.url("/v1/fail/503"), "fail-1", "{}".into()).await;
        seen.push(format!(
            "503 route: {} {}",
            res.status().as_u16(),
            res.headers().contains_key("idempotent-replayed")
        ));
    }
    let fail_calls = payments.calls_for("fail-1");

    // "Nothing happened": released, the header stripped, the retry reaches it again.
    let mut leaked = false;
    for _ in 0..2 {
        let res = post(&http, &origin.url("/v1/nothing"), "nothing-1", "{}".into()).await;
        leaked |= res.headers().contains_key("idem-release");
        seen.push(format!("release header: {}", res.status().as_u16()));
    }
    let nothing_calls = payments.calls_for("nothing-1");

    // An answer that breaks off part-way: its outcome is unknown, stored as such.
    let mut broken = Vec::new();
    for _ in 0..2 {
        let res = post(&http, &origin.url("/v1/broken"), "broken-1", "{}".into()).await;
        let replayed = res.headers().contains_key("idempotent-replayed");
        let status = res.status().as_u16();
        let text = res.text().await.unwrap_or_default();
        broken.push(format!("{status} {} {replayed}", problem_type(&text)));
    }
    let broken_calls = payments.calls_for("broken-1");

    // Slower than --upstream-timeout: the charge happens, its answer is lost.
    let slow = post(
        &http,
        &origin.url("/v1/charges"),
        "slow-1",
        charge_body("c-slow", 100, 2_500),
    )
    .await;
    let slow_status = slow.status().as_u16();
    let slow_type = problem_type(&slow.text().await.unwrap());
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let slow_retry = post(
        &http,
        &origin.url("/v1/charges"),
        "slow-1",
        charge_body("c-slow", 100, 2_500),
    )
    .await;
    let slow_retry_replayed = slow_retry.headers().contains_key("idempotent-replayed");
    let slow_retry_type = problem_type(&slow_retry.text().await.unwrap());
    let slow_charges = payments.charges_for("slow-1");
    let slow_calls = payments.calls_for("slow-1");

    // Killed while it holds the request: the answer is lost mid-way.
    let killed = {
        let (http, url) = (http.clone(), origin.url("/v1/charges"));
        tokio::spawn(async move {
            post(&http, &url, "killed-1", charge_body("c-killed", 100, 1_000)).await
        })
    };
    // Killed once it has the request.
    let deadline = Instant::now() + Duration::from_secs(10);
    while payments.calls_for("killed-1") == 0 {
        assert!(
            Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    payments.kill();
    let killed = killed.await.unwrap();
    let killed_status = killed.status().as_u16();
    let killed_type = problem_type(&killed.text().await.unwrap());

    // Down: nothing is sent, the key is released.
    let down = post(
        &http,
        &origin.url("/v1/charges"),
        "down-1",
        charge_body("c-down", 100, 0),
    )
    .await;
    let down_status = down.status().as_u16();
    let down_type = problem_type(&down.text().await.unwrap());

    payments.spawn().await;
    let killed_retry = post(
        &http,
        &origin.url("/v1/charges"),
        "killed-1",
        charge_body("c-killed", 100, 1_000),
    )
    .await;
    let killed_retry_replayed = killed_retry.headers().contains_key("idempotent-replayed");
    let killed_retry_type = problem_type(&killed_retry.text().await.unwrap());
    let killed_calls = payments.calls_for("killed-1");
    let down_retry = post(
        &http,
        &origin.url("/v1/charges"),
        "down-1",
        charge_body("c-down", 100, 0),
    )
    .await;
    let down_retry_status = down_retry.status().as_u16();
    let down_charges = payments.charges_for("down-1");

    report(
        "upstream",
        &format!(
            "outcomes: {seen:?} (upstream calls: 503 route {fail_calls}, release route {nothing_calls}); \
             an answer broken off: {broken:?} ({broken_calls} call); slower than the 1.5 s timeout: {slow_status} {slow_type}, its retry {slow_retry_type} replayed={slow_retry_replayed}, \
             {slow_charges} charge; killed mid-request: {killed_status} {killed_type}, its retry {killed_retry_type} \
             replayed={killed_retry_replayed}, {killed_calls} call; down: {down_status} {down_type}, \
             the retry once up {down_retry_status} with {down_charges} charge"
        ),
    );
    assert_eq!(seen[..2], ["503 route: 503 false", "503 route: 503 true"]);
    assert_eq!(fail_calls, 1, "a 503 is an answer, replayed");
    assert_eq!(seen[2..], ["release header: 409", "release header: 409"]);
    assert_eq!(nothing_calls, 2, "released: the retry reached the upstream");
    assert!(!leaked, "the release header stays private");
    assert_eq!(
        broken[1],
        "502 https://github.com/idem-rs/idem/blob/main/docs/problems.md#handler-failed true",
        "a broken answer is stored as unknown: {broken:?}"
    );
    assert_eq!(broken_calls, 1, "never sent again");

    assert_eq!(slow_status, 502);
    assert_eq!(
        slow_type,
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#upstream-outcome-unknown"
    );
    assert!(slow_retry_replayed);
    assert_eq!(slow_retry_type, slow_type);
    assert_eq!(slow_charges, 1, "charged once");
    assert_eq!(slow_calls, 1, "never sent again");

    assert_eq!(killed_status, 502);
    assert_eq!(
        killed_type,
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#upstream-outcome-unknown"
    );
    assert!(killed_retry_replayed);
    assert_eq!(killed_retry_type, killed_type);
    assert_eq!(killed_calls, 1, "never sent again");

    assert_eq!(down_status, 502);
    assert_eq!(
        down_type,
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#upstream-unreachable"
    );
    assert_eq!(down_retry_status, 201, "released: the retry ran");
    assert_eq!(down_charges, 1);
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

/// With `--upstream-unknown-outcome release`, a lost answer frees the key: the retry
/// is sent again, with the same downstream key — what an upstream that dedups by it
/// needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_unknown_outcome_is_resent_with_the_same_downstream_key() {
    let payments = Payments::start().await;
    let origin = proxy(
        &payments,
        &[
            "--upstream-timeout",
            "1s",
            "--upstream-unknown-outcome",
            "release",
        ],
    )
    .await;
    let http = client();
    let first = post(
        &http,
        &origin.url("/v1/charges"),
        "resend-1",
        charge_body("c-r", 100, 2_000),
    )
    .await;
    let first_status = first.status().as_u16();
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let retry = post(
        &http,
        &origin.url("/v1/charges"),
        "resend-1",
        charge_body("c-r", 100, 0),
    )
    .await;
    let retry_status = retry.status().as_u16();
    let charges = payments.charges_for("resend-1");
    let keys = payments.text(
        "SELECT group_concat(DISTINCT downstream_key) FROM charges WHERE idempotency_key = 'resend-1'",
    );
    report(
        "upstream",
        &format!(
            "unknown outcome released: {first_status}, then the retry {retry_status}; {charges} charges, downstream keys {keys:?}"
        ),
    );
    assert_eq!((first_status, retry_status), (502, 201));
    assert_eq!(charges, 2, "released: sent again");
    assert!(
        keys.starts_with("idem_") && !keys.contains(','),
        "one downstream key for both: {keys}"
    );
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

/// idem killed (SIGKILL) after sending a charge to the upstream, before it could store
/// the answer; restarted, its lease run out: the retry takes the claim over, and must
/// not send the charge again — the upstream may have acted, and this one did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_after_idem_died_mid_request_does_not_send_again() {
    let payments = Payments::start().await;
    let db = idem_tests::TestDb::new("proxy_takeover").await;
    let upstream = payments.url();
    let args = [
        "--upstream",
        upstream.as_str(),
        "--require-key-on",
        "/v1/*",
        "--store",
        "postgres",
        "--database-url",
        db.url.as_str(),
        "--lease",
        "2s",
        "--anonymous",
        "scoped",
    ];
    kill_mid_request(&payments, &args, &["died-1"]).await;
    let http = client();
    let (mut second, base) = idem_tests::OriginProcess::spawn(&args).await;
    // Past the dead holder's lease, and past the upstream finishing the charge.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let retry = post(
        &http,
        &format!("{base}/v1/charges"),
        "died-1",
        charge_body("c-orphan", 100, 2_000),
    )
    .await;
    let status = retry.status().as_u16();
    let kind = problem_type(&retry.text().await.unwrap());
    let again = post(
        &http,
        &format!("{base}/v1/charges"),
        "died-1",
        charge_body("c-orphan", 100, 2_000),
    )
    .await;
    let again_replayed = again.headers().contains_key("idempotent-replayed");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let calls = payments.calls_for("died-1");
    let charges = payments.charges_for("died-1");
    let _ = second.kill();
    let _ = second.wait();
    report(
        "upstream",
        &format!(
            "idem killed after sending, restarted, lease run out: the retry {status} {kind}, the next replayed={again_replayed}; \
             the upstream got {calls} call, made {charges} charge"
        ),
    );
    assert_eq!(calls, 1, "sent once: a takeover does not send again");
    assert_eq!(charges, 1);
    assert_eq!(status, 502);
    assert_eq!(
        kind,
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#upstream-outcome-unknown"
    );
    assert!(again_replayed, "stored");
}

/// Who a key belongs to, in proxy mode. By the `Authorization` value, a refreshed token
/// of the same principal is a new caller: its retry charges again. By the JWT's `sub`
/// (verified), it keeps its scope: one charge. By an API-key header, two callers with
/// the same key are two scopes; a request with no identity is refused (401) before
/// anything is claimed, and a token that does not verify is never anonymous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_follow_the_caller_not_the_token() {
    use idem_core::contract::scope::sign_hs256;
    const SECRET: &str = "the gateway's HS256 secret, 32 bytes or more";
    let payments = Payments::start().await;
    let secret_file = std::env::temp_dir().join(format!("idem-jwt-{}", std::process::id()));
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let http = client();
    let token = |iat: u64| {
        format!(
            "Bearer {}",
            sign_hs256(
                &format!(r#"{{"sub":"cus_1","iat":{iat},"exp":4102444800}}"#),
                SECRET.as_bytes()
            )
        )
    };
    let charge =
        |url: String, key: &'static str, auth: Option<String>, api_key: Option<&'static str>| {
            let http = http.clone();
            async move {
                let mut req = http
                    .post(url)
                    .header("idempotency-key", key)
                    .header("content-type", "application/json")
                    .body(charge_body("cus_1", 100, 0));
                if let Some(auth) = auth {
                    req = req.header("authorization", auth);
                }
                if let Some(api_key) = api_key {
                    req = req.header("x-api-key", api_key);
                }
                let res = req.send().await.unwrap();
                let status = res.status().as_u16();
                (status, problem_type(&res.text().await.unwrap()))
            }
        };

    // By the Authorization value (the default before this option): a refreshed token.
    let by_value = proxy(&payments, &["--scope-from", "authorization"]).await;
    charge(
        by_value.url("/v1/charges"),
        "refresh-value",
        Some(token(1)),
        None,
    )
    .await;
    charge(
        by_value.url("/v1/charges"),
        "refresh-value",
        Some(token(2)),
        None,
    )
    .await;
    let value_charges = payments.charges_for("refresh-value");
    // A signed request (AWS SigV4 here): every attempt carries a new signature.
    let signed = |n: u64| {
        Some(format!(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261202/eu-west-1/execute-api/aws4_request, SignedHeaders=host;x-amz-date, Signature={n:064x}"
        ))
    };
    let signed_1 = charge(by_value.url("/v1/charges"), "signed", signed(1), None).await;
    let signed_2 = charge(by_value.url("/v1/charges"), "signed", signed(2), None).await;
    let signed_calls = payments.calls_for("signed");
    // An empty bearer token names nobody (proxy mode refuses anonymous callers).
    let blank = charge(
        by_value.url("/v1/charges"),
        "blank",
        Some("Bearer ".into()),
        None,
    )
    .await;
    let blank_calls = payments.calls_for("blank");

    // By the verified JWT's sub.
    let secret_path = secret_file.to_str().unwrap();
    let by_sub = proxy(
        &payments,
        &["--scope-from", "jwt:sub", "--jwt-secret-file", secret_path],
    )
    .await;
    let first = charge(
        by_sub.url("/v1/charges"),
        "refresh-sub",
        Some(token(1)),
        None,
    )
    .await;
    let refreshed = charge(
        by_sub.url("/v1/charges"),
        "refresh-sub",
        Some(token(2)),
        None,
    )
    .await;
    let forged = format!(
        "Bearer {}",
        sign_hs256(r#"{"sub":"cus_1","exp":4102444800}"#, b"not the secret")
    );
    let forged = charge(by_sub.url("/v1/charges"), "refresh-sub", Some(forged), None).await;
    let sub_charges = payments.charges_for("refresh-sub");

    // By an API-key header, anonymous refused.
    let by_key = proxy(
        &payments,
        &["--scope-from", "header:x-api-key", "--anonymous", "refused"],
    )
    .await;
    let a = charge(by_key.url("/v1/charges"), "api-1", None, Some("key-a")).await;
    let b = charge(by_key.url("/v1/charges"), "api-1", None, Some("key-b")).await;
    let a_again = charge(by_key.url("/v1/charges"), "api-1", None, Some("key-a")).await;
    let nobody = charge(by_key.url("/v1/charges"), "api-2", None, None).await;
    let api_charges = payments.charges_for("api-1");
    let nobody_calls = payments.calls_for("api-2");
    let _ = std::fs::remove_file(&secret_file);
    report(
        "upstream",
        &format!(
            "one principal's refreshed JWT, same key and request: {value_charges} charges scoped by the Authorization value, \
             {sub_charges} by the verified sub ({first:?}, refreshed {refreshed:?}, forged {forged:?}); \
             x-api-key: {a:?}, {b:?}, again {a_again:?} -> {api_charges} charges; no identity {nobody:?}, {nobody_calls} calls; \
             two attempts signed with SigV4 {signed_1:?}, {signed_2:?} -> {signed_calls} calls; an empty bearer {blank:?}, {blank_calls} calls"
        ),
    );
    assert_eq!(
        value_charges, 2,
        "by value, a refreshed token is a new caller"
    );
    assert_eq!(sub_charges, 1, "by the verified sub, the same caller");
    assert_eq!((first.0, refreshed.0), (201, 201));
    assert_eq!(
        forged,
        (
            401,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-invalid".into()
        )
    );
    assert_eq!(api_charges, 2, "two API keys, two callers");
    assert_eq!((a.0, b.0, a_again.0), (201, 201, 201));
    assert_eq!(
        nobody,
        (
            401,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-missing".into()
        )
    );
    assert_eq!(nobody_calls, 0);
    // Scoped by their signatures, the two attempts were two callers: 2 charges before.
    let invalid = (
        401,
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-invalid".to_owned(),
    );
    assert_eq!((signed_1, signed_2), (invalid.clone(), invalid));
    assert_eq!(signed_calls, 0, "a signature is not a caller");
    // Scoped as the empty credential shared by all such callers: 201 before.
    assert_eq!(
        blank,
        (
            401,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-missing".into()
        )
    );
    assert_eq!(blank_calls, 0);
}

/// A route file gives each path its own rules, through real processes: on
/// `/v1/charges` a key is required, a retry waits for the first answer instead of
/// getting 409, and the key belongs to the API key; on `/v1/fail/*` answers live two
/// seconds and anonymous callers are scoped; anywhere else the flags hold (no identity,
/// 401).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_file_gives_each_path_its_own_rules() {
    let payments = Payments::start().await;
    let routes = std::env::temp_dir().join(format!("idem-routes-{}.toml", std::process::id()));
    std::fs::write(
        &routes,
        r#"
[[route]]
path = "/v1/charges"
require_key = true
wait = "5s"
scope_from = "header:x-api-key"

[[route]]
path = "/v1/fail/*"
ttl = "2s"
lease = "1s"
anonymous = "scoped"
"#,
    )
    .unwrap();
    let url = payments.url();
    let origin = TestOrigin::start(&[
        "--upstream",
        url.as_str(),
        "--store",
        "memory",
        "--routes",
        routes.to_str().unwrap(),
    ])
    .await;
    let http = client();
    let send =
        |path: &str, key: Option<&'static str>, api_key: Option<&'static str>, latency: u64| {
            let mut req = http
                .post(origin.url(path))
                .header("content-type", "application/json")
                .body(charge_body("cus_r", 100, latency));
            if let Some(key) = key {
                req = req.header("idempotency-key", key);
            }
            if let Some(api_key) = api_key {
                req = req.header("x-api-key", api_key);
            }
            async move {
                let res = req.send().await.unwrap();
                let replayed = res.headers().contains_key("idempotent-replayed");
                let status = res.status().as_u16();
                let kind = problem_type(&res.text().await.unwrap());
                (status, replayed, kind)
            }
        };
    let no_key = send("/v1/charges", None, Some("key-a"), 0).await;
    // The first attempt takes a second; its retry, 200 ms later, states no wait.
    let first = tokio::spawn(send("/v1/charges", Some("r-1"), Some("key-a"), 1_000));
    // Once the upstream has it, so the retry is the second.
    let deadline = Instant::now() + Duration::from_secs(10);
    while payments.calls_for("r-1") == 0 {
        assert!(
            Instant::now() < deadline,
            "the first attempt never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waited = send("/v1/charges", Some("r-1"), Some("key-a"), 1_000).await;
    let first = first.await.unwrap();
    let other_caller = send("/v1/charges", Some("r-1"), Some("key-b"), 0).await;
    let charges = payments.charges_for("r-1");
    // /v1/fail/*: anonymous is scoped there, and answers expire after two seconds.
    let failed = send("/v1/fail/503", Some("r-2"), None, 0).await;
    let replayed = send("/v1/fail/503", Some("r-2"), None, 0).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let expired = send("/v1/fail/503", Some("r-2"), None, 0).await;
    let fail_calls = payments.calls_for("r-2");
    // A path the file does not list: the flags' rules, proxy mode's refusal.
    let elsewhere = send("/v1/refunds", Some("r-3"), None, 0).await;
    let _ = std::fs::remove_file(&routes);
    report(
        "upstream",
        &format!(
            "route file: /v1/charges without a key {no_key:?}; first {first:?}, its retry with no Prefer {waited:?}, another API key {other_caller:?} -> {charges} charges; /v1/fail/* (ttl 2s, anonymous scoped) {failed:?}, {replayed:?}, after 2.5 s {expired:?} -> {fail_calls} calls; /v1/refunds (flags) {elsewhere:?}"
        ),
    );
    assert_eq!(no_key.0, 400, "a key is required on /v1/charges");
    assert_eq!(first, (201, false, String::new()));
    assert_eq!(
        waited,
        (201, true, String::new()),
        "the retry waited for the first answer"
    );
    assert_eq!(other_caller.0, 201);
    assert!(!other_caller.1, "another API key is another caller");
    assert_eq!(charges, 2);
    assert_eq!((failed.0, failed.1), (503, false));
    assert_eq!((replayed.0, replayed.1), (503, true));
    assert_eq!(
        (expired.0, expired.1),
        (503, false),
        "expired after its route's 2 s"
    );
    assert_eq!(fail_calls, 2);
    assert_eq!(
        elsewhere,
        (
            401,
            false,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-missing".into()
        )
    );
}

/// An identity provider's tokens (RS256 and ES256, from the JWKS of the shared scope
/// vectors) through real processes: one principal's tokens, of either algorithm and
/// refreshed, are one caller — one charge; a token whose payload was changed, or an
/// HS256 token signed with the public key, is refused before anything reaches the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_an_identity_provider_keep_their_principal_s_scope() {
    use idem_tests::scope_vectors::{authorization as token, document};
    let vectors = document();
    let jwks = std::env::temp_dir().join(format!("idem-jwks-{}.json", std::process::id()));
    std::fs::write(&jwks, vectors["jwks"].to_string()).unwrap();
    let payments = Payments::start().await;
    let origin = proxy(
        &payments,
        &[
            "--scope-from",
            "jwt:sub",
            "--jwks-file",
            jwks.to_str().unwrap(),
            "--jwt-issuer",
            "https://id.example",
            "--jwt-audience",
            "payments",
        ],
    )
    .await;
    let http = client();
    let mut seen = Vec::new();
    for name in [
        "jwks rs256",
        "jwks es256",
        "jwks es256, refreshed",
        "jwks es256 payload changed",
        "jwks hs256 with the public key as secret",
        "jwks unknown kid",
        "jwks another issuer",
        "jwks another audience",
    ] {
        let res = http
            .post(origin.url("/v1/charges"))
            .header("idempotency-key", "idp-1")
            .header("content-type", "application/json")
            .header("authorization", token(name))
            .body(charge_body("cus_1", 100, 0))
            .send()
            .await
            .unwrap();
        let replayed = res.headers().contains_key("idempotent-replayed");
        let status = res.status().as_u16();
        seen.push((
            name,
            status,
            replayed,
            problem_type(&res.text().await.unwrap()),
        ));
    }
    let (charges, calls) = (payments.charges_for("idp-1"), payments.calls_for("idp-1"));
    let _ = std::fs::remove_file(&jwks);
    report(
        "upstream",
        &format!("an identity provider's tokens (--jwks-file): {seen:?} -> {charges} charge, {calls} call"),
    );
    let answers: Vec<(u16, bool)> = seen.iter().map(|s| (s.1, s.2)).collect();
    assert_eq!(
        answers,
        [
            (201, false),
            (201, true),
            (201, true),
            (401, false),
            (401, false),
            (401, false),
            (401, false),
            (401, false)
        ],
        "{seen:?}"
    );
    assert!(seen[3..]
        .iter()
        .all(|s| s.3
            == "https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-invalid"));
    assert_eq!((charges, calls), (1, 1));
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

/// An upstream address that takes each connection and closes it at once (a load
/// balancer with no backend left): requests idem never handed to a connection, or
/// that hyper gave back unsent, reached nothing. Before the fix, every failure but a
/// refused connect was stored as `upstream-outcome-unknown`, and the key replayed that
/// 502 for its whole TTL for a payment that was never sent. Now those are released:
/// the retry, once the upstream is back, charges. A request hyper did write before the
/// close stays unknown (nothing tells idem the bytes were not read); no key is ever
/// charged twice.
///
/// Which of the two a request meets is a race between hyper's first write and the
/// close (a few in forty are given back unsent), so keys are sent until three were,
/// each key's first answer is kept, and each key's retry must follow from it: released
/// → charged once now; unknown → the stored 502 again, never charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_left_idem_is_not_stored_as_an_unknown_outcome() {
    let payments = Payments::start().await;
    let upstream: std::net::SocketAddr = payments
        .url()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let gate = idem_tests::Proxy::start(upstream).await;
    gate.take_down();
    let url = format!("http://{}", gate.addr);
    let origin = TestOrigin::start(&[
        "--upstream",
        &url,
        "--store",
        "memory",
        "--require-key-on",
        "/v1/*",
        "--anonymous",
        "scoped",
    ])
    .await;
    let http = client();
    const UNSENT: usize = 3;
    const MAX_KEYS: usize = 600;
    const UNREACHABLE: &str =
        "502 https://github.com/idem-rs/idem/blob/main/docs/problems.md#upstream-unreachable";
    const UNKNOWN: &str =
        "502 https://github.com/idem-rs/idem/blob/main/docs/problems.md#upstream-outcome-unknown";
    let key = |i: usize| format!("cut-{i}");
    let answer = |i: usize| {
        let (http, url) = (http.clone(), origin.url("/v1/charges"));
        async move {
            let res = post(&http, &url, &key(i), charge_body("c-cut", 100, 0)).await;
            let status = res.status().as_u16();
            let body = res.text().await.unwrap_or_default();
            (format!("{status} {}", problem_type(&body)), body)
        }
    };
    // Each key's first answer, and the details of the unknown ones (hyper's words for
    // what happened: a reset, a close before the answer, a connection "not ready").
    let mut first: Vec<String> = Vec::new();
    let mut unknown_details: BTreeMap<String, usize> = BTreeMap::new();
    while first.len() < MAX_KEYS && first.iter().filter(|a| *a == UNREACHABLE).count() < UNSENT {
        let (said, body) = answer(first.len()).await;
        if said == UNKNOWN {
            let detail = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|p| p["detail"].as_str().map(str::to_owned))
                .unwrap_or_default();
            *unknown_details.entry(detail).or_default() += 1;
        }
        first.push(said);
    }
    let sent = first.len();
    gate.bring_up();
    let mut retried: BTreeMap<String, usize> = BTreeMap::new();
    let mut inconsistent = Vec::new();
    let (mut charged, mut doubled) = (0, 0);
    for (i, first) in first.iter().enumerate() {
        let (retry, _) = answer(i).await;
        let charges = payments.charges_for(&key(i));
        charged += usize::from(charges == 1);
        doubled += usize::from(charges > 1);
        let expected = match first.as_str() {
            UNREACHABLE => ("201 ", 1),
            UNKNOWN => (UNKNOWN, 0),
            _ => ("(no such first answer)", 0),
        };
        if (retry.as_str(), charges) != expected {
            inconsistent.push(format!(
                "{}: first {first}, retry {retry}, {charges} charge(s)",
                key(i)
            ));
        }
        *retried.entry(retry).or_default() += 1;
    }
    let mut firsts: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &first {
        *firsts.entry(f.as_str()).or_default() += 1;
    }
    let released = firsts.get(UNREACHABLE).copied().unwrap_or(0);
    report(
        "upstream",
        &format!(
            "{sent} keys to an upstream address that closes every connection at once: first answers {firsts:?} \
             (the unknown ones said {unknown_details:?}); once it is back, the retries {retried:?}: \
             {charged} keys charged once, {doubled} twice"
        ),
    );
    assert_eq!(doubled, 0, "never charged twice");
    assert!(
        inconsistent.is_empty(),
        "each retry follows from its key's first answer: {inconsistent:?}"
    );
    assert!(
        released >= UNSENT,
        "{released} of {sent} requests hyper never wrote were released; the unknown ones said {unknown_details:?}"
    );
}

/// Clients that give up while their claim waits in Postgres (its table locked by
/// another transaction): the claims land when the lock goes. Before the fix they were
/// dropped with the request — nothing ran under them, yet they held their keys for the
/// lease, and the retries after it took over and were answered with a stored 502
/// `upstream-outcome-unknown` for payments never sent. The claim and what follows now
/// finish without the client: each key is charged once, and its retry replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_leaves_during_its_claim_leaves_no_orphan_claim() {
    let db = idem_tests::TestDb::new("claim_left").await;
    let payments = Payments::start().await;
    let origin = proxy(
        &payments,
        &[
            "--store",
            "postgres",
            "--database-url",
            &db.url,
            "--lease",
            "3s",
        ],
    )
    .await;
    let url = origin.url("/v1/charges");
    const LEFT: usize = 8;
    let key = |i: usize| format!("left-{i}");
    let http = client();
    let warm = post(&http, &url, "left-warm", charge_body("c-w", 100, 0)).await;
    assert_eq!(warm.status(), 201);
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let lock = idem_tests::connect(&db.url).await;
    lock.batch_execute("BEGIN; LOCK TABLE idem_records IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let sends = (0..LEFT).map(|i| {
        let (impatient, url) = (impatient.clone(), url.clone());
        async move {
            impatient
                .post(&url)
                .header("idempotency-key", key(i))
                .header("content-type", "application/json")
                .body(charge_body("c-left", 100, 0))
                .send()
                .await
                .is_err()
        }
    });
    let gave_up = futures_util::future::join_all(sends)
        .await
        .into_iter()
        .filter(|left| *left)
        .count();
    // Released within the clock tolerance (a tenth of the lease): the claims land as
    // they were computed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    lock.batch_execute("COMMIT").await.unwrap();
    // Past the lease of a claim that landed then.
    tokio::time::sleep(Duration::from_millis(3_300)).await;
    let mut retried: BTreeMap<String, usize> = BTreeMap::new();
    let mut charged_once = 0;
    for i in 0..LEFT {
        let res = post(&http, &url, &key(i), charge_body("c-left", 100, 0)).await;
        let status = res.status().as_u16();
        let replayed = res.headers().contains_key("idempotent-replayed");
        let kind = problem_type(&res.text().await.unwrap_or_default());
        *retried
            .entry(format!("{status} {kind} replayed={replayed}"))
            .or_default() += 1;
        charged_once += usize::from(payments.charges_for(&key(i)) == 1);
    }
    report(
        "upstream",
        &format!("{LEFT} clients giving up after 100 ms on claims waiting for a lock in Postgres (released 0.2 s after; lease 3 s; {gave_up} gave up): the retries after the lease {retried:?}; {charged_once} keys charged once"),
    );
    assert_eq!(gave_up, LEFT, "every client left during its claim");
    assert_eq!(
        retried.get("201  replayed=true").copied().unwrap_or(0),
        LEFT,
        "each retry replays the charge made without its client: {retried:?}"
    );
    assert_eq!(charged_once, LEFT, "each key charged once");
}

/// A route guards `PUT` on `/v1/payouts/*` and requires a key there; the API behind
/// routes leniently, as servlet containers and case-insensitive routers do (`;`
/// parameters dropped, encoded `/` and `\` and a plain `\` read as `/`, dot segments
/// resolved, case ignored), so each spelling below is a payout to it. One key sent in
/// every spelling runs once; a keyless `PUT` in another spelling is refused, never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spelling_of_a_guarded_path_runs_twice() {
    let payments = Payments::start().await;
    let routes = std::env::temp_dir().join(format!("idem-spellings-{}.toml", std::process::id()));
    std::fs::write(
        &routes,
        "[[route]]\npath = \"/v1/payouts/*\"\nmethods = [\"PUT\"]\nrequire_key = true\n",
    )
    .unwrap();
    let origin = proxy(&payments, &["--routes", routes.to_str().unwrap()]).await;
    let _ = std::fs::remove_file(&routes);
    let spellings = [
        "/v1/payouts/7",
        "/v1/payouts;x/7",
        "/v1%2Fpayouts/7",
        "/v1/Payouts/7",
        "/v1%5cpayouts/7",
        "/v1\\payouts/7",
        "/v1/x/../payouts/7",
        "/v1/payouts/%2e/7",
        "/V1/PAYOUTS/7/",
    ];
    let put = |target: &'static str, key: Option<&'static str>| {
        let addr = origin.addr;
        async move {
            let mut headers = vec![("content-type", "application/json")];
            if let Some(key) = key {
                headers.push(("idempotency-key", key));
            }
            raw_request(addr, "PUT", target, &headers, br#"{"amount": 5}"#).await
        }
    };
    let mut answers = Vec::new();
    for spelling in spellings {
        let (status, body) = put(spelling, Some("po-1")).await;
        answers.push((spelling, status, problem_kind(&body)));
    }
    let mut keyless = Vec::new();
    for spelling in ["/v1/payouts;y/8", "/v1%2Fpayouts/8", "/V1/Payouts/8"] {
        let (status, body) = put(spelling, None).await;
        keyless.push((spelling, status, problem_kind(&body)));
    }
    let executions = payments.calls_for("po-1");
    let keyless_executions =
        payments.count("SELECT count(*) FROM calls WHERE idempotency_key IS NULL");
    report(
        "upstream",
        &format!(
            "one key PUT in {} spellings of a guarded path {answers:?} -> {executions} payouts; \
             keyless {keyless:?} -> {keyless_executions} payouts",
            spellings.len()
        ),
    );
    assert_eq!(answers[0].1, 201, "{answers:?}");
    for (spelling, status, kind) in &answers[1..] {
        assert!(
            (*status == 400 && kind == "path-ambiguous")
                || (*status == 422 && kind == "idempotency-key-reused"),
            "{spelling}: {status} {kind}"
        );
    }
    for (spelling, status, kind) in &keyless {
        assert_eq!(*status, 400, "{spelling}: {kind}");
        assert!(
            kind == "path-ambiguous" || kind == "idempotency-key-missing",
            "{spelling}: {kind}"
        );
    }
    assert_eq!(executions, 1, "one key, one payout, whatever the spelling");
    assert_eq!(
        keyless_executions, 0,
        "a keyless payout is refused in every spelling"
    );
    let refused = answers[1..].iter().filter(|a| a.1 == 400).count();
    proof::record(
        "faults",
        "path-spellings",
        &[&format!(
            "{executions} payout for the key (201, then 400 path-ambiguous × {refused}, 422 × {}), {keyless_executions} keyless payouts (400 × {})",
            answers.len() - 1 - refused,
            keyless.len()
        )],
    );
}

/// Proxy mode without a base path: a path servers read differently (a `..` segment, an
/// encoded `/`, a `;`) is refused whatever the method — the upstream may take it for a
/// resource a route guards, reached by a method idem let through — unless the operator
/// names `--pass-ambiguous-paths`, which forwards only what idem does not guard. Before,
/// only paths under a base path were refused: `DELETE /../internal/users/1` reached the
/// upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_path_is_refused_on_every_method_unless_named() {
    // An upstream that records what reaches it, whatever the method and path.
    let reached: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let r = reached.clone();
    let upstream = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let r = r.clone();
        async move {
            r.lock()
                .unwrap()
                .push(format!("{} {}", req.method(), req.uri()));
            "reached"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, upstream).await });
    let targets = [
        ("DELETE", "/../internal/users/1"),
        ("GET", "/v1/charges/..%2f..%2finternal"),
        ("PUT", "/v1/charges/1;jsessionid=x"),
        ("GET", "/v1/%2e%2e/admin"),
    ];
    let mut seen = Vec::new();
    for pass in [false, true] {
        let mut args = vec![
            "--upstream",
            &url,
            "--store",
            "memory",
            "--anonymous",
            "scoped",
        ];
        if pass {
            args.push("--pass-ambiguous-paths");
        }
        let origin = TestOrigin::start(&args).await;
        reached.lock().unwrap().clear();
        let mut answers = Vec::new();
        for (method, target) in targets {
            let (status, body) = raw_request(origin.addr, method, target, &[], b"").await;
            answers.push(format!(
                "{method} {target}: {status} {}",
                problem_kind(&body)
            ));
        }
        // A guarded request (a keyed POST) on an ambiguous path: refused either way.
        let (status, body) = raw_request(
            origin.addr,
            "POST",
            "/v1/charges/..%2fpayouts",
            &[
                ("idempotency-key", "amb-1"),
                ("content-type", "application/json"),
            ],
            b"{}",
        )
        .await;
        answers.push(format!("keyed POST: {status} {}", problem_kind(&body)));
        let reached = reached.lock().unwrap().clone();
        seen.push((pass, answers, reached));
    }
    report(
        "upstream",
        &format!("ambiguous paths without a base path (false: by default; true: --pass-ambiguous-paths): {seen:?}"),
    );
    let (_, by_default, reached) = &seen[0];
    for answer in by_default {
        assert!(
            answer.ends_with(": 400 path-ambiguous"),
            "by default: {answer}"
        );
    }
    assert_eq!(
        reached,
        &Vec::<String>::new(),
        "nothing was sent by default"
    );
    let (_, named, reached) = &seen[1];
    assert!(
        named.last().unwrap().ends_with(": 400 path-ambiguous"),
        "a guarded one, named: {named:?}"
    );
    assert_eq!(
        reached.len(),
        targets.len(),
        "with --pass-ambiguous-paths every unguarded one is sent: {reached:?}"
    );
}

/// The last part of a problem's type (`path-ambiguous`), found in a raw body.
fn problem_kind(body: &str) -> String {
    body.split("https://github.com/idem-rs/idem/blob/main/docs/problems.md#")
        .nth(1)
        .map(|rest| rest.split('"').next().unwrap_or("").to_owned())
        .unwrap_or_default()
}

/// idem in proxy mode on Postgres (`args`), killed (SIGKILL) once the upstream has each
/// of `keys`' charges (2 s each) and before it could store an answer: the client lost
/// its answers, the claims are orphans. Returns when the process is gone.
async fn kill_mid_request(payments: &Payments, args: &[&str], keys: &[&'static str]) -> Instant {
    let (mut first, base) = idem_tests::OriginProcess::spawn(args).await;
    let http = client();
    let mut sent = Vec::new();
    for &key in keys {
        let (http, url) = (http.clone(), format!("{base}/v1/charges"));
        sent.push(tokio::spawn(async move {
            http.post(&url)
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(charge_body("c-orphan", 100, 2_000))
                .send()
                .await
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while keys.iter().any(|k| payments.calls_for(k) == 0) {
        assert!(
            Instant::now() < deadline,
            "a request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = first.kill();
    let _ = first.wait();
    let killed = Instant::now();
    for answer in sent {
        assert!(answer.await.unwrap().is_err(), "the client lost its answer");
    }
    killed
}

/// A TTL barely above the lease (`--ttl 3s --lease 2s`): idem killed while the upstream
/// charges, its retry 4 s later — past the claim's lease and past a TTL from its last
/// heartbeat. The orphan claim must still be there to take over (an outcome nobody
/// knows, stored as such), not expired into a free key that sends the charge again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_claim_outlives_a_short_ttl_and_is_never_resent() {
    let payments = Payments::start().await;
    let db = idem_tests::TestDb::new("proxy_short_ttl").await;
    let upstream = payments.url();
    let args = [
        "--upstream",
        upstream.as_str(),
        "--store",
        "postgres",
        "--database-url",
        db.url.as_str(),
        "--ttl",
        "3s",
        "--lease",
        "2s",
        "--anonymous",
        "scoped",
    ];
    let killed = kill_mid_request(&payments, &args, &["short-ttl-1"]).await;
    let (mut second, base) = idem_tests::OriginProcess::spawn(&args).await;
    // The last heartbeat came at most 250 ms before the kill: its lease is over by
    // kill + 2 s, a TTL past it (the old expiry) by kill + 3 s, lease and TTL past it
    // (the expiry now) no sooner than kill + 4.75 s.
    tokio::time::sleep(
        (killed + Duration::from_millis(4_000)).saturating_duration_since(Instant::now()),
    )
    .await;
    let retried_after = killed.elapsed();
    let retry = post(
        &client(),
        &format!("{base}/v1/charges"),
        "short-ttl-1",
        charge_body("c-orphan", 100, 2_000),
    )
    .await;
    let status = retry.status().as_u16();
    let kind = problem_type(&retry.text().await.unwrap());
    // Whatever the retry did reaches the upstream within its 2 s.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let calls = payments.calls_for("short-ttl-1");
    let _ = second.kill();
    let _ = second.wait();
    report(
        "upstream",
        &format!(
            "--ttl 3s --lease 2s, idem killed mid-request, the retry {retried_after:?} after: {status} {kind}; the upstream got {calls} calls"
        ),
    );
    assert!(
        retried_after < Duration::from_millis(4_700),
        "retried {retried_after:?} after the kill: too late to tell"
    );
    assert_eq!(calls, 1, "an orphan past a short TTL was sent again");
    assert_eq!(status, 502);
    assert_eq!(
        kind,
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#upstream-outcome-unknown"
    );
    proof::record(
        "faults",
        "short-ttl-orphan",
        &[&format!(
            "{status} upstream-outcome-unknown, {calls} upstream call"
        )],
    );
}

/// An operator purges orphan claims in proxy mode (their holder killed mid-request,
/// their leases over): without `resend=true` the purge is refused (409 `may-resend`)
/// and the retry stores the outcome as unknown, sending nothing; with it, the key is
/// freed and the retry sends the charge again, as the operator said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_orphan_is_resent_only_when_the_operator_says_so() {
    let payments = Payments::start().await;
    let db = idem_tests::TestDb::new("proxy_purge_orphan").await;
    let upstream = payments.url();
    let tokens = std::env::temp_dir().join(format!("idem-purge-tokens-{}", std::process::id()));
    std::fs::write(&tokens, "oncall:purge-orphan-token-0123456789\n").unwrap();
    let mut args = vec![
        "--upstream",
        upstream.as_str(),
        "--store",
        "postgres",
        "--database-url",
        db.url.as_str(),
        "--lease",
        "2s",
        "--anonymous",
        "scoped",
    ];
    let killed = kill_mid_request(&payments, &args, &["orphan-1", "orphan-2"]).await;
    let admin_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let token_file = tokens.to_str().unwrap().to_owned();
    args.extend([
        "--admin-listen",
        &admin_addr,
        "--admin-token-file",
        &token_file,
    ]);
    let (mut second, base) = idem_tests::OriginProcess::spawn(&args).await;
    tokio::time::sleep(
        (killed + Duration::from_millis(2_500)).saturating_duration_since(Instant::now()),
    )
    .await;
    let http = client();
    let admin = |method: reqwest::Method, path: String| {
        let http = http.clone();
        let url = format!("http://{admin_addr}{path}");
        async move {
            let res = http
                .request(method, url)
                .header("authorization", "Bearer purge-orphan-token-0123456789")
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            let body: serde_json::Value = res.json().await.unwrap_or_default();
            (status, body)
        }
    };
    let mut outcomes = Vec::new();
    for (key, query) in [("orphan-1", ""), ("orphan-2", "?resend=true")] {
        let (status, found) = admin(
            reqwest::Method::GET,
            format!("/admin/v1/records?key={key}&scope=anonymous"),
        )
        .await;
        assert_eq!(status, 200, "{found}");
        assert_eq!(found["record"]["state"], "in_progress", "{found}");
        let record_key = found["record"]["record_key"].as_str().unwrap().to_owned();
        let (purged, body) = admin(
            reqwest::Method::DELETE,
            format!("/admin/v1/records/{record_key}{query}"),
        )
        .await;
        let retry = post(
            &http,
            &format!("{base}/v1/charges"),
            key,
            charge_body("c-orphan", 100, 2_000),
        )
        .await;
        let retried = retry.status().as_u16();
        let kind = problem_type(&retry.text().await.unwrap());
        outcomes.push((
            key,
            purged,
            body["type"].as_str().unwrap_or("").to_owned(),
            retried,
            kind,
        ));
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let calls = (
        payments.calls_for("orphan-1"),
        payments.calls_for("orphan-2"),
    );
    let _ = second.kill();
    let _ = second.wait();
    let _ = std::fs::remove_file(&tokens);
    report(
        "upstream",
        &format!(
            "orphans purged in proxy mode (lease over), then retried: {outcomes:?}; upstream calls {calls:?}"
        ),
    );
    let (_, purged, kind, retried, retry_kind) = &outcomes[0];
    assert_eq!(
        (*purged, kind.as_str()),
        (
            409,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#admin-may-resend"
        )
    );
    assert_eq!(
        (*retried, retry_kind.as_str()),
        (
            502,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#upstream-outcome-unknown"
        )
    );
    assert_eq!(
        calls.0, 1,
        "a purged orphan was sent again without resend=true"
    );
    let (_, purged, _, retried, _) = &outcomes[1];
    assert_eq!((*purged, *retried), (200, 201), "resend=true frees the key");
    assert_eq!(calls.1, 2, "and the retry sends the charge again, as asked");
    proof::record(
        "faults",
        "purged-orphan",
        &[&format!(
            "purge 409 admin-may-resend, retry 502, {} upstream call; with resend=true purge 200, retry 201, {} calls",
            calls.0, calls.1
        )],
    );
}

/// Proxy mode under a base path (`--upstream http://…/base`): a `..` the upstream
/// resolves would climb out of it — to a path no route of idem's guards, or outside the
/// API — so no such path is sent, whatever the method (here a keyless `PUT` a route
/// requires a key for, in the spelling that escapes the base and comes back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_climbs_out_of_the_upstream_s_base_is_not_sent() {
    let payments = Payments::start().await;
    let routes = std::env::temp_dir().join(format!("idem-base-{}.toml", std::process::id()));
    std::fs::write(
        &routes,
        "[[route]]\npath = \"/v1/payouts/*\"\nmethods = [\"PUT\"]\nrequire_key = true\n",
    )
    .unwrap();
    let upstream = format!("{}/base", payments.url());
    let origin = TestOrigin::start(&[
        "--upstream",
        &upstream,
        "--store",
        "memory",
        "--anonymous",
        "scoped",
        "--routes",
        routes.to_str().unwrap(),
    ])
    .await;
    let _ = std::fs::remove_file(&routes);
    let mut answers = Vec::new();
    for target in [
        "/../base/v1/payouts/7",
        "/v1/../../base/v1/payouts/8",
        "/%2e%2e/x",
    ] {
        for method in ["PUT", "GET"] {
            let (status, body) = raw_request(origin.addr, method, target, &[], b"").await;
            answers.push((method, target, status, problem_kind(&body)));
        }
    }
    let calls = payments.count("SELECT count(*) FROM calls");
    report(
        "upstream",
        &format!("under a base path, paths that climb out of it: {answers:?}; the upstream got {calls} calls"),
    );
    for (method, target, status, kind) in &answers {
        assert_eq!(
            (*status, kind.as_str()),
            (400, "path-ambiguous"),
            "{method} {target}"
        );
    }
    assert_eq!(calls, 0, "nothing climbed out of the base path");
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

/// A route that reads its key from `X-Idempotency-Key`: concurrent retries carrying it
/// charge once; an `Idempotency-Key` there is refused, not ignored (its client believes
/// it guarded), and so are keys in two headers. A stated `Prefer: wait` is answered
/// with `Preference-Applied: wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_reads_its_key_from_the_header_it_names() {
    let payments = Payments::start().await;
    let origin = proxy(&payments, &["--key-header", "X-Idempotency-Key"]).await;
    let http = client();
    let send = |headers: Vec<(&'static str, &'static str)>, customer: &'static str| {
        let http = http.clone();
        let url = origin.url("/v1/charges");
        async move {
            let mut req = http
                .post(url)
                .header("content-type", "application/json")
                .body(charge_body(customer, 100, 300));
            for (name, value) in headers {
                req = req.header(name, value);
            }
            let res = req.send().await.expect("the proxy answers");
            let applied = res
                .headers()
                .get("preference-applied")
                .map(|v| v.to_str().unwrap_or("").to_owned());
            let status = res.status().as_u16();
            (status, problem_kind(&res.text().await.unwrap()), applied)
        }
    };
    let retries: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(send(
                vec![("x-idempotency-key", "xk-1"), ("prefer", "wait=10")],
                "custom-header",
            ))
        })
        .collect();
    let mut statuses = Vec::new();
    for retry in retries {
        let (status, _, applied) = retry.await.unwrap();
        statuses.push((status, applied));
    }
    statuses.sort();
    let standard = send(vec![("idempotency-key", "sk-1")], "standard-header").await;
    let both = send(
        vec![("idempotency-key", "bk-1"), ("x-idempotency-key", "bk-1")],
        "both-headers",
    )
    .await;
    let none = send(vec![], "no-header").await;
    let charges = |customer: &str| {
        payments.count(&format!(
            "SELECT count(*) FROM charges WHERE customer = '{customer}'"
        ))
    };
    let counts = [
        charges("custom-header"),
        charges("standard-header"),
        charges("both-headers"),
        charges("no-header"),
    ];
    report(
        "upstream",
        &format!(
            "--key-header x-idempotency-key: 4 concurrent retries (Prefer: wait=10) {statuses:?}; \
             Idempotency-Key alone {standard:?}; both headers {both:?}; neither {none:?}; \
             charges {counts:?}"
        ),
    );
    let waited = Some("wait".to_owned());
    assert_eq!(
        statuses,
        vec![(201, waited.clone()); 4],
        "one charge, the retries waited for it and got it"
    );
    assert_eq!(
        (standard.0, standard.1.as_str()),
        (400, "idempotency-key-header-not-read")
    );
    assert_eq!(standard.2, None, "no Prefer, no Preference-Applied");
    assert_eq!(
        (both.0, both.1.as_str()),
        (400, "idempotency-key-header-not-read")
    );
    assert_eq!((none.0, none.1.as_str()), (400, "idempotency-key-missing"));
    assert_eq!(counts, [1, 0, 0, 0]);
}

/// A route whose fingerprint leaves out a timestamp its clients set anew on every
/// retry: the retry with another `sent_at` gets the first charge; one with another
/// amount (a field kept) is refused with 422. The flags' whole-body fingerprint on
/// another path still refuses the changed timestamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fingerprint_that_leaves_out_a_timestamp_replays_the_retry() {
    let payments = Payments::start().await;
    let routes = std::env::temp_dir().join(format!("idem-fingerprint-{}.toml", std::process::id()));
    std::fs::write(
        &routes,
        "[[route]]\npath = \"/v1/charges\"\nfingerprint_except = [\"/sent_at\", \"/meta/trace_id\"]\n",
    )
    .unwrap();
    let origin = proxy(&payments, &["--routes", routes.to_str().unwrap()]).await;
    let http = client();
    let body = |customer: &str, amount: i64, sent_at: &str, trace: &str| {
        serde_json::json!({
            "customer": customer, "amount": amount, "currency": "usd",
            "sent_at": sent_at, "meta": {"trace_id": trace, "client": "ios"}
        })
        .to_string()
    };
    let mut seen = Vec::new();
    for (amount, sent_at, trace) in [
        (700, "2026-12-05T10:00:00Z", "t-1"),
        (700, "2026-12-05T10:00:05Z", "t-2"),
        (701, "2026-12-05T10:00:09Z", "t-3"),
    ] {
        let res = post(
            &http,
            &origin.url("/v1/charges"),
            "fp-1",
            body("fp-customer", amount, sent_at, trace),
        )
        .await;
        let replayed = res.headers().contains_key("idempotent-replayed");
        seen.push((res.status().as_u16(), replayed));
    }
    // /v1/fail/* has the flags' fingerprint: the whole body.
    let mut whole = Vec::new();
    for sent_at in ["a", "b"] {
        let res = post(
            &http,
            &origin.url("/v1/fail/500"),
            "fp-2",
            body("x", 1, sent_at, "t"),
        )
        .await;
        whole.push(res.status().as_u16());
    }
    let charges = payments.count("SELECT count(*) FROM charges WHERE customer = 'fp-customer'");
    report(
        "upstream",
        &format!(
            "fingerprint_except [/sent_at, /meta/trace_id]: first, another sent_at and trace_id, another amount \
             {seen:?}, {charges} charge; whole-body route with another sent_at {whole:?}"
        ),
    );
    let _ = std::fs::remove_file(&routes);
    assert_eq!(seen, [(201, false), (201, true), (422, false)]);
    assert_eq!(charges, 1);
    assert_eq!(
        whole,
        [500, 422],
        "the flags' fingerprint covers the whole body"
    );
}

/// A browser's retry through proxy mode: the preflight reaches the API, and a replay
/// carries the first answer's `ETag` and `Link` (`--replay-headers`) and the CORS
/// headers a page needs to read it (`--cors-origin`) — as does a `409` while the first
/// attempt runs; an origin not listed gets none. Without those flags (the defaults as
/// before), the replay has neither, and a browser hides it from the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_reads_its_replay_with_its_etag_across_origins() {
    let payments = Payments::start().await;
    let http = client();
    let app = "https://app.example";
    let mut seen = BTreeMap::new();
    for (label, extra) in [
        (
            "configured",
            &["--replay-headers", "etag,link", "--cors-origin", app][..],
        ),
        ("defaults", &[][..]),
    ] {
        let origin = proxy(&payments, extra).await;
        let preflight = http
            .request(reqwest::Method::OPTIONS, origin.url("/v1/charges"))
            .header("origin", app)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "idempotency-key, content-type",
            )
            .send()
            .await
            .unwrap();
        let header = |res: &reqwest::Response, name: &str| {
            res.headers()
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>()
                .join(" | ")
        };
        let preflight = (
            preflight.status().as_u16(),
            header(&preflight, "access-control-allow-origin"),
            header(&preflight, "access-control-allow-headers"),
        );
        let send = |key: &'static str, from: &'static str, latency: u64| {
            http.post(origin.url("/v1/charges"))
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .header("origin", from)
                .body(charge_body(label, 100, latency))
                .send()
        };
        let first = send("cors-1", app, 0).await.unwrap();
        let first_etag = header(&first, "etag");
        let replay = send("cors-1", app, 0).await.unwrap();
        let replay_seen = [
            header(&replay, "idempotent-replayed"),
            (header(&replay, "etag") == first_etag && !first_etag.is_empty()).to_string(),
            header(&replay, "link").contains("rel=\"self\"").to_string(),
            header(&replay, "access-control-allow-origin"),
            header(&replay, "access-control-expose-headers")
                .contains("idempotent-replayed")
                .to_string(),
            header(&replay, "vary"),
        ];
        let stranger = send("cors-1", "https://evil.example", 0).await.unwrap();
        let stranger = (
            header(&stranger, "idempotent-replayed"),
            header(&stranger, "access-control-allow-origin"),
        );
        // A slow charge, and its retry while it runs.
        let slow = tokio::spawn(send("cors-2", app, 1_500));
        tokio::time::sleep(Duration::from_millis(400)).await;
        let in_flight = send("cors-2", app, 1_500).await.unwrap();
        let in_flight = (
            in_flight.status().as_u16(),
            header(&in_flight, "access-control-allow-origin"),
        );
        slow.await.unwrap().unwrap();
        report(
            "upstream",
            &format!(
                "a browser's retry ({label}): preflight {preflight:?}; replay [replayed, same ETag, Link, \
                 allow-origin, exposes idempotent-replayed, vary] {replay_seen:?}; from another origin \
                 {stranger:?}; in flight {in_flight:?}"
            ),
        );
        seen.insert(label, (preflight, replay_seen, stranger, in_flight));
    }
    let preflight = (
        204,
        app.to_owned(),
        "Idempotency-Key, Content-Type".to_owned(),
    );
    assert_eq!(
        seen["configured"],
        (
            preflight.clone(),
            [
                "true".to_owned(),
                "true".into(),
                "true".into(),
                app.into(),
                "true".into(),
                "Origin".into()
            ],
            ("true".to_owned(), String::new()),
            (409, app.to_owned())
        )
    );
    assert_eq!(
        seen["defaults"],
        (
            preflight,
            [
                "true".to_owned(),
                "false".into(),
                "false".into(),
                String::new(),
                "false".into(),
                String::new()
            ],
            ("true".to_owned(), String::new()),
            (409, String::new())
        ),
        "the defaults replay neither the ETag nor CORS headers"
    );
}

/// An `https://` upstream (Python's `ssl`, a test CA): reached with its CA, charged
/// once and replayed; refused — nothing sent, the key free — with another CA, with
/// another name than its certificate's, or with the system's roots (which don't hold
/// the test CA). An upstream that asks for a client certificate gets one with
/// `--upstream-client-cert`, and charges nothing without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_is_reached_only_with_its_ca_and_its_name() {
    let ca = idem_tests::procs::TestCa::new("upstream-tls");
    let (cert, key) = (
        ca.server_cert.to_str().unwrap(),
        ca.server_key.to_str().unwrap(),
    );
    let (good, wrong) = (ca.ca.to_str().unwrap(), ca.wrong_ca.to_str().unwrap());
    let plain = Payments::start_tls(&ca.server_cert, &ca.server_key, None).await;
    let mutual = Payments::start_tls(&ca.server_cert, &ca.server_key, Some(&ca.ca)).await;
    let http = client();
    let cases: [(&str, &Payments, Vec<&str>); 6] = [
        ("its CA", &plain, vec!["--upstream-ca-file", good]),
        ("another CA", &plain, vec!["--upstream-ca-file", wrong]),
        (
            "another name",
            &plain,
            vec![
                "--upstream-ca-file",
                good,
                "--upstream-tls-name",
                "payments.internal",
            ],
        ),
        ("the system's roots", &plain, vec![]),
        (
            "mTLS with a client certificate",
            &mutual,
            vec![
                "--upstream-ca-file",
                good,
                "--upstream-client-cert",
                cert,
                "--upstream-client-key",
                key,
            ],
        ),
        ("mTLS without", &mutual, vec!["--upstream-ca-file", good]),
    ];
    let mut seen = Vec::new();
    for (i, (label, payments, extra)) in cases.iter().enumerate() {
        let url = payments.tls_url();
        let mut args = vec![
            "--upstream",
            url.as_str(),
            "--store",
            "memory",
            "--anonymous",
            "scoped",
        ];
        args.extend_from_slice(extra);
        let origin = TestOrigin::start(&args).await;
        let key = format!("tls-{i}");
        let mut answers = Vec::new();
        for _ in 0..2 {
            let res = post(
                &http,
                &origin.url("/v1/charges"),
                &key,
                charge_body(label, 100, 0),
            )
            .await;
            let replayed = res.headers().contains_key("idempotent-replayed");
            let status = res.status().as_u16();
            answers.push((status, replayed, problem_kind(&res.text().await.unwrap())));
        }
        let charges = payments.charges_for(&key);
        report(
            "upstream",
            &format!("https upstream, {label}: {answers:?}, {charges} charge"),
        );
        seen.push((*label, answers, charges));
    }
    let ok = vec![(201, false, String::new()), (201, true, String::new())];
    let unreachable = vec![(502, false, "upstream-unreachable".to_owned()); 2];
    assert_eq!(seen[0], ("its CA", ok.clone(), 1));
    assert_eq!(seen[1], ("another CA", unreachable.clone(), 0));
    assert_eq!(seen[2], ("another name", unreachable.clone(), 0));
    assert_eq!(seen[3], ("the system's roots", unreachable, 0));
    assert_eq!(seen[4], ("mTLS with a client certificate", ok, 1));
    let (_, without, charges) = &seen[5];
    assert!(
        without.iter().all(|(status, _, _)| *status == 502) && *charges == 0,
        "an upstream that wants a client certificate charged without one: {without:?}"
    );
}

/// With `--ops-listen`, idem's own `/healthz`, `/readyz` and `/metrics` move to their
/// own listener, and the API's listener hides none of the upstream's paths: its
/// `/healthz` and `/metrics` are the upstream's. Without it (as before), idem's
/// `/healthz` answers in the upstream's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_endpoints_on_their_own_listener_leave_every_path_to_the_api() {
    let payments = Payments::start().await;
    let url = payments.url();
    let ops_port = idem_tests::procs::free_port();
    let ops_listen = format!("127.0.0.1:{ops_port}");
    let http = client();
    let text = |path: String| {
        let http = http.clone();
        async move {
            let res = http.get(&path).send().await.unwrap();
            let status = res.status().as_u16();
            (status, res.text().await.unwrap())
        }
    };
    let base_args = [
        "--upstream",
        url.as_str(),
        "--store",
        "memory",
        "--anonymous",
        "scoped",
    ];
    let mut apart_args = base_args.to_vec();
    apart_args.extend(["--ops-listen", ops_listen.as_str()]);
    let (mut apart, apart_base) = idem_tests::OriginProcess::spawn(&apart_args).await;
    let api_health = text(format!("{apart_base}/healthz")).await;
    let api_metrics = text(format!("{apart_base}/metrics")).await;
    let ops_base = format!("http://{ops_listen}");
    let ops_health = text(format!("{ops_base}/healthz")).await;
    let ops_ready = text(format!("{ops_base}/readyz")).await.0;
    let ops_metrics = text(format!("{ops_base}/metrics")).await;
    let _ = apart.kill();
    let _ = apart.wait();
    let (mut together, together_base) = idem_tests::OriginProcess::spawn(&base_args).await;
    let before = text(format!("{together_base}/healthz")).await;
    let _ = together.kill();
    let _ = together.wait();
    report(
        "upstream",
        &format!(
            "--ops-listen: API listener /healthz {api_health:?}, /metrics {}; ops listener /healthz {ops_health:?}, \
             /readyz {ops_ready}, /metrics {} (idem_build_info: {}); without it, /healthz {before:?}",
            api_metrics.0,
            ops_metrics.0,
            ops_metrics.1.contains("idem_build_info")
        ),
    );
    assert_eq!(
        api_health,
        (200, "{\"ok\": true}".to_owned()),
        "the upstream's /healthz"
    );
    assert_eq!(api_metrics.0, 404, "the upstream's (missing) /metrics");
    assert_eq!(ops_health, (200, "ok\n".to_owned()));
    assert_eq!(ops_ready, 200);
    assert!(ops_metrics.0 == 200 && ops_metrics.1.contains("idem_build_info"));
    assert_eq!(
        before,
        (200, "ok\n".to_owned()),
        "idem's /healthz hid the upstream's"
    );
}

/// `--problem-base` puts idem's problem types under an operator's page: the layer's
/// refusals and proxy mode's own problems alike. By default they point at the
/// repository's `docs/problems.md`, a section per problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn problem_types_point_where_the_operator_says() {
    let payments = Payments::start().await;
    let http = client();
    let mut seen = Vec::new();
    for base in [None, Some("https://docs.example/errors#")] {
        let mut extra = vec![];
        if let Some(base) = base {
            extra.extend(["--problem-base", base]);
        }
        let origin = proxy(&payments, &extra).await;
        let missing = http
            .post(origin.url("/v1/charges"))
            .header("content-type", "application/json")
            .body(charge_body("p", 1, 0))
            .send()
            .await
            .unwrap();
        let missing = problem_type(&missing.text().await.unwrap());
        // An upstream that is gone: proxy mode's own problem.
        let gone = TestOrigin::start(&{
            let mut args = vec![
                "--upstream",
                "http://127.0.0.1:9",
                "--store",
                "memory",
                "--anonymous",
                "scoped",
            ];
            args.extend_from_slice(&extra);
            args
        })
        .await;
        let unreachable = post(&http, &gone.url("/v1/charges"), "pb-1", "{}".into()).await;
        let unreachable = problem_type(&unreachable.text().await.unwrap());
        seen.push((missing, unreachable));
    }
    report(
        "upstream",
        &format!("problem types, default and --problem-base: {seen:?}"),
    );
    let default = "https://github.com/idem-rs/idem/blob/main/docs/problems.md#";
    assert_eq!(
        seen,
        [
            (
                format!("{default}idempotency-key-missing"),
                format!("{default}upstream-unreachable")
            ),
            (
                "https://docs.example/errors#idempotency-key-missing".to_owned(),
                "https://docs.example/errors#upstream-unreachable".to_owned()
            ),
        ]
    );
}
