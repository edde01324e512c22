//! The HTTP contract on plain values: every decision the edge and the origin both
//! make about a request and its answer, so that they make it once, here.
//!
//! * [`path`] — which route a path selects, however it is spelled.
//! * [`request`] — which requests are guarded, the key, the body limit, the fingerprint.
//! * [`wait`] — `Prefer: wait` and the schedule of polls while another attempt runs.
//! * [`answer`] — what is stored of an answer, what a replay carries, and the origin's
//!   disposition header that tells the edge what it may keep.
//! * [`problem`] — the RFC 9457 problems idem answers with: types, titles, details.
//! * [`scope`] — who a key belongs to: the `Authorization` value, a header, or a claim
//!   of a verified JWT.
//!
//! The runtimes only move bytes: the origin's tower layer and the edge's worker read
//! their requests into these values and write these answers out.

use crate::InvalidSetting;
use alloc::format;
use alloc::string::String;

pub mod answer;
pub mod cors;
pub mod jwt;
pub mod path;
pub mod problem;
pub mod release;
pub mod request;
pub mod scope;
pub mod wait;

pub use answer::{
    edge_keeps, edge_kept_headers, edge_may_scope_by_header, edge_sends_request_header,
    edge_ttl_ms, execution_trace, fetch_can_send_status, forgeable, forwarded_headers,
    forwarded_request_header, key_ttl, relayed_answer_header, relayed_answer_headers,
    replay_headers, stored_header_names, stored_headers, stored_headers_of, visible_headers,
    NotKept, OriginDisposition,
};
pub use cors::{check_replay_header, Cors};
pub use jwt::{JwtKeys, JwtVerifier};
pub use path::{
    ambiguous_path, check_pattern, choose_route, listed, normal_path, PathChoice, PathPattern,
};
pub use problem::{check_problem_base, Problem, Rejection, DEFAULT_PROBLEM_BASE};
pub use release::{ReleaseOn, PROXY_DEFAULT_RELEASE};
pub use request::{
    check_declared_length, fingerprint, fingerprint_message, guards, guards_request, route,
    route_by_key_headers, KeyHeaders, Route, METHOD_OVERRIDE_HEADERS,
};
pub use scope::{Anonymous, ScopeRule, ScopeSource};
pub use wait::{prefer_wait, wait_applied, wait_ms, wait_ms_or, Waiting, PREFERENCE_APPLIED};

/// Request header carrying the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Response header marking a replay.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// Response header advertising how long the key stays bound to its request: the whole
/// seconds left until its record expires ([`key_ttl`]). On every answer whose record is
/// stored — the first, once written, and each replay — so a client knows until when a
/// retry is safe, and after when the key is free again. (The name follows the IETF
/// httpapi working group's discussion of the Idempotency-Key draft; the draft itself
/// does not define one yet.)
pub const KEY_TTL: &str = "idempotency-ttl";
/// Methods guarded by default; every other method passes through untouched.
pub const DEFAULT_METHODS: [&str; 2] = ["POST", "PATCH"];
/// Response headers stored and replayed by default (besides the status and body): what
/// the body is and where it lives, and what the API tells browsers and caches to do
/// with it — a replay without the first answer's `Cache-Control: no-store` or
/// `X-Content-Type-Options: nosniff` would be cached or sniffed where the first was not.
pub const DEFAULT_CACHED_HEADERS: [&str; 13] = [
    "content-type",
    "content-language",
    "content-encoding",
    "location",
    "content-location",
    "cache-control",
    "pragma",
    "expires",
    "x-content-type-options",
    "content-security-policy",
    "strict-transport-security",
    "referrer-policy",
    "x-frame-options",
];
/// Media type of problem bodies.
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";
/// Request header by which proxy mode tells its upstream the claim's fencing token
/// (it grows with every claim of a key: an upstream can refuse a write whose token is
/// below one it has seen). Never taken from the client.
pub const FENCING_TOKEN: &str = "idem-fencing-token";
/// Request header by which proxy mode tells its upstream a key of its own for the
/// request ([`crate::RecordKey::downstream_key`]): the same for every attempt at one
/// request, different per scope and key. Never taken from the client.
pub const DOWNSTREAM_KEY: &str = "idem-downstream-key";
/// Request header by which the edge proves to the origin that it is the edge: the
/// secret both were given (the origin's `--edge-secret-file`, the edge's `EDGE_SECRET`).
/// Only to a request that carries it does the origin tell what it stored
/// ([`ORIGIN_DISPOSITION`], [`STORED_HEADERS`]); a client never sees those headers. The
/// edge never forwards a client's, and the origin removes it before the handler (or the
/// upstream) gets the request.
pub const EDGE_SECRET: &str = "idem-edge-secret";
/// The fewest bytes an edge secret may have ([`check_edge_secret`]).
pub const MIN_EDGE_SECRET_BYTES: usize = 16;

/// Whether `secret` may be the edge's: long enough not to be guessed, and sendable as a
/// header value (visible ASCII, no spaces at either end).
pub fn check_edge_secret(secret: &[u8]) -> Result<(), InvalidSetting> {
    if secret.len() < MIN_EDGE_SECRET_BYTES {
        return Err(InvalidSetting::from(format!(
            "the edge secret is {} bytes; it needs at least {MIN_EDGE_SECRET_BYTES} \
             (e.g. `openssl rand -hex 32`)",
            secret.len()
        )));
    }
    if !secret.iter().all(|b| b.is_ascii_graphic()) {
        return Err(InvalidSetting::from(String::from(
            "the edge secret must be visible ASCII without spaces (it is sent as a header \
             value; e.g. `openssl rand -hex 32`)",
        )));
    }
    Ok(())
}

