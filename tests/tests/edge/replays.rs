//! What the edge keeps and replays: exactly what the origin stored, under its record, and nothing else.

use super::*;

/// The edge stores exactly what the origin stored: an answer without the origin's
/// disposition (a proxy's 500, a CDN's 524, a WAF's 429 — here a bare service that is
/// not an idem origin) is passed through and never replayed from the edge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_keeps_nothing_the_origin_did_not_store() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let bare = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/v1/charges",
            axum::routing::post(move || {
                c.fetch_add(1, Ordering::SeqCst);
                async {
                    (
                        http::StatusCode::INTERNAL_SERVER_ERROR,
                        "{\"error\":\"from a proxy\"}",
                    )
                }
            }),
        );
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let origin = TestOrigin::serve_router(bare, store).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let res = post(&http, &edge.base, "bare-1", charge_body("c", 1, 0), false).await;
        assert_eq!(res.status(), 500);
        seen.push(res.headers()["idem-edge"].to_str().unwrap().to_owned());
    }
    report(
        "edge",
        &format!(
            "a 500 that no idem origin stored, sent twice through the edge: {seen:?}, {} calls",
            calls.load(Ordering::SeqCst)
        ),
    );
    assert_eq!(
        seen,
        ["forwarded", "forwarded"],
        "never replayed from the edge"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// idem tells only its own edge what it stored (`idem-disposition`, which the edge keeps
/// its copies by): an edge that does not send the origin's secret keeps nothing, and
/// every retry goes to the origin, which replays; a client's `idem-edge-secret` never
/// passes the edge; no client sees the private headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_edge_that_knows_the_origin_s_secret_is_told_what_it_stored() {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let (origin, ledger) = TestOrigin::demo_on(store).await;
    let http = client();
    let another = "another-edge-secret-0123456789";
    let mut seen = BTreeMap::new();
    for (edge_secret, client_sends) in [
        (idem_tests::EDGE_SECRET, None),
        (another, Some(idem_tests::EDGE_SECRET)),
    ] {
        let edge = Edge::start(&origin.url(""), &[("EDGE_SECRET", edge_secret)]).await;
        let key = format!("secret-{}", seen.len());
        let mut handled = Vec::new();
        for _ in 0..2 {
            let mut req = http
                .post(format!("{}/v1/charges", edge.base))
                .header("idempotency-key", &key)
                .header("content-type", "application/json")
                .body(charge_body("c", 1, 0));
            if let Some(secret) = client_sends {
                req = req.header("idem-edge-secret", secret);
            }
            let res = req.send().await.unwrap();
            assert_eq!(res.status(), 201);
            for private in ["idem-disposition", "idem-stored-headers"] {
                assert!(
                    res.headers().get(private).is_none(),
                    "{private} reached a client"
                );
            }
            handled.push(res.headers()["idem-edge"].to_str().unwrap().to_owned());
        }
        assert_eq!(ledger.count_for_key(&key), 1, "{key}: charged once");
        seen.insert(edge_secret == another, handled);
    }
    report(
        "edge",
        &format!(
            "a charge sent twice through an edge with the origin's secret, and through one \
             with another (the client sending the origin's): {seen:?} (false: the origin's)"
        ),
    );
    assert_eq!(seen[&false], ["forwarded", "replayed"], "the origin's edge");
    assert_eq!(
        seen[&true],
        ["forwarded", "forwarded"],
        "an edge with another secret kept the answer (the client's secret passed it)"
    );
}

/// An answer larger than the origin stores (16 KiB here) but not than the edge does:
/// the origin delivers it to the first attempt and stores a `response-not-stored`
/// problem in its place. Before the fix it told the edge the answer was `stored`, the
/// edge kept the whole answer, and a retry got the 201 from the edge where the origin
/// replays the problem — two answers to one request, by which layer answered. The edge
/// now keeps nothing of it, and its retries get what the origin stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_does_not_keep_an_answer_the_origin_stored_a_problem_for() {
    use std::sync::atomic::Ordering;
    let (origin, runs) =
        origin_storing_at_most(Duration::from_secs(60), 32 * 1024, Some(16 * 1024)).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    let body = charge_body("big", 1, 0);
    let first = post(&http, &edge.base, "too-large-1", body.clone(), false).await;
    assert_eq!(first.status(), 201);
    assert_eq!(
        first.bytes().await.unwrap().len(),
        32 * 1024,
        "delivered whole"
    );
    let through_edge = post(&http, &edge.base, "too-large-1", body.clone(), false).await;
    let edge_said = through_edge.headers()["idem-edge"]
        .to_str()
        .unwrap()
        .to_owned();
    let edge_status = through_edge.status().as_u16();
    let at_origin = post(&http, &origin.url(""), "too-large-1", body, false).await;
    let origin_status = at_origin.status().as_u16();
    report(
        "edge",
        &format!("an answer larger than the origin stores (32 KiB, origin 16 KiB): the retry through the edge {edge_status} ({edge_said}), directly at the origin {origin_status}; {} execution(s)", runs.load(Ordering::SeqCst)),
    );
    assert_eq!(
        edge_status, origin_status,
        "one answer, whichever layer answers"
    );
    assert_eq!(edge_said, "forwarded");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The edge keeps the headers the origin stored, not a list of its own: behind
