//! What idem decides about a request before anything runs: whether it is guarded,
//! under which key, whether its body may be read, and what it was (its fingerprint).

use super::path::ambiguous_path;
use super::problem::{Problem, Rejection};
use crate::InvalidSetting;
use crate::{Fingerprint, IdempotencyKey, RecordKey, RecordTag, RequestParts};
use alloc::borrow::Cow;
use alloc::string::String;

/// What to do with a request, decided on its method, path and headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Not idem's business: pass it on untouched.
    PassThrough,
    /// Refuse it; nothing runs.
    Reject(Rejection),
    /// Guard it under this key.
    Guard(IdempotencyKey),
}

/// Routes a request. `guarded`: its method is one of the guarded ones; `path`: its
/// path as sent; `keys`: the value of every `Idempotency-Key` header it carries, in
/// order; `key_required`: whether its route requires a key (asked only when there is
/// none).
pub fn route<'a>(
    guarded: bool,
    path: &str,
    keys: impl IntoIterator<Item = &'a [u8]>,
    key_required: impl FnOnce() -> bool,
) -> Route {
    if !guarded {
        return Route::PassThrough;
    }
    // Which route's settings apply is decided on the path: one that servers read
    // differently could get one route's here and another's at the API.
    if ambiguous_path(path) {
        return Route::Reject(Rejection::new(Problem::PathAmbiguous));
    }
    let mut keys = keys.into_iter();
    match (keys.next(), keys.next()) {
        (None, _) if key_required() => Route::Reject(Rejection::new(Problem::KeyMissing)),
        (None, _) => Route::PassThrough,
        // Two headers: which one the client meant is a guess idem does not make.
        (Some(_), Some(_)) => Route::Reject(Rejection::several_keys()),
        // A runtime that joins repeated headers (the Workers runtime) joins them with
        // ", ", which no valid bare key contains: it is refused as malformed there.
        (Some(one), None) => match IdempotencyKey::parse(one) {
            Ok(key) => Route::Guard(key),
            Err(e) => Route::Reject(Rejection::key_malformed(e)),
        },
    }
}

/// The request headers a route reads its key from ([`route_by_key_headers`]):
/// `Idempotency-Key` unless the route names others (`X-Idempotency-Key`,
/// `PayPal-Request-Id`…). Names are lower-case, each once.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeyHeaders {
    names: alloc::vec::Vec<String>,
}

impl Default for KeyHeaders {
    fn default() -> Self {
        KeyHeaders {
            names: alloc::vec![String::from(super::IDEMPOTENCY_KEY)],
        }
    }
}

impl KeyHeaders {
    /// The headers `names`, checked: at least one; each a header name a client sets —
    /// not idem's own (`idem-*`), not one a proxy or CDN sets or a client could forge
    /// for one ([`super::forgeable`]), not hop-by-hop or set by the runtime, and not
    /// one that means something else to HTTP (`Authorization`, `Content-*`, `Cookie`,
    /// `Prefer`…), which would make every request of a caller one key.
    pub fn new<S: AsRef<str>>(
        names: impl IntoIterator<Item = S>,
    ) -> Result<KeyHeaders, InvalidSetting> {
        let mut out: alloc::vec::Vec<String> = alloc::vec::Vec::new();
        for name in names {
            let name = name.as_ref().trim().to_ascii_lowercase();
            let token = super::is_header_name(&name);
            if !token {
                return Err(InvalidSetting::from(alloc::format!(
                    "{name:?} is not a header name"
                )));
            }
            // Ids a proxy or tracer sets anew (Envoy resets x-request-id on external
            // requests by default): read as keys, every retry would be a new request.
            const SET_ANEW: [&str; 9] = [
                "x-request-id",
                "x-correlation-id",
                "x-amzn-trace-id",
                "x-b3-traceid",
                "x-b3-spanid",
                "x-cloud-trace-context",
                "sentry-trace",
                "baggage",
                "request-id",
            ];
            const MEANT_OTHERWISE: [&str; 13] = [
                "authorization",
                "cookie",
                "prefer",
                "content-type",
                "content-length",
                "content-encoding",
                "accept",
                // A CDN sets it anew (Cloudflare: `br, gzip`).
                "accept-encoding",
                "user-agent",
                "traceparent",
                "tracestate",
                "origin",
                "referer",
            ];
            let ours = name.starts_with("idem-") || name.starts_with("x-idem-");
            if ours
                || super::forgeable(&name)
                || !super::forwarded_request_header(&name)
                || MEANT_OTHERWISE.contains(&name.as_str())
                || SET_ANEW.contains(&name.as_str())
                || super::METHOD_OVERRIDE_HEADERS.contains(&name.as_str())
            {
                return Err(InvalidSetting::from(alloc::format!(
                    "{name} cannot carry the idempotency key: it is idem's own, set by a \
                     proxy, the runtime or the connection, or means something else to HTTP \
                     (use a header only clients set for the key, e.g. x-idempotency-key)"
                )));
            }
            if !out.contains(&name) {
                out.push(name);
            }
        }
        if out.is_empty() {
            return Err(InvalidSetting::from(String::from(
                "no header names: a guarded request needs a header to carry its key",
            )));
        }
        Ok(KeyHeaders { names: out })
    }

