//! The layer as a tower service: what it asks of the service it wraps, and how it
//! answers a body it cannot read. Both were found untested by the mutation run over
//! the layer (docs/mutants.md).

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use idem::IdempotencyLayer;
use idem::MemoryStore;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service, ServiceExt};

/// A service that is ready only when `ready` says so, and counts its calls.
#[derive(Clone)]
struct Gate {
    ready: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Service<Request<Body>> for Gate {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.ready.load(Ordering::SeqCst) {
            Poll::Ready(Ok(()))
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    fn call(&mut self, _req: Request<Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Response::new(Body::from("ran"))))
    }
}

#[tokio::test]
async fn the_layer_is_ready_only_when_the_service_it_wraps_is() {
    let gate = Gate {
        ready: Arc::new(AtomicBool::new(false)),
        calls: Arc::new(AtomicUsize::new(0)),
    };
    let mut service = IdempotencyLayer::new(Arc::new(MemoryStore::new())).layer(gate.clone());
    let mut cx = Context::from_waker(std::task::Waker::noop());
    // A concurrency-limited or overloaded inner service says "not yet": so must the
    // layer, or its caller sends a request the inner service cannot take.
    assert!(
        Service::<Request<Body>>::poll_ready(&mut service, &mut cx).is_pending(),
        "the layer said ready while the service it wraps was not"
    );
    gate.ready.store(true, Ordering::SeqCst);
    assert!(matches!(
        Service::<Request<Body>>::poll_ready(&mut service, &mut cx),
        Poll::Ready(Ok(()))
    ));
    let res = service
        .call(Request::post("/v1/charges").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(gate.calls.load(Ordering::SeqCst), 1);
}

/// The layer wraps a service whatever its response body (here `Full<Bytes>`, as a
/// hyper or tower-http service answers): its answer is stored, and replayed to a retry,
/// with the service called once.
#[tokio::test]
async fn the_layer_takes_any_response_body() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let service = tower::service_fn(move |_req: Request<Body>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let body = http_body_util::Full::new(Bytes::from_static(b"charged once"));
        async move { Ok::<_, Infallible>(Response::builder().status(201).body(body).unwrap()) }
    });
    let service = IdempotencyLayer::new(Arc::new(MemoryStore::new()))
        .scope_rule(idem::core::contract::ScopeRule::by_authorization(
            idem::core::contract::Anonymous::Scoped,
        ))
        .layer(service);
    let mut answers = Vec::new();
    for _ in 0..2 {
        let req = Request::post("/v1/charges")
            .header("idempotency-key", "any-body")
            .body(Body::from("{}"))
            .unwrap();
        let res = service.clone().oneshot(req).await.unwrap();
        let replayed = res.headers().contains_key("idempotent-replayed");
        let status = res.status().as_u16();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        answers.push((status, replayed, body));
    }
    assert_eq!(
        answers,
        [
            (201, false, Bytes::from_static(b"charged once")),
            (201, true, Bytes::from_static(b"charged once")),
        ]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "ran once");
}

/// A body that yields `chunks`, then fails.
fn failing_body(chunks: usize) -> Body {
    let mut frames: Vec<Result<Bytes, std::io::Error>> = (0..chunks)
        .map(|_| Ok(Bytes::from_static(b"{\"a\":1")))
        .collect();
    frames.push(Err(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "the client went away",
    )));
    Body::from_stream(futures_util::stream::iter(frames))
}