/// `idem-origin --upstream … --replay-set-cookie`, a retry replayed at the edge carries
/// the upstream's two `Set-Cookie` values, as a retry sent straight to the origin does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_replays_the_headers_the_origin_stored() {
    let (payments, origin) = proxy_to_payments(&["--replay-set-cookie"]).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    let cookies = |res: &reqwest::Response| -> Vec<String> {
        res.headers()
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    let mut seen = Vec::new();
    for (label, base) in [
        ("first, through the edge", &edge.base),
        ("retry at the edge", &edge.base),
        ("retry at the origin", &origin.url("")),
    ] {
        let res = post(
            &http,
            base,
            "cookie-1",
            charge_body("cus-cookie", 100, 0),
            false,
        )
        .await;
        let from = handled_by(&res);
        let private = ["idem-disposition", "idem-stored-headers"]
            .iter()
            .filter(|h| res.headers().contains_key(**h) && base == &edge.base)
            .count();
        seen.push((label, res.status().as_u16(), from, cookies(&res), private));
    }
    let charges = payments.count("SELECT count(*) FROM charges");
    report(
        "edge",
        &format!(
            "--replay-set-cookie behind the edge: {seen:?} (label, status, idem-edge, Set-Cookie, idem's private headers shown); {charges} charge"
        ),
    );
    let want = vec!["seen=1".to_owned(), "lang=en".to_owned()];
    assert_eq!(
        (seen[0].1, seen[0].3.clone()),
        (201, want.clone()),
        "{seen:?}"
    );
    assert_eq!(
        seen[1].2, "replayed",
        "the retry is answered at the edge: {seen:?}"
    );
    assert_eq!(
        seen[1].3, want,
        "the edge's replay carries the stored Set-Cookie: {seen:?}"
    );
    assert_eq!(seen[2].3, want, "as the origin's does: {seen:?}");
    assert!(
        seen.iter().all(|s| s.4 == 0),
        "no private header reaches the client: {seen:?}"
    );
    assert_eq!(charges, 1);
}

/// Answers whose status forbids a body (204, 205, 304): the edge forwards the first and
/// replays its retry from its own record with the same status, executing once — the
/// runtime refuses to build such a response with a body, even an empty one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_replays_answers_that_have_no_body() {
    use std::sync::atomic::Ordering;
    let http = client();
    let mut seen = Vec::new();
    for status in [204u16, 205, 304] {
        let (origin, runs) =
            origin_answering_without_a_body(http::StatusCode::from_u16(status).unwrap()).await;
        let edge = Edge::start(&origin.url(""), &[]).await;
        let key = format!("bodiless-{status}");
        let mut answers = Vec::new();
        for _ in 0..2 {
            let res = post(&http, &edge.base, &key, charge_body("c", 1, 0), false).await;
            let from = handled_by(&res);
            let code = res.status().as_u16();
            let body = res.bytes().await.map(|b| b.len()).unwrap_or(usize::MAX);
            answers.push((code, from, body));
        }
        seen.push((status, answers, runs.load(Ordering::SeqCst)));
    }
    report(
        "edge",
        &format!("answers without a body through the edge (status, [(status, idem-edge, body bytes)] first then retry, executions): {seen:?}"),
    );
    for (status, answers, runs) in &seen {
        assert_eq!(
            answers[0].0, *status,
            "the first attempt gets the origin's answer: {seen:?}"
        );
        assert_eq!(
            (answers[1].0, answers[1].1.as_str(), answers[1].2),
            (*status, "replayed", 0),
            "the retry is replayed at the edge with the same status: {seen:?}"
        );
        assert_eq!(*runs, 1, "executed once: {seen:?}");
    }
}

