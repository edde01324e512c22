//! What the edge decides before it talks to anything: which requests it guards, the
//! key, the scope, the fingerprint — the same decisions as the origin's layer, on the
//! same core, over plain values.

use idem_core::contract::{Problem, DEFAULT_METHODS, IDEMPOTENCY_KEY};
use idem_core::{Fingerprint, IdempotencyKey, Policy, RecordKey, RequestParts, Scope};

/// The edge's settings (from the worker's vars).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EdgeConfig {
    /// Where first attempts go, e.g. `http://127.0.0.1:8080`.
    pub origin_url: String,
    /// Lease and retention of edge records.
    pub policy: Policy,
    /// Upper bound on `Prefer: wait=N`, in ms.
    pub max_wait_ms: u64,
    /// Largest request body accepted on guarded requests.
    pub max_body_bytes: usize,
    /// Largest response body stored at the edge; above it, retries go to the origin.
    pub max_stored_body_bytes: usize,
    /// Paths on which a key is required.
    pub require_key_paths: Vec<String>,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        EdgeConfig {
            origin_url: "http://127.0.0.1:8080".into(),
            policy: Policy::default(),
            max_wait_ms: 10_000,
            max_body_bytes: 1024 * 1024,
            max_stored_body_bytes: 64 * 1024,
            require_key_paths: vec!["/v1/charges".into()],
        }
    }
}

impl EdgeConfig {
    /// Builds the config from `var(name)` lookups, keeping defaults for absent or
    /// unparsable values.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let d = EdgeConfig::default();
        let num = |name: &str, default: u64| {
            var(name)
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(default)
        };
        EdgeConfig {
            origin_url: var("ORIGIN_URL")
                .map(|u| u.trim_end_matches('/').to_owned())
                .unwrap_or(d.origin_url),
            policy: Policy {
                lease_ms: num("LEASE_MS", d.policy.lease_ms).max(1),
                ttl_ms: num("TTL_MS", d.policy.ttl_ms),
            },
            max_wait_ms: num("MAX_WAIT_MS", d.max_wait_ms),
            max_body_bytes: num("MAX_BODY_BYTES", d.max_body_bytes as u64) as usize,
            max_stored_body_bytes: num("MAX_STORED_BODY_BYTES", d.max_stored_body_bytes as u64)
                as usize,
            require_key_paths: var("REQUIRE_KEY_PATHS")
                .map(|v| {
                    v.split(',')
                        .map(|p| p.trim().to_owned())
                        .filter(|p| !p.is_empty())
                        .collect()
                })
                .unwrap_or(d.require_key_paths),
        }
    }
}

/// What to do with a request, before reading its body.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// Not idem's business: forward as is.
    PassThrough,
    /// Refuse with this problem and detail.
    Reject(Problem, String),
    /// Guard it under this key.
    Guard(IdempotencyKey),
}

/// Decides on the method, path and headers (`headers` yields name, value pairs with
/// lower-case names).
pub fn route<'a>(
    config: &EdgeConfig,
    method: &str,
    path: &str,
    headers: impl Iterator<Item = (&'a str, &'a [u8])>,
) -> Route {
    if !DEFAULT_METHODS.contains(&method) {
        return Route::PassThrough;
    }
    let keys: Vec<&[u8]> = headers
        .filter(|(n, _)| n.eq_ignore_ascii_case(IDEMPOTENCY_KEY))
        .map(|(_, v)| v)
        .collect();
    match keys.as_slice() {
        [] if config.require_key_paths.iter().any(|p| p == path) => Route::Reject(
            Problem::KeyMissing,
            "send an Idempotency-Key header, e.g. Idempotency-Key: \"<uuid>\"".into(),
        ),
        [] => Route::PassThrough,
        [one] => match IdempotencyKey::parse(one) {
            Ok(key) => Route::Guard(key),
            Err(e) => Route::Reject(Problem::KeyMalformed, e.to_string()),
        },
        // Two headers, or one header whose value the runtime joined with ", ".
        _ => Route::Reject(
            Problem::KeyMalformed,
            "send exactly one Idempotency-Key header".into(),
        ),
    }
}

/// The record key and fingerprint of a guarded request — byte for byte what the
/// origin computes for it.
pub fn identify(
    key: &IdempotencyKey,
    authorization: Option<&[u8]>,
    method: &str,
    path_and_query: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> (RecordKey, Fingerprint) {
    let record_key = RecordKey::new(&Scope::from_authorization(authorization), key);
    let fingerprint = Fingerprint::of(&RequestParts {
        method,
        path_and_query,
        content_type,
        body,
    });
    (record_key, fingerprint)
}

/// The wait a `Prefer` header asks for, capped, in ms.
pub fn wait_ms(config: &EdgeConfig, prefer: Option<&[u8]>) -> u64 {
    prefer
        .and_then(idem_core::contract::prefer_wait)
        .map_or(0, |s| s.saturating_mul(1000).min(config.max_wait_ms))
}

/// Request headers not forwarded to the origin (hop-by-hop, or set by the runtime).
pub fn forwardable(name: &str) -> bool {
    !matches!(
        name.to_ascii_lowercase().as_str(),
        "host"
            | "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "upgrade"
            | "content-length"
            | "cf-connecting-ip"
            | "cf-ray"
            | "cf-visitor"
            | "x-forwarded-proto"
            | "x-real-ip"
            | "cf-ew-via"
            | "cdn-loop"
            | "cf-worker"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn r(method: &str, path: &str, headers: &[(&str, &[u8])]) -> Route {
        route(
            &EdgeConfig::default(),
            method,
            path,
            headers.iter().copied(),
        )
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn routes_like_the_origin() {
        assert_eq!(r("GET", "/v1/charges", &[]), Route::PassThrough);
        assert_eq!(
            r("PUT", "/v1/charges", &[("idempotency-key", b"bad key")]),
            Route::PassThrough
        );
        assert!(matches!(
            r("POST", "/v1/charges", &[]),
            Route::Reject(Problem::KeyMissing, _)
        ));
        assert_eq!(r("POST", "/other", &[]), Route::PassThrough);
        assert!(matches!(
            r("POST", "/v1/charges", &[("idempotency-key", b"a b")]),
            Route::Reject(Problem::KeyMalformed, _)
        ));
        assert!(matches!(
            r(
                "POST",
                "/v1/charges",
                &[("idempotency-key", b"a"), ("Idempotency-Key", b"b")]
            ),
            Route::Reject(Problem::KeyMalformed, _)
        ));
        assert_eq!(
            r("PATCH", "/x", &[("Idempotency-Key", b"\"k1\"")]),
            Route::Guard(IdempotencyKey::parse(b"k1").unwrap())
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn reads_vars_and_caps_waits() {
        let c = EdgeConfig::from_vars(|n| match n {
            "ORIGIN_URL" => Some("http://o:1/".into()),
            "LEASE_MS" => Some("500".into()),
            "MAX_WAIT_MS" => Some("2000".into()),
            "REQUIRE_KEY_PATHS" => Some("/a, /b".into()),
            "TTL_MS" => Some("junk".into()),
            _ => None,
        });
        assert_eq!(c.origin_url, "http://o:1");
        assert_eq!(
            c.policy,
            Policy {
                lease_ms: 500,
                ttl_ms: Policy::default().ttl_ms
            }
        );
        assert_eq!(c.require_key_paths, ["/a", "/b"]);
        assert_eq!(wait_ms(&c, Some(b"wait=1")), 1000);
        assert_eq!(wait_ms(&c, Some(b"wait=60")), 2000);
        assert_eq!(wait_ms(&c, None), 0);
    }
}
