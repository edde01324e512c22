//! One contract for both runtimes: the same table of requests goes to the origin's
//! layer alone, and to the edge's flow (host-side, its records in the Durable
//! Object's pure `apply`) in front of an origin — and the two answers must be the same
//! bytes: status, headers in order, body. The edge must also have answered the rows
//! it can answer by itself (replays, refusals), or the table could pass with an edge
//! that forwards everything.
//!
//! Needs no service: both stores are in memory, every request is a `oneshot`.

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use http::{HeaderName, HeaderValue, Request, StatusCode};
use http_body_util::BodyExt;
use idem::MemoryStore;
use idem::{release, IdempotencyLayer};
use idem_core::RecordKey;
use idem_edge::config::EdgeConfig;
use idem_edge::flow::{
    self, Answer, EdgeRuntime, Handled, Head, Outbound, Payload, ReadError, EDGE_HEADER,
};
use idem_edge::memory::{MemoryObject, MemoryObjects};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower::ServiceExt;

const MAX_BODY: usize = 1024;
const MAX_WAIT: Duration = Duration::from_secs(5);

/// The API behind idem: every call of a handler is an effect, counted.
#[derive(Clone)]
struct Api {
    calls: Arc<AtomicUsize>,
    /// `/v1/slow` takes a permit before it answers: the test holds it in flight.
    gate: Arc<Semaphore>,
}

impl Api {
    fn new() -> Self {
        Api {
            calls: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn router(&self) -> Router {
        Router::new()
            .route("/v1/charges", post(charge).get(listing))
            .route("/v1/other", post(charge).patch(charge).put(listing))
            .route("/v1/reject", post(reject))
            .route("/v1/no-store", post(no_store))
            .route("/v1/unavailable", post(unavailable))
            .route("/v1/slow", post(slow))
            .with_state(self.clone())
    }

    /// The API behind the layer, configured as the edge is.
    fn guarded(&self) -> Router {
        let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()))
            .scope_rule(idem_core::contract::ScopeRule::by_authorization(
                idem_core::contract::Anonymous::Scoped,
            ))
            .require_key_on(["/v1/charges"])
            .max_wait(MAX_WAIT)
            .max_body_bytes(MAX_BODY)
            .edge_secret(idem_tests::EDGE_SECRET)
            .unwrap();
        self.router().layer(layer)
    }
}

async fn charge(State(api): State<Api>) -> Response {
    let n = api.calls.fetch_add(1, Ordering::SeqCst) + 1;
    let mut res = (StatusCode::CREATED, format!("{{\"id\":\"ch_{n}\"}}")).into_response();
    let headers = res.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let mut add = |name: &'static str, value: String| {
        headers.append(name, HeaderValue::from_str(&value).unwrap());
    };
    add("location", format!("/v1/charges/ch_{n}"));
    // Not a cached header: the first answer has it, replays do not.
    add("x-request-id", format!("req_{n}"));
    // A cached header with two values: both kept, in order.
    add("content-language", "en".into());
    add("content-language", "fr".into());
    res
}

async fn listing() -> Response {
    (StatusCode::OK, "[]").into_response()
}

async fn reject(State(api): State<Api>) -> Response {
    api.calls.fetch_add(1, Ordering::SeqCst);
    release((StatusCode::BAD_REQUEST, "amount must be positive").into_response())
}

async fn no_store(State(api): State<Api>) -> Response {
    let n = api.calls.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        [("cache-control", "no-store")],
        format!("charged {n}"),
    )
        .into_response()
}

async fn unavailable(State(api): State<Api>) -> Response {
    let n = api.calls.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("upstream timed out after effect {n}"),
    )
        .into_response()
}

async fn slow(State(api): State<Api>) -> Response {
    let n = api.calls.fetch_add(1, Ordering::SeqCst) + 1;
    api.gate.acquire().await.expect("gate open").forget();
    (StatusCode::CREATED, format!("slow {n}")).into_response()
}

/// A request of the table.
#[derive(Clone, Debug)]
struct Req {
    method: &'static str,
    path: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

fn req(method: &'static str, path: &'static str) -> Req {
    Req {
        method,
        path,
        headers: Vec::new(),
        body: Vec::new(),
    }
}

impl Req {
    fn key(self, key: &str) -> Self {
        self.header("idempotency-key", key)
    }
    fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }
    fn json(mut self, body: &str) -> Self {
        self.body = body.as_bytes().to_vec();
        self.header("content-type", "application/json")
    }
    fn http(&self) -> Request<Body> {
        let mut builder = Request::builder().method(self.method).uri(self.path);
        for (name, value) in &self.headers {
            builder = builder.header(*name, value);
        }
        builder.body(Body::from(self.body.clone())).unwrap()
    }
}

