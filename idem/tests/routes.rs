//! Per-path settings (`IdempotencyLayer::route`): each path gets its route's TTL,
//! waits, methods, key requirement and scope, and a path no route matches gets the
//! layer's own.

use axum::body::Body;
use axum::routing::any;
use axum::Router;
use http::Request;
use http_body_util::BodyExt;
use idem::core::Scope;
use idem::IdempotencyLayer;
use idem::MemoryStore;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

/// Every path answers after `delay`, counting its calls.
fn app(layer: IdempotencyLayer, calls: Arc<AtomicUsize>, delay: Duration) -> Router {
    Router::new()
        .route(
            "/{*path}",
            any(move || {
                let calls = calls.clone();
                async move {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(delay).await;
                    (http::StatusCode::CREATED, format!("call {n}"))
                }
            }),
        )
        .layer(layer)
}

async fn send(app: &Router, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, bool) {
    let mut req = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::from("{}")).unwrap())
        .await
        .unwrap();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let status = res.status().as_u16();
    res.into_body().collect().await.unwrap();
    (status, replayed)
}

#[tokio::test]
async fn each_route_has_its_own_settings_and_the_rest_the_layer_s() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()))
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(
            idem_core::contract::Anonymous::Scoped,
        ))
        .route("/strict/*", |strict| {
            strict
                .require_key_when(|_| true)
                .methods([http::Method::POST, http::Method::PUT])
                .ttl(Duration::from_secs(1))
        })
        .route("/by-tenant", |tenant| {
            tenant.scope(|parts| {
                let tenant = parts
                    .headers
                    .get("x-tenant")
                    .map_or(&b""[..], |v| v.as_bytes());
                Scope::from_header("x-tenant", tenant)
            })
        })
        // Set after the routes: they get it too.
        .max_body_bytes(64);
    let app = app(layer, calls.clone(), Duration::ZERO);

    // A key is required on /strict/*, not elsewhere.
    assert_eq!(send(&app, "POST", "/strict/a", &[]).await, (400, false));
    assert_eq!(send(&app, "POST", "/loose", &[]).await, (201, false));
    // PUT is guarded on /strict/* only.
    let key = [("idempotency-key", "k-put")];
    assert_eq!(send(&app, "PUT", "/strict/a", &key).await, (201, false));
    assert_eq!(send(&app, "PUT", "/strict/a", &key).await, (201, true));
    assert_eq!(send(&app, "PUT", "/loose", &key).await, (201, false));
    assert_eq!(send(&app, "PUT", "/loose", &key).await, (201, false));
    // /strict/*'s 1 s TTL: replayed, then expired and run again; elsewhere 24 h.
    // (Keys belong to the caller, not the path: another path needs another key.)
    let (key, other) = (
        [("idempotency-key", "k-ttl")],
        [("idempotency-key", "k-ttl-2")],
    );
    assert_eq!(send(&app, "POST", "/strict/b", &key).await, (201, false));
    assert_eq!(send(&app, "POST", "/strict/b", &key).await, (201, true));
    assert_eq!(send(&app, "POST", "/other", &other).await, (201, false));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(send(&app, "POST", "/strict/b", &key).await, (201, false));
    assert_eq!(send(&app, "POST", "/other", &other).await, (201, true));
    // /by-tenant scopes by X-Tenant, whoever's token it is.
    let as_user = |token: &'static str, tenant: &'static str| {
        [
            ("idempotency-key", "k-tenant"),
            ("authorization", token),
            ("x-tenant", tenant),
        ]
    };
    let tenant = send(&app, "POST", "/by-tenant", &as_user("Bearer a", "t1")).await;
    assert_eq!(tenant, (201, false));
    let tenant = send(&app, "POST", "/by-tenant", &as_user("Bearer b", "t1")).await;
    assert_eq!(tenant, (201, true), "same tenant, another token");
    let tenant = send(&app, "POST", "/by-tenant", &as_user("Bearer a", "t2")).await;
    assert_eq!(tenant, (201, false), "another tenant");
    // The body limit set after the routes reaches them.
    let big = Request::builder()
        .method("POST")
        .uri("/strict/c")
        .header("idempotency-key", "k-big")
        .body(Body::from("x".repeat(65)))
        .unwrap();
    assert_eq!(app.clone().oneshot(big).await.unwrap().status(), 413);
    // Handler calls: /loose POST 1, PUT /strict 1, PUT /loose 2, TTL 3, tenant 2.
    assert_eq!(calls.load(Ordering::SeqCst), 9);
}

