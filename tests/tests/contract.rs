//! The HTTP contract (docs/contract.md) on the stores that need a service: every row of
//! `idem-testkit`'s on Postgres, Redis, Redis Cluster and both tiered modes — the same
//! rows `cargo test -p idem` runs on the memory store — and the rows that need more
//! than a store: a store that goes away, a client that hangs up, the demo's own release.

use idem_testkit::rows;

use idem::OutboxOptions;
use idem::PgOptions;
use idem::{Durability, PostgresStore, Store, TieredStore};
use idem_tests::{
    charge_body, client, pg_addr, post_charge, redis_cluster_urls, redis_store, redis_url, via,
    Proxy, TestDb, TestOrigin,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn demo(db: &TestDb, extra: &[&str]) -> TestOrigin {
    let mut args = vec!["--store", "postgres", "--database-url", &db.url];
    args.extend_from_slice(extra);
    TestOrigin::start(&args).await
}

async fn pg_store(db: &TestDb) -> Arc<PostgresStore> {
    Arc::new(
        PostgresStore::connect(&db.url, PgOptions::default())
            .await
            .unwrap(),
    )
}

async fn postgres(_row: &str) -> (Arc<dyn Store>, TestDb) {
    let db = TestDb::new("row").await;
    (pg_store(&db).await, db)
}

async fn redis(_row: &str) -> (Arc<dyn Store>, ()) {
    (Arc::new(redis_store(&redis_url(), "rows").await), ())
}

async fn redis_cluster(_row: &str) -> (Arc<dyn Store>, ()) {
    (
        Arc::new(redis_store(&redis_cluster_urls(), "rows").await),
        (),
    )
}

async fn tiered(durability: Durability) -> (Arc<dyn Store>, TestDb) {
    let db = TestDb::new("row").await;
    let store = TieredStore::new(
        redis_store(&redis_cluster_urls(), "rows").await,
        pg_store(&db).await,
        durability,
        OutboxOptions::default(),
    );
    (Arc::new(store), db)
}

async fn tiered_sync(_row: &str) -> (Arc<dyn Store>, TestDb) {
    tiered(Durability::Sync).await
}

async fn tiered_async(_row: &str) -> (Arc<dyn Store>, TestDb) {
    tiered(Durability::Async).await
}

mod on_postgres {
    idem_testkit::contract_rows!(super::postgres);
}

mod on_redis {
    idem_testkit::contract_rows!(super::redis);
}

mod on_redis_cluster {
    idem_testkit::contract_rows!(super::redis_cluster);
}

mod on_tiered_sync {
    idem_testkit::contract_rows!(super::tiered_sync);
}

mod on_tiered_async {
    idem_testkit::contract_rows!(super::tiered_async);
}

/// Proxy mode: the handler served over HTTP on a socket, the layer in front of
/// `idem-origin`'s upstream client, as `--upstream` builds it.
fn through_the_proxy(app: axum::Router, layer: idem::IdempotencyLayer) -> axum::Router {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let upstream = idem_origin::proxy::Upstream::new(idem_origin::proxy::UpstreamOptions {
        url: format!("http://{addr}"),
        timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(4),
        release_header: http::HeaderName::from_static("idem-release"),
        unknown_outcome: idem_origin::config::UnknownOutcome::Store,
        public_hosts: Vec::new(),
        pass_ambiguous_paths: false,
        tls: Default::default(),
        problem_base: idem_core::contract::DEFAULT_PROBLEM_BASE.into(),
    })
    .unwrap();
    idem_origin::app::proxied(layer, upstream)
}

async fn proxied_memory(_row: &str) -> (Arc<dyn Store>, ()) {
    rows::through(through_the_proxy);
    (Arc::new(idem::MemoryStore::new()), ())
}

async fn proxied_redis_cluster(row: &str) -> (Arc<dyn Store>, ()) {
    rows::through(through_the_proxy);
    redis_cluster(row).await
}

mod through_the_proxy_on_memory {
    idem_testkit::contract_rows!(super::proxied_memory);
}

mod through_the_proxy_on_redis_cluster {
    idem_testkit::contract_rows!(super::proxied_redis_cluster);
}

/// README's row for the release rule, once it held on every store.
#[tokio::test]
async fn the_release_rule_holds_on_every_store() {
    let memory: Arc<dyn Store> = Arc::new(idem::MemoryStore::new());
    rows::gateway_errors_and_no_store_answers_are_the_result(memory).await;
    let (store, _db) = postgres("").await;
    rows::gateway_errors_and_no_store_answers_are_the_result(store).await;
    let (store, _) = redis("").await;
    rows::gateway_errors_and_no_store_answers_are_the_result(store).await;
    let (store, _) = redis_cluster("").await;
    rows::gateway_errors_and_no_store_answers_are_the_result(store).await;
    let (store, _db) = tiered_sync("").await;
    rows::gateway_errors_and_no_store_answers_are_the_result(store).await;
    let (store, _db) = tiered_async("").await;
    rows::gateway_errors_and_no_store_answers_are_the_result(store).await;
    idem_tests::proof::record(
        "faults",
        "gateway-results",
        &["each stored and replayed, 1 effect (memory, postgres, redis, redis cluster, tiered sync and async)"],
    );
}

/// A holder keeps its lease when the store's new connections are slow to open (a
/// database far away, or too loaded to start a session quickly): its renewals' own
/// connections are opened with the store, not by the first renewal, which gave up on
/// its connection with itself, every time. Here a new connection takes 150 ms and a
/// renewal gives up after a twelfth of the 1 s lease (83 ms).
#[tokio::test]
async fn a_holder_keeps_its_lease_when_new_store_connections_are_slow() {
    slow_charges_under_slow_connects(SlowConnects::new(Fault::None, 1)).await;
}

/// [`a_holder_keeps_its_lease_when_new_store_connections_are_slow`], and every store
/// connection is cut while the charges run (the server closed its sessions): the
/// renewals' connections are opened again in the background, not by a renewal, which
/// would give up on it, every time, until the lease ends. Eight holders, twice the
/// renewals' connections: renewals waiting for a connection must not keep the refill
/// from counting the ones missing.
#[tokio::test]
async fn holders_keep_their_leases_when_their_store_connections_are_cut_and_slow_to_reopen() {
    slow_charges_under_slow_connects(SlowConnects::new(Fault::Cut, 8)).await;
}

/// A partition of 1 s (a quarter of the 4 s lease) 1 s into two 7 s charges (both
/// claimed by then), new connections taking 500 ms (more than a renewal may, 333 ms):
/// every connection is lost, the refill's attempts are refused meanwhile and back off
/// (up to 1 s), and once the store is back a connection opened in the background
/// carries the renewals before the leases end. The retries at 4.5 s must find the
/// charges running.
#[tokio::test]
async fn a_holder_keeps_its_lease_through_a_partition_when_connections_are_slow_to_reopen() {
    slow_charges_under_slow_connects(SlowConnects {
        lease: Duration::from_secs(4),
        handler: Duration::from_secs(7),
        connect_delay: Duration::from_millis(500),
        fault_at: Duration::from_secs(1),
        retry_at: Duration::from_millis(4_500),
        ..SlowConnects::new(Fault::Partition(Duration::from_secs(1)), 2)
    })
    .await;
}

/// What befalls the store's connections while the charges run.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// Every connection cut (the server closed its sessions).
    Cut,
    /// Every connection cut and new ones refused, for this long.
    Partition(Duration),
}