/// An origin whose route leaves a field out of its fingerprint, behind an edge that
/// fingerprints whole requests: the edge keeps nothing of its answers (the origin says
/// under which fingerprint it stored them, and it is not the edge's), so a retry with
/// another value there reaches the origin and gets the charge — where a copy kept at the
/// edge would refuse it with 422. A change to a kept field is still 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_keeps_nothing_of_an_origin_that_fingerprints_otherwise() {
    let (origin, ledger) = demo_origin_with(|l| l.fingerprint_rule(all_but_latency())).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    // The demo refuses unknown fields: the field its retries change is the latency.
    let body = |amount: i64, varied: u64| charge_body("c", amount, varied);
    let mut seen = Vec::new();
    for (amount, varied) in [(300, 0), (300, 1), (300, 2), (301, 3)] {
        let res = post(&http, &edge.base, "fp-edge-1", body(amount, varied), false).await;
        seen.push((
            res.status().as_u16(),
            res.headers().contains_key("idempotent-replayed"),
            res.headers()["idem-edge"].to_str().unwrap().to_owned(),
        ));
    }
    let charges = ledger.count_for_key("fp-edge-1");
    // While the first attempt runs (1.5 s), a retry that differs only in the field left
    // out meets the edge's claim: the origin decides (it waits, then replays), where the
    // edge alone refused it with 422.
    let slow = {
        let (http, base) = (http.clone(), edge.base.clone());
        tokio::spawn(async move { post(&http, &base, "fp-edge-2", body(300, 1_500), false).await })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let in_flight = post(&http, &edge.base, "fp-edge-2", body(300, 0), true).await;
    let in_flight = (
        in_flight.status().as_u16(),
        in_flight.headers().contains_key("idempotent-replayed"),
    );
    let slow = slow.await.unwrap().status().as_u16();
    let in_flight_charges = ledger.count_for_key("fp-edge-2");
    report(
        "edge",
        &format!(
            "an origin fingerprinting all but /simulate_latency_ms, behind the edge: first, \
             two retries with other values of it, another amount: {seen:?}; {charges} charge; \
             a retry while the first runs (Prefer: wait): {in_flight:?}, the first {slow}, \
             {in_flight_charges} charge"
        ),
    );
    assert_eq!(
        (slow, in_flight, in_flight_charges),
        (201, (201, true), 1),
        "the retry in flight waited for the first and got its answer"
    );
    let other = "forwarded; other-fingerprint".to_owned();
    assert_eq!(
        seen,
        [
            (201, false, other.clone()),
            (201, true, other.clone()),
            (201, true, other),
            (422, false, "forwarded".to_owned()),
        ]
    );
    assert_eq!(charges, 1);
}

/// An edge given its origin's fingerprint rule and key header (`FINGERPRINT_EXCEPT`,
/// `KEY_HEADER`, as the origin's route has them) applies them itself: retries that
/// differ only in the field left out are replayed at the edge, a change to a kept field
/// is refused there (422), and a key sent in `Idempotency-Key`, which the route does not
/// read, is refused at the edge as at the origin. Without the vars (the test above) the
/// edge keeps nothing and every retry goes to the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_with_its_origin_s_fingerprint_rule_and_key_header_replays_at_the_edge() {
    let (origin, ledger) = demo_origin_with(|l| {
        l.key_headers(idem_core::contract::KeyHeaders::new(["x-idempotency-key"]).unwrap())
            .fingerprint_rule(all_but_latency())
    })
    .await;
    let edge = Edge::start(
        &origin.url(""),
        &[
            ("FINGERPRINT_EXCEPT", "/simulate_latency_ms"),
            ("KEY_HEADER", "X-Idempotency-Key"),
        ],
    )
    .await;
    let http = client();
    let body = |amount: i64, varied: u64| charge_body("c", amount, varied);
    let mut seen = Vec::new();
    for (amount, varied) in [(300, 0), (300, 1), (300, 2), (301, 3)] {
        let res = post_keyed(
            &http,
            &edge.base,
            "x-idempotency-key",
            "fp-rule-1",
            body(amount, varied),
            false,
        )
        .await;
        seen.push((
            res.status().as_u16(),
            res.headers().contains_key("idempotent-replayed"),
            handled_by(&res),
        ));
    }
    let standard = post(&http, &edge.base, "fp-rule-2", body(300, 0), false).await;
    let standard = (
        standard.status().as_u16(),
        handled_by(&standard),
        standard.text().await.unwrap(),
    );
    let charges = (
        ledger.count_for_key("fp-rule-1"),
        ledger.count_for_key("fp-rule-2"),
    );
    report(
        "edge",
        &format!(
            "an edge and origin both fingerprinting all but /simulate_latency_ms, keys in \
             X-Idempotency-Key: first, two retries with other values of it, another amount: \
             {seen:?}; {charges:?} charges; a key in Idempotency-Key: {} {}",
            standard.0, standard.1
        ),
    );
    assert_eq!(
        seen,
        [
            (201, false, "forwarded".to_owned()),
            (201, true, "replayed".to_owned()),
            (201, true, "replayed".to_owned()),
            (422, false, "refused".to_owned()),
        ],
        "the edge answered the retries itself"
    );
    assert_eq!(
        (standard.0, standard.1.as_str()),
        (400, "refused"),
        "{}",
        standard.2
    );
    assert!(
        standard.2.contains("idempotency-key-header-not-read"),
        "{}",
        standard.2
    );
    assert_eq!(charges, (1, 0));
}