#[tokio::test]
async fn a_route_s_default_wait_turns_a_409_into_the_first_answer() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()))
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(
            idem_core::contract::Anonymous::Scoped,
        ))
        .route("/patient", |patient| {
            patient.default_wait(Duration::from_secs(5))
        });
    let app = app(layer, calls.clone(), Duration::from_millis(300));
    let race = |path: &'static str, key: &'static str, prefer: Option<&'static str>| {
        let app = app.clone();
        async move {
            let first = tokio::spawn({
                let app = app.clone();
                async move { send(&app, "POST", path, &[("idempotency-key", key)]).await }
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut headers = vec![("idempotency-key", key)];
            if let Some(prefer) = prefer {
                headers.push(("prefer", prefer));
            }
            let retry = send(&app, "POST", path, &headers).await;
            (first.await.unwrap(), retry)
        }
    };
    assert_eq!(
        race("/patient", "w1", None).await,
        ((201, false), (201, true)),
        "the retry waited for the first answer"
    );
    assert_eq!(
        race("/patient", "w2", Some("wait=0")).await.1,
        (409, false),
        "a client that says wait=0 is not kept waiting"
    );
    assert_eq!(
        race("/impatient", "w3", None).await.1,
        (409, false),
        "elsewhere no wait unless asked"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// A route's own scope follows the resource, not its spelling: a retry sent to
/// `/v1/charges/` (or `//v1/charges`, `/v1/%63harges`), which most servers take for
/// `/v1/charges`, is under the route's scope too — so it meets the first attempt's
/// record (422: not the same request) instead of a fresh scope that runs it again.
#[tokio::test]
async fn a_retry_on_another_spelling_of_a_route_s_path_does_not_run_again() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()))
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(
            idem_core::contract::Anonymous::Scoped,
        ))
        .route("/v1/charges", |r| {
            r.scope(|parts| {
                let tenant = parts
                    .headers
                    .get("x-tenant")
                    .map_or(&b""[..], |v| v.as_bytes());
                Scope::from_header("x-tenant", tenant)
            })
        });
    let app = app(layer, calls.clone(), Duration::ZERO);
    let headers = [
        ("idempotency-key", "spelled-1"),
        ("authorization", "Bearer gateway"),
        ("x-tenant", "t1"),
    ];
    let mut seen = vec![send(&app, "POST", "/v1/charges", &headers).await];
    for spelling in [
        "/v1/charges/",
        "//v1/charges",
        "/v1/%63harges",
        "/v1//charges",
    ] {
        seen.push(send(&app, "POST", spelling, &headers).await);
    }
    assert_eq!(
        seen,
        [
            (201, false),
            (422, false),
            (422, false),
            (422, false),
            (422, false)
        ],
        "each spelling met the first attempt's record"
    );
    // Spellings servers read differently (Go decodes %2F, Tomcat drops ;x=1, some
    // resolve .., some don't): refused before anything runs.
    for spelling in [
        "/v1%2Fcharges",
        "/v1/charges;x=1",
        "/v1/./charges",
        "/v1/charges/%2e%2e",
    ] {
        let refused = send(&app, "POST", spelling, &headers).await;
        assert_eq!(refused, (400, false), "{spelling}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "charged once");
}
