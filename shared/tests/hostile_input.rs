//! Hostile input: every parser a client or an operator feeds idem, on arbitrary bytes
//! and on strings drawn from the characters each parser treats specially (random
//! bytes alone rarely get past a parser's first check). Each parser returns — it never
//! panics — and what it accepts is well formed and reads back the same.
//!
//! `PROPTEST_CASES` sets how many inputs each property gets (1 000 here by default;
//! the release checklist's longer run uses 1 000 000).
#![cfg(not(target_arch = "wasm32"))]

use idem_core::contract::{
    self, ambiguous_path, check_pattern, choose_route, normal_path, JwtKeys, JwtVerifier,
    PathPattern, ScopeRule, ScopeSource,
};
use idem_core::json::canonicalize;
use idem_core::{IdempotencyKey, Record, MAX_KEY_LEN};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

/// Strings of `alphabet`'s bytes: near misses of what the parser accepts.
fn from(alphabet: &'static [u8], max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(proptest::sample::select(alphabet), 0..max)
}

/// `valid` with one change: cut short, one byte replaced, or a range removed — inputs
/// that get past a parser's first checks and fail (or not) deep inside it.
fn mutated(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = valid.len().max(1);
    (0..3u8, 0..len, 0..len, any::<u8>()).prop_map(move |(how, at, to, byte)| {
        let mut out = valid.clone();
        let at = at.min(out.len());
        match how {
            0 => out.truncate(at),
            1 if at < out.len() => out[at] = byte,
            _ => {
                let (from, to) = (at.min(to), at.max(to).min(out.len()));
                out.drain(from..to);
            }
        }
        out
    })
}

/// The JWKS of the scope vectors (an RSA, an EC and an encryption key).
fn jwks() -> Vec<u8> {
    let vectors: serde_json::Value =
        serde_json::from_str(include_str!("../testdata/scope-vectors.json")).unwrap();
    vectors["jwks"].to_string().into_bytes()
}

/// Encoded records, in progress and completed.
fn encoded_record() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<bool>(),
        any::<[u8; 32]>(),
        any::<u64>(),
        any::<u64>(),
        100u16..600,
        bytes(40),
    )
        .prop_map(|(done, fingerprint, token, at, status, body)| {
            let fingerprint = idem_core::Fingerprint(fingerprint);
            let record = if done {
                Record::Completed {
                    fingerprint,
                    token,
                    response: idem_core::StoredResponse {
                        status,
                        headers: vec![("content-type".into(), b"text/plain".to_vec())],
                        body,
                    },
                    expires_at: at,
                }
            } else {
                Record::InProgress {
                    fingerprint,
                    token,
                    lease_until: at / 2,
                    expires_at: at,
                }
            };
            record.encode()
        })
}

fn records() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![bytes(400), encoded_record().prop_flat_map(mutated)]
}

fn jwks_inputs() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        bytes(300),
        from(b"{}[]\":,keysktyRSAECnealgcrvxyP-256kid ", 200),
        mutated(jwks()),
    ]
}

fn keys() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        bytes(300),
        from(b"\"\\ \t,;=aZ09-\x7f\x01\xc3", 40),
        "[!-~]{0,300}".prop_map(String::into_bytes),
        "[ \t]?\"([ -!#-\\[\\]-~]|\\\\[\"\\\\a]){0,40}\"[ \t]?".prop_map(String::into_bytes),
    ]
}

/// JSON documents: numbers, strings with any characters, nesting.
fn json_document() -> impl Strategy<Value = Vec<u8>> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::btree_map(any::<String>(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .prop_map(|v| v.to_string().into_bytes())
}

fn json() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        bytes(200),
        from(b"{}[]\",:0123456789.eE+- \\utrfalsn\t\n", 80),
        json_document(),
        json_document().prop_flat_map(mutated),
    ]
}

fn paths() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![bytes(80), from(b"/.%2fF5cCeE;\\av1*?#", 40)]
}

fn text(input: &[u8]) -> String {
    String::from_utf8_lossy(input).into_owned()
}

