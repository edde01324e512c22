//! Whose key a request is: the edge scopes as its origin does, or keeps nothing.

use super::*;

/// Keys kept per tenant by the host a client asked for, the same rule at the edge and
/// at the origin (`SCOPE_FROM=header:x-forwarded-host`): the origin reads the
/// `X-Forwarded-Host` the edge sets from the client's `Host`, and the edge now reads
/// the same. Before, the edge read the client's own `X-Forwarded-Host` — none, or a
/// forged one — so two tenants' requests with one key shared a scope at the edge: the
/// second tenant got a `422` (or the first tenant's answer) for a request the origin
/// would have run. Executions: one per tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_scopes_by_the_headers_the_origin_gets() {
    use idem_core::contract::{Anonymous, ScopeRule, ScopeSource};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let rule = ScopeRule {
        source: ScopeSource::Header("x-forwarded-host".into()),
        anonymous: Anonymous::Scoped,
    };
    let layer = idem::IdempotencyLayer::new(store.clone())
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(
            idem_core::contract::Anonymous::Scoped,
        ))
        .require_key_on(["/v1/charges"])
        .scope_rule(rule)
        .edge_secret(idem_tests::EDGE_SECRET)
        .unwrap();
    let app = axum::Router::new()
        .route(
            "/v1/charges",
            axum::routing::post(move || {
                r.fetch_add(1, Ordering::SeqCst);
                async move { (http::StatusCode::CREATED, "charged") }
            }),
        )
        .layer(layer)
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    let origin = TestOrigin::serve_router(app, store).await;
    let edge = Edge::start(
        &origin.url(""),
        &[("SCOPE_FROM", "header:x-forwarded-host")],
    )
    .await;
    let http = client();
    let mut seen = Vec::new();
    for (tenant, amount) in [("a.example", 1), ("b.example", 2)] {
        let res = http
            .post(format!("{}/v1/charges", edge.base))
            .header("host", tenant)
            .header("idempotency-key", "per-tenant-1")
            .header("content-type", "application/json")
            .body(charge_body("c", amount, 0))
            .send()
            .await
            .unwrap();
        seen.push(format!("{tenant}: {}", res.status().as_u16()));
    }
    report(
        "edge",
        &format!("two tenants (by Host), one key, through an edge scoping by X-Forwarded-Host: {seen:?}; {} executions", runs.load(Ordering::SeqCst)),
    );
    assert_eq!(seen, ["a.example: 201", "b.example: 201"]);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A scope rule naming a header the runtime sets and the edge does not forward
/// (`CF-Connecting-IP`: keys per client address) reads it as the edge got it. (Reading
/// every header as the origin gets it made it absent: with anonymous callers refused,
/// every guarded request was a 401.) The origin, which never gets the header, names
/// its records otherwise: the edge claims and forwards, and keeps none of the origin's
/// answers (before record tags, it kept them under its own per-address record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_scopes_by_a_header_its_runtime_sets() {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let (origin, ledger) = TestOrigin::demo_on(store).await;
    let edge = Edge::start(
        &origin.url(""),
        &[
            ("SCOPE_FROM", "header:cf-connecting-ip"),
            ("ANONYMOUS", "refused"),
        ],
    )
    .await;
    let http = client();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let res = post(
            &http,
            &edge.base,
            "per-address-1",
            charge_body("c", 1, 0),
            false,
        )
        .await;
        seen.push(format!(
            "{} {}",
            res.status().as_u16(),
            res.headers()
                .get("idem-edge")
                .map_or("-", |v| v.to_str().unwrap())
        ));
    }
    report(
        "edge",
        &format!(
            "SCOPE_FROM=header:cf-connecting-ip, anonymous refused: {seen:?}; {} charge",
            ledger.len()
        ),
    );
    assert_eq!(
        seen,
        ["201 forwarded; other-record", "201 forwarded; other-record"]
    );
    assert_eq!(ledger.len(), 1, "the origin replayed the retry");
}

