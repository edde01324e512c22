//! What idem decides about a request before anything runs: whether it is guarded,
//! under which key, whether its body may be read, and what it was (its fingerprint).

use super::path::ambiguous_path;
use super::problem::{Problem, Rejection};
use crate::{Fingerprint, IdempotencyKey, RequestParts};
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
