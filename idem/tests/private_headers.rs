//! What the origin tells an edge in front — `idem-disposition`, `idem-stored-headers` —
//! comes from idem alone: a handler (or an upstream in proxy mode) that sets them
//! itself would make the edge keep, and replay to retries, an answer idem never stored.

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use http::Request;
use idem::IdempotencyLayer;
use idem::MemoryStore;
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

const SECRET: &str = "edge-secret-0123456789abcdef";

/// A layer whose edge proves itself with [`SECRET`] (`with_secret`), or one with no edge
/// secret; its handler answers whether it saw the secret, and `/release` frees its key.
fn edged(with_secret: bool) -> Router {
    let saw_secret = |headers: http::HeaderMap| async move {
        let seen = headers.contains_key("idem-edge-secret");
        (http::StatusCode::CREATED, format!("secret seen: {seen}"))
    };
    let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new())).scope_rule(
        idem_core::contract::ScopeRule::by_authorization(idem_core::contract::Anonymous::Scoped),
    );
    let layer = match with_secret {
        true => layer.edge_secret(SECRET).unwrap(),
        false => layer,
    };
    Router::new()
        .route("/charge", post(saw_secret))
        .route("/read", get(saw_secret))
        .route(
            "/release",
            post(|| async {
                idem::release(axum::response::IntoResponse::into_response((
                    http::StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid",
                )))
            }),
        )
        .layer(layer)
}

/// The private headers an answer carried, and its body.
async fn seen(app: &Router, path: &str, key: &str, secrets: &[&str]) -> (Vec<String>, String) {
    let mut req = Request::post(path).header("idempotency-key", key);
    for secret in secrets {
        req = req.header("idem-edge-secret", *secret);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::from("{}")).unwrap())
        .await
        .unwrap();
    let private = ["idem-disposition", "idem-stored-headers"]
        .into_iter()
        .filter_map(|name| {
            let v = res.headers().get(name)?.to_str().ok()?;
            Some(format!("{name}: {}", v.split(';').next().unwrap_or(v)))
        })
        .collect();
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    (private, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn idem_tells_what_it_stored_only_to_the_edge_that_proves_itself() {
    let app = edged(true);
    let stored = vec![
        String::from("idem-disposition: stored"),
        String::from("idem-stored-headers: content-type"),
    ];
    let nothing = Vec::<String>::new();
    let wrong = "edge-secret-0123456789abcdeX";
    // The first attempt, by a client (no secret, a guessed one, two values): the answer
    // is stored, and nothing says so.
    for (key, secrets) in [
        ("c-1", vec![]),
        ("c-2", vec![wrong]),
        ("c-3", vec![SECRET, SECRET]),
        ("c-4", vec![wrong, SECRET]),
    ] {
        let (private, body) = seen(&app, "/charge", key, &secrets).await;
        assert_eq!(private, nothing, "{key}: a client told what idem stored");
        assert_eq!(body, "secret seen: false", "{key}");
        // Its replay, to a client: neither.
        let (private, _) = seen(&app, "/charge", key, &[]).await;
        assert_eq!(private, nothing, "{key}: replayed to a client");
        // …and to the edge: told.
        let (private, _) = seen(&app, "/charge", key, &[SECRET]).await;
        assert_eq!(private, stored, "{key}: replayed to the edge");
    }
    // The edge's first attempt: told; the handler never sees the secret.
    let (private, body) = seen(&app, "/charge", "e-1", &[SECRET]).await;
    assert_eq!(private, stored, "the edge's first attempt");
    assert_eq!(
        body, "secret seen: false",
        "the handler saw the edge's secret"
    );
    // A released key: the edge is told, a client is not.
    let (private, _) = seen(&app, "/release", "r-1", &[]).await;
    assert_eq!(private, nothing, "released, to a client");
    let (private, _) = seen(&app, "/release", "r-1", &[SECRET]).await;
    assert_eq!(private, vec![String::from("idem-disposition: released")]);
    // Passed through: the secret is taken off there too.
    let read = Request::get("/read")
        .header("idem-edge-secret", SECRET)
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(read).await.unwrap();
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap();
    assert_eq!(body.to_bytes(), "secret seen: false");
    // A layer with no edge secret tells nobody, whatever is sent.
    let (private, body) = seen(&edged(false), "/charge", "n-1", &[SECRET]).await;
    assert_eq!(private, nothing, "no edge secret set");
    assert_eq!(body, "secret seen: false");
}

#[test]
fn an_edge_secret_that_could_be_guessed_is_refused() {
    let layer = || IdempotencyLayer::new(Arc::new(MemoryStore::new()));
    let short = layer().edge_secret("hunter2").err().unwrap();
    assert!(short.message().contains("7 bytes"), "{short}");
    assert!(layer().edge_secret("with spaces in the secret").is_err());
    assert!(layer().edge_secret(SECRET).is_ok());
}

#[tokio::test]
async fn while_rotating_both_secrets_are_the_edge_s() {
    let new = "the-new-edge-secret-0123456789";
    let app = Router::new()
        .route(
            "/charge",
            post(|| async { (http::StatusCode::CREATED, "charged") }),
        )
        .layer(
            IdempotencyLayer::new(Arc::new(MemoryStore::new()))
                .scope_rule(idem_core::contract::ScopeRule::by_authorization(
                    idem_core::contract::Anonymous::Scoped,
                ))
                .edge_secret(SECRET)
                .unwrap()
                .edge_secret(new)
                .unwrap(),
        );
    for (key, secret, told) in [
        ("rot-1", SECRET, true),
        ("rot-2", new, true),
        ("rot-3", "neither-of-the-two-0123456789", false),
    ] {
        let (private, _) = seen(&app, "/charge", key, &[secret]).await;
        assert_eq!(!private.is_empty(), told, "{key}: {private:?}");
    }
}
