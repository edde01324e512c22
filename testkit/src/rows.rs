//! The rows of the HTTP contract (docs/contract.md) that hold on any store, each a
//! function of the store it runs on. `contract_rows!(fixture)` makes one
//! `#[tokio::test]` per row: `idem`'s own tests run them on the memory store (no
//! service needed), `idem-tests` on Postgres, Redis and tiered.
//!
//! Requests go through the layer with `tower::ServiceExt::oneshot`: no socket, so
//! nothing here depends on timing but the rows that wait on purpose. A fixture may
//! put a wire between the layer and the handler ([`through`]): proxy mode runs every
//! row with the handler as an HTTP upstream on a socket.

use axum::body::Body;
use axum::routing::any;
use axum::Router;
use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use idem::core::{IdempotencyKey, RecordKey, Scope};
use idem::Store;
use idem::{release, IdempotencyLayer};
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Defines one test per row, each on a store made by `$fixture(row_name).await`, which
/// returns the store and whatever keeps it alive.
#[macro_export]
macro_rules! contract_rows {
    ($fixture:path) => {
        $crate::contract_rows!($fixture;
            a_new_key_runs_the_handler_once_and_stores_its_answer,
            a_retry_after_completion_replays_status_body_and_cached_headers,
            a_retry_while_running_gets_409_with_retry_after,
            prefer_wait_replays_the_first_attempt_when_it_finishes,
            prefer_wait_is_capped_by_max_wait,
            the_same_key_with_a_different_request_is_422,
            a_missing_or_malformed_key_is_400_and_stores_nothing,
            a_body_over_the_limit_is_413_and_stores_nothing,
            gateway_errors_and_no_store_answers_are_the_result,
            the_private_release_signal_frees_the_key_and_never_reaches_the_client,
            a_broken_response_is_stored_as_a_problem_and_never_run_again,
            other_answers_2xx_4xx_500_are_cached_and_replayed,
            a_panicking_handler_stores_a_500,
            other_methods_pass_through_untouched,
            keys_are_scoped_to_the_caller,
        );
    };
    ($fixture:path; $($row:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $row() {
                let (store, _keep) = $fixture(stringify!($row)).await;
                $crate::rows::$row(store).await;
            }
        )+
    };
}

/// How the layer reaches the handler's router: `None`, it wraps it; or a function
/// that serves it somewhere and returns the layer in front of what reaches it.
pub type Wire = fn(Router, IdempotencyLayer) -> Router;

thread_local! {
    static WIRE: Cell<Option<Wire>> = const { Cell::new(None) };
}

/// Puts `wire` between the layer and the handler for the rest of this test (a
/// `#[tokio::test]` runs on its own thread).
pub fn through(wire: Wire) {
    WIRE.with(|w| w.set(Some(wire)));
}

/// Whether this test's rows run over a wire (an upstream behind a proxy).
pub fn over_a_wire() -> bool {
    WIRE.with(|w| w.get().is_some())
}

/// A handler that answers with the next scripted status and counts its calls — each
/// call is an effect (a charge) that must happen once.
#[derive(Clone)]
pub struct Script {
    calls: Arc<AtomicUsize>,
    answers: Arc<Mutex<VecDeque<(u16, Mark)>>>,
    /// Calls marked [`Mark::Gated`] take a permit before they answer.
    gate: Arc<Semaphore>,
    /// Served over a wire: "nothing happened" is said with the release header an
    /// upstream sends, not the in-process signal.
    wired: Arc<AtomicBool>,
}

/// How a scripted answer is made.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mark {
    Plain,
    /// `Cache-Control: no-store`, as security middleware stamps on every answer.
    NoStore,
    /// idem's private release signal: "nothing happened".
    Release,
    /// Held until the test opens the gate.
    Gated,
    /// The effect happens, then the handler panics.
    Panics,
    /// The body breaks off after its first bytes.
    Breaks,
}

impl Script {
    pub fn new(statuses: &[u16]) -> Self {
        let marked: Vec<(u16, Mark)> = statuses.iter().map(|s| (*s, Mark::Plain)).collect();
        Self::marked(&marked)
    }

