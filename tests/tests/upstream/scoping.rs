//! Whose key a request is: the caller, not the token it happens to carry.

use super::*;

/// Who a key belongs to, in proxy mode. By the `Authorization` value, a refreshed token
/// of the same principal is a new caller: its retry charges again. By the JWT's `sub`
/// (verified), it keeps its scope: one charge. By an API-key header, two callers with
/// the same key are two scopes; a request with no identity is refused (401) before
/// anything is claimed, and a token that does not verify is never anonymous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_follow_the_caller_not_the_token() {
    use idem_core::contract::scope::sign_hs256;
    const SECRET: &str = "the gateway's HS256 secret, 32 bytes or more";
    let payments = Payments::start().await;
    let secret_file = std::env::temp_dir().join(format!("idem-jwt-{}", std::process::id()));
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let http = client();
    let token = |iat: u64| {
        format!(
            "Bearer {}",
            sign_hs256(
                &format!(r#"{{"sub":"cus_1","iat":{iat},"exp":4102444800}}"#),
                SECRET.as_bytes()
            )
        )
    };
    let charge =
        |url: String, key: &'static str, auth: Option<String>, api_key: Option<&'static str>| {
            let http = http.clone();
            async move {
                let mut req = http
                    .post(url)
                    .header("idempotency-key", key)
                    .header("content-type", "application/json")
                    .body(charge_body("cus_1", 100, 0));
                if let Some(auth) = auth {
                    req = req.header("authorization", auth);
                }
                if let Some(api_key) = api_key {
                    req = req.header("x-api-key", api_key);
                }
                let res = req.send().await.unwrap();
                let status = res.status().as_u16();
                (status, problem_type(&res.text().await.unwrap()))
            }
        };

    // By the Authorization value (the default before this option): a refreshed token.
    let by_value = proxy(&payments, &["--scope-from", "authorization"]).await;
    charge(
        by_value.url("/v1/charges"),
        "refresh-value",
        Some(token(1)),
        None,
    )
    .await;
    charge(
        by_value.url("/v1/charges"),
        "refresh-value",
        Some(token(2)),
        None,
    )
    .await;
    let value_charges = payments.charges_for("refresh-value");
    // A signed request (AWS SigV4 here): every attempt carries a new signature.
    let signed = |n: u64| {
        Some(format!(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261202/eu-west-1/execute-api/aws4_request, SignedHeaders=host;x-amz-date, Signature={n:064x}"
        ))
    };
    let signed_1 = charge(by_value.url("/v1/charges"), "signed", signed(1), None).await;
    let signed_2 = charge(by_value.url("/v1/charges"), "signed", signed(2), None).await;
    let signed_calls = payments.calls_for("signed");
    // An empty bearer token names nobody (proxy mode refuses anonymous callers).
    let blank = charge(
        by_value.url("/v1/charges"),
        "blank",
        Some("Bearer ".into()),
        None,
    )
    .await;
    let blank_calls = payments.calls_for("blank");

    // By the verified JWT's sub.
    let secret_path = secret_file.to_str().unwrap();
    let by_sub = proxy(
        &payments,
        &["--scope-from", "jwt:sub", "--jwt-secret-file", secret_path],
    )
    .await;
    let first = charge(
        by_sub.url("/v1/charges"),
        "refresh-sub",
        Some(token(1)),
        None,
    )
    .await;
    let refreshed = charge(
        by_sub.url("/v1/charges"),
        "refresh-sub",
        Some(token(2)),
        None,
    )
    .await;
    let forged = format!(
        "Bearer {}",
        sign_hs256(r#"{"sub":"cus_1","exp":4102444800}"#, b"not the secret")
    );
    let forged = charge(by_sub.url("/v1/charges"), "refresh-sub", Some(forged), None).await;
    let sub_charges = payments.charges_for("refresh-sub");

    // By an API-key header, anonymous refused.
    let by_key = proxy(
        &payments,
        &["--scope-from", "header:x-api-key", "--anonymous", "refused"],
    )
    .await;
    let a = charge(by_key.url("/v1/charges"), "api-1", None, Some("key-a")).await;
    let b = charge(by_key.url("/v1/charges"), "api-1", None, Some("key-b")).await;
    let a_again = charge(by_key.url("/v1/charges"), "api-1", None, Some("key-a")).await;
    let nobody = charge(by_key.url("/v1/charges"), "api-2", None, None).await;
    let api_charges = payments.charges_for("api-1");
    let nobody_calls = payments.calls_for("api-2");
    let _ = std::fs::remove_file(&secret_file);
    report(
        "upstream",
        &format!(
            "one principal's refreshed JWT, same key and request: {value_charges} charges scoped by the Authorization value, \
             {sub_charges} by the verified sub ({first:?}, refreshed {refreshed:?}, forged {forged:?}); \
             x-api-key: {a:?}, {b:?}, again {a_again:?} -> {api_charges} charges; no identity {nobody:?}, {nobody_calls} calls; \
             two attempts signed with SigV4 {signed_1:?}, {signed_2:?} -> {signed_calls} calls; an empty bearer {blank:?}, {blank_calls} calls"
        ),
    );
    assert_eq!(
        value_charges, 2,
        "by value, a refreshed token is a new caller"
    );
    assert_eq!(sub_charges, 1, "by the verified sub, the same caller");
    assert_eq!((first.0, refreshed.0), (201, 201));
    assert_eq!(
        forged,
        (
            401,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-invalid".into()
        )
    );
    assert_eq!(api_charges, 2, "two API keys, two callers");
    assert_eq!((a.0, b.0, a_again.0), (201, 201, 201));
    assert_eq!(
        nobody,
        (
            401,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-missing".into()
        )
    );
    assert_eq!(nobody_calls, 0);
    // Scoped by their signatures, the two attempts were two callers: 2 charges before.
    let invalid = (
        401,
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-invalid".to_owned(),
    );
    assert_eq!((signed_1, signed_2), (invalid.clone(), invalid));
    assert_eq!(signed_calls, 0, "a signature is not a caller");
    // Scoped as the empty credential shared by all such callers: 201 before.
    assert_eq!(
        blank,
        (
            401,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-missing".into()
        )
    );
    assert_eq!(blank_calls, 0);
}

/// An identity provider's tokens (RS256 and ES256, from the JWKS of the shared scope
/// vectors) through real processes: one principal's tokens, of either algorithm and
/// refreshed, are one caller — one charge; a token whose payload was changed, or an
/// HS256 token signed with the public key, is refused before anything reaches the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_an_identity_provider_keep_their_principal_s_scope() {
    use idem_tests::scope_vectors::{authorization as token, document};
    let vectors = document();
    let jwks = std::env::temp_dir().join(format!("idem-jwks-{}.json", std::process::id()));
    std::fs::write(&jwks, vectors["jwks"].to_string()).unwrap();
    let payments = Payments::start().await;
    let origin = proxy(
        &payments,
        &[
            "--scope-from",
            "jwt:sub",
            "--jwks-file",
            jwks.to_str().unwrap(),
            "--jwt-issuer",
            "https://id.example",
            "--jwt-audience",
            "payments",
        ],
    )
    .await;
    let http = client();
    let mut seen = Vec::new();
    for name in [
        "jwks rs256",
        "jwks es256",
        "jwks es256, refreshed",
        "jwks es256 payload changed",
        "jwks hs256 with the public key as secret",
        "jwks unknown kid",
        "jwks another issuer",
        "jwks another audience",
    ] {
        let res = http
            .post(origin.url("/v1/charges"))
            .header("idempotency-key", "idp-1")
            .header("content-type", "application/json")
            .header("authorization", token(name))
            .body(charge_body("cus_1", 100, 0))
            .send()
            .await
            .unwrap();
        let replayed = res.headers().contains_key("idempotent-replayed");
        let status = res.status().as_u16();
        seen.push((
            name,
            status,
            replayed,
            problem_type(&res.text().await.unwrap()),
        ));
    }
    let (charges, calls) = (payments.charges_for("idp-1"), payments.calls_for("idp-1"));
    let _ = std::fs::remove_file(&jwks);
    report(
        "upstream",
        &format!("an identity provider's tokens (--jwks-file): {seen:?} -> {charges} charge, {calls} call"),
    );
    let answers: Vec<(u16, bool)> = seen.iter().map(|s| (s.1, s.2)).collect();
    assert_eq!(
        answers,
        [
            (201, false),
            (201, true),
            (201, true),
            (401, false),
            (401, false),
            (401, false),
            (401, false),
            (401, false)
        ],
        "{seen:?}"
    );
    assert!(seen[3..]
        .iter()
        .all(|s| s.3
            == "https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-invalid"));
    assert_eq!((charges, calls), (1, 1));
}
