//! What the edge sends the origin, and what it answers when the origin cannot be reached or answers what it cannot pass on.

use super::*;

/// A 3xx from the origin is the answer: the edge never follows it (a POST re-sent as a
/// bodiless GET, whose answer would be stored under the POST's key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_never_follows_a_redirect() {
    let (origin, seen) = recording_origin().await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let res = post(
        &no_redirects,
        &edge.base,
        "redirect-1",
        charge_body("c", 1, 0),
        false,
    )
    .await;
    let status = res.status().as_u16();
    let location = res
        .headers()
        .get("location")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = res.text().await.unwrap();
    let requests = seen.lock().unwrap().clone();
    report(
        "edge",
        &format!("an origin answering 303 to a POST: the client got {status} {location:?} {body:?}; the origin saw {requests:?}"),
    );
    assert_eq!(status, 303, "the redirect is the answer: {body}");
    assert_eq!(location.as_deref(), Some("/landing"));
    assert_eq!(requests, ["POST /v1/charges"], "nothing followed it");
}

/// Methods the runtime has no name for (WebDAV's, `QUERY`, `PURGE`) pass through as
/// themselves, not as GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_passes_unknown_methods_through_as_themselves() {
    let (origin, seen) = recording_origin().await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    let mut answered = Vec::new();
    for method in ["PROPFIND", "QUERY", "PURGE"] {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let res = http
            .request(m, format!("{}/dav", edge.base))
            .send()
            .await
            .unwrap();
        answered.push(res.text().await.unwrap());
    }
    let requests = seen.lock().unwrap().clone();
    report(
        "edge",
        &format!("PROPFIND, QUERY, PURGE through the edge: the origin saw {requests:?}"),
    );
    assert_eq!(requests, ["PROPFIND /dav", "QUERY /dav", "PURGE /dav"]);
    assert_eq!(answered, ["PROPFIND", "QUERY", "PURGE"]);
}

/// A client that hangs up while its request is at the origin: the edge still stores
/// the origin's answer, and the retry is a replay at the edge — not a 409 for as long
/// as the edge's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_finishes_when_the_client_leaves() {
    let db = TestDb::new("edge_gone").await;
    let origin = TestOrigin::start(&["--store", "postgres", "--database-url", &db.url]).await;
    let edge = Edge::start(&origin.url(""), &[("LEASE_MS", "20000")]).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let body = charge_body("cus-gone", 100, 1_500);
    let gave_up = impatient
        .post(format!("{}/v1/charges", edge.base))
        .header("idempotency-key", "gone-1")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await;
    assert!(gave_up.is_err(), "the client gave up");
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let retry = post(&client(), &edge.base, "gone-1", body, false).await;
    let status = retry.status().as_u16();
    let edge_did = retry
        .headers()
        .get("idem-edge")
        .map(|v| v.to_str().unwrap().to_owned());
    let charges = db.charges_for("gone-1").await;
    report(
        "edge",
        &format!("client gone after 300 ms of a 1.5 s charge, retry 3 s later: {status} {edge_did:?}; {charges} charge"),
    );
    assert_eq!(charges, 1);
    assert_eq!(
        (status, edge_did.as_deref()),
        (201, Some("replayed")),
        "the edge stored the answer after the client left"
    );
}

/// A misconfigured edge says so, naming the var, and forwards nothing — no loopback
/// default for a missing `ORIGIN_URL`, no silent default for a malformed number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misconfigured_edge_says_so_and_forwards_nothing() {
    let (origin, seen) = recording_origin().await;
    let mut answers = Vec::new();
    for (var, value, origin_url) in [
        ("ORIGIN_URL", "", ""),
        ("ORIGIN_URL", "http://bad host:8080", "http://bad host:8080"),
        (
            "TTL_MS",
            "unquoted:5000000000000",
            origin.url("").leak() as &str,
        ),
        ("TTL_MS", "junk", origin.url("").leak() as &str),
        ("EDGE_SECRET", "hunter2", origin.url("").leak() as &str),
        (
            "TTL_MS",
            "99999999999999999999",
            origin.url("").leak() as &str,
        ),
    ] {
        let edge = Edge::launch(origin_url, &[(var, value)], |_| true).await;
        let res = post(
            &client(),
            &edge.base,
            "misconfigured-1",
            charge_body("c", 1, 0),
            false,
        )
        .await;
        let status = res.status().as_u16();
        let problem: serde_json::Value = res.json().await.unwrap_or_default();
        answers.push(format!("{var}={value:?}: {status} {}", problem["detail"]));
        assert_eq!(status, 500, "{var}={value:?}: {problem}");
        assert_eq!(
            problem["type"],
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#edge-misconfigured"
        );
        assert!(
            problem["detail"].as_str().unwrap_or("").starts_with(var),
            "the detail names {var}: {problem}"
        );
    }
    let requests = seen.lock().unwrap().clone();
    report(
        "edge",
        &format!("misconfigured edges: {answers:?}; the origin saw {requests:?}"),
    );
    assert!(requests.is_empty(), "nothing was forwarded: {requests:?}");
}

