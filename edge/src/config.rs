//! The edge's settings, read from the worker's vars.

use idem_core::contract::{Anonymous, JwtKeys, JwtVerifier, ScopeRule, ScopeSource};
use idem_core::Policy;

/// `SCOPE_FROM` (`authorization`, `header:<name>`, `jwt:<claim>`), `JWT_SECRET` (an
/// HS256 key, a Worker secret) or `JWKS` (the identity provider's public keys, as
/// JSON) with `JWT_ISSUER` and `JWT_AUDIENCE`, and `ANONYMOUS` (`scoped`, `refused`),
/// as the origin's flags.
fn scope_rule(var: &impl Fn(&str) -> Option<String>) -> Result<ScopeRule, String> {
    // As the origin reads its secret file: a trailing newline is not part of it.
    let secret = var("JWT_SECRET").map(|s| s.trim_end_matches(['\r', '\n']).as_bytes().to_vec());
    let keys = match (secret, var("JWKS")) {
        (None, Some(jwks)) => Some(parsed_jwks(&jwks).map_err(|e| format!("JWKS: {e}"))?),
        (secret, jwks) => JwtKeys::either(secret, jwks.as_deref().map(str::as_bytes))
            .map_err(|e| format!("JWT_SECRET, JWKS: {e}"))?,
    };
    let (issuer, audience) = (var("JWT_ISSUER"), var("JWT_AUDIENCE"));
    let exp_optional = match var("JWT_REQUIRE_EXP").as_deref().map(str::trim) {
        None | Some("true") => false,
        Some("false") => true,
        Some(other) => {
            return Err(format!(
                "JWT_REQUIRE_EXP must be true or false, got {other:?}"
            ))
        }
    };
    let jwt = keys
        .map(|keys| JwtVerifier::new(keys, issuer.as_deref(), audience.as_deref()))
        .transpose()
        .map_err(|e| format!("JWT_SECRET, JWT_ISSUER, JWT_AUDIENCE: {e}"))?
        .map(|jwt| jwt.exp_optional(exp_optional));
    let source = match var("SCOPE_FROM") {
        None => ScopeSource::Authorization,
        Some(spec) => ScopeSource::parse(&spec, jwt)
            .map_err(|e| format!("SCOPE_FROM: {e} (JWT_SECRET or JWKS gives it)"))?,
    };
    if let ScopeSource::Header(name) = &source {
        if !idem_core::contract::edge_may_scope_by_header(name) {
            return Err(format!(
                "SCOPE_FROM: header:{name} is not passed to the origin, and a client can set \
                 it to anything: scope by a header the origin also gets (one your clients \
                 authenticate with), or by cf-connecting-ip"
            ));
        }
    }
    let anonymous = match var("ANONYMOUS").as_deref().map(str::trim) {
        // Strangers share no scope unless the deployment says so.
        Some("scoped") => Anonymous::Scoped,
        None | Some("refused") => Anonymous::Refused,
        Some(other) => {
            return Err(format!(
                "ANONYMOUS must be scoped or refused, got {other:?}"
            ))
        }
    };
    Ok(ScopeRule { source, anonymous })
}

/// `EDGE_SECRET`, required: without it the origin never says what it stored, and the
/// edge would keep nothing while seeming to work. Its value is never echoed.
fn edge_secret(var: &impl Fn(&str) -> Option<String>) -> Result<EdgeSecret, String> {
    let Some(secret) = var("EDGE_SECRET") else {
        return Err(
            "EDGE_SECRET is not set: the origin tells only an edge that sends its \
                    --edge-secret-file what it stored (`wrangler secret put EDGE_SECRET`)"
                .into(),
        );
    };
    // As the origin reads its secret file: a trailing newline is not part of it.
    let secret = secret.trim_end_matches(['\r', '\n']).to_owned();
    idem_core::contract::check_edge_secret(secret.as_bytes())
        .map_err(|e| format!("EDGE_SECRET: {e}"))?;
    Ok(EdgeSecret(secret))
}

