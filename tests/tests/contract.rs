//! One test per row of the HTTP contract (README, "The HTTP contract"), through the real HTTP server,
//! with records in real Postgres.

use axum::body::Body;
use axum::routing::{any, post};
use axum::Router;
use bytes::Bytes;
use futures_util::stream;
use idem_origin::idempotency::IdempotencyLayer;
use idem_origin::store::postgres::PgOptions;
use idem_origin::store::{PostgresStore, Store};
use idem_tests::{charge_body, client, pg_addr, post_charge, via, Proxy, TestDb, TestOrigin};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

async fn demo(db: &TestDb, extra: &[&str]) -> TestOrigin {
    let mut args = vec!["--store", "postgres", "--database-url", &db.url];
    args.extend_from_slice(extra);
    TestOrigin::start(&args).await
}

async fn pg_store(db: &TestDb) -> Arc<dyn Store> {
    Arc::new(
        PostgresStore::connect(&db.url, PgOptions::default())
            .await
            .unwrap(),
    )
}

/// A handler that answers with the next scripted status and counts its calls — each
/// call is an effect (a charge) that must happen once.
#[derive(Clone, Default)]
struct Script {
    calls: Arc<AtomicUsize>,
    statuses: Arc<Mutex<VecDeque<(u16, Mark)>>>,
}

/// How a scripted answer is marked.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mark {
    Plain,
    /// `Cache-Control: no-store`, as security middleware stamps on every answer.
    NoStore,
    /// idem's private release signal: "nothing happened".
    Release,
}

impl Script {
    fn new(statuses: &[u16]) -> Self {
        let marked: Vec<(u16, Mark)> = statuses.iter().map(|s| (*s, Mark::Plain)).collect();
        Self::marked(&marked)
    }
    fn marked(answers: &[(u16, Mark)]) -> Self {
        Script {
            calls: Arc::default(),
            statuses: Arc::new(Mutex::new(answers.iter().copied().collect())),
        }
    }
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    fn router(&self) -> Router {
        let s = self.clone();
        Router::new().route(
            "/op",
            any(move || {
                let s = s.clone();
                async move {
                    let n = s.calls.fetch_add(1, Ordering::SeqCst) + 1;
                    let (status, mark) = s
                        .statuses
                        .lock()
                        .unwrap()
                        .pop_front()
                        .unwrap_or((200, Mark::Plain));
                    let mut res = http::Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .header("x-not-cached", "1");
                    if mark == Mark::NoStore {
                        res = res.header("cache-control", "no-store");
                    }
                    let res = res.body(Body::from(format!("{{\"call\":{n}}}"))).unwrap();
                    match mark {
                        Mark::Release => idem_origin::idempotency::release(res),
                        _ => res,
                    }
                }
            }),
        )
    }
}

async fn scripted(db: &TestDb, script: &Script) -> TestOrigin {
    let store = pg_store(db).await;
    let router = script
        .router()
        .layer(IdempotencyLayer::new(store.clone()).require_key_on(["/op"]));
    TestOrigin::serve_router(router, store).await
}

