//! The edge's settings, read from the worker's vars.

use idem_core::Policy;

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

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn reads_vars() {
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
        assert_eq!(c.max_wait_ms, 2000);
    }
}