/// An origin the edge cannot reach: the answer says the request may have run and a
/// retry with the same key gets its result (`origin-unreachable`, `Retry-After`), and
/// the edge keeps nothing, so the retry goes to the origin. Before, the edge answered
/// `handler-failed` — the type of a final answer, stored and never run again — while
/// the retry, once the origin answered, got the origin's `201`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_origin_is_an_answer_to_retry_not_a_final_one() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let edge = Edge::launch(&closed, &[], |_| true).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let res = post(
            &client(),
            &edge.base,
            "unreachable-1",
            charge_body("c", 1, 0),
            false,
        )
        .await;
        let status = res.status().as_u16();
        let retry_after = res
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let problem: serde_json::Value = res.json().await.unwrap_or_default();
        seen.push((
            status,
            problem["type"].as_str().unwrap_or("").to_owned(),
            retry_after,
        ));
    }
    report(
        "edge",
        &format!("an origin the edge cannot reach, asked twice: {seen:?}"),
    );
    for (status, kind, retry_after) in &seen {
        assert_eq!(*status, 502);
        assert_eq!(
            kind,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#origin-unreachable"
        );
        assert_eq!(retry_after.as_deref(), Some("1"));
    }
    // A request the edge does not guard (no key) gets no invitation to retry: it may
    // have reached the origin, and nothing would recognise it a second time.
    let unguarded = client()
        .get(format!("{}/v1/charges/ch_1", edge.base))
        .send()
        .await
        .unwrap();
    let unguarded_retry_after = unguarded.headers().get("retry-after").cloned();
    let unguarded_status = unguarded.status().as_u16();
    let unguarded_type = unguarded.json::<serde_json::Value>().await.unwrap()["type"].clone();
    report(
        "edge",
        &format!("an unguarded GET to an origin the edge cannot reach: {unguarded_status} {unguarded_type}, Retry-After {unguarded_retry_after:?}"),
    );
    assert_eq!(unguarded_status, 502);
    assert_ne!(
        unguarded_type,
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#origin-unreachable"
    );
    assert!(unguarded_retry_after.is_none());
    // At most its claim, freed (an in-progress record: 58 bytes, and the storage's
    // framing); never an answer, which carries a status, headers and a body.
    let sizes: Vec<usize> = edge
        .stored_records()
        .iter()
        .map(|(_, len, _)| *len)
        .collect();
    assert!(
        sizes.iter().all(|&len| len < 80),
        "the edge kept no answer: {sizes:?}"
    );
}