/// Headers that differ by runtime, not by contract: the edge's diagnostic, the
/// origin's disposition and stored-header list (for the edge, which strips them) and
/// the body's framing, which each runtime's HTTP stack writes for itself.
const RUNTIME_HEADERS: [&str; 4] = [
    EDGE_HEADER,
    "idem-disposition",
    "idem-stored-headers",
    "content-length",
];

/// The answer as a client compares it: status, headers in order, body — without
/// [`RUNTIME_HEADERS`].
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Seen {
    fn of(answer: &Answer) -> Seen {
        Seen {
            status: answer.status,
            headers: answer
                .headers
                .iter()
                .filter(|(n, _)| !RUNTIME_HEADERS.contains(&n.as_str()))
                .map(|(n, v)| match n.as_str() {
                    // Seconds left, read on each runtime's clock: they may straddle a
                    // second. Both must say the TTL (24 h) give or take a few seconds.
                    "idempotency-ttl" => {
                        let near = v
                            .parse::<u64>()
                            .is_ok_and(|s| (86_390..=86_400).contains(&s));
                        (
                            n.clone(),
                            if near {
                                "~86400".into()
                            } else {
                                format!("unexpected {v}")
                            },
                        )
                    }
                    _ => (n.clone(), v.clone()),
                })
                .collect(),
            body: String::from_utf8_lossy(&answer.body).into_owned(),
        }
    }
}

async fn answer_of(res: Response) -> Answer {
    let (parts, body) = res.into_parts();
    Answer {
        status: parts.status.as_u16(),
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: body.collect().await.unwrap().to_bytes().to_vec(),
    }
}

/// The origin's layer alone.
struct OriginAlone {
    api: Api,
    router: Router,
}

impl OriginAlone {
    fn new() -> Self {
        let api = Api::new();
        OriginAlone {
            router: api.guarded(),
            api,
        }
    }

    async fn send(&self, req: &Req) -> Answer {
        answer_of(self.router.clone().oneshot(req.http()).await.unwrap()).await
    }
}

/// The edge's flow in front of an origin; its records in [`MemoryObjects`].
struct EdgeChain {
    api: Api,
    origin: Router,
    objects: MemoryObjects,
    config: EdgeConfig,
}

impl EdgeChain {
    fn new() -> Self {
        let api = Api::new();
        let config = EdgeConfig {
            origin_url: "http://origin.test".into(),
            max_wait_ms: MAX_WAIT.as_millis() as u64,
            max_body_bytes: MAX_BODY,
            // The origin's rule (`Api::guarded`): anonymous callers scoped on purpose.
            scope: idem_core::contract::ScopeRule::by_authorization(
                idem_core::contract::Anonymous::Scoped,
            ),
            edge_secret: idem_edge::config::EdgeSecret(idem_tests::EDGE_SECRET.into()),
            ..EdgeConfig::default()
        };
        assert_eq!(config.require_key_paths, ["/v1/charges"]);
        EdgeChain {
            origin: api.guarded(),
            api,
            objects: MemoryObjects::new(idem::now),
            config,
        }
    }

    async fn send(&self, req: &Req) -> Answer {
        let head = Head {
            method: req.method.into(),
            path_and_query: req.path.into(),
            headers: req
                .headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.clone()))
                .collect(),
            scheme: "http".into(),
        };
        flow::handle(self, &self.config, head, req.body.clone())
            .await
            .map_body(|body| match body {
                Payload::Bytes(bytes) | Payload::Stream(bytes) => bytes,
            })
    }
}

impl EdgeRuntime for EdgeChain {
    type Body = Vec<u8>;
    type Stream = Vec<u8>;
    type Records = MemoryObject;

    async fn read_body(&self, body: Vec<u8>, limit: usize) -> Result<Vec<u8>, ReadError> {
        if body.len() > limit {
            return Err(ReadError::TooLarge);
        }
        Ok(body)
    }

    async fn fetch_streamed(&self, request: Outbound) -> Result<Answer, String> {
        self.fetch_whole(request).await
    }

    async fn fetch_whole(&self, request: Outbound) -> Result<Answer, String> {
        let path = request
            .url
            .strip_prefix(&self.config.origin_url)
            .ok_or("not the origin")?;
        let mut http = Request::builder().method(request.method.as_str()).uri(path);
        for (name, value) in &request.headers {
            http = http.header(
                HeaderName::from_bytes(name.as_bytes()).map_err(|e| e.to_string())?,
                HeaderValue::from_str(value).map_err(|e| e.to_string())?,
            );
        }
        let http = http
            .body(Body::from(request.body.unwrap_or_default()))
            .map_err(|e| e.to_string())?;
        Ok(answer_of(self.origin.clone().oneshot(http).await.unwrap()).await)
    }

    fn records(&self, key: &RecordKey) -> Result<MemoryObject, String> {
        Ok(self.objects.object(key))
    }

