//! `Idempotency-TTL`: every answer whose record is stored tells the client how many
//! whole seconds its key stays bound to the request; answers that bind nothing say
//! nothing.

use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use http::Request;
use http_body_util::BodyExt;
use idem::IdempotencyLayer;
use idem::MemoryStore;
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

fn app() -> Router {
    Router::new()
        .route(
            "/charge",
            post(|| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                // The handler's own header is not idem's promise.
                (
                    http::StatusCode::CREATED,
                    [("idempotency-ttl", "999999")],
                    "charged",
                )
            }),
        )
        .route(
            "/invalid",
            post(|| async {
                idem::release((http::StatusCode::BAD_REQUEST, "nothing happened").into_response())
            }),
        )
        .layer(
            IdempotencyLayer::new(Arc::new(MemoryStore::new()))
                .scope_rule(idem_core::contract::ScopeRule::by_authorization(
                    idem_core::contract::Anonymous::Scoped,
                ))
                .require_key_when(|_| true)
                .ttl(Duration::from_secs(60)),
        )
}

/// The status and the `Idempotency-TTL` value.
async fn send(app: &Router, path: &str, key: &str, body: &'static str) -> (u16, Option<u64>) {
    let req = Request::post(path)
        .header("idempotency-key", key)
        .body(Body::from(body))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let ttl = res
        .headers()
        .get("idempotency-ttl")
        .map(|v| v.to_str().unwrap().parse().expect("whole seconds"));
    let status = res.status().as_u16();
    res.into_body().collect().await.unwrap();
    (status, ttl)
}

#[tokio::test]
async fn stored_answers_advertise_the_seconds_their_key_stays_bound() {
    let app = app();
    // A retry while the first runs: 409, nothing bound to promise.
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "/charge", "k", "{}").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(send(&app, "/charge", "k", "{}").await, (409, None));
    let (status, ttl) = first.await.unwrap();
    assert_eq!(status, 201);
    let ttl = ttl.expect("the first answer, once stored, advertises its key's TTL");
    assert!((59..=60).contains(&ttl), "{ttl}");
    // A replay, a second later: the seconds left, counting down.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (status, replayed) = send(&app, "/charge", "k", "{}").await;
    assert_eq!(status, 201);
    let replayed = replayed.expect("a replay advertises its key's TTL");
    assert!(replayed < ttl && replayed >= 57, "{replayed} after {ttl}");
    // Another body under the key: 422, and no promise about a key that isn't its.
    assert_eq!(send(&app, "/charge", "k", "{\"x\":1}").await, (422, None));
    // A released answer frees the key: nothing to advertise.
    assert_eq!(send(&app, "/invalid", "r", "{}").await, (400, None));
}
