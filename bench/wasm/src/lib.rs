//! The core's fingerprinting compiled to WASM — the code the edge worker runs — so
//! that `idem-bench` can time it under Node against the same code built natively.
//!
//! ```text
//! cargo build --release --target wasm32-unknown-unknown -p idem-bench-wasm
//! wasm-bindgen --target nodejs --out-dir target/idem-bench/wasm \
//!     target/wasm32-unknown-unknown/release/idem_bench_wasm.wasm
//! node bench/wasm/run.cjs target/idem-bench/wasm/idem_bench_wasm.js 1000
//! ```

use idem_core::{Fingerprint, RequestParts};
use wasm_bindgen::prelude::*;

/// Body sizes timed, with their labels.
pub const SIZES: [(&str, usize); 3] = [("1KiB", 1024), ("64KiB", 64 * 1024), ("1MiB", 1024 * 1024)];

/// A body of about `size` bytes: raw bytes, or a JSON array of charge-like objects
/// whose keys are out of order (so canonicalisation has sorting to do).
pub fn body(json: bool, size: usize) -> Vec<u8> {
    if !json {
        return (0..size).map(|i| (i * 31 % 251) as u8).collect();
    }
    let item = r#"{"currency":"usd","amount":1999,"metadata":{"order":"A-1042","note":"caf\u00e9"},"customer":"cus_9f8e7d"}"#;
    let mut out = String::from("[");
    while out.len() + item.len() + 2 < size {
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(item);
    }
    out.push(']');
    out.into_bytes()
}

/// The fingerprint of a `POST /v1/charges` with `body`.
pub fn fingerprint_of(json: bool, body: &[u8]) -> Fingerprint {
    Fingerprint::of(&request(json, body))
}

fn request(json: bool, body: &[u8]) -> RequestParts<'_> {
    RequestParts {
        method: "POST",
        path_and_query: "/v1/charges",
        content_type: Some(if json {
            "application/json"
        } else {
            "application/octet-stream"
        }),
        body,
    }
}

/// Fingerprints `body`, copied in from JavaScript as the edge's request body is.
#[wasm_bindgen]
pub fn fingerprint(json: bool, body: &[u8]) -> Vec<u8> {
    fingerprint_of(json, body).0.to_vec()
}

/// What the edge does instead for bodies of 4 KiB and more: the bytes to hash, made
/// in WASM and handed to the runtime's WebCrypto SHA-256 (`edge/src/flow.rs`,
/// `fingerprint_of`).
#[wasm_bindgen(js_name = fingerprintMessage)]
pub fn fingerprint_message(json: bool, body: &[u8]) -> Vec<u8> {
    Fingerprint::message(&request(json, body))
}

/// [`body`], for the JavaScript side.
#[wasm_bindgen(js_name = makeBody)]
pub fn make_body(json: bool, size: usize) -> Vec<u8> {
    body(json, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_the_size_asked_and_json_ones_are_canonicalised() {
        for (_, size) in SIZES {
            assert_eq!(body(false, size).len(), size);
            let json = body(true, size);
            assert!(json.len() <= size && json.len() > size / 2);
            let c = idem_core::json::canonicalize(&json).unwrap();
            assert!(c.starts_with(br#"[{"amount":1999,"currency":"usd","customer""#));
        }
        assert_ne!(
            fingerprint_of(true, &body(true, 1024)),
            fingerprint_of(false, &body(true, 1024))
        );
    }
}
