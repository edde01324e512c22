//! The shared scope test vectors (`testdata/scope-vectors.json`, produced by an
//! independent Python implementation, `testdata/scopes.py`): the origin's layer and
//! the edge's worker both scope with this code, here checked on the host and in WASM.

use idem_core::contract::{Anonymous, JwtKeys, JwtVerifier, ScopeRule, ScopeSource};
use wasm_bindgen_test::wasm_bindgen_test;

const VECTORS: &str = include_str!("../testdata/scope-vectors.json");

#[wasm_bindgen_test(unsupported = test)]
fn scopes_match_the_shared_vectors() {
    let doc: serde_json::Value = serde_json::from_str(VECTORS).unwrap();
    let secret = doc["secret"].as_str().unwrap().as_bytes().to_vec();
    let jwks = JwtVerifier::new(
        JwtKeys::from_jwks(doc["jwks"].to_string().as_bytes()).unwrap(),
        doc["issuer"].as_str(),
        doc["audience"].as_str(),
    )
    .unwrap();
    let hs256 = JwtVerifier::new(JwtKeys::Hs256(secret), None, None).unwrap();
    let now = doc["now"].as_u64().unwrap();
    let vectors = doc["vectors"].as_array().unwrap();
    assert!(vectors.len() >= 50, "only {} vectors", vectors.len());
    assert!(
        vectors.iter().filter(|v| v["keys"] == "jwks").count() >= 15,
        "the RS256 and ES256 vectors are missing"
    );
    let mut failures = Vec::new();
    for v in vectors {
        let rule = ScopeRule {
            source: ScopeSource::parse(
                v["scope_from"].as_str().unwrap(),
                Some(match v["keys"].as_str().unwrap() {
                    "jwks" => jwks.clone(),
                    "hs256-exp-optional" => hs256.clone().exp_optional(true),
                    _ => hs256.clone(),
                }),
            )
            .unwrap(),
            anonymous: match v["anonymous"].as_str().unwrap() {
                "scoped" => Anonymous::Scoped,
                _ => Anonymous::Refused,
            },
        };
        let headers = v["headers"].as_object().unwrap();
        // A header's value, or its values when it is sent more than once.
        let values = |name: &str| -> Vec<&[u8]> {
            match headers.get(name) {
                Some(serde_json::Value::String(v)) => vec![v.as_bytes()],
                Some(serde_json::Value::Array(vs)) => {
                    vs.iter().map(|v| v.as_str().unwrap().as_bytes()).collect()
                }
                _ => Vec::new(),
            }
        };
        let got = match rule.scope(values, now) {
            Ok(scope) => idem_core::hex(scope.as_bytes()),
            Err(rejection) => rejection
                .problem
                .type_uri()
                .trim_start_matches("https://github.com/idem-rs/idem/blob/main/docs/problems.md#")
                .to_owned(),
        };
        if got != v["expect"].as_str().unwrap() {
            failures.push(format!("{}: got {got}, want {}", v["name"], v["expect"]));
        }
    }
    assert!(
        failures.is_empty(),
        "scope mismatches:\n{}",
        failures.join("\n")
    );
}