async fn op(origin: &TestOrigin, method: reqwest::Method, key: &str) -> reqwest::Response {
    client()
        .request(method, origin.url("/op"))
        .header("idempotency-key", key)
        .body("{}")
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn new_key_runs_the_handler_once_and_stores_its_answer() {
    let db = TestDb::new("new_key").await;
    let origin = demo(&db, &[]).await;
    let res = post_charge(
        &client(),
        &origin.url(""),
        Some("\"new-1\""),
        &charge_body("c", 500, 0),
    )
    .await;
    assert_eq!(res.status(), 201);
    assert!(res.headers().get("idempotent-replayed").is_none());
    assert_eq!(db.charges_for("new-1").await, 1);
    assert_eq!(
        db.count("SELECT count(*) FROM idem_records WHERE state = 1")
            .await,
        1
    );
}

#[tokio::test]
async fn retry_after_completion_replays_status_body_and_content_headers() {
    let db = TestDb::new("replay").await;
    let origin = demo(&db, &[]).await;
    let http = client();
    let first = post_charge(
        &http,
        &origin.url(""),
        Some("\"replay-1\""),
        &charge_body("c", 700, 0),
    )
    .await;
    let (status, headers) = (first.status(), first.headers().clone());
    let body = first.bytes().await.unwrap();
    // Reordered JSON with other whitespace is the same request.
    let again =
        r#"{ "customer": "c", "simulate_latency_ms": 0, "currency": "usd", "amount": 700 }"#;
    for _ in 0..3 {
        let res = post_charge(&http, &origin.url(""), Some("replay-1"), again).await;
        assert_eq!(res.status(), status);
        assert_eq!(res.headers()["idempotent-replayed"], "true");
        assert_eq!(res.headers()["content-type"], headers["content-type"]);
        assert_eq!(res.headers()["location"], headers["location"]);
        assert_eq!(res.bytes().await.unwrap(), body);
    }
    assert_eq!(db.charges_for("replay-1").await, 1);
}

#[tokio::test]
async fn retry_while_running_gets_409_with_retry_after() {
    let db = TestDb::new("inflight").await;
    let origin = demo(&db, &[]).await;
    let http = client();
    let body = charge_body("c", 100, 1500);
    let first = tokio::spawn({
        let (http, url, body) = (http.clone(), origin.url(""), body.clone());
        async move {
            post_charge(&http, &url, Some("\"run-1\""), &body)
                .await
                .status()
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let res = post_charge(&http, &origin.url(""), Some("\"run-1\""), &body).await;
    assert_eq!(res.status(), 409);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let problem: serde_json::Value = res.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:request-in-flight");
    assert_eq!(first.await.unwrap(), 201);
    assert_eq!(db.charges_for("run-1").await, 1);
}

#[tokio::test]
async fn prefer_wait_replays_the_first_attempt_when_it_finishes() {
    let db = TestDb::new("wait").await;
    let origin = demo(&db, &[]).await;
    let http = client();
    let body = charge_body("c", 100, 1000);
    let first = tokio::spawn({
        let (http, url, body) = (http.clone(), origin.url(""), body.clone());
        async move {
            post_charge(&http, &url, Some("\"wait-1\""), &body)
                .await
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let res = http
        .post(origin.url("/v1/charges"))
        .header("idempotency-key", "\"wait-1\"")
        .header("content-type", "application/json")
        .header("prefer", "wait=5")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    let waited: serde_json::Value = res.json().await.unwrap();
    assert_eq!(waited["id"], first.await.unwrap()["id"]);
    assert_eq!(db.charges_for("wait-1").await, 1);
}

#[tokio::test]
async fn prefer_wait_is_capped_by_max_wait() {
    let db = TestDb::new("wait_cap").await;
    let origin = demo(&db, &["--max-wait", "500ms"]).await;
    let http = client();
    let body = charge_body("c", 100, 3000);
    let first = tokio::spawn({
        let (http, url, body) = (http.clone(), origin.url(""), body.clone());
        async move {
            post_charge(&http, &url, Some("cap-1"), &body)
                .await
                .status()
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let res = http
        .post(origin.url("/v1/charges"))
        .header("idempotency-key", "cap-1")
        .header("content-type", "application/json")
        .header("prefer", "wait=60")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 409);
    // It waited (about 500 ms), but not for the minute it asked for.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_millis(2500),
        "waited {waited:?}"
    );
    assert_eq!(first.await.unwrap(), 201);
}

#[tokio::test]
async fn same_key_with_a_different_request_is_422() {
    let db = TestDb::new("mismatch").await;
    let origin = demo(&db, &[]).await;
    let http = client();
    assert_eq!(
        post_charge(
            &http,
            &origin.url(""),
            Some("mm-1"),
            &charge_body("c", 100, 0)
        )
        .await
        .status(),
        201
    );
    let res = post_charge(
        &http,
        &origin.url(""),
        Some("mm-1"),
        &charge_body("c", 101, 0),
    )
    .await;
    assert_eq!(res.status(), 422);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let problem: serde_json::Value = res.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:idempotency-key-reused");
    assert_eq!(problem["status"], 422);
    // A mismatch never replays and never charges.
    assert_eq!(db.charges().await, 1);
}

#[tokio::test]
async fn missing_key_on_a_route_that_requires_one_is_400() {
    let db = TestDb::new("missing").await;
    let origin = demo(&db, &[]).await;
    let res = post_charge(&client(), &origin.url(""), None, &charge_body("c", 100, 0)).await;
    assert_eq!(res.status(), 400);
    let problem: serde_json::Value = res.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:idempotency-key-missing");
    assert_eq!(db.charges().await, 0);
    assert_eq!(db.count("SELECT count(*) FROM idem_records").await, 0);
}

#[tokio::test]
async fn store_unreachable_is_503_and_the_handler_never_runs_then_it_recovers() {
    let db = TestDb::new("unreachable").await;
    let proxy = Proxy::start(pg_addr(&db.url)).await;
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect(
            &via(&db.url, proxy.addr),
            PgOptions {
                timeout: Duration::from_secs(1),
                ..PgOptions::default()
            },
        )
        .await
        .unwrap(),
    );
    // The ledger is in memory, so a handler running unguarded would be seen.
    let (origin, ledger) = TestOrigin::demo_on(store).await;
    let http = client();

    proxy.take_down();
    tokio::time::sleep(Duration::from_millis(200)).await; // the proxy cuts live connections
    for i in 0..5 {
        let res = post_charge(
            &http,
            &origin.url(""),
            Some(&format!("down-{i}")),
            &charge_body("c", 100, 0),
        )
        .await;
        assert_eq!(res.status(), 503);
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        let problem: serde_json::Value = res.json().await.unwrap();
        assert_eq!(problem["type"], "urn:idem:problem:store-unavailable");
    }
    let readyz = http.get(origin.url("/readyz")).send().await.unwrap();
    assert_eq!(readyz.status(), 503);
    // A short reason; the store's own error (addresses, users, server messages) stays
    // in the log.
    let body: serde_json::Value = readyz.json().await.unwrap();
    assert_eq!(body["store"]["error"], "unreachable", "{body}");
    let text = body.to_string();
    assert!(
        !text.contains("127.0.0.1") && !text.contains("postgres:") && !text.contains("refused"),
        "no internals in /readyz: {text}"
    );
    assert_eq!(ledger.len(), 0, "the handler ran without the store");

    proxy.bring_up();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let s = post_charge(
            &http,
            &origin.url(""),
            Some("down-0"),
            &charge_body("c", 100, 0),
        )
        .await
        .status();
        if s != 503 || Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status, 201, "the origin recovers without a restart");
    assert_eq!(
        http.get(origin.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(ledger.count_for_key("down-0"), 1);
}

/// The release rule: nothing is inferred from statuses or headers. A 502/503/504 can
/// follow a committed effect (an upstream timeout after the charge), and security
/// middleware stamps `no-store` on every answer: each is the result, replayed, and the
/// effect happens once.
#[tokio::test]
async fn gateway_errors_and_no_store_answers_are_the_result_never_run_again() {
    let answers = [
        (502u16, Mark::Plain),
        (503, Mark::Plain),
        (504, Mark::Plain),
        (201, Mark::NoStore),
        (400, Mark::NoStore),
    ];
    let mut effects = Vec::new();
    for (status, mark) in answers {
        let db = TestDb::new(&format!("s{status}{mark:?}").to_lowercase()).await;
        let script = Script::marked(&[(status, mark), (201, Mark::Plain)]);
        let origin = scripted(&db, &script).await;
        let first = op(&origin, reqwest::Method::POST, "k").await;
        assert_eq!(first.status().as_u16(), status);
        assert!(first.headers()["idem-disposition"]
            .to_str()
            .unwrap()
            .starts_with("stored; expires="));
        let retry = op(&origin, reqwest::Method::POST, "k").await;
        assert_eq!(
            retry.status().as_u16(),
            status,
            "{status} {mark:?}: replayed"
        );
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
        effects.push(format!("{status} {mark:?}: {} effects", script.calls()));
        assert_eq!(
            script.calls(),
            1,
            "{status} {mark:?}: the handler ran again"
        );
    }
    idem_tests::report(
        "release_rule",
        &format!("answered then retried: {}", effects.join(", ")),
    );
}

/// Only idem's private signal frees the key: the handler said nothing happened.
#[tokio::test]
async fn the_private_release_signal_frees_the_key_and_never_reaches_the_client() {
    let db = TestDb::new("signal").await;
    let script = Script::marked(&[(503, Mark::Release), (201, Mark::Plain)]);
    let origin = scripted(&db, &script).await;
    let first = op(&origin, reqwest::Method::POST, "k").await;
    assert_eq!(first.status(), 503);
    assert_eq!(first.headers()["idem-disposition"], "released");
    assert_eq!(db.live_records().await, 0, "nothing stored");
    let retry = op(&origin, reqwest::Method::POST, "k").await;
    assert_eq!(retry.status(), 201, "the retry runs the handler again");
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(script.calls(), 2);
    let third = op(&origin, reqwest::Method::POST, "k").await;
    assert_eq!(third.headers()["idempotent-replayed"], "true");
    assert_eq!(script.calls(), 2);
}

/// A body that breaks off after the handler ran: its outcome is unknown, so it is
/// stored as a 502 problem of its own type and never silently run again.
#[tokio::test]
async fn a_broken_response_is_stored_as_a_problem_and_never_run_again() {
    let db = TestDb::new("broken").await;
    let store = pg_store(&db).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let router = Router::new()
        .route(
            "/op",
            post(move || {
                let c = c.clone();
                async move {
                    if c.fetch_add(1, Ordering::SeqCst) == 0 {
                        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
                            Ok(Bytes::from_static(b"{\"partial\":")),
                            Err(std::io::Error::other("connection reset")),
                        ];
                        http::Response::new(Body::from_stream(stream::iter(chunks)))
                    } else {
                        http::Response::new(Body::from("{\"ok\":true}"))
                    }
                }
            }),
        )
        .layer(IdempotencyLayer::new(store.clone()));
    let origin = TestOrigin::serve_router(router, store).await;
    let send = || {
        client()
            .post(origin.url("/op"))
            .header("idempotency-key", "b")
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), 502);
    let first_body = first.text().await.unwrap();
    assert!(
        first_body.contains("urn:idem:problem:handler-failed"),
        "{first_body}"
    );
    let retry = send().await.unwrap();
    assert_eq!(retry.status(), 502);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.text().await.unwrap(), first_body);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never run again");
}

#[tokio::test]
async fn a_released_rejection_frees_the_key_for_the_corrected_retry() {
    let db = TestDb::new("nostore").await;
    let origin = demo(&db, &[]).await;
    let http = client();
    let bad = post_charge(
        &http,
        &origin.url(""),
        Some("fix-1"),
        r#"{"amount":-5,"currency":"usd","customer":"c"}"#,
    )
    .await;
    assert_eq!(bad.status(), 400);
    assert_eq!(bad.headers()["idem-disposition"], "released");
    assert_eq!(db.live_records().await, 0);
    let fixed = post_charge(
        &http,
        &origin.url(""),
        Some("fix-1"),
        &charge_body("c", 5, 0),
    )
    .await;
    assert_eq!(fixed.status(), 201);
    assert!(fixed.headers().get("idempotent-replayed").is_none());
    assert_eq!(db.charges_for("fix-1").await, 1);
}

#[tokio::test]
async fn other_answers_2xx_4xx_500_are_cached_and_replayed() {
    for status in [200u16, 202, 400, 402, 404, 409, 500] {
        let db = TestDb::new(&format!("c{status}")).await;
        let script = Script::new(&[status, 201]);
        let origin = scripted(&db, &script).await;
        let first = op(&origin, reqwest::Method::POST, "k").await;
        assert_eq!(first.status().as_u16(), status);
        let retry = op(&origin, reqwest::Method::POST, "k").await;
        assert_eq!(retry.status().as_u16(), status, "{status} is the result");
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
        assert_eq!(retry.headers()["content-type"], "application/json");
        assert!(
            retry.headers().get("x-not-cached").is_none(),
            "only allow-listed headers are replayed"
        );
        assert_eq!(retry.text().await.unwrap(), "{\"call\":1}");
        assert_eq!(script.calls(), 1);
    }
}

#[tokio::test]
async fn a_panicking_handler_stores_a_500() {
    let db = TestDb::new("panic").await;
    let store = pg_store(&db).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let router = Router::new()
        .route(
            "/op",
            post(move || {
                let c = c.clone();
                async move {
                    // The side effect happens, then the handler panics.
                    c.fetch_add(1, Ordering::SeqCst);
                    panic!("handler bug after the side effect");
                    #[allow(unreachable_code)]
                    "never"
                }
            }),
        )
        .layer(IdempotencyLayer::new(store.clone()));
    let origin = TestOrigin::serve_router(router, store).await;
    for replayed in [false, true] {
        let res = client()
            .post(origin.url("/op"))
            .header("idempotency-key", "p")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 500);
        assert_eq!(res.headers().get("idempotent-replayed").is_some(), replayed);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn get_head_put_delete_options_pass_through_untouched() {
    let db = TestDb::new("passthrough").await;
    let script = Script::new(&[]);
    let origin = scripted(&db, &script).await;
    let methods = [
        reqwest::Method::GET,
        reqwest::Method::HEAD,
        reqwest::Method::PUT,
        reqwest::Method::DELETE,
        reqwest::Method::OPTIONS,
    ];
    for m in &methods {
        for _ in 0..2 {
            let res = op(&origin, m.clone(), "same-key").await;
            assert_eq!(res.status(), 200, "{m}");
            assert!(res.headers().get("idempotent-replayed").is_none());
        }
    }
    assert_eq!(script.calls(), methods.len() * 2);
    assert_eq!(db.count("SELECT count(*) FROM idem_records").await, 0);
    // Even a malformed key is not idem's business on these methods.
    assert_eq!(
        op(&origin, reqwest::Method::GET, "bad key").await.status(),
        200
    );
}

#[tokio::test]
async fn keys_are_scoped_to_the_caller() {
    let db = TestDb::new("scope").await;
    let origin = demo(&db, &[]).await;
    let http = client();
    let send = |token: Option<&'static str>| {
        let mut req = http
            .post(origin.url("/v1/charges"))
            .header("idempotency-key", "shared-key")
            .header("content-type", "application/json")
            .body(charge_body("c", 100, 0));
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        req.send()
    };
    let alice = send(Some("sk_alice")).await.unwrap();
    let bob = send(Some("sk_bob")).await.unwrap();
    let anon = send(None).await.unwrap();
    let alice_again = send(Some("sk_alice")).await.unwrap();
    for r in [&alice, &bob, &anon] {
        assert_eq!(r.status(), 201);
        assert!(
            r.headers().get("idempotent-replayed").is_none(),
            "a caller never sees another's response"
        );
    }
    assert_eq!(alice_again.headers()["idempotent-replayed"], "true");
    assert_eq!(db.charges_for("shared-key").await, 3);
}

#[tokio::test]
async fn a_client_that_disconnects_does_not_cancel_the_handler() {
    let db = TestDb::new("disconnect").await;
    let origin = demo(&db, &[]).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let body = charge_body("c", 100, 800);
    let gave_up = impatient
        .post(origin.url("/v1/charges"))
        .header("idempotency-key", "dc-1")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await;
    assert!(gave_up.is_err(), "the client timed out");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let res = post_charge(&client(), &origin.url(""), Some("dc-1"), &body).await;
    assert_eq!(res.status(), 201);
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(db.charges_for("dc-1").await, 1);
}
