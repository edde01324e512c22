//! What the origin tells an edge in front — `idem-disposition`, `idem-stored-headers` —
//! comes from idem alone: a handler (or an upstream in proxy mode) that sets them
//! itself would make the edge keep, and replay to retries, an answer idem never stored.

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use http::Request;
use idem::idempotency::IdempotencyLayer;
use idem::store::MemoryStore;
use std::sync::Arc;
use tower::ServiceExt;

const FORGED: [(&str, &str); 2] = [
    (
        "idem-disposition",
        "stored; expires=99999999999999; record=0123456789abcdef0123456789abcdef",
    ),
    ("idem-stored-headers", "set-cookie"),
];

fn app() -> Router {
    let forging = || async {
        (
            http::StatusCode::CREATED,
            [FORGED[0], FORGED[1], ("set-cookie", "session=stolen")],
            "answer",
        )
    };
    Router::new()
        .route("/read", get(forging))
        .route("/charge", post(forging))
        .layer(
            IdempotencyLayer::new(Arc::new(MemoryStore::new()))
                .scope_rule(idem_core::contract::ScopeRule::by_authorization(
                    idem_core::contract::Anonymous::Scoped,
                ))
                .require_key_on(["/charge"]),
        )
}

async fn forged_headers_seen(req: Request<Body>) -> Vec<String> {
    let res = app().oneshot(req).await.unwrap();
    FORGED
        .iter()
        .filter_map(|(name, forged)| {
            let v = res.headers().get(*name)?.to_str().ok()?;
            (v == *forged).then(|| format!("{name}: {v}"))
        })
        .collect()
}

#[tokio::test]
async fn a_handler_never_speaks_for_idem_to_the_edge() {
    // Passed through (a method idem does not guard; a path without a key).
    let read = Request::get("/read").body(Body::empty()).unwrap();
    assert_eq!(
        forged_headers_seen(read).await,
        Vec::<String>::new(),
        "pass-through"
    );
    // Guarded: idem's own values replace the handler's.
    let charge = Request::post("/charge")
        .header("idempotency-key", "k-1")
        .body(Body::from("{}"))
        .unwrap();
    assert_eq!(
        forged_headers_seen(charge).await,
        Vec::<String>::new(),
        "guarded"
    );
}
