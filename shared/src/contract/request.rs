//! What idem decides about a request before anything runs: whether it is guarded,
//! under which key, whether its body may be read, and what it was (its fingerprint).

use super::problem::{Problem, Rejection};
use crate::{Fingerprint, IdempotencyKey, RequestParts};
use alloc::borrow::Cow;
use alloc::format;
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

/// Whether `method` is one of `methods` (compared as written: HTTP methods are
/// case-sensitive).
pub fn guards(methods: &[impl AsRef<str>], method: &str) -> bool {
    methods.iter().any(|m| m.as_ref() == method)
}

/// Whether `path` is one of `paths`: equal to one; under one that ends in `/*` (`/v1/*`
/// lists `/v1`, `/v1/charges` and `/v1/refunds/7`); or starting with one that ends in
/// another `*` (`/v1*` lists `/v10` too). Paths are compared in their [`normal_path`]
/// form, so that the spellings a server takes for one resource (`/v1//charges/`,
/// `/v1/%63harges`) get that resource's settings — and the same scope, where a route
/// has its own.
pub fn listed(paths: &[impl AsRef<str>], path: &str) -> bool {
    let path = normal_path(path);
    paths.iter().any(|p| {
        let p = p.as_ref();
        if let Some(base) = p.strip_suffix("/*") {
            let base = normal_path(base);
            let base = base.trim_end_matches('/');
            path == base
                || (path.starts_with(base) && path.as_bytes().get(base.len()) == Some(&b'/'))
        } else if let Some(prefix) = p.strip_suffix('*') {
            path.starts_with(prefix)
        } else {
            normal_path(p) == path
        }
    })
}

/// Checks a path pattern as [`listed`] reads it: `*`, or a path that starts with `/`,
/// in visible ASCII without `?` or `#`, whose only `*` ends it, written in normal form
/// (a pattern written otherwise could never match, or not where it seems to). The
/// error says what to write.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern == "*" {
        return Ok(());
    }
    let visible = |c: char| c.is_ascii_graphic() && !matches!(c, '?' | '#');
    let star = pattern.find('*');
    if !pattern.starts_with('/')
        || star.is_some_and(|at| at != pattern.len() - 1)
        || !pattern.chars().all(visible)
    {
        return Err(format!("{pattern:?} must start with /, hold visible ASCII without ? or #, and may end in * (a prefix) or /* (a path and what is under it), e.g. \"/v1/payouts/*\""));
    }
    let (base, star) = match (pattern.strip_suffix("/*"), pattern.strip_suffix('*')) {
        (Some(base), _) => (base, "/*"),
        (None, Some(prefix)) => (prefix, "*"),
        (None, None) => (pattern, ""),
    };
    if base.is_empty() {
        return Ok(());
    }
    let normal = normal_path(base);
    // A plain prefix may end in a slash (`/v1/*` aside): `/v1/pay*`, `/v1/x/*`.
    let same = normal == base
        || (star == "*"
            && base.ends_with('/')
            && normal_path(base.trim_end_matches('/')) == base.trim_end_matches('/')
            && !base.ends_with("//"));
    if !same || ambiguous_path(base) {
        return Err(format!(
            "{pattern:?} is matched as \"{normal}{star}\": write it so"
        ));
    }
    Ok(())
}

/// Whether servers disagree on what `path` names: it holds an encoded `/` or `\` (Go
/// and WSGI decode them, others don't), a `;` parameter (Tomcat drops it), or a `.` or
/// `..` segment, plain or encoded (some resolve them, some route them as written).
pub fn ambiguous_path(path: &str) -> bool {
    let lower = |i: usize| path.as_bytes().get(i).map(u8::to_ascii_lowercase);
    let encoded_separator = path.match_indices('%').any(|(i, _)| {
        lower(i + 1) == Some(b'2') && lower(i + 2) == Some(b'f')
            || lower(i + 1) == Some(b'5') && lower(i + 2) == Some(b'c')
    });
    let dot_segment = |segment: &str| {
        let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
        decoded == "." || decoded == ".."
    };
    encoded_separator || path.contains(';') || path.split('/').any(dot_segment)
}

/// `path` as servers commonly take it (RFC 3986 §6.2.2): percent-encoded unreserved
/// characters decoded (`%63` is `c`; other escapes kept, their hex in capitals), `.`
/// and `..` segments removed, repeated slashes collapsed, no trailing slash (but `/`).
/// Borrowed when it is already so.
pub fn normal_path(path: &str) -> Cow<'_, str> {
    let plain = path.starts_with('/')
        && !path.contains("//")
        && !path.contains('%')
        && (path.len() == 1 || !path.ends_with('/'))
        && !path.split('/').any(|s| s == "." || s == "..");
    if plain {
        return Cow::Borrowed(path);
    }
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = path.as_bytes();
    let mut decoded = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            if let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            ) {
                let c = h << 4 | l;
                if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                    decoded.push(char::from(c));
                } else {
                    decoded.push('%');
                    decoded.push(char::from(bytes[i + 1].to_ascii_uppercase()));
                    decoded.push(char::from(bytes[i + 2].to_ascii_uppercase()));
                }
                i += 3;
                continue;
            }
        }
        // Whole characters: the path is text, and every byte above is ASCII.
        let ch = path[i..].chars().next().unwrap_or('\u{fffd}');
        decoded.push(ch);
        i += ch.len_utf8();
    }
    let mut segments: alloc::vec::Vec<&str> = alloc::vec::Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() {
        out.push('/');
    }
    Cow::Owned(out)
}