/// `REQUIRE_KEY_PATHS`: patterns separated by commas, or a list (written as a TOML
/// array in [vars], it arrives as JSON); each checked as the origin checks its own.
fn key_paths(value: &str) -> Result<Vec<String>, String> {
    let paths = list(value)?;
    for path in &paths {
        idem_core::contract::check_pattern(path)?;
    }
    Ok(paths)
}

thread_local! {
    /// The last JWKS parsed, by its text: the vars are read on every request, and an
    /// isolate runs one request at a time, so the keys are checked once per isolate.
    static JWKS_PARSED: std::cell::RefCell<Option<(String, JwtKeys)>> =
        const { std::cell::RefCell::new(None) };
}

fn parsed_jwks(text: &str) -> Result<JwtKeys, String> {
    JWKS_PARSED.with(|cache| {
        if let Some((cached, keys)) = cache.borrow().as_ref() {
            if cached == text {
                return Ok(keys.clone());
            }
        }
        let keys = JwtKeys::from_jwks(text.as_bytes())?;
        *cache.borrow_mut() = Some((text.to_owned(), keys.clone()));
        Ok(keys)
    })
}

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
    /// Who a key belongs to (`SCOPE_FROM`, `JWT_SECRET`, `ANONYMOUS`): it must be the
    /// origin's rule, or the two name different records for one request.
    pub scope: ScopeRule,
    /// `EDGE_SECRET` (a Worker secret), the origin's `--edge-secret-file`: sent with
    /// every request forwarded ([`idem_core::contract::EDGE_SECRET`]), it is what makes
    /// the origin tell the edge what it stored.
    pub edge_secret: EdgeSecret,
    /// `CORS_ORIGINS` (with `CORS_CREDENTIALS`): the origins whose pages may read the
    /// edge's own answers (replays, refusals), as the origin's `--cors-origin`.
    pub cors: Option<idem_core::contract::Cors>,
    /// `PROBLEM_BASE`: what problem `type` URIs start with, as the origin's
    /// `--problem-base` (the repository's `docs/problems.md#` by default).
    pub problem_base: String,
    /// `KEY_HEADER`: the headers the key is read from, as the origin's `--key-header`
    /// (`Idempotency-Key` by default).
    pub key_headers: idem_core::contract::KeyHeaders,
    /// `FINGERPRINT_EXCEPT`, `FINGERPRINT_ONLY`, `FINGERPRINT_HEADERS`: which parts of
    /// a request make two "the same", as the origin's flags of those names. Where the
    /// origin's rule for a request differs, it says so in its disposition and the edge
    /// keeps nothing of that answer.
    pub fingerprint: idem_core::FingerprintRule,
}

/// A var holding a list: names separated by commas, or a list (a TOML array in
/// [vars] arrives as JSON), as the origin's flags of the same meaning take them.
fn list(value: &str) -> Result<Vec<String>, String> {
    match value.trim_start().starts_with('[') {
        true => {
            serde_json::from_str(value).map_err(|_| String::from("a list must hold strings only"))
        }
        false => Ok(value
            .split(',')
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty())
            .collect()),
    }
}

/// `KEY_HEADER`, checked as the origin's `--key-header`.
fn key_headers(
    var: &impl Fn(&str) -> Option<String>,
) -> Result<idem_core::contract::KeyHeaders, String> {
    let Some(value) = var("KEY_HEADER") else {
        return Ok(Default::default());
    };
    list(&value)
        .and_then(|names| idem_core::contract::KeyHeaders::new(names).map_err(String::from))
        .map_err(|e| format!("KEY_HEADER: {e}"))
}

/// `FINGERPRINT_ONLY`, `FINGERPRINT_EXCEPT` and `FINGERPRINT_HEADERS`, checked as the
/// origin's flags of those names.
fn fingerprint_rule(
    var: &impl Fn(&str) -> Option<String>,
) -> Result<idem_core::FingerprintRule, String> {
    let read = |name: &str| {
        var(name).map_or(Ok(Vec::new()), |v| {
            list(&v).map_err(|e| format!("{name}: {e}"))
        })
    };
    let (only, except, headers) = (
        read("FINGERPRINT_ONLY")?,
        read("FINGERPRINT_EXCEPT")?,
        read("FINGERPRINT_HEADERS")?,
    );
    idem_core::FingerprintRule::new(&only, &except, &headers)
        .map_err(|e| format!("FINGERPRINT_ONLY, FINGERPRINT_EXCEPT, FINGERPRINT_HEADERS: {e}"))
}