    pub fn marked(answers: &[(u16, Mark)]) -> Self {
        Script {
            calls: Arc::default(),
            answers: Arc::new(Mutex::new(answers.iter().copied().collect())),
            gate: Arc::new(Semaphore::new(0)),
            wired: Arc::default(),
        }
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn open_gate(&self) {
        self.gate.add_permits(1);
    }

    /// `/op` (any method) behind the layer, over this test's wire if it has one.
    pub fn router(&self, layer: IdempotencyLayer) -> Router {
        let s = self.clone();
        let app = Router::new().route("/op", any(move || s.clone().answer()));
        match WIRE.with(Cell::get) {
            None => app.layer(layer),
            Some(wire) => {
                self.wired.store(true, Ordering::SeqCst);
                wire(app, layer)
            }
        }
    }

    async fn answer(self) -> http::Response<Body> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let (status, mark) = self
            .answers
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or((200, Mark::Plain));
        if mark == Mark::Gated {
            self.gate.acquire().await.unwrap().forget();
        }
        if mark == Mark::Panics {
            panic!("handler bug after the side effect");
        }
        let body = if mark == Mark::Breaks {
            let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(Bytes::from_static(b"{\"partial\":")),
                Err(std::io::Error::other("connection reset")),
            ];
            Body::from_stream(stream::iter(chunks))
        } else {
            Body::from(format!("{{\"call\":{n}}}"))
        };
        let mut res = http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .header("location", format!("/op/{n}"))
            .header("x-not-cached", "1");
        if mark == Mark::NoStore {
            res = res.header("cache-control", "no-store");
        }
        if mark == Mark::Release && self.wired.load(Ordering::SeqCst) {
            res = res.header("idem-release", "1");
        }
        let res = res.body(body).unwrap();
        match mark {
            Mark::Release => release(res),
            _ => res,
        }
    }
}

/// The layer on `store`, with a key required on `/op`.
pub fn layer(store: &Arc<dyn Store>) -> IdempotencyLayer {
    IdempotencyLayer::new(store.clone())
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(
            idem_core::contract::Anonymous::Scoped,
        ))
        .require_key_on(["/op"])
        .max_body_bytes(1024)
        .edge_secret(EDGE_SECRET)
        .unwrap()
}

/// The secret the rows' requests carry, as an edge in front would: so that the rows
/// see what idem tells an edge (`idem-disposition`).
pub const EDGE_SECRET: &str = "rows-edge-secret-0123456789";

/// An answer, read whole.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json")
        );
        let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        v["type"].as_str().unwrap().to_owned()
    }
}

/// A request to `/op`.
pub fn op(method: &str, key: Option<&str>) -> http::request::Builder {
    let req = Request::builder()
        .method(method)
        .uri("/op")
        .header("content-type", "application/json")
        .header("idem-edge-secret", EDGE_SECRET);
    match key {
        Some(key) => req.header("idempotency-key", key),
        None => req,
    }
}