#[tokio::test]
async fn a_body_that_fails_to_read_is_400_unreadable_not_413_and_runs_nothing() {
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Gate {
        ready: Arc::new(AtomicBool::new(true)),
        calls: calls.clone(),
    };
    let store = Arc::new(MemoryStore::new());
    let service = IdempotencyLayer::new(store.clone())
        .max_body_bytes(1024)
        .layer(gate);
    for chunks in [0, 3] {
        let req = Request::post("/v1/charges")
            .header("idempotency-key", "\"broken-body\"")
            .header("authorization", "Bearer layer-tests")
            .header("content-type", "application/json")
            .body(failing_body(chunks))
            .unwrap();
        let res = service.clone().oneshot(req).await.unwrap();
        let status = res.status().as_u16();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8_lossy(&body);
        assert_eq!(
            (
                status,
                body.contains(
                    "https://github.com/idem-rs/idem/blob/main/docs/problems.md#body-unreadable"
                )
            ),
            (400, true),
            "a body that failed after {chunks} chunks: {status} {body}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler ran");
    assert!(store.is_empty(), "a record was stored for an unread body");
    // A body over the limit, undeclared, is still 413: the read error says which.
    let big = Body::from_stream(futures_util::stream::iter(
        (0..8).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 200]))),
    ));
    let req = Request::post("/v1/charges")
        .header("idempotency-key", "\"big-body\"")
        .header("authorization", "Bearer layer-tests")
        .body(big)
        .unwrap();
    let res = service.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), 413);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// Every path answers 201 with a body of `size` bytes, counting its calls.
fn charges(calls: Arc<AtomicUsize>, size: usize) -> axum::Router {
    axum::Router::new().route(
        "/{*path}",
        axum::routing::any(move || {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                (http::StatusCode::CREATED, "x".repeat(size))
            }
        }),
    )
}

async fn post(app: &axum::Router, key: &str) -> (u16, String, Option<String>) {
    let req = Request::post("/v1/charges")
        .header("idempotency-key", key)
        .header("authorization", "Bearer layer-tests")
        .body(Body::from("{}"))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let retry_after = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        String::from_utf8_lossy(&body).into_owned(),
        retry_after,
    )
}

#[tokio::test]
async fn a_full_memory_store_refuses_new_keys_with_503_and_does_not_grow() {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(MemoryStore::bounded(50, usize::MAX));
    let app = charges(calls.clone(), 10).layer(IdempotencyLayer::new(store.clone()));
    let mut statuses = std::collections::BTreeMap::new();
    for n in 0..80 {
        let (status, body, retry_after) = post(&app, &format!("k{n}")).await;
        *statuses.entry(status).or_insert(0) += 1;
        if status == 503 {
            assert!(
                body.contains(
                    "https://github.com/idem-rs/idem/blob/main/docs/problems.md#store-full"
                ),
                "{body}"
            );
            assert_eq!(retry_after.as_deref(), Some("30"));
        }
    }
    assert_eq!(statuses, [(201, 50), (503, 30)].into(), "{statuses:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 50, "a refused key ran");
    assert_eq!(store.len(), 50, "the store grew past its cap");
    // What it holds still replays, and a refused key is refused again, not run.
    let (status, _, _) = post(&app, "k7").await;
    assert_eq!(status, 201);
    let (status, _, _) = post(&app, "k70").await;
    assert_eq!(status, 503);
    assert_eq!(calls.load(Ordering::SeqCst), 50);

    // By bytes: answers of 10 000 bytes, a cap of 100 000: it fills after about 9
    // (each record also counts its key and a fixed allowance), then refuses.
    let calls = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(MemoryStore::bounded(usize::MAX, 100_000));
    let app = charges(calls.clone(), 10_000).layer(IdempotencyLayer::new(store.clone()));
    let mut ran = 0;
    for n in 0..40 {
        let (status, body, _) = post(&app, &format!("b{n}")).await;
        match status {
            201 => ran += 1,
            503 => assert!(body.contains("store-full"), "{body}"),
            other => panic!("{other}: {body}"),
        }
    }
    assert!(
        (9..=11).contains(&ran),
        "{ran} answers of 10 000 bytes under a cap of 100 000"
    );
    assert_eq!(calls.load(Ordering::SeqCst), ran);
    assert!(store.bytes() < 100_000 + 11_000, "{} bytes", store.bytes());
}

/// A body that sends `first`, then waits for `rest` to be sent on the returned channel.
fn stalled_body(first: &'static [u8]) -> (Body, tokio::sync::mpsc::Sender<Bytes>) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let head = futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(first))]);
    let tail = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (Ok(chunk), rx))
    });
    (
        Body::from_stream(futures_util::StreamExt::chain(head, tail)),
        tx,
    )
}

