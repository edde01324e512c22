//! Where the proxy meets the rest: browsers, TLS upstreams, its own endpoints, its problem types.

use super::*;

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
