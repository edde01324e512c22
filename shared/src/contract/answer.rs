//! What becomes of an answer: what is stored of it, what a replay carries, which
//! headers pass between client, edge and origin, and what the origin tells the edge
//! it may keep.

use super::{trim_ows, EXECUTION_TRACE, IDEMPOTENT_REPLAYED};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// The headers stored with an answer: those named in `cached` (lower-case names), in
/// that order, each with all its values in the order the answer carried them.
/// `values_of(name, push)` pushes every value the answer has for `name`, compared
/// case-insensitively.
pub fn stored_headers<F>(cached: &[impl AsRef<str>], mut values_of: F) -> Vec<(String, Vec<u8>)>
where
    F: FnMut(&str, &mut dyn FnMut(&[u8])),
{
    let mut out = Vec::new();
    for name in cached {
        let name = name.as_ref();
        values_of(name, &mut |value| {
            out.push((name.to_ascii_lowercase(), value.to_vec()))
        });
    }
    out
}

/// [`stored_headers`] over a list of (name, value) pairs.
pub fn stored_headers_of<'a, I>(cached: &[impl AsRef<str>], headers: I) -> Vec<(String, Vec<u8>)>
where
    I: IntoIterator<Item = (&'a str, &'a [u8])> + Clone,
{
    stored_headers(cached, |name, push| {
        for (n, v) in headers.clone() {
            if n.eq_ignore_ascii_case(name) {
                push(v)
            }
        }
    })
}

/// The stored headers ([`crate::StoredResponse::headers`]) a client is sent, in their
/// order: all but idem's private ones ([`super::EXECUTION_TRACE`]).
pub fn visible_headers(stored: &[(String, Vec<u8>)]) -> impl Iterator<Item = (&str, &[u8])> {
    stored
        .iter()
        .filter(|(n, _)| !n.eq_ignore_ascii_case(EXECUTION_TRACE))
        .map(|(n, v)| (n.as_str(), v.as_slice()))
}

/// The headers of a replay: the stored ones a client sees ([`visible_headers`]), in their
/// order, then `Idempotent-Replayed: true`.
pub fn replay_headers(stored: &[(String, Vec<u8>)]) -> impl Iterator<Item = (&str, &[u8])> {
    visible_headers(stored)
        .filter(|(n, _)| !n.eq_ignore_ascii_case(IDEMPOTENT_REPLAYED))
        .chain(core::iter::once((IDEMPOTENT_REPLAYED, &b"true"[..])))
}

/// The `traceparent` of the execution that produced a stored answer, if it was traced
/// ([`super::EXECUTION_TRACE`]).
pub fn execution_trace(stored: &[(String, Vec<u8>)]) -> Option<&[u8]> {
    stored
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(EXECUTION_TRACE))
        .map(|(_, v)| v.as_slice())
}

/// The [`super::KEY_TTL`] value of an answer whose record expires at `expires_at`, read
/// at `now` on the clock that wrote or read the record: the whole seconds left, rounded
/// down; `None` once it has expired (no promise to make).
pub fn key_ttl(expires_at: crate::Millis, now: crate::Millis) -> Option<alloc::string::String> {
    (expires_at > now).then(|| format!("{}", (expires_at - now) / 1000))
}

/// Whether a runtime building answers with the Fetch standard's `Response` (the edge's)
/// can send an answer of `status`: 200–599. HTTP's final statuses are 200–599 (RFC 9110
/// §15 allows 100–599, 1xx being interim); `Response` throws on anything else, where
/// hyper, the origin's server, sends any three digits.
pub fn fetch_can_send_status(status: u16) -> bool {
    (200..=599).contains(&status)
}

/// Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection, never the
/// message, and are not passed on.
fn hop_by_hop(name: &str) -> bool {
    [
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "transfer-encoding",
        "upgrade",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

/// Whether a client's request header is passed on to the origin: not hop-by-hop, not
/// one the runtime sets itself (`Host`, `Content-Length`, idem's fencing token,
/// downstream key and edge secret), and not one a CDN stamps — a client could forge those.
pub fn forwarded_request_header(name: &str) -> bool {
    const SET_BY_THE_RUNTIME: [&str; 13] = [
        super::FENCING_TOKEN,
        super::EDGE_SECRET,
        super::DOWNSTREAM_KEY,
        "host",
        "content-length",
        "cf-connecting-ip",
        "cf-ray",
        "cf-visitor",
        "cf-ew-via",
        "cf-worker",
        "cdn-loop",
        "x-forwarded-proto",
        "x-real-ip",
    ];
    !hop_by_hop(name)
        && !SET_BY_THE_RUNTIME
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h))
}

/// The header names a message's `Connection` header lists: hop-by-hop for that
/// message too (RFC 9110 §7.6.1), lower-cased.
fn connection_named<N: AsRef<str>, V: AsRef<str>>(headers: &[(N, V)]) -> Vec<String> {
    headers
        .iter()
        .filter(|(n, _)| n.as_ref().eq_ignore_ascii_case("connection"))
        .flat_map(|(_, v)| v.as_ref().split(','))
        .map(|token| token.trim().to_ascii_lowercase())
        .filter(|token| !token.is_empty())
        .collect()
}

/// Request headers a client could send to pass for the CDN or a proxy in front of the
/// origin: they are dropped, and the edge sets its own. (Other `cf-*` headers — Access
/// tokens, Turnstile responses — are the client's and pass.) Scoped by one of them, a
/// client names any scope it likes — another tenant's — unless a proxy in front sets
/// the header and drops the client's: the origin refuses them as scope headers unless
/// told one does (`--trusted-proxy`).
pub fn forgeable(name: &str) -> bool {
    // Every X-Forwarded-* (-For, -Host, -Proto, -Port, -Prefix, -Server…); by bytes,
    // so a name that is not ASCII can't split a character.
    let prefix = b"x-forwarded-";
    let x_forwarded = name
        .as_bytes()
        .get(..prefix.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(prefix));
    x_forwarded
        || [
            "x-real-ip",
            "x-client-ip",
            "forwarded",
            "true-client-ip",
            "cf-connecting-ipv6",
            "cf-pseudo-ipv4",
            "cf-ipcountry",
        ]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
}

/// Whether the edge sends the origin a request header of this name (a client's it
/// passes on, or one it sets: `X-Forwarded-For`, `-Host`, `-Proto`), so that the origin
/// reads it as [`forwarded_headers`] makes it. (A header named in the client's
/// `Connection` is dropped too, for that request.)
pub fn edge_sends_request_header(name: &str) -> bool {
    ["x-forwarded-for", "x-forwarded-host", "x-forwarded-proto"]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
        || (forwarded_request_header(name) && !forgeable(name))
}

/// Whether the edge may scope keys by this request header (`SCOPE_FROM=header:<name>`):
/// one it sends the origin, so that both read the same value, or the runtime's
/// `CF-Connecting-IP`, the client address the CDN stamps. Any other header the edge
/// drops is one a client can forge (`X-Real-IP`, `Forwarded`, `X-Forwarded-Port`…):
/// scoped by it, a client could name another client's scope, and the origin, which
/// never gets it, could not check it.
pub fn edge_may_scope_by_header(name: &str) -> bool {
    edge_sends_request_header(name) || name.eq_ignore_ascii_case("cf-connecting-ip")
}