/// Whether a request's [`EDGE_SECRET`] values are exactly one, equal to `secret`: then
/// it came from the edge. Compared in time independent of where the bytes differ.
pub fn from_edge<'a>(secret: &[u8], mut sent: impl Iterator<Item = &'a [u8]>) -> bool {
    let (Some(value), None) = (sent.next(), sent.next()) else {
        return false;
    };
    value.len() == secret.len()
        && value
            .iter()
            .zip(secret)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

/// Response header by which the origin tells the edge what it did with an answer
/// (the edge strips it): see [`OriginDisposition`].
pub const ORIGIN_DISPOSITION: &str = "idem-disposition";
/// Response header by which the origin tells the edge which of a stored answer's
/// headers it stored (the edge strips it), so that the edge keeps the same ones
/// ([`stored_header_names`], [`edge_kept_headers`]): `Set-Cookie` with
/// `--replay-set-cookie`, a library user's own list.
pub const STORED_HEADERS: &str = "idem-stored-headers";
/// A header idem stores with an answer, never sent: the W3C `traceparent` of the
/// execution that produced it, so that a replay's trace can link to it
/// ([`execution_trace`]). Replays and stored answers leave it out ([`visible_headers`]).
pub const EXECUTION_TRACE: &str = "idem-execution-trace";

/// What to do with a handler's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Store it and replay it to every retry.
    Store,
    /// Store nothing and free the key, so a retry runs the handler again.
    Release,
}

/// The contract's release rule: once the handler started, its answer is the result,
/// whatever its headers (Stripe's semantics) — unless the handler said "nothing
/// happened" through idem's private release signal, which only it can send and which
/// idem strips before the client sees it, or its status is one the route names as
/// "nothing happened" (`release_on`: client errors only, [`ReleaseOn`]). Nothing is
/// inferred from standard headers or from a 5xx: security middleware stamps
/// `Cache-Control: no-store` on every answer, and a 503 or 504 can follow a committed
/// effect.
pub fn disposition(release_signalled: bool, status: u16, release_on: ReleaseOn) -> Disposition {
    if release_signalled || release_on.contains(status) {
        Disposition::Release
    } else {
        Disposition::Store
    }
}

/// Whether `name` is an HTTP token (RFC 9110 §5.6.2), as a header name must be.
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// `s` without leading and trailing spaces and tabs (HTTP's optional whitespace).
pub(crate) fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// A run of 1 to `max_digits` ASCII digits as a number; `None` for anything else.
pub(crate) fn parse_digits(digits: &[u8], max_digits: usize) -> Option<u64> {
    if digits.is_empty() || digits.len() > max_digits || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found untested by cargo-mutants (docs/mutants.md).
    #[wasm_bindgen_test::wasm_bindgen_test(unsupported = test)]
    fn digits_are_one_to_max_ascii_digits() {
        assert_eq!(parse_digits(b"", 5), None);
        assert_eq!(parse_digits(b"12345", 5), Some(12_345));
        assert_eq!(parse_digits(b"123456", 5), None);
        assert_eq!(parse_digits(b"12a", 5), None);
    }
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn contract_table_dispositions() {
        // The private signal releases; a status only when the route names it.
        let none = ReleaseOn::NONE;
        let proxy = ReleaseOn::proxy_default();
        assert_eq!(disposition(false, 400, none), Disposition::Store);
        assert_eq!(disposition(true, 201, none), Disposition::Release);
        assert_eq!(disposition(false, 400, proxy), Disposition::Release);
        assert_eq!(disposition(false, 429, proxy), Disposition::Release);
        for stored in [200, 201, 302, 404, 409, 500, 502, 503, 504] {
            assert_eq!(
                disposition(false, stored, proxy),
                Disposition::Store,
                "{stored}"
            );
        }
    }
}

#[cfg(test)]
mod edge_secret_tests {
    use super::*;

    #[test]
    fn only_the_one_secret_value_is_the_edge() {
        let secret = b"0123456789abcdef0123";
        let sent = |values: &[&'static [u8]]| from_edge(secret, values.iter().copied());
        assert!(sent(&[b"0123456789abcdef0123"]));
        assert!(!sent(&[]));
        assert!(!sent(&[b"0123456789abcdef012"]), "a prefix");
        assert!(!sent(&[b"0123456789abcdef01234"]), "longer");
        assert!(!sent(&[b"0123456789abcdef0124"]), "the last byte");
        assert!(!sent(&[b"1123456789abcdef0123"]), "the first byte");
        // Two values: which one would a server read? Neither.
        assert!(!sent(&[b"0123456789abcdef0123", b"0123456789abcdef0123"]));
        assert!(!sent(&[b"x", b"0123456789abcdef0123"]));
    }

    #[test]
    fn a_secret_is_long_and_sendable() {
        assert!(check_edge_secret(b"0123456789abcdef").is_ok());
        let short = alloc::string::String::from(check_edge_secret(b"hunter2").unwrap_err());
        assert!(short.contains("7 bytes"), "{short}");
        assert!(check_edge_secret(b"0123456789abcdef\n").is_err());
        assert!(check_edge_secret(b"0123456789 abcdef").is_err());
        assert!(check_edge_secret("0123456789abcdéf".as_bytes()).is_err());
    }
}
