//! The HTTP contract's decisions that are not about records: which answers are
//! cached, how `Prefer: wait` and `Cache-Control: no-store` are read, and the
//! RFC 9457 problem types that the edge and the origin both return.

use alloc::format;
use alloc::vec::Vec;

/// Request header carrying the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Response header marking a replay.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// Methods guarded by default; every other method passes through untouched.
pub const DEFAULT_METHODS: [&str; 2] = ["POST", "PATCH"];
/// Response headers stored and replayed by default (besides the status and body).
pub const DEFAULT_CACHED_HEADERS: [&str; 5] = [
    "content-type",
    "content-language",
    "content-encoding",
    "location",
    "content-location",
];
/// Media type of problem bodies.
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// What to do with a handler's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Store it and replay it to every retry.
    Store,
    /// Store nothing and free the key, so a retry runs the handler again.
    Release,
}

/// The contract table: 502/503/504 (the upstream failed, nothing happened) and any
/// answer marked `Cache-Control: no-store` (the handler rejected the request before
/// doing anything) release the key; every other answer — 2xx, 4xx, 500 — is the
/// result, because execution began (Stripe's semantics).
pub fn disposition(status: u16, cache_control: Option<&[u8]>) -> Disposition {
    if matches!(status, 502..=504) || cache_control.is_some_and(has_no_store) {
        Disposition::Release
    } else {
        Disposition::Store
    }
}

/// Whether a `Cache-Control` value contains the `no-store` directive.
pub fn has_no_store(cache_control: &[u8]) -> bool {
    cache_control.split(|&b| b == b',').any(|d| {
        let d = trim(d);
        let name = d.split(|&b| b == b'=').next().unwrap_or(d);
        trim(name).eq_ignore_ascii_case(b"no-store")
    })
}

/// The `wait` preference of a `Prefer` header (RFC 7240), in seconds, if present and
/// well-formed. With several `wait` preferences the first wins, as RFC 7240 says.
pub fn prefer_wait(prefer: &[u8]) -> Option<u64> {
    for pref in prefer.split(|&b| b == b',') {
        // A preference may carry parameters after ';' — only its head matters here.
        let head = pref.split(|&b| b == b';').next().unwrap_or(pref);
        let mut kv = head.splitn(2, |&b| b == b'=');
        let name = trim(kv.next().unwrap_or_default());
        if !name.eq_ignore_ascii_case(b"wait") {
            continue;
        }
        let value = trim(kv.next()?);
        let value = value
            .strip_prefix(b"\"")
            .and_then(|v| v.strip_suffix(b"\""))
            .unwrap_or(value);
        if value.is_empty() || value.len() > 9 || !value.iter().all(u8::is_ascii_digit) {
            return None;
        }
        return value
            .iter()
            .try_fold(0u64, |n, d| Some(n * 10 + u64::from(d - b'0')));
    }
    None
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// Every error idem itself produces, each with a stable problem `type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Problem {
    /// 400: the route requires an `Idempotency-Key` and none was sent.
    KeyMissing,
    /// 400: the key is empty, too long, non-ASCII or a bad sf-string.
    KeyMalformed,
    /// 413: the body is larger than the configured limit.
    BodyTooLarge,
    /// 400: the body could not be read.
    BodyUnreadable,
    /// 409: the same request is still running.
    InFlight,
    /// 422: the key was used for a different request.
    Mismatch,
    /// 503: the idempotency store is unreachable; the handler did not run.
    StoreUnavailable,
    /// 500: the handler panicked. Execution began, so this answer is stored.
    HandlerPanicked,
    /// 502: the handler's response broke off mid-body. Nothing is stored; the key is released.
    HandlerFailed,
}

