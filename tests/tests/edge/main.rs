//! End to end through the edge: the worker under real workerd (`wrangler dev`) in
//! front of an origin on real Postgres. Needs the worker built (`scripts/test` does it:
//! `edge/build/`) and `edge/node_modules` (scripts/edge-toolchain). The harness is
//! `idem_tests::edge`; here are the origins the tests put behind it.

mod forwarding;
mod race;
mod replays;
mod scoping;
mod storage;
mod streaming;

use idem_tests::edge::*;
use idem_tests::upstream::sqlite as try_sqlite;
use idem_tests::{charge_body, client, proof, report, TestDb, TestOrigin};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A bare origin (not an idem origin) that records every request it gets: method and
/// path, and answers `/v1/charges` with a redirect, `/landing` with a page, and
/// anything else with the method it saw.
pub(crate) async fn recording_origin() -> (TestOrigin, Arc<std::sync::Mutex<Vec<String>>>) {
    use axum::extract::Request;
    use axum::response::IntoResponse;
    let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let s = seen.clone();
    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .fallback(move |req: Request| {
            let s = s.clone();
            async move {
                let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
                s.lock().unwrap().push(format!("{method} {path}"));
                match path.as_str() {
                    "/v1/charges" => (
                        http::StatusCode::SEE_OTHER,
                        [(http::header::LOCATION, "/landing")],
                        "see other",
                    )
                        .into_response(),
                    "/landing" => "the landing page".into_response(),
                    _ => method.into_response(),
                }
            }
        });
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    (TestOrigin::serve_router(app, store).await, seen)
}

/// A stream of `chunks`, each sent after its delay: a client or an origin that takes
/// its time.
pub(crate) fn paced(
    chunks: Vec<(Duration, Vec<u8>)>,
    sent: Arc<std::sync::Mutex<Vec<Instant>>>,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + 'static {
    futures_util::stream::unfold(chunks.into_iter(), move |mut rest| {
        let sent = sent.clone();
        async move {
            let (delay, chunk) = rest.next()?;
            tokio::time::sleep(delay).await;
            sent.lock().unwrap().push(Instant::now());
            Some((Ok(bytes::Bytes::from(chunk)), rest))
        }
    })
}

/// The same, storing answers of at most `max_stored` bytes (a problem in their place).
pub(crate) async fn origin_storing_at_most(
    ttl: Duration,
    body_len: usize,
    max_stored: Option<usize>,
) -> (TestOrigin, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let layer = idem::IdempotencyLayer::new(store.clone())
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(
            idem_core::contract::Anonymous::Scoped,
        ))
        .require_key_on(["/v1/charges"])
        .ttl(ttl)
        .edge_secret(idem_tests::EDGE_SECRET)
        .unwrap();
    let layer = match max_stored {
        Some(limit) => layer.max_stored_body_bytes(limit),
        None => layer,
    };
    let app = axum::Router::new()
        .route(
            "/v1/charges",
            axum::routing::post(move || {
                r.fetch_add(1, Ordering::SeqCst);
                async move { (http::StatusCode::CREATED, vec![b'a'; body_len]) }
            }),
        )
        .layer(layer)
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    (TestOrigin::serve_router(app, store).await, runs)
}

/// An idem origin keeping its answers for `ttl`, whose charge answers 201 with a body
/// of `body_len` bytes, counting its executions.
pub(crate) async fn origin_with_large_answers(
    ttl: Duration,
    body_len: usize,
) -> (TestOrigin, Arc<std::sync::atomic::AtomicUsize>) {
    origin_storing_at_most(ttl, body_len, None).await
}

/// The Python payments API, and `idem-origin --upstream` in front of it guarding
/// `/v1/*` for anonymous callers too, with `extra` flags.
pub(crate) async fn proxy_to_payments(extra: &[&str]) -> (idem_tests::Payments, TestOrigin) {
    let payments = idem_tests::Payments::start().await;
    let upstream = payments.url();
    let mut args = vec![
        "--upstream",
        upstream.as_str(),
        "--require-key-on",
        "/v1/*",
        "--anonymous",
        "scoped",
    ];
    if !extra.contains(&"--store") {
        args.extend_from_slice(&["--store", "memory"]);
    }
    args.extend_from_slice(extra);
    let origin = TestOrigin::start(&args).await;
    (payments, origin)
}

/// An idem origin whose charge answers `status` with no body, counting its executions.
pub(crate) async fn origin_answering_without_a_body(
    status: http::StatusCode,
) -> (TestOrigin, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let layer = idem::IdempotencyLayer::new(store.clone())
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(
            idem_core::contract::Anonymous::Scoped,
        ))
        .require_key_on(["/v1/charges"])
        .edge_secret(idem_tests::EDGE_SECRET)
        .unwrap();
    let app = axum::Router::new()
        .route(
            "/v1/charges",
            axum::routing::post(move || {
                r.fetch_add(1, Ordering::SeqCst);
                async move { status }
            }),
        )
        .layer(layer)
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    (TestOrigin::serve_router(app, store).await, runs)
}

/// The demo charges API behind the layer on a memory store, scoped by `Authorization`
/// (anonymous callers scoped), telling the edge what it stored, with `configure`'s
/// settings: the origin and the ledger of its charges.
pub(crate) async fn demo_origin_with(
    configure: impl FnOnce(idem::IdempotencyLayer) -> idem::IdempotencyLayer,
) -> (TestOrigin, Arc<idem_origin::charges::MemoryLedger>) {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let ledger = Arc::new(idem_origin::charges::MemoryLedger::default());
    let layer = idem::IdempotencyLayer::new(store.clone()).scope_rule(
        idem_core::contract::ScopeRule::by_authorization(idem_core::contract::Anonymous::Scoped),
    );
    let layer = configure(layer)
        .edge_secret(idem_tests::EDGE_SECRET)
        .unwrap();
    let demo = idem_origin::charges::Demo::new(ledger.clone());
    let router = idem_origin::app::router(layer, store.clone(), demo);
    (TestOrigin::serve_router(router, store).await, ledger)
}

/// The fingerprint rule of the tests below: all of the body but the demo's latency.
pub(crate) fn all_but_latency() -> idem_core::FingerprintRule {
    idem_core::FingerprintRule::new(&[] as &[&str], &["/simulate_latency_ms"], &[] as &[&str])
        .unwrap()
}