/// The edge scopes as the origin does (the same core rule): by a verified JWT's `sub`,
/// a refreshed token's retry is replayed at the edge — behind an origin that scopes by
/// the token's value, where it would charge again; no identity, or a token that does
/// not verify, is refused there and never reaches the origin.
/// An identity provider's tokens at the edge: the JWKS written as a table in
/// wrangler's [vars] (the worker reads it as JSON), with its issuer and audience. One
/// principal's RS256 token, then its refreshed ES256 token, are one caller — the second
/// replayed at the edge, one charge; another issuer's token and an altered one are
/// refused there, and never forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_scopes_by_an_identity_provider_s_tokens() {
    use idem_core::contract::{Anonymous, JwtKeys, JwtVerifier, ScopeRule, ScopeSource};
    use idem_tests::scope_vectors::{authorization as token, document};
    let vectors = document();
    // JSON as a TOML inline table.
    fn inline(v: &serde_json::Value) -> String {
        match v {
            serde_json::Value::Object(m) => {
                let members: Vec<String> = m
                    .iter()
                    .map(|(k, v)| format!("{k} = {}", inline(v)))
                    .collect();
                format!("{{ {} }}", members.join(", "))
            }
            serde_json::Value::Array(a) => {
                format!("[{}]", a.iter().map(inline).collect::<Vec<_>>().join(", "))
            }
            other => other.to_string(),
        }
    }
    let jwks = format!("{UNQUOTED}{}", inline(&vectors["jwks"]));
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let keys = JwtKeys::either(None, Some(vectors["jwks"].to_string().as_bytes()))
        .unwrap()
        .unwrap();
    let jwt = JwtVerifier::new(keys, Some("https://id.example"), Some("payments")).unwrap();
    let rule = ScopeRule {
        source: ScopeSource::parse("jwt:sub", Some(jwt)).unwrap(),
        anonymous: Anonymous::Refused,
    };
    let (origin, ledger) = TestOrigin::demo_scoped(store, rule).await;
    let edge = Edge::start(
        &origin.url(""),
        &[
            ("SCOPE_FROM", "jwt:sub"),
            ("JWKS", &jwks),
            ("JWT_ISSUER", "https://id.example"),
            ("JWT_AUDIENCE", "payments"),
            ("ANONYMOUS", "refused"),
        ],
    )
    .await;
    let http = client();
    let mut seen = Vec::new();
    for name in [
        "jwks rs256",
        "jwks es256, refreshed",
        "jwks another issuer",
        "jwks rs256 payload changed",
    ] {
        let res = http
            .post(format!("{}/v1/charges", edge.base))
            .header("idempotency-key", "jwks-edge-1")
            .header("content-type", "application/json")
            .header("authorization", token(name))
            .body(charge_body("cus_1", 100, 0))
            .send()
            .await
            .unwrap();
        let edge_did = res.headers()["idem-edge"].to_str().unwrap().to_owned();
        let status = res.status().as_u16();
        let body: serde_json::Value = res.json().await.unwrap_or_default();
        let kind = body["type"].as_str().unwrap_or("-").to_owned();
        seen.push(format!("{status} {edge_did} {kind}"));
    }
    let charges = ledger.len();
    report(
        "edge",
        &format!("JWKS (a [vars] table) at the edge: {seen:?}; {charges} charge"),
    );
    assert_eq!(
        seen,
        [
            "201 forwarded -",
            "201 replayed -",
            "401 refused https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-invalid",
            "401 refused https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-invalid",
        ]
    );
    assert_eq!(charges, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_scopes_by_a_verified_jwt_claim() {
    use idem_core::contract::scope::sign_hs256;
    use idem_core::contract::{Anonymous, JwtKeys, JwtVerifier, ScopeRule, ScopeSource};
    const SECRET: &str = "the gateway's HS256 secret, 32 bytes or more";
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    // The origin scopes as the edge does: else it names other records, and the edge
    // keeps none of its answers.
    let jwt = JwtVerifier::new(JwtKeys::Hs256(SECRET.as_bytes().to_vec()), None, None).unwrap();
    let rule = ScopeRule {
        source: ScopeSource::parse("jwt:sub", Some(jwt)).unwrap(),
        anonymous: Anonymous::Refused,
    };
    let (origin, ledger) = TestOrigin::demo_scoped(store, rule).await;
    let edge = Edge::start(
        &origin.url(""),
        &[
            ("SCOPE_FROM", "jwt:sub"),
            ("JWT_SECRET", SECRET),
            ("ANONYMOUS", "refused"),
        ],
    )
    .await;
    let http = client();
    let send = |auth: Option<String>| {
        let (http, base) = (http.clone(), edge.base.clone());
        async move {
            let mut req = http
                .post(format!("{base}/v1/charges"))
                .header("idempotency-key", "jwt-edge-1")
                .header("content-type", "application/json")
                .body(charge_body("cus_1", 100, 0));
            if let Some(auth) = auth {
                req = req.header("authorization", auth);
            }
            let res = req.send().await.unwrap();
            let edge_did = res.headers()["idem-edge"].to_str().unwrap().to_owned();
            let status = res.status().as_u16();
            let body: serde_json::Value = res.json().await.unwrap_or_default();
            let kind = body["type"].as_str().unwrap_or("-").to_owned();
            format!("{status} {edge_did} {kind}")
        }
    };
    let token = |iat: u64| {
        format!(
            "Bearer {}",
            sign_hs256(
                &format!(r#"{{"sub":"cus_1","iat":{iat},"exp":4102444800}}"#),
                SECRET.as_bytes()
            )
        )
    };
    let first = send(Some(token(1))).await;
    let refreshed = send(Some(token(2))).await;
    let forged = send(Some(format!(
        "Bearer {}",
        sign_hs256(r#"{"sub":"cus_1"}"#, b"not the secret")
    )))
    .await;
    let nobody = send(None).await;
    let charges = ledger.len();
    report(
        "edge",
        &format!("SCOPE_FROM=jwt:sub at the edge: first {first}, refreshed token {refreshed}, forged {forged}, none {nobody}; {charges} charge"),
    );
    assert_eq!(first, "201 forwarded -");
    assert_eq!(refreshed, "201 replayed -", "the same caller at the edge");
    assert_eq!(
        forged,
        "401 refused https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-invalid"
    );
    assert_eq!(
        nobody,
        "401 refused https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-missing"
    );
    assert_eq!(charges, 1);
}

/// An edge scoped otherwise than its origin: `idem-origin --upstream … --scope-from
/// header:x-api-key` (README's proxy quick start) behind the repository's wrangler.toml
/// (`SCOPE_FROM = "authorization"`, anonymous callers scoped). Tenants `a` and `b` send
/// the same key and body with their own API key and no `Authorization`: the edge puts
/// both in one record, the origin in two. The origin names the record it stored each
/// answer in, so the edge keeps neither, and tenant `b` is charged on its own — never
/// replayed tenant `a`'s charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_scoped_otherwise_than_its_origin_never_replays_another_tenant_s_answer() {
    let (payments, origin) = proxy_to_payments(&["--scope-from", "header:x-api-key"]).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    let charge = |tenant: &'static str| {
        let req = http
            .post(format!("{}/v1/charges", edge.base))
            .header("idempotency-key", "tenants-1")
            .header("content-type", "application/json")
            .header("x-api-key", tenant)
            .body(charge_body("cus-t", 100, 0));
        async move {
            let res = req.send().await.expect("the edge answers");
            let handled = handled_by(&res);
            let replayed = res.headers().contains_key("idempotent-replayed");
            let status = res.status().as_u16();
            let body: serde_json::Value = res.json().await.unwrap_or_default();
            (
                status,
                replayed,
                handled,
                body["id"].as_str().unwrap_or("").to_owned(),
            )
        }
    };
    let a = charge("tenant-a").await;
    let a_again = charge("tenant-a").await;
    let b = charge("tenant-b").await;
    let b_again = charge("tenant-b").await;
    let charges = payments.charges_for("tenants-1");
    report(
        "edge",
        &format!(
            "edge SCOPE_FROM=authorization, origin --scope-from header:x-api-key, one key and body from tenants a and b: \
             a {a:?}, a again {a_again:?}, b {b:?}, b again {b_again:?}; the upstream made {charges} charges"
        ),
    );
    assert_eq!((a.0, a.1), (201, false), "{a:?}");
    assert_eq!(
        (b.0, b.1),
        (201, false),
        "tenant b was answered with tenant a's charge: {b:?}"
    );
    assert_ne!(b.3, a.3, "tenant b got tenant a's charge");
    assert_eq!(charges, 2, "one charge per tenant");
    assert_eq!(
        a.2, "forwarded; other-record",
        "the edge kept nothing: {a:?}"
    );
    for (again, first) in [(&a_again, &a), (&b_again, &b)] {
        assert_eq!(
            (again.0, again.1, &again.3),
            (201, true, &first.3),
            "each tenant's retry replays its own charge, from the origin"
        );
        assert_eq!(again.2, "forwarded; other-record", "{again:?}");
    }
    proof::record(
        "faults",
        "edge-other-scope",
        &[&format!("each tenant charged once ({charges} charges), each replayed its own from the origin; the edge kept neither (`forwarded; other-record`)")],
    );
}