/// Charges run at once under a lease while new store connections are slow.
struct SlowConnects {
    fault: Fault,
    charges: usize,
    lease: Duration,
    handler: Duration,
    connect_delay: Duration,
    fault_at: Duration,
    retry_at: Duration,
}

impl SlowConnects {
    /// 3 s charges under a 1 s lease, new connections taking 150 ms, retried at 1.5 s.
    fn new(fault: Fault, charges: usize) -> SlowConnects {
        SlowConnects {
            fault,
            charges,
            lease: Duration::from_secs(1),
            handler: Duration::from_secs(3),
            connect_delay: Duration::from_millis(150),
            fault_at: Duration::from_millis(300),
            retry_at: Duration::from_millis(1_500),
        }
    }
}

/// Runs `run`'s charges, puts its fault in at `fault_at`, and retries each at `retry_at`:
/// every retry must find its charge running (409), and each charge run once.
async fn slow_charges_under_slow_connects(run: SlowConnects) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let SlowConnects {
        fault,
        charges,
        lease,
        handler,
        connect_delay,
        fault_at,
        retry_at,
    } = run;
    let db = TestDb::new(match fault {
        Fault::None => "slow_connects",
        Fault::Cut => "cut_slow",
        Fault::Partition(_) => "partition_slow",
    })
    .await;
    let proxy = Proxy::start(pg_addr(&db.url)).await;
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect(&via(&db.url, proxy.addr), PgOptions::default())
            .await
            .unwrap(),
    );
    store.ping().await.unwrap();
    proxy.slow_connects(connect_delay);
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let layer = idem::IdempotencyLayer::new(store.clone())
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(
            idem_core::contract::Anonymous::Scoped,
        ))
        .require_key_on(["/v1/slow"])
        .lease(lease);
    let app = axum::Router::new()
        .route(
            "/v1/slow",
            axum::routing::post(move || {
                r.fetch_add(1, Ordering::SeqCst);
                async move {
                    tokio::time::sleep(handler).await;
                    http::StatusCode::CREATED
                }
            }),
        )
        .layer(layer);
    let origin = TestOrigin::serve_router(app, store).await;
    let url = origin.url("/v1/slow");
    let send = |charge: usize| {
        let url = url.clone();
        async move {
            let res = client()
                .post(url)
                .header("idempotency-key", format!("slow-connects-{charge}"))
                .body("{}")
                .send()
                .await
                .unwrap();
            (res.status().as_u16(), res.text().await.unwrap())
        }
    };
    let firsts: Vec<_> = (0..charges).map(|c| tokio::spawn(send(c))).collect();
    let started = tokio::time::Instant::now();
    tokio::time::sleep_until(started + fault_at).await;
    match fault {
        Fault::None => {}
        Fault::Cut => proxy.cut_connections(),
        Fault::Partition(down) => {
            proxy.take_down();
            tokio::time::sleep(down).await;
            proxy.bring_up();
        }
    }
    tokio::time::sleep_until(started + retry_at).await;
    let retries = futures_util::future::join_all((0..charges).map(send)).await;
    let mut first = Vec::new();
    for f in firsts {
        first.push(f.await.unwrap().0);
    }
    let runs = runs.load(Ordering::SeqCst);
    let retry: Vec<u16> = retries.iter().map(|(status, _)| *status).collect();
    let setting = match fault {
        Fault::None => String::new(),
        Fault::Cut => format!("every connection cut {fault_at:?} in, "),
        Fault::Partition(down) => format!("a {down:?} partition {fault_at:?} in, "),
    };
    idem_tests::report(
        "contract",
        &format!("{charges} charge(s) of {handler:?} under a {lease:?} lease, {setting}new connections taking {connect_delay:?}: first attempts {first:?}, their retries at {retry_at:?} {retry:?}; {runs} run(s)"),
    );
    for (status, body) in &retries {
        assert_eq!(*status, 409, "the charge kept its lease: {body}");
    }
    assert!(first.iter().all(|&status| status == 201), "{first:?}");
    assert_eq!(runs, charges, "each ran once");
    let (retry, first) = (retry[0], first[0]);
    let counted = if charges == 1 {
        format!("retry {retry} while it ran, {runs} charge; the first answered {first}")
    } else {
        format!("{charges} retries {retry} while they ran, {runs} charges; the first attempts answered {first}")
    };
    idem_tests::proof::record(
        "faults",
        match fault {
            Fault::None => "slow-connects",
            Fault::Cut => "cut-slow-connects",
            Fault::Partition(_) => "partition-slow-connects",
        },
        &[&counted],
    );
}