pub async fn send(router: &Router, req: http::request::Builder, body: &str) -> Answer {
    let req = req.body(Body::from(body.to_owned())).unwrap();
    let res = router.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

pub async fn post(router: &Router, key: &str) -> Answer {
    send(router, op("POST", Some(key)), "{}").await
}

/// The record key of an anonymous caller's `key`.
pub fn record_key(key: &str) -> RecordKey {
    RecordKey::new(
        &Scope::anonymous(),
        &IdempotencyKey::parse(key.as_bytes()).unwrap(),
    )
}

async fn is_completed(store: &Arc<dyn Store>, key: &str) -> bool {
    let record = store.get(&record_key(key)).await.unwrap();
    record.is_some_and(|r| r.is_completed())
}

/// Waits until the script's handler was entered `n` times.
async fn entered(script: &Script, n: usize) {
    while script.calls() < n {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

pub async fn a_new_key_runs_the_handler_once_and_stores_its_answer(store: Arc<dyn Store>) {
    let script = Script::new(&[201]);
    let router = script.router(layer(&store));
    let res = post(&router, "\"new-1\"").await;
    assert_eq!(res.status, 201);
    assert!(!res.replayed());
    assert!(res
        .header("idem-disposition")
        .unwrap()
        .starts_with("stored; expires="));
    assert_eq!(script.calls(), 1);
    assert!(is_completed(&store, "new-1").await);
}

pub async fn a_retry_after_completion_replays_status_body_and_cached_headers(
    store: Arc<dyn Store>,
) {
    let script = Script::new(&[201]);
    let router = script.router(layer(&store));
    let body = r#"{"amount":700,"currency":"usd"}"#;
    let first = send(&router, op("POST", Some("\"replay-1\"")), body).await;
    // Reordered JSON with other whitespace is the same request; so is the bare key.
    let again = r#"{ "currency": "usd", "amount": 700 }"#;
    for _ in 0..3 {
        let res = send(&router, op("POST", Some("replay-1")), again).await;
        assert_eq!(res.status, first.status);
        assert!(res.replayed());
        assert_eq!(res.header("content-type"), first.header("content-type"));
        assert_eq!(res.header("location"), first.header("location"));
        assert_eq!(
            res.header("x-not-cached"),
            None,
            "only cached headers replay"
        );
        assert_eq!(res.body, first.body);
    }
    assert_eq!(script.calls(), 1);
}

pub async fn a_retry_while_running_gets_409_with_retry_after(store: Arc<dyn Store>) {
    let script = Script::marked(&[(201, Mark::Gated)]);
    let router = script.router(layer(&store));
    let first = tokio::spawn({
        let router = router.clone();
        async move { post(&router, "run-1").await.status }
    });
    entered(&script, 1).await;
    let res = post(&router, "run-1").await;
    assert_eq!(res.status, 409);
    assert_eq!(res.header("retry-after"), Some("1"));
    assert_eq!(res.header("cache-control"), Some("no-store"));
    assert_eq!(
        res.problem_type(),
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#request-in-flight"
    );
    script.open_gate();
    assert_eq!(first.await.unwrap(), 201);
    assert_eq!(script.calls(), 1);
}

pub async fn prefer_wait_replays_the_first_attempt_when_it_finishes(store: Arc<dyn Store>) {
    let script = Script::marked(&[(201, Mark::Gated)]);
    let router = script.router(layer(&store));
    let first = tokio::spawn({
        let router = router.clone();
        async move { post(&router, "wait-1").await }
    });
    entered(&script, 1).await;
    let waiter = tokio::spawn({
        let router = router.clone();
        async move {
            send(
                &router,
                op("POST", Some("wait-1")).header("prefer", "wait=5"),
                "{}",
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "it waits");
    script.open_gate();
    let first = first.await.unwrap();
    let waited = waiter.await.unwrap();
    assert_eq!(waited.status, 201);
    assert!(waited.replayed());
    assert_eq!(waited.body, first.body);
    assert_eq!(script.calls(), 1);
}

pub async fn prefer_wait_is_capped_by_max_wait(store: Arc<dyn Store>) {
    let script = Script::marked(&[(201, Mark::Gated)]);
    let router = script.router(layer(&store).max_wait(Duration::from_millis(300)));
    let first = tokio::spawn({
        let router = router.clone();
        async move { post(&router, "cap-1").await.status }
    });
    entered(&script, 1).await;
    let started = tokio::time::Instant::now();
    let res = send(
        &router,
        op("POST", Some("cap-1")).header("prefer", "wait=60"),
        "{}",
    )
    .await;
    let waited = started.elapsed();
    assert_eq!(res.status, 409);
    // It waited (about 300 ms), not the minute it asked for.
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_secs(30),
        "waited {waited:?}"
    );
    script.open_gate();
    assert_eq!(first.await.unwrap(), 201);
}

pub async fn the_same_key_with_a_different_request_is_422(store: Arc<dyn Store>) {
    let script = Script::new(&[201]);
    let router = script.router(layer(&store));
    assert_eq!(
        send(&router, op("POST", Some("mm-1")), r#"{"a":1}"#)
            .await
            .status,
        201
    );
    for (method, body) in [("POST", r#"{"a":2}"#), ("PATCH", r#"{"a":1}"#)] {
        let res = send(&router, op(method, Some("mm-1")), body).await;
        assert_eq!(res.status, 422, "{method} {body}");
        assert_eq!(
            res.problem_type(),
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#idempotency-key-reused"
        );
    }
    let text = Request::builder()
        .method("POST")
        .uri("/op")
        .header("idempotency-key", "mm-1")
        .header("content-type", "text/plain");
    let res = send(&router, text, r#"{"a":1}"#).await;
    assert_eq!(res.status, 422, "the content type is part of the request");
    // A second Content-Type is read as the joined value (as runtimes that fold
    // repeated headers read it): another request.
    let twice = op("POST", Some("mm-1")).header("content-type", "text/plain");
    assert_eq!(send(&router, twice, r#"{"a":1}"#).await.status, 422);
    assert_eq!(script.calls(), 1, "a mismatch never runs the handler");
}

pub async fn a_missing_or_malformed_key_is_400_and_stores_nothing(store: Arc<dyn Store>) {
    let script = Script::new(&[]);
    let router = script.router(layer(&store));
    let missing = send(&router, op("POST", None), "{}").await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.problem_type(),
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#idempotency-key-missing"
    );
    let long = "k".repeat(256);
    for bad in ["a b", "\"open", "", long.as_str()] {
        let res = post(&router, bad).await;
        assert_eq!(res.status, 400, "{bad:?}");
        assert_eq!(
            res.problem_type(),
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#idempotency-key-malformed"
        );
    }
    let two = op("POST", Some("k1")).header("idempotency-key", "k2");
    let res = send(&router, two, "{}").await;
    assert_eq!(res.status, 400);
    assert_eq!(
        res.problem_type(),
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#idempotency-key-malformed"
    );
    for key in ["k1", "k2"] {
        assert_eq!(store.get(&record_key(key)).await.unwrap(), None);
    }
    assert_eq!(script.calls(), 0);
}

pub async fn a_body_over_the_limit_is_413_and_stores_nothing(store: Arc<dyn Store>) {
    let script = Script::new(&[]);
    let router = script.router(layer(&store));
    let big = "x".repeat(1025);
    let res = send(&router, op("POST", Some("big-1")), &big).await;
    assert_eq!(res.status, 413);
    assert_eq!(
        res.problem_type(),
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#body-too-large"
    );
    // Refused on its declared length, before a byte is read.
    let declared = op("POST", Some("big-2")).header("content-length", "5000000");
    let res = send(&router, declared, "").await;
    assert_eq!(res.status, 413);
    for key in ["big-1", "big-2"] {
        assert_eq!(store.get(&record_key(key)).await.unwrap(), None);
    }
    assert_eq!(script.calls(), 0);
}

/// The release rule: nothing is inferred from statuses or headers. A 502/503/504 can
/// follow a committed effect (an upstream timeout after the charge), and security
/// middleware stamps `no-store` on every answer: each is the result, replayed, and the
/// effect happens once.
pub async fn gateway_errors_and_no_store_answers_are_the_result(store: Arc<dyn Store>) {
    let answers = [
        (502u16, Mark::Plain),
        (503, Mark::Plain),
        (504, Mark::Plain),
        (201, Mark::NoStore),
        (400, Mark::NoStore),
    ];
    for (i, (status, mark)) in answers.into_iter().enumerate() {
        let script = Script::marked(&[(status, mark), (201, Mark::Plain)]);
        let router = script.router(layer(&store));
        let key = format!("result-{i}");
        let first = post(&router, &key).await;
        assert_eq!(first.status.as_u16(), status);
        let retry = post(&router, &key).await;
        assert_eq!(retry.status.as_u16(), status, "{status} {mark:?}: replayed");
        assert!(retry.replayed());
        assert_eq!(
            script.calls(),
            1,
            "{status} {mark:?}: the handler ran again"
        );
    }
}

pub async fn the_private_release_signal_frees_the_key_and_never_reaches_the_client(
    store: Arc<dyn Store>,
) {
    let script = Script::marked(&[(503, Mark::Release), (201, Mark::Plain)]);
    let router = script.router(layer(&store));
    let first = post(&router, "signal-1").await;
    assert_eq!(first.status, 503);
    assert_eq!(first.header("idem-disposition"), Some("released"));
    assert_eq!(
        first.header("idem-release"),
        None,
        "the upstream's signal is private"
    );
    assert!(!is_completed(&store, "signal-1").await, "nothing stored");
    let retry = post(&router, "signal-1").await;
    assert_eq!(retry.status, 201, "the retry runs the handler again");
    assert!(!retry.replayed());
    let third = post(&router, "signal-1").await;
    assert!(third.replayed());
    assert_eq!(script.calls(), 2);
}

/// A body that breaks off after the handler ran: its outcome is unknown, so it is
/// stored as a 502 problem of its own type and never silently run again. Over a
/// wire, the upstream's server may drop the connection before its head went out
/// (the body broke while the first write was buffered): the answer was then lost
/// whole, which is `upstream-outcome-unknown`, stored the same way.
pub async fn a_broken_response_is_stored_as_a_problem_and_never_run_again(store: Arc<dyn Store>) {
    let script = Script::marked(&[(200, Mark::Breaks)]);
    let router = script.router(layer(&store));
    let first = post(&router, "broken-1").await;
    assert_eq!(first.status, 502);
    let kind = first.problem_type();
    let lost_whole = over_a_wire() && kind == "https://github.com/idem-rs/idem/blob/main/docs/problems.md#upstream-outcome-unknown";
    assert!(
        kind == "https://github.com/idem-rs/idem/blob/main/docs/problems.md#handler-failed"
            || lost_whole,
        "{kind}"
    );
    assert_eq!(
        first.header("cache-control"),
        None,
        "a result, not a refusal"
    );
    let retry = post(&router, "broken-1").await;
    assert_eq!(retry.status, 502);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(script.calls(), 1, "never run again");
}

pub async fn other_answers_2xx_4xx_500_are_cached_and_replayed(store: Arc<dyn Store>) {
    for status in [200u16, 202, 400, 402, 404, 409, 500] {
        let script = Script::new(&[status, 201]);
        let router = script.router(layer(&store));
        let key = format!("cached-{status}");
        let first = post(&router, &key).await;
        assert_eq!(first.status.as_u16(), status);
        let retry = post(&router, &key).await;
        assert_eq!(retry.status.as_u16(), status, "{status} is the result");
        assert!(retry.replayed());
        assert_eq!(retry.header("content-type"), Some("application/json"));
        assert_eq!(retry.header("x-not-cached"), None);
        assert_eq!(&retry.body[..], b"{\"call\":1}");
        assert_eq!(script.calls(), 1);
    }
}

/// In process, a panic is caught and stored as a 500. Over a wire, the upstream's
/// server drops the connection with the request in hand: the outcome is unknown,
/// stored as such.
pub async fn a_panicking_handler_stores_a_500(store: Arc<dyn Store>) {
    let script = Script::marked(&[(201, Mark::Panics)]);
    let router = script.router(layer(&store));
    let (status, kind) = if over_a_wire() {
        (
            502,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#upstream-outcome-unknown",
        )
    } else {
        (
            500,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#handler-panicked",
        )
    };
    for replayed in [false, true] {
        let res = post(&router, "panic-1").await;
        assert_eq!(res.status, status);
        assert_eq!(res.problem_type(), kind);
        assert_eq!(res.replayed(), replayed);
        assert_eq!(
            res.header("cache-control"),
            None,
            "a result, the same on every answer"
        );
    }
    assert_eq!(script.calls(), 1);
}

pub async fn other_methods_pass_through_untouched(store: Arc<dyn Store>) {
    let script = Script::new(&[]);
    let router = script.router(layer(&store));
    let methods = ["GET", "HEAD", "PUT", "DELETE", "OPTIONS"];
    for method in methods {
        for _ in 0..2 {
            let res = send(&router, op(method, Some("same-key")), "").await;
            assert_eq!(res.status, 200, "{method}");
            assert!(!res.replayed());
        }
    }
    assert_eq!(script.calls(), methods.len() * 2);
    assert_eq!(store.get(&record_key("same-key")).await.unwrap(), None);
    // Even a malformed key is not idem's business on these methods.
    let res = send(&router, op("GET", Some("bad key")), "").await;
    assert_eq!(res.status, 200);
}

pub async fn keys_are_scoped_to_the_caller(store: Arc<dyn Store>) {
    let script = Script::new(&[201, 201, 201]);
    let router = script.router(layer(&store));
    let as_caller = |token: Option<&str>| {
        let req = op("POST", Some("shared-key"));
        match token {
            Some(t) => req.header("authorization", format!("Bearer {t}")),
            None => req,
        }
    };
    for token in [Some("sk_alice"), Some("sk_bob"), None] {
        let res = send(&router, as_caller(token), "{}").await;
        assert_eq!(res.status, 201);
        assert!(!res.replayed(), "a caller never sees another's answer");
    }
    let alice_again = send(&router, as_caller(Some("sk_alice")), "{}").await;
    assert!(alice_again.replayed());
    assert_eq!(&alice_again.body[..], b"{\"call\":1}");
    assert_eq!(script.calls(), 3);
}
