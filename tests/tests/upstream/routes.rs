//! Per-route rules: the route file, the key's header, the fingerprint's fields.

use super::*;

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