/// The request headers the edge sends the origin: the client's, less those that are
/// hop-by-hop (or named in its `Connection`), set by the runtime, or forgeable
/// (`cf-*`, `X-Forwarded-*`, `Forwarded`); then `X-Forwarded-For` with the client
/// address the runtime saw (`client_ip`), `X-Forwarded-Host` with the `Host` the
/// client asked for, and `X-Forwarded-Proto` with the scheme it used. (Names and
/// values are read as text of any kind: a caller passes borrowed ones.)
pub fn forwarded_headers<N: AsRef<str>, V: AsRef<str>>(
    headers: &[(N, V)],
    client_ip: Option<&str>,
    proto: &str,
) -> Vec<(String, String)> {
    let named = connection_named(headers);
    let host = headers
        .iter()
        .find(|(n, _)| n.as_ref().eq_ignore_ascii_case("host"))
        .map(|(_, v)| String::from(v.as_ref()));
    let mut out: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.as_ref(), v.as_ref()))
        .filter(|(n, _)| {
            forwarded_request_header(n)
                && !forgeable(n)
                && !named.iter().any(|c| n.eq_ignore_ascii_case(c))
        })
        .map(|(n, v)| (String::from(n), String::from(v)))
        .collect();
    // One address, or none: never a list, never a name.
    let ip = client_ip
        .map(str::trim)
        .filter(|ip| ip.parse::<core::net::IpAddr>().is_ok());
    if let Some(ip) = ip {
        out.push(("x-forwarded-for".into(), ip.into()));
    }
    if let Some(host) = host {
        out.push(("x-forwarded-host".into(), host));
    }
    out.push(("x-forwarded-proto".into(), proto.into()));
    out
}

/// The headers of the origin's answer to a `method` request that the client gets
/// ([`relayed_answer_header`], and not one its `Connection` names). The answer to HEAD
/// keeps its `Content-Length`: it has no body for the runtime to count, and the
/// header is what the client asked for.
pub fn relayed_answer_headers<N: AsRef<str>, V: AsRef<str>>(
    method: &str,
    headers: &[(N, V)],
) -> Vec<(String, String)> {
    let named = connection_named(headers);
    // Methods are case-sensitive (RFC 9110): `head` is not HEAD.
    let head = method == "HEAD";
    headers
        .iter()
        .map(|(n, v)| (n.as_ref(), v.as_ref()))
        .filter(|(n, _)| {
            (relayed_answer_header(n) || (head && n.eq_ignore_ascii_case("content-length")))
                && !named.iter().any(|c| n.eq_ignore_ascii_case(c))
        })
        .map(|(n, v)| (String::from(n), String::from(v)))
        .collect()
}

/// Whether a header of the origin's answer is passed on to the client: not
/// hop-by-hop, not `Content-Length` (the runtime frames the body), and not the
/// origin's disposition or stored-header list, which are for the edge alone.
pub fn relayed_answer_header(name: &str) -> bool {
    !hop_by_hop(name)
        && !name.eq_ignore_ascii_case("content-length")
        && !name.eq_ignore_ascii_case(super::ORIGIN_DISPOSITION)
        && !name.eq_ignore_ascii_case(super::STORED_HEADERS)
}

/// The origin's [`super::STORED_HEADERS`] value for a stored answer: the names of the
/// headers it stored that a client sees, lower-case, each once, comma-separated.
pub fn stored_header_names(stored: &[(String, Vec<u8>)]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for (name, _) in visible_headers(stored) {
        if !names.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            names.push(name);
        }
    }
    names.join(",").to_ascii_lowercase()
}

/// The most names the edge takes from [`super::STORED_HEADERS`].
const MAX_STORED_HEADER_NAMES: usize = 64;

/// Which headers of the origin's answer the edge keeps with its copy: those the origin
/// says it stored ([`super::STORED_HEADERS`]), or, when it says nothing (an origin
/// older than the header), [`super::DEFAULT_CACHED_HEADERS`]. `None` for a damaged
/// list: the edge then keeps nothing, and the origin answers the retries.
pub fn edge_kept_headers(value: Option<&[u8]>) -> Option<Vec<String>> {
    let Some(value) = value else {
        return Some(
            super::DEFAULT_CACHED_HEADERS
                .iter()
                .map(|h| String::from(*h))
                .collect(),
        );
    };
    let text = core::str::from_utf8(value).ok()?;
    let mut names = Vec::new();
    for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let token = super::is_header_name(name);
        if !token || names.len() == MAX_STORED_HEADER_NAMES {
            return None;
        }
        // Never one the edge must not replay, whatever the list says.
        if relayed_answer_header(name)
            && !name.eq_ignore_ascii_case(EXECUTION_TRACE)
            && !name.eq_ignore_ascii_case(IDEMPOTENT_REPLAYED)
        {
            names.push(name.to_ascii_lowercase());
        }
    }
    Some(names)
}

