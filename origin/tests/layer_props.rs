//! Whatever arrives — any key bytes, any body, any content type — the layer answers
//! with a deliberate status and never panics; what it rejects leaves no charge behind.

use axum::body::Body;
use http::{HeaderValue, Request};
use http_body_util::BodyExt;
use idem::IdempotencyLayer;
use idem::MemoryStore;
use idem_origin::charges::MemoryLedger;
use proptest::prelude::*;
use std::sync::Arc;
use tower::ServiceExt;

fn key_bytes() -> impl Strategy<Value = Vec<u8>> {
    // Everything a header value can carry: visible ASCII, tab, space, obs-text.
    prop_oneof![
        proptest::collection::vec(
            prop_oneof![0x20u8..0x7f, Just(b'\t'), 0x80u8..=0xff],
            0..300
        ),
        "\"[ -~]{0,260}\"".prop_map(String::into_bytes),
        "[A-Za-z0-9-]{1,40}".prop_map(String::into_bytes),
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..200),
        Just(br#"{"amount":1,"currency":"usd","customer":"c"}"#.to_vec()),
        "\\{\"amount\":-?[0-9]{1,25},\"currency\":\"[a-z]{2,4}\",\"customer\":\"[ -~]{0,8}\"\\}"
            .prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn any_request_gets_a_deliberate_answer(key in key_bytes(), body in body(), json in any::<bool>(), method in 0usize..3) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let store = Arc::new(MemoryStore::new());
            let ledger = Arc::new(MemoryLedger::default());
            let layer = IdempotencyLayer::new(store.clone())
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(idem_core::contract::Anonymous::Scoped)).require_key_on(["/v1/charges"]).max_body_bytes(150);
            let app = idem_origin::app::router(layer, store.clone(), idem_origin::charges::Demo::new(ledger.clone()));
            let mut req = Request::builder()
                .method(["POST", "PATCH", "PUT"][method])
                .uri("/v1/charges")
                .header("idempotency-key", HeaderValue::from_bytes(&key).unwrap());
            if json {
                req = req.header("content-type", "application/json");
            }
            let res = app.oneshot(req.body(Body::from(body.clone())).unwrap()).await.unwrap();
            let status = res.status().as_u16();
            let bytes = res.into_body().collect().await.unwrap().to_bytes();
            prop_assert!([201, 400, 405, 413].contains(&status), "status {}", status);
            if status != 201 {
                prop_assert!(serde_json::from_slice::<serde_json::Value>(&bytes).is_ok(), "problem bodies are JSON");
                prop_assert_eq!(ledger.len(), 0, "a rejected request charges nothing");
            }
            if status == 201 {
                prop_assert!(idem_core::IdempotencyKey::parse(&key).is_ok());
                prop_assert_eq!(ledger.len(), 1);
            }
            Ok(())
        })?;
    }
}