    /// The names, lower-case, in the order given.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether `Idempotency-Key` is one of them.
    pub fn reads_standard(&self) -> bool {
        self.names.iter().any(|n| n == super::IDEMPOTENCY_KEY)
    }

    /// The tag by which an origin that read the key from these headers names `record`
    /// to an edge ([`super::OriginDisposition::Stored`]'s `record`), and by which the
    /// edge checks it: [`RecordKey::tag`] for `Idempotency-Key` alone, else a hash of
    /// the record key with the names (in any order). The record key is the key's value
    /// alone, so an edge reading it from other headers than the route keeps nothing of
    /// the route's answers: there, the same value in another header is another
    /// request's key (or none).
    pub fn record_tag(&self, record: &RecordKey) -> RecordTag {
        if let [only] = self.names.as_slice() {
            if only == super::IDEMPOTENCY_KEY {
                return record.tag();
            }
        }
        let mut names: alloc::vec::Vec<&[u8]> = self.names.iter().map(|n| n.as_bytes()).collect();
        names.sort_unstable();
        let mut parts = alloc::vec![record.as_str().as_bytes()];
        parts.extend(names);
        let digest = crate::scope::tagged_hash(b"idem/record-tag/key-headers/v1", &parts);
        let mut tag = [0; 16];
        tag.copy_from_slice(&digest[..16]);
        RecordTag(tag)
    }
}

/// [`route`] for a route that reads its key from `key_headers`: `values_of(name)` gives
/// every value of the request's header `name`, in order. Two values — of one header or
/// of two of them — are refused as [`route`] refuses two keys; an `Idempotency-Key` on a
/// route that does not read it is refused ([`Problem::KeyHeaderNotRead`]): its client
/// believes the request guarded, and it would run as often as it is sent.
pub fn route_by_key_headers<'a, I>(
    guarded: bool,
    path: &str,
    key_headers: &KeyHeaders,
    values_of: impl Fn(&str) -> I,
    key_required: impl FnOnce() -> bool,
) -> Route
where
    I: IntoIterator<Item = &'a [u8]>,
{
    if guarded
        && !key_headers.reads_standard()
        && values_of(super::IDEMPOTENCY_KEY)
            .into_iter()
            .next()
            .is_some()
        && !ambiguous_path(path)
    {
        return Route::Reject(Rejection::new(Problem::KeyHeaderNotRead));
    }
    let keys = key_headers
        .names
        .iter()
        .flat_map(|name| values_of(name).into_iter());
    match route(guarded, path, keys, key_required) {
        // Name the header this route reads, not the standard one.
        Route::Reject(r)
            if !key_headers.reads_standard()
                && (r.problem == Problem::KeyMissing || r == Rejection::several_keys()) =>
        {
            let one_of = key_headers.names.join(" or ");
            let detail = match r.problem {
                Problem::KeyMissing => alloc::format!("send the key in a {one_of} header"),
                _ => alloc::format!("send exactly one key, in one {one_of} header"),
            };
            Route::Reject(Rejection::with_detail(r.problem, detail))
        }
        decided => decided,
    }
}