/// What the origin said about an answer, read from [`ORIGIN_DISPOSITION`](super::ORIGIN_DISPOSITION).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OriginDisposition {
    /// The answer is stored at the origin, in the record `record` names, until
    /// `expires_at`.
    Stored {
        /// When the origin's record expires.
        expires_at: crate::Millis,
        /// Which record holds it ([`crate::RecordKey::tag`]).
        record: crate::RecordTag,
        /// The fingerprint the origin stored it under — under its route's rule
        /// ([`crate::FingerprintRule`]). Said to the edge on every stored answer; `None`
        /// only within the origin, before it is said.
        fingerprint: Option<crate::Fingerprint>,
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
            OriginDisposition::Stored {
                expires_at,
                record,
                fingerprint,
            } => {
                let mut value = format!("stored; expires={expires_at}; record={}", record.to_hex());
                if let Some(fingerprint) = fingerprint {
                    value.push_str("; fingerprint=");
                    value.push_str(&fingerprint.to_hex());
                }
                value
            }
            OriginDisposition::Released => "released".into(),
            OriginDisposition::Pending => "pending".into(),
        }
    }

    /// Parses a header value; `None` for anything else (an answer that did not come
    /// from an idem origin, an older origin's `stored` that names no record, or a
    /// damaged value: the edge then stores nothing).
    pub fn parse(value: &[u8]) -> Option<OriginDisposition> {
        let value = trim_ows(value);
        match value {
            b"released" => return Some(OriginDisposition::Released),
            b"pending" => return Some(OriginDisposition::Pending),
            _ => {}
        }
        let mut params = value.strip_prefix(b"stored;")?.split(|b| *b == b';');
        let digits = trim_ows(params.next()?).strip_prefix(b"expires=")?;
        let expires_at = super::parse_digits(digits, 20)?;
        let tag = trim_ows(params.next()?).strip_prefix(b"record=")?;
        let record = crate::RecordTag::parse(tag)?;
        let fingerprint = match params.next() {
            None => None,
            Some(param) => Some(crate::Fingerprint::from_hex(
                trim_ows(param).strip_prefix(b"fingerprint=")?,
            )?),
        };
        if params.next().is_some() {
            return None;
        }
        Some(OriginDisposition::Stored {
            expires_at,
            record,
            fingerprint,
        })
    }
}

/// Why a cache in front of the origin keeps nothing of an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotKept {
    /// The origin did not say it stored the answer (released, pending, not an idem
    /// origin's answer).
    NotStored,
    /// The origin stored it under another record than the cache's own: the two name
    /// callers differently (their scope rules differ). Kept, the answer would be
    /// replayed to whoever the cache puts in the same record — another tenant,
    /// perhaps; not kept, the cache is only slower.
    OtherRecord,
    /// The origin stored it under another fingerprint than the cache's own (its route
    /// fingerprints part of the body, or headers, and the cache the whole body), or
    /// did not say under which: kept, the cache would refuse with `422` the retries the
    /// origin replays to.
    OtherFingerprint,
}