    fn now(&self) -> u64 {
        idem::now()
    }

    async fn sleep(&self, ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await
    }

    fn warn(&self, message: &str) {
        eprintln!("edge: {message}");
    }
}

fn edge_said(answer: &Answer) -> Option<&str> {
    answer
        .headers
        .iter()
        .find(|(n, _)| n == EDGE_HEADER)
        .map(|(_, v)| v.as_str())
}

/// A row: the request, the status both must answer, and what the edge must have done.
struct Row {
    req: Req,
    status: u16,
    edge: Handled,
}

fn row(req: Req, status: u16, edge: Handled) -> Row {
    Row { req, status, edge }
}

fn table() -> Vec<Row> {
    use Handled::*;
    let big = "x".repeat(MAX_BODY + 1);
    vec![
        // Routing and keys.
        row(req("POST", "/v1/charges").json("{}"), 400, Refused),
        row(
            req("POST", "/v1/charges").key("a b").json("{}"),
            400,
            Refused,
        ),
        row(
            req("POST", "/v1/charges").key("\"unterminated").json("{}"),
            400,
            Refused,
        ),
        row(req("POST", "/v1/charges").key("").json("{}"), 400, Refused),
        row(
            req("POST", "/v1/charges").key(&"k".repeat(256)).json("{}"),
            400,
            Refused,
        ),
        row(
            req("POST", "/v1/charges").key("k0").key("k1").json("{}"),
            400,
            Refused,
        ),
        row(req("GET", "/v1/charges"), 200, Passed),
        row(req("PUT", "/v1/other").key("bad key"), 200, Passed),
        row(req("POST", "/v1/other").json("{}"), 201, Passed),
        // Bodies over the limit, declared or not.
        row(
            req("POST", "/v1/charges").key("k-big").json(&big),
            413,
            Refused,
        ),
        // Executed once, then replayed with the cached headers only.
        row(
            req("POST", "/v1/charges")
                .key("k1")
                .json(r#"{"amount":100}"#),
            201,
            Forwarded,
        ),
        row(
            req("POST", "/v1/charges")
                .key("k1")
                .json(r#"{"amount":100}"#),
            201,
            Replayed,
        ),
        row(
            req("POST", "/v1/charges")
                .key("\"k1\"")
                .json(r#"{ "amount" : 100 }"#),
            201,
            Replayed,
        ),
        // A different request under the key.
        row(
            req("POST", "/v1/charges")
                .key("k1")
                .json(r#"{"amount":200}"#),
            422,
            Refused,
        ),
        row(
            req("POST", "/v1/charges?expand=x")
                .key("k1")
                .json(r#"{"amount":100}"#),
            422,
            Refused,
        ),
        row(
            req("POST", "/v1/charges")
                .key("k1")
                .header("content-type", "text/plain"),
            422,
            Refused,
        ),
        // Keys belong to their caller.
        row(
            req("POST", "/v1/charges")
                .key("k1")
                .header("authorization", "Bearer sk_b")
                .json(r#"{"amount":100}"#),
            201,
            Forwarded,
        ),
        row(
            req("POST", "/v1/charges")
                .key("k1")
                .header("authorization", "Bearer sk_b")
                .json(r#"{"amount":100}"#),
            201,
            Replayed,
        ),
        // Guarded where a key is optional.
        row(
            req("PATCH", "/v1/other").key("k2").json("{}"),
            201,
            Forwarded,
        ),
        row(
            req("PATCH", "/v1/other").key("k2").json("{}"),
            201,
            Replayed,
        ),
        // A repeated Content-Type is read as the folded value on both.
        row(
            req("POST", "/v1/other")
                .key("k6")
                .header("content-type", "application/json")
                .header("content-type", "text/plain"),
            201,
            Forwarded,
        ),
        row(
            req("POST", "/v1/other")
                .key("k6")
                .header("content-type", "application/json, text/plain"),
            201,
            Replayed,
        ),
        row(
            req("POST", "/v1/other")
                .key("k6")
                .header("content-type", "application/json"),
            422,
            Refused,
        ),
        // Only the private signal releases; no-store and a 503 are results.
        row(
            req("POST", "/v1/reject").key("k3").json("{}"),
            400,
            Forwarded,
        ),
        row(
            req("POST", "/v1/reject").key("k3").json("{}"),
            400,
            Forwarded,
        ),
        row(req("POST", "/v1/no-store").key("k4"), 201, Forwarded),
        row(req("POST", "/v1/no-store").key("k4"), 201, Replayed),
        row(req("POST", "/v1/unavailable").key("k5"), 503, Forwarded),
        row(req("POST", "/v1/unavailable").key("k5"), 503, Replayed),
    ]
}

#[tokio::test]
async fn the_same_table_gets_the_same_answers_from_the_edge_and_the_origin() {
    let origin = OriginAlone::new();
    let edge = EdgeChain::new();
    let rows = table();
    for (i, row) in rows.iter().enumerate() {
        let alone = origin.send(&row.req).await;
        let chained = edge.send(&row.req).await;
        let what = format!("row {i}: {:?}", row.req);
        assert_eq!(alone.status, row.status, "{what}");
        assert_eq!(Seen::of(&chained), Seen::of(&alone), "{what}");
        assert_eq!(edge_said(&chained), Some(row.edge.as_str()), "{what}");
        assert_eq!(edge.api.calls(), origin.api.calls(), "effects after {what}");
    }
    // k1 by two callers, k2, k6, k3 twice (released), k4, k5, the pass-through POST.
    assert_eq!(origin.api.calls(), 9);
    println!("same-table rows: {}", rows.len());
}

/// Sends `req` while `/v1/slow` holds its key: a retry gets 409, a retry that waits
/// gets the first attempt's answer once it finishes — from either runtime.
#[tokio::test]
async fn a_retry_in_flight_is_refused_or_waits_the_same_way_on_both() {
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let origin = Arc::new(OriginAlone::new());
            let edge = std::rc::Rc::new(EdgeChain::new());
            let first = req("POST", "/v1/slow").key("k-slow").json("{}");
            let o = origin.clone();
            let f = first.clone();
            let origin_first = tokio::task::spawn_local(async move { o.send(&f).await });
            let e = edge.clone();
            let f = first.clone();
            let edge_first = tokio::task::spawn_local(async move { e.send(&f).await });
            while origin.api.calls() < 1 || edge.api.calls() < 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }

            let busy_alone = origin.send(&first).await;
            let busy_chained = edge.send(&first).await;
            assert_eq!(busy_alone.status, 409);
            assert_eq!(Seen::of(&busy_chained), Seen::of(&busy_alone));
            assert_eq!(edge_said(&busy_chained), Some("refused"));
            // A different request under the key is refused as such while it runs.
            let other = req("POST", "/v1/slow").key("k-slow").json(r#"{"x":1}"#);
            let other_alone = origin.send(&other).await;
            assert_eq!(other_alone.status, 422);
            assert_eq!(Seen::of(&edge.send(&other).await), Seen::of(&other_alone));

            let waiting = first.clone().header("prefer", "wait=5");
            let o = origin.clone();
            let w = waiting.clone();
            let origin_waiter = tokio::task::spawn_local(async move { o.send(&w).await });
            let e = edge.clone();
            let w = waiting.clone();
            let edge_waiter = tokio::task::spawn_local(async move { e.send(&w).await });
            tokio::time::sleep(Duration::from_millis(100)).await;
            origin.api.gate.add_permits(1);
            edge.api.gate.add_permits(1);

            let (origin_first, edge_first) =
                (origin_first.await.unwrap(), edge_first.await.unwrap());
            assert_eq!(origin_first.status, 201);
            assert_eq!(Seen::of(&edge_first), Seen::of(&origin_first));
            assert_eq!(edge_said(&edge_first), Some("forwarded"));
            let (origin_waited, edge_waited) =
                (origin_waiter.await.unwrap(), edge_waiter.await.unwrap());
            assert_eq!(origin_waited.status, 201);
            assert!(origin_waited
                .headers
                .contains(&("idempotent-replayed".into(), "true".into())));
            assert_eq!(Seen::of(&edge_waited), Seen::of(&origin_waited));
            assert_eq!(edge_said(&edge_waited), Some("replayed"));
            assert_eq!((origin.api.calls(), edge.api.calls()), (1, 1));
        })
        .await;
}

/// The edge that lost its records sends retries to the origin, which replays: the
/// answers stay the same and nothing runs twice.
#[tokio::test]
async fn an_edge_that_lost_its_records_still_answers_like_the_origin() {
    let origin = OriginAlone::new();
    let edge = EdgeChain::new();
    let charge = req("POST", "/v1/charges")
        .key("k-lost")
        .json(r#"{"amount":1}"#);
    assert_eq!(
        Seen::of(&edge.send(&charge).await),
        Seen::of(&origin.send(&charge).await)
    );
    assert_eq!(edge.objects.len(), 1);
    edge.objects.forget_all();
    let alone = origin.send(&charge).await;
    let chained = edge.send(&charge).await;
    assert_eq!(Seen::of(&chained), Seen::of(&alone));
    assert_eq!(
        edge_said(&chained),
        Some("forwarded"),
        "the origin replayed it"
    );
    assert_eq!((origin.api.calls(), edge.api.calls()), (1, 1));
    assert_eq!(
        Seen::of(&edge.send(&charge).await).status,
        201,
        "the edge keeps the origin's replay again"
    );
}