#[tokio::test]
async fn bodies_hold_the_bytes_they_sent_until_their_answer_and_no_more() {
    let calls = Arc::new(AtomicUsize::new(0));
    let slow = {
        let calls = calls.clone();
        axum::Router::new().route(
            "/{*path}",
            axum::routing::post(move |body: Bytes| {
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
                    (http::StatusCode::CREATED, format!("{} bytes", body.len()))
                }
            }),
        )
    };
    let app = slow.layer(
        IdempotencyLayer::new(Arc::new(MemoryStore::new()))
            .max_body_bytes(100)
            .max_buffered_body_bytes(100),
    );
    let request = |key: &str, length: usize, body: Body| {
        Request::post("/v1/charges")
            .header("idempotency-key", key)
            .header("authorization", "Bearer layer-tests")
            .header("content-length", length.to_string())
            .body(body)
            .unwrap()
    };
    let status =
        |res: Result<http::Response<axum::body::Body>, Infallible>| res.unwrap().status().as_u16();
    // A client that declared 100 bytes and sent 10 holds 10, not 100: another body of
    // 80 is read.
    let (trickle, more) = stalled_body(b"{\"a\":\"1234");
    let trickling = tokio::spawn(app.clone().oneshot(request("trickle", 100, trickle)));
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let eighty = Body::from(format!("{{\"b\":\"{}\"}}", "x".repeat(72)));
    let first = tokio::spawn(app.clone().oneshot(request("eighty", 80, eighty)));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    // While the 80 bytes' handler runs, they are still held: 10 + 80 + 30 > 100.
    let thirty = || Body::from(format!("{{\"c\":\"{}\"}}", "y".repeat(22)));
    let refused = app
        .clone()
        .oneshot(request("thirty", 30, thirty()))
        .await
        .unwrap();
    assert_eq!(refused.status(), 503, "a body that did not fit was read");
    assert_eq!(refused.headers()["retry-after"], "1");
    let problem = refused.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&problem)
            .contains("https://github.com/idem-rs/idem/blob/main/docs/problems.md#server-busy"),
        "{problem:?}"
    );
    assert_eq!(
        status(first.await.unwrap()),
        201,
        "the 80 bytes beside a trickle of 10"
    );
    // Its answer given, its 80 bytes are free: the 30 fit now.
    assert_eq!(
        status(app.clone().oneshot(request("thirty", 30, thirty())).await),
        201
    );
    // The trickle ends, with 10 + 90 bytes sent: read, and answered.
    more.send(Bytes::from(format!("{}\"}}", "z".repeat(88))))
        .await
        .unwrap();
    drop(more);
    assert_eq!(status(trickling.await.unwrap()), 201);
    assert_eq!(calls.load(Ordering::SeqCst), 3, "the refused body ran");
}

/// Found untested by the layer's mutation run: an answer of exactly the stored-body
/// limit is stored; one byte more is not (its replays get `response-not-stored`).
#[tokio::test]
async fn an_answer_of_exactly_the_stored_limit_is_stored_and_one_byte_more_is_not() {
    for (size, replayed) in [
        (10, "xxxxxxxxxx"),
        (
            11,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#response-not-stored",
        ),
    ] {
        let calls = Arc::new(AtomicUsize::new(0));
        let app = charges(calls.clone(), size)
            .layer(IdempotencyLayer::new(Arc::new(MemoryStore::new())).max_stored_body_bytes(10));
        let (first, body, _) = post(&app, "exact").await;
        assert_eq!(
            (first, body.len()),
            (201, size),
            "the attempt that ran gets it all"
        );
        let (again, body, _) = post(&app, "exact").await;
        assert!(
            body.contains(replayed),
            "{size} bytes, replayed: {again} {body}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}

/// The defaults the book and the flags document.
#[test]
fn the_documented_defaults() {
    assert_eq!(idem::DEFAULT_BUFFERED_BODY_BYTES, 64 * 1024 * 1024);
    assert_eq!(idem::DEFAULT_MAX_IN_PROGRESS, 10_000);
    assert_eq!(MemoryStore::DEFAULT_MAX_RECORDS, 1_000_000);
    assert_eq!(MemoryStore::DEFAULT_MAX_BYTES, 256 * 1024 * 1024);
}