impl Problem {
    /// All problems, for documentation and tests.
    pub const ALL: [Problem; 9] = [
        Problem::KeyMissing,
        Problem::KeyMalformed,
        Problem::BodyTooLarge,
        Problem::BodyUnreadable,
        Problem::InFlight,
        Problem::Mismatch,
        Problem::StoreUnavailable,
        Problem::HandlerPanicked,
        Problem::HandlerFailed,
    ];

    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            Problem::KeyMissing | Problem::KeyMalformed | Problem::BodyUnreadable => 400,
            Problem::BodyTooLarge => 413,
            Problem::InFlight => 409,
            Problem::Mismatch => 422,
            Problem::StoreUnavailable => 503,
            Problem::HandlerPanicked => 500,
            Problem::HandlerFailed => 502,
        }
    }

    /// The stable `type` URI.
    pub fn type_uri(self) -> &'static str {
        match self {
            Problem::KeyMissing => "urn:idem:problem:idempotency-key-missing",
            Problem::KeyMalformed => "urn:idem:problem:idempotency-key-malformed",
            Problem::BodyTooLarge => "urn:idem:problem:body-too-large",
            Problem::BodyUnreadable => "urn:idem:problem:body-unreadable",
            Problem::InFlight => "urn:idem:problem:request-in-flight",
            Problem::Mismatch => "urn:idem:problem:idempotency-key-reused",
            Problem::StoreUnavailable => "urn:idem:problem:store-unavailable",
            Problem::HandlerPanicked => "urn:idem:problem:handler-panicked",
            Problem::HandlerFailed => "urn:idem:problem:handler-failed",
        }
    }

    /// The short human-readable summary.
    pub fn title(self) -> &'static str {
        match self {
            Problem::KeyMissing => "Idempotency-Key header required",
            Problem::KeyMalformed => "Malformed Idempotency-Key header",
            Problem::BodyTooLarge => "Request body too large",
            Problem::BodyUnreadable => "Request body could not be read",
            Problem::InFlight => "A request with this Idempotency-Key is still being processed",
            Problem::Mismatch => "Idempotency-Key reused with a different request",
            Problem::StoreUnavailable => "Idempotency store unavailable",
            Problem::HandlerPanicked => "The request handler failed",
            Problem::HandlerFailed => "The request handler's response broke off",
        }
    }

    /// Whether the answer carries `Retry-After`.
    pub fn retry_after_secs(self) -> Option<u64> {
        match self {
            Problem::InFlight | Problem::StoreUnavailable => Some(1),
            _ => None,
        }
    }

    /// The `application/problem+json` body, with `detail` when given.
    pub fn body(self, detail: Option<&str>) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"{\"type\":");
        crate::json::write_string(self.type_uri().as_bytes(), &mut out);
        out.extend_from_slice(b",\"title\":");
        crate::json::write_string(self.title().as_bytes(), &mut out);
        out.extend_from_slice(format!(",\"status\":{}", self.status()).as_bytes());
        if let Some(detail) = detail {
            out.extend_from_slice(b",\"detail\":");
            crate::json::write_string(detail.as_bytes(), &mut out);
        }
        out.push(b'}');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn contract_table_dispositions() {
        for status in [200, 201, 204, 400, 402, 404, 409, 422, 500] {
            assert_eq!(disposition(status, None), Disposition::Store, "{status}");
        }
        for status in [502, 503, 504] {
            assert_eq!(disposition(status, None), Disposition::Release, "{status}");
        }
        assert_eq!(disposition(400, Some(b"no-store")), Disposition::Release);
        assert_eq!(
            disposition(400, Some(b"private, No-Store ,max-age=0")),
            Disposition::Release
        );
        assert_eq!(disposition(400, Some(b"no-cache")), Disposition::Store);
        assert_eq!(disposition(400, Some(b"no-storey")), Disposition::Store);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn reads_prefer_wait() {
        assert_eq!(prefer_wait(b"wait=5"), Some(5));
        assert_eq!(prefer_wait(b"respond-async, Wait = 10"), Some(10));
        assert_eq!(
            prefer_wait(b"handling=lenient; x=1, wait=\"3\"; y"),
            Some(3)
        );
        assert_eq!(prefer_wait(b"wait=5, wait=9"), Some(5));
        assert_eq!(prefer_wait(b"wait"), None);
        assert_eq!(prefer_wait(b"wait=-1"), None);
        assert_eq!(prefer_wait(b"wait=99999999999999999999"), None);
        assert_eq!(prefer_wait(b"return=minimal"), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn problem_bodies_are_json() {
        for p in Problem::ALL {
            let body = p.body(Some("say \"hi\"\n"));
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["status"], p.status());
            assert_eq!(v["type"], p.type_uri());
            assert_eq!(v["detail"], "say \"hi\"\n");
        }
    }
}