/// Whether `method` is one of `methods`, compared without regard to ASCII case: HTTP
/// methods are case-sensitive, but Django, Werkzeug and ASP.NET take `put` for `PUT`,
/// and a request they run as a `PUT` must be guarded as one.
pub fn guards(methods: &[impl AsRef<str>], method: &str) -> bool {
    methods
        .iter()
        .any(|m| m.as_ref().eq_ignore_ascii_case(method))
}

/// Request headers by which a client asks the server to take a request for another
/// method, as Rails (Rack::MethodOverride), Express (method-override), Spring
/// (HiddenHttpMethodFilter) and ASP.NET (UseHttpMethodOverride) may be set up to.
pub const METHOD_OVERRIDE_HEADERS: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Whether a request is guarded by `methods`: its own method ([`guards`]), or one that a
/// [`METHOD_OVERRIDE_HEADERS`] value (`overrides`, every value of every such header)
/// asks the server to take it for. (A method override in a form body, `_method`, is
/// the API's to refuse: idem reads no body before deciding.)
pub fn guards_request<'a>(
    methods: &[impl AsRef<str>],
    method: &str,
    overrides: impl IntoIterator<Item = &'a [u8]>,
) -> bool {
    guards(methods, method)
        || overrides
            .into_iter()
            .any(|value| core::str::from_utf8(value).is_ok_and(|v| guards(methods, v.trim())))
}

/// Refuses a guarded request whose declared `Content-Length` is over `limit`
/// before a byte of it is read. An unparsable length is left to the runtime's body
/// reader, which counts what actually arrives against the same limit. The length, when
/// declared and within the limit (what a server reserves to buffer the body).
pub fn check_declared_length(
    content_length: Option<&[u8]>,
    limit: usize,
) -> Result<Option<usize>, Rejection> {
    let Some(value) = content_length.map(super::trim_ows) else {
        return Ok(None);
    };
    let all_digits = !value.is_empty() && value.iter().all(u8::is_ascii_digit);
    match super::parse_digits(value, usize::MAX) {
        Some(n) if n > limit as u64 => Err(Rejection::body_too_large(limit)),
        // Within the limit, so within usize.
        Some(n) => Ok(usize::try_from(n).ok()),
        // More digits than a u64 holds: larger than any limit.
        None if all_digits => Err(Rejection::body_too_large(limit)),
        None => Ok(None),
    }
}

/// The fingerprint of a guarded request, from what both runtimes see of it: the
/// method, the path and query as sent (`/` when empty), the `Content-Type` header —
/// its values joined by `", "` when repeated, as a runtime that folds repeated headers
/// (the Workers runtime) hands them over, with bytes that are not UTF-8 replaced — and
/// the body.
pub fn fingerprint<'a>(
    method: &str,
    path_and_query: &str,
    content_type: impl IntoIterator<Item = &'a [u8]>,
    body: &[u8],
) -> Fingerprint {
    with_parts(method, path_and_query, content_type, body, Fingerprint::of)
}

/// The bytes [`fingerprint`] hashes with SHA-256, for a runtime that hashes them
/// itself (the edge hands large bodies to WebCrypto); wrap the digest in [`Fingerprint`].
pub fn fingerprint_message<'a>(
    method: &str,
    path_and_query: &str,
    content_type: impl IntoIterator<Item = &'a [u8]>,
    body: &[u8],
) -> alloc::vec::Vec<u8> {
    with_parts(
        method,
        path_and_query,
        content_type,
        body,
        Fingerprint::message,
    )
}