/// Refuses a guarded request whose declared `Content-Length` is over `limit`
/// before a byte of it is read. An unparsable length is left to the runtime's body
/// reader, which counts what actually arrives against the same limit.
pub fn check_declared_length(content_length: Option<&[u8]>, limit: usize) -> Result<(), Rejection> {
    let Some(value) = content_length.map(super::trim_ows) else {
        return Ok(());
    };
    let all_digits = !value.is_empty() && value.iter().all(u8::is_ascii_digit);
    match super::parse_digits(value, usize::MAX) {
        Some(n) if n > limit as u64 => Err(Rejection::body_too_large(limit)),
        // More digits than a u64 holds: larger than any limit.
        None if all_digits => Err(Rejection::body_too_large(limit)),
        _ => Ok(()),
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
        assert_eq!(r("post", "/v1/charges", &[]), Route::PassThrough);
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
    fn patterns_are_checked_as_they_are_read() {
        for good in [
            "*",
            "/*",
            "/v1/charges",
            "/v1/*",
            "/v1*",
            "/v1/pay*",
            "/v1/x/*",
            "/",
        ] {
            assert_eq!(check_pattern(good), Ok(()), "{good}");
        }
        for (bad, says) in [
            ("", "must start with /"),
            ("v1*", "must start with /"),
            ("/v1/*/x", "must start with /"),
            ("/a?b", "must start with /"),
            ("/caf\u{e9}", "must start with /"),
            ("/v1/charges/", "is matched as \"/v1/charges\""),
            ("/v1//c*", "is matched as \"/v1/c*\""),
            ("/v1/%63h*", "is matched as \"/v1/ch*\""),
            ("/v1/./x/*", "is matched as \"/v1/x/*\""),
        ] {
            let error = check_pattern(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
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
    fn declared_lengths() {
        assert_eq!(check_declared_length(None, 10), Ok(()));
        assert_eq!(check_declared_length(Some(b"10"), 10), Ok(()));
        assert_eq!(
            check_declared_length(Some(b" 11 "), 10),
            Err(Rejection::body_too_large(10))
        );
        assert_eq!(
            check_declared_length(Some(b"99999999999999999999999"), 10),
            Err(Rejection::body_too_large(10)),
            "past u64: larger than any limit"
        );
        assert_eq!(check_declared_length(Some(b"x"), 10), Ok(()));
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
    fn listed_paths_are_exact_under_a_segment_or_a_prefix() {
        let paths = ["/v1/charges", "/v2/*"];
        assert!(listed(&paths, "/v1/charges"));
        assert!(
            !listed(&paths, "/v1/charges/7"),
            "exact unless it ends in *"
        );
        assert!(listed(&paths, "/v2/"));
        assert!(listed(&paths, "/v2/refunds/7"));
        assert!(listed(&paths, "/v2"), "/v2/* covers /v2 itself");
        assert!(!listed(&paths, "/v20"), "a segment, not a prefix");
        assert!(listed(&["/v2*"], "/v20"), "a plain prefix");
        assert!(listed(&["*"], "/anything"));
        assert!(listed(&["/*"], "/anything"));
        assert!(listed(&["/*"], "/"));
        assert!(!listed(&[] as &[&str], "/v1/charges"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn spellings_of_one_path_are_listed_alike() {
        for spelling in [
            "/v1/charges/",
            "//v1/charges",
            "/v1//charges",
            "/v1/%63harges",
            "/v1/%63%68arges",
            "/v1/./charges",
            "/v1/x/../charges",
            "/v1/charges/.",
        ] {
            assert_eq!(normal_path(spelling), "/v1/charges", "{spelling}");
            assert!(listed(&["/v1/charges"], spelling), "{spelling}");
            assert!(listed(&["/v1/charges/*"], spelling), "{spelling}");
        }
        assert!(matches!(normal_path("/v1/charges"), Cow::Borrowed(_)));
        assert_eq!(
            normal_path("/a%2fb"),
            "/a%2Fb",
            "an escaped slash is not a slash"
        );
        assert_eq!(normal_path("/a%zz"), "/a%zz");
        assert_eq!(normal_path("/a%"), "/a%");
        assert_eq!(normal_path("/caf\u{e9}/%41"), "/caf\u{e9}/A");
        assert_eq!(normal_path("/../.."), "/");
        assert_eq!(normal_path(""), "/");
        assert!(
            !listed(&["/v1/charges"], "/V1/charges"),
            "paths are case-sensitive"
        );
    }
}
