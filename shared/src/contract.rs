//! The HTTP contract's decisions that are not about records: which answers are
//! cached, how `Prefer: wait` and the origin's disposition header are read, and the
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

/// Response header by which the origin tells the edge what it did with an answer
/// (the edge strips it): `stored; expires=<ms since the epoch>` when the answer is
/// the key's stored result until that instant, `released` when the key was freed,
/// `pending` when the answer is the result but its record is not written yet.
pub const ORIGIN_DISPOSITION: &str = "idem-disposition";

/// What the origin said about an answer, read from [`ORIGIN_DISPOSITION`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OriginDisposition {
    /// The answer is stored at the origin until this instant.
    Stored {
        /// When the origin's record expires.
        expires_at: crate::Millis,
    },
    /// The origin freed the key; nothing is stored.
    Released,
    /// The answer is the result, but its record was not written yet.
    Pending,
}

impl OriginDisposition {
    /// The header value.
    pub fn header_value(self) -> alloc::string::String {
        match self {
            OriginDisposition::Stored { expires_at } => format!("stored; expires={expires_at}"),
            OriginDisposition::Released => "released".into(),
            OriginDisposition::Pending => "pending".into(),
        }
    }

    /// Parses a header value; `None` for anything else (an answer that did not come
    /// from an idem origin, or a damaged value: the edge then stores nothing).
    pub fn parse(value: &[u8]) -> Option<OriginDisposition> {
        let value = trim(value);
        match value {
            b"released" => return Some(OriginDisposition::Released),
            b"pending" => return Some(OriginDisposition::Pending),
            _ => {}
        }
        let rest = value.strip_prefix(b"stored;")?;
        let digits = trim(rest).strip_prefix(b"expires=")?;
        if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let expires_at = digits.iter().try_fold(0u64, |n, d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })?;
        Some(OriginDisposition::Stored { expires_at })
    }
}

/// How long the edge keeps an answer, given what the origin said about it and the
/// edge's clock: only an answer the origin stored, only until the origin's record
/// expires (a refill from a late replay never outlives it). `None`: keep nothing.
pub fn edge_ttl_ms(origin: Option<OriginDisposition>, now: crate::Millis) -> Option<u64> {
    match origin? {
        OriginDisposition::Stored { expires_at } if expires_at > now => Some(expires_at - now),
        _ => None,
    }
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
    /// 502: the handler's response broke off mid-body, or it ran past the maximum
    /// execution time. Execution began and its outcome is unknown: this answer is
    /// stored, and the request is never silently run again.
    HandlerFailed,
    /// 500: the request ran and its answer was delivered to the first attempt, but it
    /// was too large to keep for replay. Stored in its place, so the key stays used.
    ResponseNotStored,
    /// 409: this attempt lost its claim to a newer attempt (its lease ran out while it
    /// was paused or cut off) and its transaction was rolled back: nothing it did
    /// happened. Never stored; a retry gets the request's result.
    Fenced,
}

impl Problem {
    /// All problems, for documentation and tests.
    pub const ALL: [Problem; 11] = [
        Problem::KeyMissing,
        Problem::KeyMalformed,
        Problem::BodyTooLarge,
        Problem::BodyUnreadable,
        Problem::InFlight,
        Problem::Mismatch,
        Problem::StoreUnavailable,
        Problem::HandlerPanicked,
        Problem::HandlerFailed,
        Problem::ResponseNotStored,
        Problem::Fenced,
    ];

    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            Problem::KeyMissing | Problem::KeyMalformed | Problem::BodyUnreadable => 400,
            Problem::BodyTooLarge => 413,
            Problem::InFlight | Problem::Fenced => 409,
            Problem::Mismatch => 422,
            Problem::StoreUnavailable => 503,
            Problem::HandlerPanicked => 500,
            Problem::HandlerFailed => 502,
            Problem::ResponseNotStored => 500,
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
            Problem::ResponseNotStored => "urn:idem:problem:response-not-stored",
            Problem::Fenced => "urn:idem:problem:fenced",
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
            Problem::HandlerFailed => "The request handler's outcome is unknown",
            Problem::ResponseNotStored => "The answer was too large to keep for replay",
            Problem::Fenced => {
                "This attempt lost its claim to a newer one; nothing it did was kept"
            }
        }
    }

    /// Whether the answer carries `Retry-After`.
    pub fn retry_after_secs(self) -> Option<u64> {
        match self {
            Problem::InFlight | Problem::StoreUnavailable | Problem::Fenced => Some(1),
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
        // Only the private signal releases; statuses and headers are never read.
        assert_eq!(disposition(false), Disposition::Store);
        assert_eq!(disposition(true), Disposition::Release);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_edge_keeps_only_what_the_origin_stored_until_it_expires() {
        let stored = |expires_at| Some(OriginDisposition::Stored { expires_at });
        assert_eq!(edge_ttl_ms(stored(1_500), 1_000), Some(500));
        assert_eq!(
            edge_ttl_ms(stored(1_000), 1_000),
            None,
            "expired at the edge"
        );
        assert_eq!(edge_ttl_ms(stored(900), 1_000), None);
        assert_eq!(edge_ttl_ms(Some(OriginDisposition::Released), 0), None);
        assert_eq!(edge_ttl_ms(Some(OriginDisposition::Pending), 0), None);
        assert_eq!(edge_ttl_ms(None, 0), None, "not an idem origin's answer");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn origin_disposition_round_trips_and_refuses_junk() {
        for d in [
            OriginDisposition::Stored { expires_at: 0 },
            OriginDisposition::Stored {
                expires_at: 1_764_000_000_123,
            },
            OriginDisposition::Stored {
                expires_at: u64::MAX,
            },
            OriginDisposition::Released,
            OriginDisposition::Pending,
        ] {
            assert_eq!(
                OriginDisposition::parse(d.header_value().as_bytes()),
                Some(d)
            );
        }
        assert_eq!(
            OriginDisposition::parse(b" stored;expires=5 "),
            Some(OriginDisposition::Stored { expires_at: 5 })
        );
        for junk in [
            &b""[..],
            b"stored",
            b"stored; expires=",
            b"stored; expires=-1",
            b"stored; expires=18446744073709551616",
            b"stored; expires=1e9",
            b"Stored; expires=1",
            b"no-store",
        ] {
            assert_eq!(OriginDisposition::parse(junk), None, "{junk:?}");
        }
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