fn with_parts<'a, T>(
    method: &str,
    path_and_query: &str,
    content_type: impl IntoIterator<Item = &'a [u8]>,
    body: &[u8],
    then: impl FnOnce(&RequestParts<'_>) -> T,
) -> T {
    let mut values = content_type.into_iter();
    let content_type: Option<Cow<'_, str>> = match (values.next(), values.next()) {
        (None, _) => None,
        (Some(one), None) => Some(String::from_utf8_lossy(one)),
        (Some(first), Some(second)) => {
            let mut joined = String::from_utf8_lossy(first).into_owned();
            for value in core::iter::once(second).chain(values) {
                joined.push_str(", ");
                joined.push_str(&String::from_utf8_lossy(value));
            }
            Some(Cow::Owned(joined))
        }
    };
    then(&RequestParts {
        method,
        path_and_query: if path_and_query.is_empty() {
            "/"
        } else {
            path_and_query
        },
        content_type: content_type.as_deref(),
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::listed;
    use alloc::vec;
    use alloc::vec::Vec;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn r(method: &str, path: &str, keys: &[&[u8]]) -> Route {
        route(
            guards(&super::super::DEFAULT_METHODS, method),
            path,
            keys.iter().copied(),
            || listed(&["/v1/charges"], path),
        )
    }

    fn problem(route: Route) -> Option<Problem> {
        match route {
            Route::Reject(r) => Some(r.problem),
            _ => None,
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn routes() {
        assert_eq!(r("GET", "/v1/charges", &[]), Route::PassThrough);
        assert_eq!(r("PUT", "/v1/charges", &[b"bad key"]), Route::PassThrough);
        assert_eq!(
            problem(r("post", "/v1/charges", &[])),
            Some(Problem::KeyMissing),
            "a method spelled in lower case is guarded, as lenient servers run it"
        );
        assert_eq!(
            problem(r("POST", "/v1/charges", &[])),
            Some(Problem::KeyMissing)
        );
        assert_eq!(r("POST", "/other", &[]), Route::PassThrough);
        assert_eq!(
            problem(r("POST", "/v1/charges", &[b"a b"])),
            Some(Problem::KeyMalformed)
        );
        assert_eq!(
            r("POST", "/x", &[b"a", b"b"]),
            Route::Reject(Rejection::several_keys())
        );
        assert_eq!(
            problem(r("POST", "/x", &[b"a, b"])),
            Some(Problem::KeyMalformed),
            "two headers joined by a runtime"
        );
        assert_eq!(
            r("PATCH", "/x", &[b"\"k1\""]),
            Route::Guard(IdempotencyKey::parse(b"k1").unwrap())
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_route_reads_its_key_from_the_headers_it_names() {
        let by = |names: &[&str], headers: &[(&'static str, &'static [u8])]| {
            let rule = KeyHeaders::new(names).unwrap();
            let headers = headers.to_vec();
            route_by_key_headers(
                true,
                "/v1/charges",
                &rule,
                |name: &str| {
                    headers
                        .iter()
                        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                        .map(|(_, v)| *v)
                        .collect::<Vec<&[u8]>>()
                },
                || true,
            )
        };
        let k1 = Route::Guard(IdempotencyKey::parse(b"k1").unwrap());
        assert_eq!(by(&["idempotency-key"], &[("Idempotency-Key", b"k1")]), k1);
        assert_eq!(
            by(&["X-Idempotency-Key"], &[("x-idempotency-key", b"k1")]),
            k1
        );
        assert_eq!(
            by(
                &["x-idempotency-key", "paypal-request-id"],
                &[("PayPal-Request-Id", b"k1")]
            ),
            k1
        );
        assert_eq!(
            problem(by(&["x-idempotency-key"], &[("idempotency-key", b"k1")])),
            Some(Problem::KeyHeaderNotRead),
            "a key the route does not read is not ignored"
        );
        assert_eq!(
            problem(by(
                &["x-idempotency-key", "paypal-request-id"],
                &[("x-idempotency-key", b"k1"), ("paypal-request-id", b"k1")]
            )),
            Some(Problem::KeyMalformed),
            "two keys, even equal, are two keys"
        );
        assert_eq!(
            problem(by(&["x-idempotency-key"], &[])),
            Some(Problem::KeyMissing)
        );
        assert_eq!(
            by(
                &["idempotency-key", "x-idempotency-key"],
                &[("idempotency-key", b"k1")]
            ),
            k1
        );
        for bad in [
            "authorization",
            "Idem-Edge-Secret",
            "x-forwarded-for",
            "host",
            "content-length",
            "connection",
            "cookie",
            "x-http-method-override",
            "",
            "a b",
        ] {
            assert!(KeyHeaders::new([bad]).is_err(), "{bad:?}");
        }
        assert!(KeyHeaders::new(Vec::<&str>::new()).is_err());
        assert_eq!(
            KeyHeaders::new(["X-Idempotency-Key", "x-idempotency-key"])
                .unwrap()
                .names(),
            ["x-idempotency-key"]
        );
        for set_anew in [
            "x-request-id",
            "X-Amzn-Trace-Id",
            "x-correlation-id",
            "baggage",
        ] {
            assert!(KeyHeaders::new([set_anew]).is_err(), "{set_anew}");
        }
        assert!(KeyHeaders::default().reads_standard());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn declared_lengths() {
        assert_eq!(check_declared_length(None, 10), Ok(None));
        assert_eq!(check_declared_length(Some(b"10"), 10), Ok(Some(10)));
        assert_eq!(check_declared_length(Some(b" 0"), 10), Ok(Some(0)));
        assert_eq!(
            check_declared_length(Some(b" 11 "), 10),
            Err(Rejection::body_too_large(10))
        );
        assert_eq!(
            check_declared_length(Some(b"99999999999999999999999"), 10),
            Err(Rejection::body_too_large(10)),
            "past u64: larger than any limit"
        );
        assert_eq!(check_declared_length(Some(b"x"), 10), Ok(None));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn fingerprints_from_what_both_runtimes_see() {
        let json: [&[u8]; 1] = [b"application/json"];
        let a = fingerprint("POST", "", json, b"{}");
        let b = fingerprint("POST", "/", json, b"{}");
        assert_eq!(a, b, "an empty target is /");
        let lossy = fingerprint("POST", "/", [&[0xffu8][..]], b"");
        let replaced = fingerprint("POST", "/", ["\u{fffd}".as_bytes()], b"");
        assert_eq!(lossy, replaced);
        let repeated = fingerprint("POST", "/", [&b"a/b"[..], b"c/d", b"e/f"], b"");
        let folded = fingerprint("POST", "/", [&b"a/b, c/d, e/f"[..]], b"");
        assert_eq!(
            repeated, folded,
            "repeated headers read as a folding runtime reads them"
        );
        let none: [&[u8]; 0] = [];
        let all: Vec<Fingerprint> = vec![
            fingerprint("POST", "/a", none, b""),
            fingerprint("PATCH", "/a", none, b""),
            fingerprint("POST", "/a?x", none, b""),
            fingerprint("POST", "/a", [&b"text/plain"[..]], b""),
            fingerprint("POST", "/a", none, b"x"),
        ];
        for (i, x) in all.iter().enumerate() {
            for y in &all[i + 1..] {
                assert_ne!(x, y);
            }
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_guarded_request_on_an_ambiguous_path_is_refused() {
        for path in [
            "/v1%2Fcharges",
            "/v1%2fcharges",
            "/v1%5Ccharges",
            "/v1/charges;jsessionid=1",
            "/v1/charges/..",
            "/v1/charges/%2e%2E",
            "/v1/./charges",
            "/v1/charges/%2E",
        ] {
            assert!(ambiguous_path(path), "{path}");
            assert_eq!(
                problem(r("POST", path, &[b"\"k1\""])),
                Some(Problem::PathAmbiguous),
                "{path}"
            );
            assert_eq!(
                r("GET", path, &[]),
                Route::PassThrough,
                "not idem's business"
            );
        }
        for path in [
            "/v1/charges",
            "/v1/charges/",
            "//v1/charges",
            "/v1/%63harges",
            "/v1/a.b",
            "/v1/..x",
            "/%25",
        ] {
            assert!(!ambiguous_path(path), "{path}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_method_override_is_guarded_as_the_method_it_asks_for() {
        let put = ["PUT"];
        let none: [&[u8]; 0] = [];
        assert!(guards_request(&put, "PUT", none));
        assert!(guards_request(&put, "put", none));
        assert!(!guards_request(&put, "POST", none));
        assert!(guards_request(&put, "POST", [&b" put "[..]]));
        assert!(!guards_request(&put, "POST", [&b"DELETE"[..], &[0xff][..]]));
    }
}
