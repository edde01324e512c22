//! The runtime's own SHA-256 (WebCrypto's `crypto.subtle.digest`): native code in
//! workerd, against SHA-256 compiled to WASM. [`crate::flow`] hands it the fingerprint's
//! message where it is faster (`idem-bench --edge-hash` measures where).

use wasm_bindgen::prelude::*;
use worker::js_sys;
use worker::wasm_bindgen_futures::JsFuture;

#[wasm_bindgen]
extern "C" {
    /// WebCrypto copies `data` before it returns (the spec's "get a copy of the
    /// bytes"), so a view into WASM memory is safe to pass.
    #[wasm_bindgen(catch, js_namespace = ["crypto", "subtle"], js_name = digest)]
    fn subtle_digest(algorithm: &str, data: &[u8]) -> Result<js_sys::Promise, JsValue>;
}

/// SHA-256 of `data` by WebCrypto; `None` if the runtime refuses (the caller then
/// hashes in WASM).
pub async fn sha256(data: &[u8]) -> Option<[u8; 32]> {
    let digest = JsFuture::from(subtle_digest("SHA-256", data).ok()?)
        .await
        .ok()?;
    let bytes = js_sys::Uint8Array::new(&digest);
    if bytes.length() != 32 {
        return None;
    }
    let mut out = [0; 32];
    bytes.copy_to(&mut out);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{Fingerprint, RequestParts};
    use wasm_bindgen_test::wasm_bindgen_test;

    /// WebCrypto over the core's message gives every fingerprint of the shared vectors
    /// (the Python reference's), as WASM SHA-256 does: the edge may use either.
    #[wasm_bindgen_test]
    async fn webcrypto_over_the_message_gives_the_reference_fingerprints() {
        let doc: serde_json::Value = serde_json::from_str(include_str!(
            "../../shared/testdata/fingerprint-vectors.json"
        ))
        .unwrap();
        let vectors = doc["vectors"].as_array().expect("a list of vectors");
        assert!(vectors.len() >= 20, "only {} vectors", vectors.len());
        for v in vectors {
            let hex = v["body_hex"].as_str().unwrap();
            let body: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            let parts = RequestParts {
                method: v["method"].as_str().unwrap(),
                path_and_query: v["path_and_query"].as_str().unwrap(),
                content_type: v["content_type"].as_str(),
                body: &body,
            };
            let digest = sha256(&Fingerprint::message(&parts)).await;
            let got = Fingerprint(digest.expect("WebCrypto digests"));
            assert_eq!(
                got.to_hex(),
                v["fingerprint"].as_str().unwrap(),
                "{}",
                v["name"]
            );
        }
        // A body far above any threshold: both ways, the same bytes.
        let big = vec![7u8; 1 << 20];
        let parts = RequestParts {
            method: "POST",
            path_and_query: "/v1/charges",
            content_type: Some("application/octet-stream"),
            body: &big,
        };
        let digest = sha256(&Fingerprint::message(&parts)).await.unwrap();
        assert_eq!(Fingerprint(digest), Fingerprint::of(&parts));
    }
}
