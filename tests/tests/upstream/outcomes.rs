//! What the proxy stores when it cannot know what the upstream did: never sent again, unless the operator says so.

use super::*;

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
    let origin = proxy_to(&format!("http://{}", gate.addr), &[]).await;
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

/// A kept-alive upstream on a raw socket: answers every request on its connection with
/// a 201, and closes a connection left idle `keep_alive` after its last answer (never
/// one that has not had a request yet). Counts requests, and the bursts (from the
/// keys `idle-<burst>-<i>`) each connection served.
struct KeptAliveUpstream {
    addr: std::net::SocketAddr,
    requests: Arc<std::sync::atomic::AtomicUsize>,
    bursts_per_connection: Arc<std::sync::Mutex<Vec<std::collections::BTreeSet<String>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl KeptAliveUpstream {
    async fn start(keep_alive: Option<Duration>) -> KeptAliveUpstream {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let bursts_per_connection = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (r, b) = (requests.clone(), bursts_per_connection.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    continue;
                };
                let index = {
                    let mut all = b.lock().unwrap();
                    all.push(std::collections::BTreeSet::new());
                    all.len() - 1
                };
                let (r, b) = (r.clone(), b.clone());
                tokio::spawn(async move {
                    let (mut buf, mut chunk, mut answered) = (Vec::new(), [0u8; 4096], false);
                    loop {
                        let end = loop {
                            if let Some(head) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                let text =
                                    String::from_utf8_lossy(&buf[..head]).to_ascii_lowercase();
                                let length: usize = text
                                    .lines()
                                    .find_map(|l| l.strip_prefix("content-length:"))
                                    .and_then(|v| v.trim().parse().ok())
                                    .unwrap_or(0);
                                if buf.len() >= head + 4 + length {
                                    if let Some(burst) = text
                                        .lines()
                                        .find_map(|l| l.strip_prefix("idempotency-key:"))
                                        .and_then(|k| k.trim().trim_matches('"').split('-').nth(1))
                                    {
                                        b.lock().unwrap()[index].insert(burst.to_owned());
                                    }
                                    break head + 4 + length;
                                }
                            }
                            // Idle only counts once an answer has gone out on it.
                            let wait = match (answered && buf.is_empty(), keep_alive) {
                                (true, Some(keep_alive)) => keep_alive,
                                _ => Duration::from_secs(30),
                            };
                            match tokio::time::timeout(wait, conn.read(&mut chunk)).await {
                                Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                                _ => return,
                            }
                        };
                        buf.drain(..end);
                        r.fetch_add(1, Ordering::SeqCst);
                        let answer = "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";
                        if conn.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                        answered = true;
                    }
                });
            }
        });
        KeptAliveUpstream {
            addr,
            requests,
            bursts_per_connection,
            task,
        }
    }
}

impl Drop for KeptAliveUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Bursts of 8 new keys, 200 ms apart, through proxy mode to `upstream`: each burst's
/// answers, counted.
async fn bursts_through(upstream: &KeptAliveUpstream, extra: &[&str]) -> BTreeMap<String, usize> {
    let origin = proxy_to(&format!("http://{}", upstream.addr), extra).await;
    let http = client();
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    for burst in 0..BURSTS {
        let sent: Vec<_> = (0..PER_BURST)
            .map(|i| {
                let (http, url) = (http.clone(), origin.url("/v1/charges"));
                tokio::spawn(async move {
                    let key = format!("idle-{burst}-{i}");
                    let res = post(&http, &url, &key, charge_body("c-idle", 100, 0)).await;
                    let status = res.status().as_u16();
                    let body = res.text().await.unwrap_or_default();
                    format!("{status} {}", problem_type(&body))
                })
            })
            .collect();
        for answer in sent {
            *answers.entry(answer.await.unwrap()).or_default() += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    answers
}

const BURSTS: usize = 6;
const PER_BURST: usize = 8;

/// Kept-alive connections to the upstream, between bursts of new keys 200 ms apart:
///
/// * an upstream whose keep-alive (50 ms) is shorter than idem's closes them while
///   idle, as servers behind a short `keepalive_timeout` do: each key must reach it
///   once and get its answer — never a 502 for a connection it had already closed
///   (released, or worse, stored as an unknown outcome);
/// * an upstream that keeps them open, with `--upstream-idle-timeout 50ms`: no
///   connection idle longer than that is used again — none serves two bursts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_alive_connections_are_used_only_while_both_sides_keep_them() {
    use std::sync::atomic::Ordering;
    let closing = KeptAliveUpstream::start(Some(Duration::from_millis(50))).await;
    let closed_under = bursts_through(&closing, &[]).await;
    let closing_requests = closing.requests.load(Ordering::SeqCst);
    let open = KeptAliveUpstream::start(None).await;
    let idle_out = bursts_through(&open, &["--upstream-idle-timeout", "50ms"]).await;
    let reused_across: Vec<_> = open
        .bursts_per_connection
        .lock()
        .unwrap()
        .iter()
        .filter(|bursts| bursts.len() > 1)
        .cloned()
        .collect();
    let connections = open.bursts_per_connection.lock().unwrap().len();
    report(
        "upstream",
        &format!(
            "{BURSTS} bursts of {PER_BURST} new keys, 200 ms apart: to an upstream closing connections idle 50 ms, answers {closed_under:?} ({closing_requests} requests reached it); \
             to one keeping them, idem's idle timeout 50 ms, answers {idle_out:?} over {connections} connections, {} of them used across bursts",
            reused_across.len()
        ),
    );
    let all = Some(BURSTS * PER_BURST);
    assert_eq!(
        closed_under.get("201 ").copied(),
        all,
        "every key answered: {closed_under:?}"
    );
    assert_eq!(
        closing_requests,
        BURSTS * PER_BURST,
        "each key reached the upstream once"
    );
    assert_eq!(
        idle_out.get("201 ").copied(),
        all,
        "every key answered: {idle_out:?}"
    );
    assert!(
        reused_across.is_empty(),
        "connections idle past --upstream-idle-timeout were used again: {reused_across:?}"
    );
}