/// The origin learns who asked from the edge, not from the client: the client's
/// `X-Forwarded-For` and `CF-*` headers are dropped, the edge sets `X-Forwarded-For`
/// (the address the runtime saw), `-Host` and `-Proto`; a header the origin's answer
/// names in `Connection` stops at the edge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_origin_gets_the_edge_s_forwarding_headers_not_the_client_s() {
    use axum::response::IntoResponse;
    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/headers",
            axum::routing::get(|headers: http::HeaderMap| async move {
                let seen: BTreeMap<String, String> = headers
                    .iter()
                    .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("?").to_owned()))
                    .collect();
                (
                    [
                        ("x-answer-private", "hop"),
                        ("connection", "x-answer-private"),
                    ],
                    axum::Json(seen),
                )
                    .into_response()
            }),
        );
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let origin = TestOrigin::serve_router(app, store).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let res = client()
        .get(format!("{}/headers", edge.base))
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-forwarded-host", "evil.example")
        .header("cf-ray", "forged")
        .header("connection", "x-private")
        .header("x-private", "secret")
        .send()
        .await
        .unwrap();
    let leaked_answer_header = res.headers().get("x-answer-private").is_some();
    let seen: BTreeMap<String, String> = res.json().await.unwrap();
    let edge_host = edge.base.trim_start_matches("http://").to_owned();
    report(
        "edge",
        &format!("forwarding headers at the origin: x-forwarded-for {:?}, -host {:?}, -proto {:?}, cf-ray {:?}, x-private {:?}; the answer's connection-named header reached the client: {leaked_answer_header}",
            seen.get("x-forwarded-for"), seen.get("x-forwarded-host"), seen.get("x-forwarded-proto"), seen.get("cf-ray"), seen.get("x-private")),
    );
    assert_ne!(
        seen.get("x-forwarded-for").map(String::as_str),
        Some("6.6.6.6"),
        "{seen:?}"
    );
    // The address workerd saw the client at: this machine's loopback.
    assert_eq!(
        seen.get("x-forwarded-for").map(String::as_str),
        Some("127.0.0.1"),
        "the edge sets X-Forwarded-For to the address it saw, not the client's say: {seen:?}"
    );
    assert_eq!(seen.get("x-forwarded-host"), Some(&edge_host), "{seen:?}");
    assert_eq!(
        seen.get("x-forwarded-proto").map(String::as_str),
        Some("http"),
        "{seen:?}"
    );
    assert_ne!(
        seen.get("cf-ray").map(String::as_str),
        Some("forged"),
        "{seen:?}"
    );
    // The client's `Connection` header is consumed by workerd before the worker sees
    // it, so what it named (`x-private`) can't be told apart here; the core drops such
    // headers whenever a runtime hands `Connection` over (its unit test).
    assert!(
        !leaked_answer_header,
        "named in the answer's Connection: hop-by-hop"
    );
}

/// An answer whose status the edge's runtime cannot send (HTTP's final statuses are
/// 200-599; hyper, the origin's server, sends any three digits): before the fix the
/// worker threw building it and hung — a 500 "your Worker's code had hung" for the
/// first attempt and for every retry of the key. Now each gets a final problem saying
/// so; the origin executed once, and the edge goes on answering other keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_answers_an_origin_status_it_cannot_send_with_a_problem() {
    use std::sync::atomic::Ordering;
    let http = client();
    let mut seen = Vec::new();
    for status in [600u16, 999] {
        let (origin, runs) =
            origin_answering_without_a_body(http::StatusCode::from_u16(status).unwrap()).await;
        let edge = Edge::start(&origin.url(""), &[]).await;
        let key = format!("status-{status}");
        let mut answers = Vec::new();
        for _ in 0..2 {
            let res = post(&http, &edge.base, &key, charge_body("c", 1, 0), false).await;
            let from = handled_by(&res);
            let code = res.status().as_u16();
            let body = res.text().await.unwrap_or_default();
            let kind = serde_json::from_str::<serde_json::Value>(&body)
                .map(|v| v["type"].as_str().unwrap_or("").to_owned())
                .unwrap_or_else(|_| body.chars().take(80).collect());
            answers.push((code, from, kind));
        }
        let direct = post(&http, &origin.url(""), &key, charge_body("c", 1, 0), false).await;
        let other = post(&http, &edge.base, "another", charge_body("c", 1, 0), false).await;
        seen.push((
            status,
            answers,
            direct.status().as_u16(),
            other.status().as_u16(),
            runs.load(Ordering::SeqCst),
        ));
    }
    report(
        "edge",
        &format!("origin statuses the edge cannot send (status, [(status, idem-edge, problem)] first then retry, at the origin, another key at the edge, executions): {seen:?}"),
    );
    for (status, answers, direct, other, runs) in &seen {
        for answer in answers {
            assert_eq!(
                (answer.0, answer.2.as_str()),
                (
                    502,
                    "https://github.com/idem-rs/idem/blob/main/docs/problems.md#handler-failed"
                ),
                "a final problem, not a hung worker: {seen:?}"
            );
        }
        assert_eq!(*direct, *status, "the origin replays its answer: {seen:?}");
        assert_eq!(
            *other, 502,
            "the edge goes on answering (not hung): {seen:?}"
        );
        assert_eq!(*runs, 2, "one execution per key: {seen:?}");
    }
}