/// Until when a cache in front of the origin (the edge) may keep an answer it claimed
/// under the record tagged `own` ([`super::KeyHeaders::record_tag`] of its record key
/// and key headers) with `own_fingerprint`: only one the origin stored in the same
/// record, read from the same headers ([`OriginDisposition::Stored`]'s `record`), under
/// the same fingerprint, until the origin's record expires.
pub fn edge_keeps(
    origin: Option<OriginDisposition>,
    own: crate::RecordTag,
    own_fingerprint: &crate::Fingerprint,
) -> Result<crate::Millis, NotKept> {
    match origin {
        Some(OriginDisposition::Stored { record, .. }) if record != own => {
            Err(NotKept::OtherRecord)
        }
        Some(OriginDisposition::Stored {
            expires_at,
            fingerprint: Some(fingerprint),
            ..
        }) if fingerprint == *own_fingerprint => Ok(expires_at),
        Some(OriginDisposition::Stored { .. }) => Err(NotKept::OtherFingerprint),
        _ => Err(NotKept::NotStored),
    }
}

/// How long the edge keeps an answer the origin stored until `stored_until`, given the
/// clock of whoever writes the copy: only until the origin's record expires (a refill
/// from a late replay never outlives it), and never longer than `max_ttl_ms`. `None`:
/// keep nothing.
pub fn edge_ttl_ms(
    stored_until: Option<crate::Millis>,
    now: crate::Millis,
    max_ttl_ms: u64,
) -> Option<u64> {
    match stored_until? {
        expires_at if expires_at > now => Some((expires_at - now).min(max_ttl_ms)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoredResponse;
    use alloc::vec;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// Found untested in the core by cargo-mutants (docs/mutants.md): which statuses a
    /// Fetch `Response` can carry, which headers the edge sends on, and which it may
    /// scope by.
    #[wasm_bindgen_test(unsupported = test)]
    fn what_the_edge_can_send_and_scope_by() {
        assert!(!fetch_can_send_status(199) && !fetch_can_send_status(600));
        assert!(fetch_can_send_status(200) && fetch_can_send_status(599));
        for sent in [
            "X-Forwarded-For",
            "x-forwarded-host",
            "X-FORWARDED-PROTO",
            "content-type",
            "authorization",
            "x-api-key",
        ] {
            assert!(edge_sends_request_header(sent), "{sent}");
            assert!(edge_may_scope_by_header(sent), "{sent}");
        }
        for dropped in [
            "connection",
            "x-real-ip",
            "forwarded",
            "cf-ray",
            "x-forwarded-port",
        ] {
            assert!(!edge_sends_request_header(dropped), "{dropped}");
            assert!(!edge_may_scope_by_header(dropped), "{dropped}");
        }
        assert!(!edge_sends_request_header("cf-connecting-ip"));
        assert!(edge_may_scope_by_header("CF-Connecting-IP"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_key_ttl_is_the_whole_seconds_left() {
        assert_eq!(key_ttl(86_400_000, 0).as_deref(), Some("86400"));
        assert_eq!(key_ttl(10_999, 1_000).as_deref(), Some("9"));
        assert_eq!(key_ttl(1_500, 1_000).as_deref(), Some("0"));
        assert_eq!(key_ttl(1_000, 1_000), None);
        assert_eq!(key_ttl(0, 1_000), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_edge_keeps_the_headers_the_origin_says_it_stored() {
        let stored: Vec<(String, Vec<u8>)> = vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("set-cookie".into(), b"a=1".to_vec()),
            ("Set-Cookie".into(), b"b=2".to_vec()),
            (EXECUTION_TRACE.into(), b"00-ab-cd-01".to_vec()),
        ];
        let said = stored_header_names(&stored);
        assert_eq!(said, "content-type,set-cookie");
        assert_eq!(
            edge_kept_headers(Some(said.as_bytes())).unwrap(),
            ["content-type", "set-cookie"]
        );
        // An origin that says nothing: the default list.
        assert_eq!(
            edge_kept_headers(None).unwrap(),
            super::super::DEFAULT_CACHED_HEADERS
        );
        // Nothing stored: nothing kept.
        assert!(edge_kept_headers(Some(b"")).unwrap().is_empty());
        // Never framing, hop-by-hop or idem's own, whatever the list says.
        assert_eq!(
            edge_kept_headers(Some(
                b"Location, content-length, connection, idem-disposition, idem-execution-trace, idempotent-replayed"
            ))
            .unwrap(),
            ["location"]
        );
        // Damaged: keep nothing.
        for bad in [&b"content type"[..], b"a,\xff", b"x\r\ny"] {
            assert_eq!(edge_kept_headers(Some(bad)), None, "{bad:?}");
        }
        let many = vec!["x-h"; MAX_STORED_HEADER_NAMES + 1].join(",");
        assert_eq!(edge_kept_headers(Some(many.as_bytes())), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn stores_the_cached_headers_in_their_order_with_every_value() {
        let answer: Vec<(&str, &[u8])> = vec![
            ("Set-Cookie", b"a=1"),
            ("Location", b"/v1/charges/1"),
            ("content-type", b"application/json"),
            ("X-Request-Id", b"r1"),
            ("Content-Language", b"en"),
            ("content-language", b"fr"),
        ];
        let stored = stored_headers_of(
            &super::super::DEFAULT_CACHED_HEADERS,
            answer.iter().copied(),
        );
        let expected: Vec<(String, Vec<u8>)> = vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("content-language".into(), b"en".to_vec()),
            ("content-language".into(), b"fr".to_vec()),
            ("location".into(), b"/v1/charges/1".to_vec()),
        ];
        assert_eq!(stored, expected);
        let stored = StoredResponse {
            status: 201,
            headers: stored,
            body: vec![],
        };
        let replayed: Vec<(&str, &[u8])> = replay_headers(&stored.headers).collect();
        assert_eq!(replayed.len(), 5);
        assert_eq!(replayed[4], ("idempotent-replayed", &b"true"[..]));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_execution_s_trace_is_stored_never_sent() {
        let trace = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let stored: Vec<(String, Vec<u8>)> = vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("idem-execution-trace".into(), trace.to_vec()),
        ];
        assert_eq!(execution_trace(&stored), Some(&trace[..]));
        let sent: Vec<(&str, &[u8])> = replay_headers(&stored).collect();
        assert_eq!(
            sent,
            vec![
                ("content-type", &b"application/json"[..]),
                ("idempotent-replayed", &b"true"[..])
            ]
        );
        assert_eq!(visible_headers(&stored).count(), 1);
        assert_eq!(execution_trace(&stored[..1]), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_origin_gets_the_edge_s_forwarding_headers_not_the_client_s() {
        let h = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(n, v)| ((*n).into(), (*v).into()))
                .collect()
        };
        let client = h(&[
            ("Host", "api.example"),
            ("Connection", "keep-alive, X-Private"),
            ("X-Private", "secret"),
            ("X-Forwarded-For", "6.6.6.6"),
            ("Forwarded", "for=6.6.6.6"),
            ("CF-Ray", "forged"),
            ("cf-connecting-ip", "6.6.6.6"),
            ("Authorization", "Bearer sk"),
            ("Idempotency-Key", "k"),
        ]);
        let sent = forwarded_headers(&client, Some("203.0.113.9"), "https");
        for bad in ["6.6.6.6, 7.7.7.7", "unknown", ""] {
            let sent = forwarded_headers(&client, Some(bad), "https");
            assert!(!sent.iter().any(|(n, _)| n == "x-forwarded-for"), "{bad:?}");
        }
        let access = h(&[("Cf-Access-Jwt-Assertion", "jwt"), ("CF-IPCountry", "XX")]);
        assert_eq!(
            forwarded_headers(&access, None, "https"),
            h(&[
                ("Cf-Access-Jwt-Assertion", "jwt"),
                ("x-forwarded-proto", "https")
            ]),
            "the client's own cf-* headers pass"
        );
        assert_eq!(
            sent,
            h(&[
                ("Authorization", "Bearer sk"),
                ("Idempotency-Key", "k"),
                ("x-forwarded-for", "203.0.113.9"),
                ("x-forwarded-host", "api.example"),
                ("x-forwarded-proto", "https"),
            ])
        );
        let answer = h(&[
            ("Connection", "X-Hop"),
            ("X-Hop", "1"),
            ("Content-Length", "3"),
            ("idem-disposition", "released"),
            ("Location", "/x"),
        ]);
        assert_eq!(
            relayed_answer_headers("POST", &answer),
            h(&[("Location", "/x")])
        );
        assert_eq!(
            relayed_answer_headers("HEAD", &answer),
            h(&[("Content-Length", "3"), ("Location", "/x")]),
            "HEAD keeps the length it has no body to show"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn hop_by_hop_and_forgeable_headers_stay_behind() {
        for name in [
            "Connection",
            "transfer-encoding",
            "Host",
            "CF-Connecting-IP",
            "x-real-ip",
            "Idem-Fencing-Token",
            "idem-downstream-key",
            "Proxy-Authorization",
        ] {
            assert!(!forwarded_request_header(name), "{name}");
        }
        for name in [
            "X-Forwarded-Port",
            "x-forwarded-prefix",
            "X-Client-IP",
            "forwarded",
        ] {
            assert!(forgeable(name), "{name}");
        }
        assert!(!forgeable("x-forwarde"));
        for name in ["authorization", "Idempotency-Key", "content-type", "prefer"] {
            assert!(forwarded_request_header(name), "{name}");
        }
        for name in ["idem-disposition", "Content-Length", "keep-alive"] {
            assert!(!relayed_answer_header(name), "{name}");
        }
        for name in ["location", "set-cookie", "cache-control"] {
            assert!(relayed_answer_header(name), "{name}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_edge_keeps_only_what_the_origin_stored_until_it_expires() {
        const MAX: u64 = 10_000;
        assert_eq!(edge_ttl_ms(Some(1_500), 1_000, MAX), Some(500));
        assert_eq!(
            edge_ttl_ms(Some(1_000), 1_000, MAX),
            None,
            "expired at the edge"
        );
        assert_eq!(edge_ttl_ms(Some(900), 1_000, MAX), None);
        assert_eq!(
            edge_ttl_ms(Some(u64::MAX), 1_000, MAX),
            Some(MAX),
            "never past the edge's own bound"
        );
        assert_eq!(edge_ttl_ms(None, 0, MAX), None);
    }

    fn record_key(scope: &[u8]) -> crate::RecordKey {
        let key = crate::IdempotencyKey::parse(b"k1").unwrap();
        crate::RecordKey::new(&crate::Scope::from_credential(scope), &key)
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_edge_keeps_only_what_the_origin_stored_in_the_same_record() {
        let (tenant_a, tenant_b) = (record_key(b"a"), record_key(b"b"));
        let (own, other) = (crate::Fingerprint([1; 32]), crate::Fingerprint([2; 32]));
        let stored = |fingerprint| {
            Some(OriginDisposition::Stored {
                expires_at: 5_000,
                record: tenant_a.tag(),
                fingerprint,
            })
        };
        assert_eq!(
            edge_keeps(stored(Some(own)), tenant_a.tag(), &own),
            Ok(5_000)
        );
        assert_eq!(
            edge_keeps(stored(Some(own)), tenant_b.tag(), &own),
            Err(NotKept::OtherRecord),
            "an edge that scopes otherwise than the origin keeps nothing"
        );
        assert_eq!(
            edge_keeps(stored(Some(other)), tenant_a.tag(), &own),
            Err(NotKept::OtherFingerprint),
            "an origin whose route fingerprints otherwise keeps the edge from keeping"
        );
        assert_eq!(
            edge_keeps(stored(None), tenant_a.tag(), &own),
            Err(NotKept::OtherFingerprint),
            "nor does one that does not say"
        );
        for said in [
            Some(OriginDisposition::Released),
            Some(OriginDisposition::Pending),
            None,
        ] {
            assert_eq!(
                edge_keeps(said, tenant_a.tag(), &own),
                Err(NotKept::NotStored)
            );
        }
        assert_ne!(tenant_a.tag(), tenant_b.tag());
        // Read from other headers, the same key value names another record's tag: an
        // edge whose KEY_HEADER is not the route's keeps nothing of its answers.
        let standard = super::super::KeyHeaders::default();
        let custom = super::super::KeyHeaders::new(["x-idempotency-key"]).unwrap();
        let both = super::super::KeyHeaders::new(["idempotency-key", "x-idempotency-key"]);
        let both_reversed = super::super::KeyHeaders::new(["x-idempotency-key", "idempotency-key"]);
        assert_eq!(standard.record_tag(&tenant_a), tenant_a.tag());
        let on_custom = Some(OriginDisposition::Stored {
            expires_at: 5_000,
            record: custom.record_tag(&tenant_a),
            fingerprint: Some(own),
        });
        assert_eq!(
            edge_keeps(on_custom, custom.record_tag(&tenant_a), &own),
            Ok(5_000)
        );
        for edge_reads in [&standard, &both.clone().unwrap()] {
            assert_eq!(
                edge_keeps(on_custom, edge_reads.record_tag(&tenant_a), &own),
                Err(NotKept::OtherRecord),
                "{edge_reads:?}"
            );
        }
        assert_eq!(
            both.unwrap().record_tag(&tenant_a),
            both_reversed.unwrap().record_tag(&tenant_a),
            "the order of the names is not the route's choice of key"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn origin_disposition_round_trips_and_refuses_junk() {
        let record = record_key(b"a").tag();
        for d in [
            OriginDisposition::Stored {
                expires_at: 0,
                record,
                fingerprint: None,
            },
            OriginDisposition::Stored {
                expires_at: 1_764_000_000_123,
                record,
                fingerprint: Some(crate::Fingerprint([0xab; 32])),
            },
            OriginDisposition::Stored {
                expires_at: u64::MAX,
                record,
                fingerprint: Some(crate::Fingerprint([0; 32])),
            },
            OriginDisposition::Released,
            OriginDisposition::Pending,
        ] {
            assert_eq!(
                OriginDisposition::parse(d.header_value().as_bytes()),
                Some(d)
            );
        }
        let tag = record.to_hex();
        assert_eq!(
            OriginDisposition::parse(format!(" stored;expires=5;record={tag} ").as_bytes()),
            Some(OriginDisposition::Stored {
                expires_at: 5,
                record,
                fingerprint: None,
            })
        );
        let upper = format!("stored; expires=5; record={}", tag.to_ascii_uppercase());
        assert_eq!(
            OriginDisposition::parse(upper.as_bytes()),
            Some(OriginDisposition::Stored {
                expires_at: 5,
                record,
                fingerprint: None,
            })
        );
        let short = format!("stored; expires=5; record={}", &tag[1..]);
        let extra = format!("stored; expires=5; record={tag}; x=1");
        let fp = "ab".repeat(32);
        let after = format!("stored; expires=5; record={tag}; fingerprint={fp}; x=1");
        let cut = format!("stored; expires=5; record={tag}; fingerprint={}", &fp[1..]);
        for junk in [
            &b""[..],
            b"stored",
            b"stored; expires=",
            b"stored; expires=5",
            b"stored; expires=-1; record=00000000000000000000000000000000",
            b"stored; expires=18446744073709551616",
            b"stored; expires=1e9",
            b"Stored; expires=1",
            b"no-store",
            b"stored; expires=5; record=zz000000000000000000000000000000",
            short.as_bytes(),
            extra.as_bytes(),
            after.as_bytes(),
            cut.as_bytes(),
        ] {
            assert_eq!(OriginDisposition::parse(junk), None, "{junk:?}");
        }
    }
}