/// `CORS_ORIGINS` (origins separated by commas, or a list) and `CORS_CREDENTIALS`.
fn cors(
    var: &impl Fn(&str) -> Option<String>,
) -> Result<Option<idem_core::contract::Cors>, String> {
    let credentials = match var("CORS_CREDENTIALS").as_deref().map(str::trim) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(format!(
                "CORS_CREDENTIALS must be true or false, got {other:?}"
            ))
        }
    };
    let Some(value) = var("CORS_ORIGINS") else {
        return match credentials {
            true => Err("CORS_CREDENTIALS needs CORS_ORIGINS".into()),
            false => Ok(None),
        };
    };
    let origins = list(&value).map_err(|e| format!("CORS_ORIGINS: {e}"))?;
    idem_core::contract::Cors::new(&origins, credentials)
        .map(Some)
        .map_err(|e| format!("CORS_ORIGINS: {e}"))
}

/// The edge's secret; shown by `Debug` as its length only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EdgeSecret(pub String);

impl std::fmt::Debug for EdgeSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EdgeSecret({} bytes)", self.0.len())
    }
}

/// Bounds of each number, as (least, most): a value outside them is refused, never
/// clamped. A TTL past a year would make the Durable Object's alarm date invalid.
const BOUNDS: [(&str, u64, u64); 5] = [
    ("LEASE_MS", Policy::MIN_LEASE_MS, 3_600_000),
    ("TTL_MS", 1_000, crate::records::MAX_TTL_MS),
    ("MAX_WAIT_MS", 0, 60_000),
    ("MAX_BODY_BYTES", 1, 100 * 1024 * 1024),
    // Sent to the Durable Object as hex (twice its size) and stored in one value (2 MB
    // with its key), with its headers: 512 KiB leaves room for both.
    ("MAX_STORED_BODY_BYTES", 0, 512 * 1024),
];

impl Default for EdgeConfig {
    /// Everything but the origin's URL, which has no default.
    fn default() -> Self {
        EdgeConfig {
            origin_url: String::new(),
            // Short: the origin is the authority. A claim orphaned by an invocation
            // that was cut off frees itself soon, and a forward slower than this is
            // answered by the origin (409 or its replay).
            policy: Policy {
                lease_ms: 10_000,
                ..Policy::default()
            },
            max_wait_ms: 10_000,
            max_body_bytes: 1024 * 1024,
            max_stored_body_bytes: 64 * 1024,
            require_key_paths: vec!["/v1/charges".into()],
            scope: ScopeRule::default(),
            edge_secret: EdgeSecret::default(),
            cors: None,
            problem_base: idem_core::contract::DEFAULT_PROBLEM_BASE.into(),
            key_headers: Default::default(),
            fingerprint: Default::default(),
        }
    }
}

