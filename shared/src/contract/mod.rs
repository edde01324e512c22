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

pub mod answer;
pub mod jwt;
pub mod path;
pub mod problem;
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
pub use jwt::{JwtKeys, JwtVerifier};
pub use path::{
    ambiguous_path, check_pattern, choose_route, listed, normal_path, PathChoice, PathPattern,
};
pub use problem::{Problem, Rejection};
pub use request::{
    check_declared_length, fingerprint, fingerprint_message, guards, guards_request, route, Route,
    METHOD_OVERRIDE_HEADERS,
};
pub use scope::{Anonymous, ScopeRule, ScopeSource};
pub use wait::{prefer_wait, wait_ms, wait_ms_or, Waiting};

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
/// whatever its status or headers (Stripe's semantics) — unless the handler said
/// "nothing happened" through idem's private release signal, which only it can send
/// and which idem strips before the client sees it. Nothing is inferred from standard
/// headers or statuses: security middleware stamps `Cache-Control: no-store` on
/// every answer, and a 503 or 504 can follow a committed effect.
pub fn disposition(release_signalled: bool) -> Disposition {
    if release_signalled {
        Disposition::Release
    } else {
        Disposition::Store
    }
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
        // Only the private signal releases; statuses and headers are never read.
        assert_eq!(disposition(false), Disposition::Store);
        assert_eq!(disposition(true), Disposition::Release);
    }
}