#[tokio::test]
async fn store_unreachable_is_503_and_the_handler_never_runs_then_it_recovers() {
    let db = TestDb::new("unreachable").await;
    let proxy = Proxy::start(pg_addr(&db.url)).await;
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect(
            &via(&db.url, proxy.addr),
            PgOptions::default().timeout(Duration::from_secs(1)),
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
        assert_eq!(
            problem["type"],
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#store-unavailable"
        );
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

#[tokio::test]
async fn a_released_rejection_frees_the_key_for_the_corrected_retry() {
    let db = TestDb::new("nostore").await;
    let origin = demo(&db, &[]).await;
    let http = client();
    let bad = idem_tests::post_charge_as_edge(
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

/// A handler that blocks its thread (a synchronous payment SDK in an async handler)
/// past its lease keeps its claim: the lease's heartbeat is a task of its own. Before
/// the fix it was spawned into the blocked worker's LIFO slot, which no other worker
/// may take, so it never ran: no renewal, and a retry after the lease took the key
/// over and ran the handler a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_that_blocks_its_thread_keeps_its_lease() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let db = TestDb::new("blocking").await;
    let store: Arc<dyn Store> = pg_store(&db).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let layer = idem::IdempotencyLayer::new(store.clone())
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(
            idem_core::contract::Anonymous::Scoped,
        ))
        .require_key_on(["/v1/charges"])
        .lease(Duration::from_secs(3));
    let app = axum::Router::new()
        .route(
            "/v1/charges",
            axum::routing::post(move || {
                r.fetch_add(1, Ordering::SeqCst);
                // Blocks before its first await, as a synchronous client would.
                std::thread::sleep(Duration::from_millis(8_000));
                async { http::StatusCode::CREATED }
            }),
        )
        .layer(layer);
    // The pool's first connection is made now, not inside the first claim: on a loaded
    // machine its setup could take the claim past its budget (a 503, nothing run), and
    // the lease would never be tested.
    store.ping().await.unwrap();
    let origin = TestOrigin::serve_router(app, store).await;
    let url = origin.url("");
    let body = charge_body("c", 100, 0);
    // Other work keeps the runtime's other workers awake, as a server's other requests
    // do (idle, they would all sleep with the blocked one, and nothing would run). A
    // timer, not a `yield_now` loop: spinning, two such tests at once took both cores
    // here, the store's replies came too late for a renewal (a twelfth of the lease), and
    // the lease was lost with nothing wrong in idem (CI at 62556a7 and 0f5e048).
    let busy = tokio::spawn(async {
        loop {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    let first = {
        let (url, body) = (url.clone(), body.clone());
        tokio::spawn(async move { post_charge(&client(), &url, Some("blocking-1"), &body).await })
    };
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    let retry = post_charge(&client(), &url, Some("blocking-1"), &body).await;
    let retry_status = retry.status().as_u16();
    let first_status = first.await.unwrap().status().as_u16();
    let after = post_charge(&client(), &url, Some("blocking-1"), &body).await;
    let replayed = after.headers().contains_key("idempotent-replayed");
    busy.abort();
    let runs = runs.load(Ordering::SeqCst);
    idem_tests::report(
        "contract",
        &format!("a handler blocking its thread 8 s under a 3 s lease: first {first_status}, a retry at 4.5 s {retry_status}, then {} (replayed: {replayed}); {runs} run(s)", after.status().as_u16()),
    );
    assert_eq!(retry_status, 409, "still in flight, its lease renewed");
    assert_eq!(
        (first_status, after.status().as_u16(), replayed),
        (201, 201, true)
    );
    assert_eq!(runs, 1, "ran once");
}

/// A handler that blocks its thread holds back no other claim's lease: a slow async
/// charge is claimed, then, before its first renewal is due, another request's handler
/// blocks its worker for 4 s. Each heartbeat is a task of its own that leaves the
/// worker it was spawned on before its handler runs: the slow charge keeps its lease,
/// its retry is refused while it runs, and it runs once. (Other work wakes the runtime
/// as in the test above.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blocked_worker_holds_back_no_other_claim_s_heartbeat() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let db = TestDb::new("blocking_other").await;
    let store: Arc<dyn Store> = pg_store(&db).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let (slow_runs, blocking_runs) = (runs.clone(), runs.clone());
    let layer = idem::IdempotencyLayer::new(store.clone())
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(
            idem_core::contract::Anonymous::Scoped,
        ))
        .require_key_on(["/v1/slow", "/v1/blocking"])
        .lease(Duration::from_secs(1));
    let app = axum::Router::new()
        .route(
            "/v1/slow",
            axum::routing::post(move || {
                slow_runs.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(Duration::from_millis(3_000)).await;
                    http::StatusCode::CREATED
                }
            }),
        )
        .route(
            "/v1/blocking",
            axum::routing::post(move || {
                blocking_runs.fetch_add(100, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(4_000));
                async { http::StatusCode::CREATED }
            }),
        )
        .layer(layer);
    let origin = TestOrigin::serve_router(app, store).await;
    let send = |path: &'static str| {
        let url = origin.url(path);
        async move {
            let res = client()
                .post(url)
                .header("idempotency-key", path)
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            (status, res.text().await.unwrap())
        }
    };
    let busy = tokio::spawn(async {
        loop {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    let slow = tokio::spawn(send("/v1/slow"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let blocking = tokio::spawn(send("/v1/blocking"));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let retry = send("/v1/slow").await;
    let (slow, blocking) = (slow.await.unwrap(), blocking.await.unwrap());
    busy.abort();
    let runs = runs.load(Ordering::SeqCst);
    idem_tests::report(
        "contract",
        &format!("a slow charge under a 1 s lease while another handler blocks its worker 4 s: the slow one {}, its retry at 1.5 s {}, the blocking one {}; runs {runs} (slow + 100 × blocking)", slow.0, retry.0, blocking.0),
    );
    for (what, (status, body)) in [("slow", &slow), ("retry", &retry), ("blocking", &blocking)] {
        if *status >= 500 {
            idem_tests::report("contract", &format!("the {what} one's {status}: {body}"));
        }
    }
    let (slow, retry, blocking) = (slow.0, retry.0, blocking.0);
    assert_eq!(retry, 409, "the slow charge kept its lease");
    assert_eq!((slow, blocking, runs), (201, 201, 101), "each ran once");
}