impl EdgeConfig {
    /// Whether the origin is reached by plain `http://` at a host off this machine.
    pub fn origin_in_clear(&self) -> bool {
        let Some(rest) = self
            .origin_url
            .get(..7)
            .filter(|s| s.eq_ignore_ascii_case("http://"))
            .and_then(|_| self.origin_url.get(7..))
        else {
            return false;
        };
        let authority = rest.split('/').next().unwrap_or("");
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
        };
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        !loopback
    }

    /// Builds the config from `var(name)` lookups: defaults for absent numbers, an
    /// error naming the var for a missing `ORIGIN_URL` or a value that is malformed or
    /// out of bounds — a misconfigured edge says so rather than guess.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let d = EdgeConfig::default();
        let num = |name: &str, default: u64| -> Result<u64, String> {
            let Some(raw) = var(name) else {
                return Ok(default);
            };
            let (_, least, most) = BOUNDS
                .iter()
                .find(|(n, ..)| *n == name)
                .copied()
                .unwrap_or((name, 0, u64::MAX));
            match raw.trim().parse::<u64>() {
                Ok(n) if (least..=most).contains(&n) => Ok(n),
                _ => Err(format!(
                    "{name} must be a whole number from {least} to {most}, got {raw:?}"
                )),
            }
        };
        let origin_url =
            match var("ORIGIN_URL").map(|u| u.trim().trim_end_matches('/').to_owned()) {
                None => return Err(
                    "ORIGIN_URL is not set: the edge needs its origin's http:// or https:// URL"
                        .into(),
                ),
                Some(u) if u.is_empty() => {
                    return Err(
                        "ORIGIN_URL is empty: the edge needs its origin's http:// or https:// URL"
                            .into(),
                    )
                }
                // The value is not echoed: it can hold an internal address or a password.
                Some(u)
                    if !(u
                        .get(..7)
                        .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
                        || u.get(..8)
                            .is_some_and(|s| s.eq_ignore_ascii_case("https://"))) =>
                {
                    return Err("ORIGIN_URL must be an http:// or https:// URL".into())
                }
                Some(u) => match worker::Url::parse(&u) {
                    // The request's path and query are appended to it.
                    Ok(url) if url.query().is_some() || url.fragment().is_some() => {
                        return Err("ORIGIN_URL must not have a query or a fragment".into())
                    }
                    Ok(url) if url.host_str().is_some_and(|h| !h.is_empty()) => u,
                    // The parser's reason names what is wrong, not the value.
                    Ok(_) => return Err("ORIGIN_URL has no host".into()),
                    Err(why) => return Err(format!("ORIGIN_URL is not a valid URL: {why}")),
                },
            };
        let edge_secret = edge_secret(&var)?;
        let policy = Policy {
            lease_ms: num("LEASE_MS", d.policy.lease_ms)?,
            ttl_ms: num("TTL_MS", d.policy.ttl_ms)?,
        };
        if let Some(why) = policy.refusal() {
            return Err(format!(
                "LEASE_MS ({}) and TTL_MS ({}): {why}",
                policy.lease_ms, policy.ttl_ms
            ));
        }
        Ok(EdgeConfig {
            origin_url,
            policy,
            max_wait_ms: num("MAX_WAIT_MS", d.max_wait_ms)?,
            max_body_bytes: num("MAX_BODY_BYTES", d.max_body_bytes as u64)? as usize,
            max_stored_body_bytes: num("MAX_STORED_BODY_BYTES", d.max_stored_body_bytes as u64)?
                as usize,
            require_key_paths: match var("REQUIRE_KEY_PATHS") {
                None => d.require_key_paths,
                Some(v) => key_paths(&v).map_err(|e| format!("REQUIRE_KEY_PATHS: {e}"))?,
            },
            scope: scope_rule(&var)?,
            edge_secret,
            cors: cors(&var)?,
            problem_base: match var("PROBLEM_BASE") {
                None => d.problem_base,
                Some(base) => {
                    let base = base.trim().to_owned();
                    idem_core::contract::check_problem_base(&base)
                        .map_err(|e| format!("PROBLEM_BASE: {e}"))?;
                    base
                }
            },
            key_headers: key_headers(&var)?,
            fingerprint: fingerprint_rule(&var)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    #[wasm_bindgen_test(unsupported = test)]
    fn strangers_share_no_scope_unless_the_deployment_says_so() {
        let anonymous = |value: Option<&str>| {
            EdgeConfig::from_vars(|n| match n {
                "ORIGIN_URL" => Some("http://o".into()),
                "EDGE_SECRET" => Some(SECRET.into()),
                "ANONYMOUS" => value.map(Into::into),
                _ => None,
            })
            .unwrap()
            .scope
            .anonymous
        };
        assert_eq!(anonymous(None), Anonymous::Refused);
        assert_eq!(anonymous(Some("refused")), Anonymous::Refused);
        assert_eq!(anonymous(Some("scoped")), Anonymous::Scoped);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn cors_origins_are_checked_as_the_origin_checks_them() {
        let cors = |origins: Option<&str>, credentials: Option<&str>| {
            EdgeConfig::from_vars(|n| match n {
                "ORIGIN_URL" => Some("http://o".into()),
                "EDGE_SECRET" => Some(SECRET.into()),
                "CORS_ORIGINS" => origins.map(Into::into),
                "CORS_CREDENTIALS" => credentials.map(Into::into),
                _ => None,
            })
            .map(|c| c.cors.is_some())
        };
        assert_eq!(cors(None, None), Ok(false));
        assert_eq!(
            cors(Some("https://a.example, https://b.example"), None),
            Ok(true)
        );
        assert_eq!(
            cors(Some(r#"["https://a.example"]"#), Some("true")),
            Ok(true)
        );
        assert_eq!(cors(Some("*"), None), Ok(true));
        for (origins, credentials, says) in [
            (Some("*"), Some("true"), "CORS_ORIGINS"),
            (Some("a.example"), None, "CORS_ORIGINS"),
            (None, Some("true"), "needs CORS_ORIGINS"),
            (Some("https://a.example"), Some("yes"), "CORS_CREDENTIALS"),
        ] {
            let error = cors(origins, credentials).unwrap_err();
            assert!(error.contains(says), "{error}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn key_headers_and_fingerprint_rules_are_checked_as_the_origin_checks_them() {
        let config = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect();
            EdgeConfig::from_vars(|n| match n {
                "ORIGIN_URL" => Some("http://o".into()),
                "EDGE_SECRET" => Some(SECRET.into()),
                _ => vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()),
            })
        };
        let d = config(&[]).unwrap();
        assert_eq!(d.key_headers, idem_core::contract::KeyHeaders::default());
        assert!(d.fingerprint.is_whole());
        let set = config(&[
            ("KEY_HEADER", "X-Idempotency-Key, paypal-request-id"),
            ("FINGERPRINT_EXCEPT", r#"["/sent_at", "/a,b"]"#),
            ("FINGERPRINT_HEADERS", "x-api-version"),
        ])
        .unwrap();
        assert_eq!(
            set.key_headers.names(),
            ["x-idempotency-key", "paypal-request-id"]
        );
        assert_eq!(
            set.fingerprint,
            idem_core::FingerprintRule::new(
                &[] as &[&str],
                &["/sent_at", "/a,b"],
                &["x-api-version"]
            )
            .unwrap(),
            "a list may be JSON, for a pointer holding a comma"
        );
        for (vars, says) in [
            (
                vec![("KEY_HEADER", "x-request-id")],
                "KEY_HEADER: x-request-id",
            ),
            (
                vec![("KEY_HEADER", "authorization")],
                "KEY_HEADER: authorization",
            ),
            (vec![("KEY_HEADER", " , ")], "KEY_HEADER: no header names"),
            (
                vec![("KEY_HEADER", "[1]")],
                "KEY_HEADER: a list must hold strings",
            ),
            (
                vec![("FINGERPRINT_ONLY", "/a"), ("FINGERPRINT_EXCEPT", "/b")],
                "not both",
            ),
            (
                vec![("FINGERPRINT_EXCEPT", "sent_at")],
                "FINGERPRINT_ONLY, FINGERPRINT_EXCEPT",
            ),
            (
                vec![("FINGERPRINT_HEADERS", "x-forwarded-for")],
                "cannot be fingerprinted",
            ),
        ] {
            let error = config(&vars).unwrap_err();
            assert!(error.contains(says), "{vars:?}: {error}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_origin_off_this_machine_in_clear_is_told_apart() {
        let in_clear = |url: &str| {
            EdgeConfig {
                origin_url: url.into(),
                ..EdgeConfig::default()
            }
            .origin_in_clear()
        };
        assert!(in_clear("http://origin.example"));
        assert!(in_clear("HTTP://10.0.0.5:8080/base"));
        assert!(!in_clear("https://origin.example"));
        assert!(!in_clear("http://127.0.0.1:8080"));
        assert!(!in_clear("http://localhost:8080"));
        assert!(!in_clear("http://[::1]:8080"));
        assert!(in_clear("http://[2001:db8::1]:8080"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn reads_vars() {
        let c = EdgeConfig::from_vars(|n| match n {
            "ORIGIN_URL" => Some("http://o:1/".into()),
            "EDGE_SECRET" => Some(SECRET.into()),
            "LEASE_MS" => Some("500".into()),
            "MAX_WAIT_MS" => Some("2000".into()),
            "REQUIRE_KEY_PATHS" => Some("/a, /b".into()),
            _ => None,
        })
        .unwrap();
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

    #[wasm_bindgen_test(unsupported = test)]
    fn refuses_what_it_cannot_use_naming_the_var() {
        let with = |name: &'static str, value: &'static str| {
            EdgeConfig::from_vars(move |n| match n {
                "ORIGIN_URL" if name != "ORIGIN_URL" => Some("https://origin.example".into()),
                "EDGE_SECRET" if name != "EDGE_SECRET" => Some(SECRET.into()),
                n if n == name => Some(value.into()),
                _ => None,
            })
        };
        assert!(EdgeConfig::from_vars(|_| None)
            .unwrap_err()
            .contains("ORIGIN_URL is not set"));
        assert!(with("ORIGIN_URL", " ")
            .unwrap_err()
            .contains("ORIGIN_URL is empty"));
        assert!(with("ORIGIN_URL", "origin:8080")
            .unwrap_err()
            .contains("http://"));
        let bad_host = with("ORIGIN_URL", "http://bad host:8080/p").unwrap_err();
        assert!(
            bad_host.starts_with("ORIGIN_URL is not a valid URL"),
            "{bad_host}"
        );
        assert!(
            !bad_host.contains("bad host"),
            "the value is not echoed: {bad_host}"
        );
        assert!(with("ORIGIN_URL", "https://api.example:8443/base").is_ok());
        // The origin tells only the edge what it stored: without the secret, nothing.
        let unset = EdgeConfig::from_vars(|n| (n == "ORIGIN_URL").then(|| "http://o".into()));
        assert!(
            unset.unwrap_err().starts_with("EDGE_SECRET is not set"),
            "no secret"
        );
        let short = with("EDGE_SECRET", "hunter2").unwrap_err();
        assert!(
            short.starts_with("EDGE_SECRET: ") && !short.contains("hunter2"),
            "{short}"
        );
        assert_eq!(
            with("EDGE_SECRET", "0123456789abcdef0123\n")
                .unwrap()
                .edge_secret
                .0,
            "0123456789abcdef0123",
            "a trailing newline is not part of it"
        );
        assert!(with("ORIGIN_URL", "https://api.example/?a=1")
            .unwrap_err()
            .contains("query"));
        for (name, value) in [
            ("TTL_MS", "junk"),
            ("TTL_MS", "99999999999999999"),
            ("LEASE_MS", "0"),
            ("MAX_WAIT_MS", "-1"),
            ("MAX_BODY_BYTES", "0"),
            ("MAX_STORED_BODY_BYTES", "100000000"),
        ] {
            let err = with(name, value).unwrap_err();
            assert!(err.starts_with(name), "{name}={value}: {err}");
        }
        // A header the edge drops before the origin, and a client can forge: refused.
        for forgeable in [
            "header:x-real-ip",
            "header:Forwarded",
            "header:x-forwarded-port",
            "header:true-client-ip",
        ] {
            let err = with("SCOPE_FROM", forgeable).unwrap_err();
            assert!(
                err.starts_with("SCOPE_FROM: header:") && err.contains("can set it to anything"),
                "{forgeable}: {err}"
            );
        }
        for usable in [
            "header:x-api-key",
            "header:cf-connecting-ip",
            "header:X-Forwarded-Host",
            "header:x-forwarded-for",
        ] {
            assert!(with("SCOPE_FROM", usable).is_ok(), "{usable}");
        }
        let lease_past_ttl = EdgeConfig::from_vars(|n| match n {
            "ORIGIN_URL" => Some("http://o".into()),
            "EDGE_SECRET" => Some(SECRET.into()),
            "LEASE_MS" => Some("5000".into()),
            "TTL_MS" => Some("2000".into()),
            _ => None,
        });
        assert!(lease_past_ttl
            .unwrap_err()
            .contains("the TTL must be longer than the lease"));
        let lease_equal_to_ttl = EdgeConfig::from_vars(|n| match n {
            "ORIGIN_URL" => Some("http://o".into()),
            "EDGE_SECRET" => Some(SECRET.into()),
            "LEASE_MS" | "TTL_MS" => Some("5000".into()),
            _ => None,
        });
        assert!(
            lease_equal_to_ttl
                .unwrap_err()
                .contains("the TTL must be longer than the lease"),
            "a TTL equal to the lease"
        );
        assert!(with("TTL_MS", "86400000").is_ok());
        let listed = with("REQUIRE_KEY_PATHS", "[\"/v1/charges\", \"/v2/*\"]").unwrap();
        assert_eq!(
            listed.require_key_paths,
            ["/v1/charges", "/v2/*"],
            "a TOML array"
        );
        for bad in ["v1/charges", "/v1/charges/", "[1]"] {
            let err = with("REQUIRE_KEY_PATHS", bad).unwrap_err();
            assert!(err.starts_with("REQUIRE_KEY_PATHS: "), "{bad}: {err}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn reads_a_jwks_or_a_secret_never_both() {
        let vectors: serde_json::Value =
            serde_json::from_str(include_str!("../../shared/testdata/scope-vectors.json")).unwrap();
        let jwks = vectors["jwks"].to_string();
        let with = |vars: &[(&'static str, String)]| {
            let vars = vars.to_vec();
            EdgeConfig::from_vars(move |n| match n {
                "ORIGIN_URL" => Some("http://o".into()),
                "EDGE_SECRET" => Some(SECRET.into()),
                "SCOPE_FROM" => Some("jwt:sub".into()),
                n => vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone()),
            })
        };
        for _ in 0..2 {
            // (the second time from the cache)
            let c = with(&[
                ("JWKS", jwks.clone()),
                ("JWT_ISSUER", "https://id.example".into()),
                ("JWT_AUDIENCE", "payments".into()),
            ])
            .unwrap();
            assert_eq!(
                format!("{:?}", c.scope.source),
                "jwt:sub",
                "parsed: {:?}",
                c.scope
            );
            assert!(matches!(
                c.scope.source,
                ScopeSource::JwtClaim { ref jwt, .. } if matches!(jwt.keys(), JwtKeys::Jwks(keys) if keys.len() == 2)
            ));
        }
        let both = with(&[("JWKS", jwks.clone()), ("JWT_SECRET", "s".into())]).unwrap_err();
        assert!(both.contains("not both"), "{both}");
        let broken = with(&[("JWKS", "{\"keys\":[]}".into())]).unwrap_err();
        assert!(
            broken.starts_with("JWKS: it has no RS256 or ES256"),
            "{broken}"
        );
        let no_audience = with(&[("JWKS", jwks.clone()), ("JWT_ISSUER", "i".into())]).unwrap_err();
        assert!(
            no_audience.starts_with("JWT_SECRET, JWT_ISSUER, JWT_AUDIENCE: a JWKS's keys"),
            "{no_audience}"
        );
        let short = with(&[("JWT_SECRET", "s3cret".into())]).unwrap_err();
        assert!(short.contains("the HS256 secret is 6 bytes"), "{short}");
        let never_expiring = with(&[
            ("JWT_SECRET", "x".repeat(32)),
            ("JWT_REQUIRE_EXP", "maybe".into()),
        ]);
        assert!(never_expiring.unwrap_err().starts_with("JWT_REQUIRE_EXP"));
        let neither = with(&[]).unwrap_err();
        assert!(neither.contains("JWT_SECRET or JWKS"), "{neither}");
    }
}
