//! The shared fingerprint test vectors (`testdata/fingerprint-vectors.json`, produced by
//! an independent Python implementation). The edge runs this same check in WASM.

use idem_core::{json, Fingerprint, RequestParts};
use wasm_bindgen_test::wasm_bindgen_test;

const VECTORS: &str = include_str!("../testdata/fingerprint-vectors.json");

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[wasm_bindgen_test(unsupported = test)]
fn fingerprints_match_the_shared_vectors() {
    let doc: serde_json::Value = serde_json::from_str(VECTORS).unwrap();
    let vectors = doc["vectors"].as_array().unwrap();
    assert!(vectors.len() >= 20, "only {} vectors", vectors.len());
    let mut failures = Vec::new();
    for v in vectors {
        let body = unhex(v["body_hex"].as_str().unwrap());
        let parts = RequestParts {
            method: v["method"].as_str().unwrap(),
            path_and_query: v["path_and_query"].as_str().unwrap(),
            content_type: v["content_type"].as_str(),
            body: &body,
        };
        let got = Fingerprint::of(&parts).to_hex();
        if got != v["fingerprint"].as_str().unwrap() {
            failures.push(format!(
                "{}: got {got}, want {}",
                v["name"], v["fingerprint"]
            ));
        }
        if v["json_canonical"].as_bool().unwrap() {
            assert!(
                json::canonicalize(&body).is_ok(),
                "{} should canonicalise",
                v["name"]
            );
        }
    }
    assert!(
        failures.is_empty(),
        "fingerprint mismatches:\n{}",
        failures.join("\n")
    );
}

/// A route's fingerprint rule (JSON Pointers kept or left out, headers) against the
/// same independent Python implementation.
#[wasm_bindgen_test(unsupported = test)]
fn selected_fingerprints_match_the_shared_vectors() {
    let doc: serde_json::Value = serde_json::from_str(VECTORS).unwrap();
    let vectors = doc["selected"].as_array().unwrap();
    assert!(vectors.len() >= 25, "only {} vectors", vectors.len());
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    let mut failures = Vec::new();
    let mut distinct = std::collections::BTreeSet::new();
    for v in vectors {
        let body = unhex(v["body_hex"].as_str().unwrap());
        let rule = idem_core::FingerprintRule::new(
            &strings(&v["only"]),
            &strings(&v["except"]),
            &strings(&v["rule_headers"]),
        )
        .unwrap();
        let headers: Vec<(String, Vec<u8>)> = v["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h[0].as_str().unwrap().to_owned(),
                    h[1].as_str().unwrap().as_bytes().to_vec(),
                )
            })
            .collect();
        let content_type: Vec<&[u8]> = v["content_type"]
            .as_str()
            .map(str::as_bytes)
            .into_iter()
            .collect();
        let got = rule
            .fingerprint(
                v["method"].as_str().unwrap(),
                v["path_and_query"].as_str().unwrap(),
                content_type,
                &body,
                |name| {
                    headers
                        .iter()
                        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v.as_slice())
                        .collect::<Vec<&[u8]>>()
                },
            )
            .to_hex();
        distinct.insert(got.clone());
        if got != v["fingerprint"].as_str().unwrap() {
            failures.push(format!(
                "{}: got {got}, want {}",
                v["name"], v["fingerprint"]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "selected fingerprint mismatches:\n{}",
        failures.join("\n")
    );
    // The vectors are not all one value: the rule's cases tell requests apart.
    assert!(distinct.len() >= 20, "{} distinct", distinct.len());
}