/// An edge that reads the key from other headers than the origin's route keeps
/// nothing of the route's answers: the record key is the key's value alone, so the
/// same value in another header would be another request there. Before the origin
/// named its key headers in the record tag, the second request below — a new key in
/// the route's header, the first key's value in the edge's — was answered with the
/// first request's stored answer at the edge, and never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_reading_the_key_from_other_headers_than_the_route_keeps_nothing() {
    let (origin, ledger) = demo_origin_with(|l| {
        l.key_headers(idem_core::contract::KeyHeaders::new(["x-idempotency-key"]).unwrap())
    })
    .await;
    let edge = Edge::start(&origin.url(""), &[("KEY_HEADER", "paypal-request-id")]).await;
    let http = client();
    let send = |route_key: &'static str, edge_key: &'static str| {
        let (http, base) = (http.clone(), edge.base.clone());
        async move {
            let res = http
                .post(format!("{base}/v1/charges"))
                .header("x-idempotency-key", route_key)
                .header("paypal-request-id", edge_key)
                .header("content-type", "application/json")
                .body(charge_body("c", 500, 0))
                .send()
                .await
                .unwrap();
            (res.status().as_u16(), handled_by(&res))
        }
    };
    let first = send("pp-k", "pp-k").await;
    let second = send("pp-j", "pp-k").await;
    let charges = (ledger.count_for_key("pp-k"), ledger.count_for_key("pp-j"));
    report(
        "edge",
        &format!(
            "origin route reading X-Idempotency-Key, edge KEY_HEADER=PayPal-Request-Id: a \
             request with k in both {first:?}, then j in the route's header and k in the \
             edge's {second:?}; charges (k, j) {charges:?}"
        ),
    );
    assert_eq!(first, (201, "forwarded; other-record".to_owned()));
    assert_eq!(
        second,
        (201, "forwarded; other-record".to_owned()),
        "the edge replayed k's answer to a request the origin runs as j"
    );
    assert_eq!(charges, (1, 1), "each key ran once, at the origin");
}

/// With `CORS_ORIGINS`, a page of a listed origin can read the edge's own replay (and
/// the headers it carries); another origin's page cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_a_listed_origin_reads_the_edge_s_replay() {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let (origin, ledger) = TestOrigin::demo_on(store).await;
    let app = "https://app.example";
    let edge = Edge::start(&origin.url(""), &[("CORS_ORIGINS", app)]).await;
    let http = client();
    let mut seen = Vec::new();
    for from in [app, app, "https://evil.example"] {
        let res = http
            .post(format!("{}/v1/charges", edge.base))
            .header("idempotency-key", "cors-edge-1")
            .header("content-type", "application/json")
            .header("origin", from)
            .body(charge_body("c", 1, 0))
            .send()
            .await
            .unwrap();
        let header = |name: &str| {
            res.headers()
                .get(name)
                .map_or(String::new(), |v| v.to_str().unwrap().to_owned())
        };
        seen.push((
            header("idem-edge"),
            header("access-control-allow-origin"),
            header("access-control-expose-headers").contains("location"),
        ));
    }
    report(
        "edge",
        &format!("CORS_ORIGINS={app}: first, replay, replay to another origin: {seen:?}"),
    );
    assert_eq!(ledger.count_for_key("cors-edge-1"), 1);
    assert_eq!(
        seen,
        [
            ("forwarded".to_owned(), String::new(), false),
            ("replayed".to_owned(), app.to_owned(), true),
            ("replayed".to_owned(), String::new(), false),
        ]
    );
}
