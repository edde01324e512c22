//! Paths: no spelling runs a request twice or reaches a resource the proxy did not judge.

use super::*;

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