/// A key written as an RFC 8941 sf-string.
fn quoted(key: &str) -> String {
    let mut out = String::from("\"");
    for c in key.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn idempotency_keys(raw in keys()) {
        if let Ok(key) = IdempotencyKey::parse(&raw) {
            let k = key.as_str();
            prop_assert!((1..=MAX_KEY_LEN).contains(&k.len()));
            prop_assert!(k.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{:?}", k);
            prop_assert_eq!(IdempotencyKey::parse(quoted(k).as_bytes()), Ok(key.clone()));
        }
    }

    #[test]
    fn prefer_headers(raw in prop_oneof![bytes(100), from(b"wait=0123456789 ,;\"respond-async\t-+.e", 40)], max in 0u64..100_000) {
        let one = contract::prefer_wait(&raw);
        let capped = contract::wait_ms([raw.as_slice()], max);
        prop_assert!(capped <= max);
        if one.is_none() {
            prop_assert_eq!(capped, 0, "no wait asked, a wait given");
        }
    }

    #[test]
    fn json_bodies(raw in json()) {
        if let Ok(canonical) = canonicalize(&raw) {
            // Canonical form is a fixed point, and JSON a strict reader takes (its
            // grammar: numbers are kept as written, so `1e316` is JSON serde_json
            // parses but will not hold in an f64).
            let again = canonicalize(&canonical);
            prop_assert_eq!(again.as_ref(), Ok(&canonical));
            prop_assert!(
                serde_json::from_slice::<serde::de::IgnoredAny>(&canonical).is_ok(),
                "{}", String::from_utf8_lossy(&canonical)
            );
        }
    }

    #[test]
    fn bearer_tokens(token in prop_oneof![bytes(300), from(b"eyJhbGciOiJIUzI1NiJ9.-_=+/", 300)], now in any::<u64>()) {
        let verifier = JwtVerifier::new(JwtKeys::Hs256(vec![7; 32]), None, None).unwrap();
        // Random bytes never carry the secret's signature: refused, never a panic, and
        // never an anonymous scope.
        prop_assert!(contract::scope::verify_jwt(&token, &verifier, now).is_err());
        let rule = ScopeRule {
            source: ScopeSource::parse("jwt:sub", Some(verifier)).unwrap(),
            anonymous: contract::Anonymous::Scoped,
        };
        let mut header = b"Bearer ".to_vec();
        header.extend_from_slice(&token);
        let values = |name: &str| {
            if name.eq_ignore_ascii_case("authorization") { vec![header.as_slice()] } else { vec![] }
        };
        prop_assert!(rule.scope(values, now).is_err(), "a forged token got a scope");
    }

    #[test]
    fn jwks_documents(raw in jwks_inputs()) {
        if let Ok(keys) = JwtKeys::from_jwks(&raw) {
            prop_assert!(matches!(keys, JwtKeys::Jwks(ref all) if !all.is_empty()));
        }
    }

    #[test]
    fn stored_records(raw in records()) {
        if let Ok(record) = Record::decode(&raw) {
            prop_assert_eq!(Record::decode(&record.encode()), Ok(record));
        }
    }

    #[test]
    fn scope_specs(spec in prop_oneof![bytes(60), from(b"header:jwt:authorization-xX_.: ", 40)]) {
        let spec = text(&spec);
        if let Ok(source) = ScopeSource::parse(&spec, None) {
            // What is accepted names a source that reads back the same way.
            prop_assert_eq!(ScopeSource::parse(&source.to_string(), None), Ok(source));
        }
    }

    #[test]
    fn request_paths(path in paths()) {
        let path = text(&path);
        let patterns = [PathPattern::new("/v1/*").unwrap(), PathPattern::new("/a").unwrap()];
        let guarded_everywhere = choose_route(&patterns, &path, |_| true);
        if ambiguous_path(&path) {
            prop_assert_eq!(guarded_everywhere, contract::PathChoice::Ambiguous);
        } else {
            // An unambiguous path is read one way, and that reading is stable.
            let normal = normal_path(&path).into_owned();
            prop_assert_eq!(normal_path(&normal).into_owned(), normal);
        }
        // Nothing guarded: no reading of it matters.
        prop_assert!(matches!(choose_route(&patterns, &path, |_| false), contract::PathChoice::Route(_)));
    }

    #[test]
    fn route_patterns(pattern in prop_oneof![bytes(40), from(b"/.*%2f;\\av1", 20)]) {
        let pattern = text(&pattern);
        match PathPattern::new(&pattern) {
            Ok(p) => {
                prop_assert!(check_pattern(&pattern).is_ok());
                prop_assert_eq!(p.as_str(), pattern.as_str());
            }
            Err(e) => prop_assert!(!e.message().is_empty()),
        }
    }

    #[test]
    fn declared_lengths(raw in prop_oneof![bytes(30), from(b"0123456789 \t+-x", 30)], limit in 0usize..1_000_000) {
        if let Ok(Some(n)) = contract::check_declared_length(Some(&raw), limit) {
            prop_assert!(n <= limit);
        }
    }
}

/// How many of 2 000 inputs from `strategy` `accepts` takes.
fn accepted<S: Strategy>(strategy: S, accepts: impl Fn(&S::Value) -> bool) -> usize {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    (0..2_000)
        .filter(|_| accepts(&strategy.new_tree(&mut runner).unwrap().current()))
        .count()
}

/// The properties above say what holds of what a parser accepts: they prove nothing
/// unless their inputs reach it. Each strategy gets past its parser's checks often.
#[test]
fn the_inputs_reach_what_each_parser_accepts() {
    let counts = [
        (
            "keys",
            accepted(keys(), |raw| IdempotencyKey::parse(raw).is_ok()),
        ),
        ("json", accepted(json(), |raw| canonicalize(raw).is_ok())),
        (
            "records",
            accepted(records(), |raw| Record::decode(raw).is_ok()),
        ),
        (
            "jwks",
            accepted(jwks_inputs(), |raw| JwtKeys::from_jwks(raw).is_ok()),
        ),
        (
            "unambiguous paths",
            accepted(paths(), |raw| !ambiguous_path(&text(raw))),
        ),
    ];
    let line = format!(
        "10 parsers, {} arbitrary inputs each (a panic or a bad round trip fails its test); of 2 000 inputs, accepted: {counts:?}",
        config().cases
    );
    eprintln!("{line}");
    // Beside the integration tests' reports (scripts/test prints them at the end).
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/idem-reports");
    let _ = std::fs::create_dir_all(dir);
    let _ = std::fs::write(format!("{dir}/hostile-input.txt"), format!("{line}\n"));
    for (what, n) in counts {
        assert!(n >= 20, "{what}: only {n} of 2 000 inputs accepted");
    }
    // And what must be refused is not refused for a reason of its own: the same
    // verifier takes a token it signed.
    let verifier = JwtVerifier::new(JwtKeys::Hs256(vec![7; 32]), None, None).unwrap();
    let token = contract::scope::sign_hs256(r#"{"sub":"a","exp":4102444800}"#, &[7; 32]);
    assert!(contract::scope::verify_jwt(token.as_bytes(), &verifier, 1_700_000_000).is_ok());
}
