//! Which route a request's path selects, decided once for the library, proxy mode and
//! the edge.
//!
//! Servers read one path differently: Tomcat drops `;` parameters, Go and WSGI decode
//! an encoded `/`, IIS reads `\` as `/`, Express and ASP.NET route without regard to
//! case, some resolve `..` and some route it as written. A request guarded in one
//! reading and passed through in another runs twice under one key, or without the key
//! its route requires. So a route matches without regard to ASCII case unless it says
//! otherwise ([`PathPattern::case_sensitive`]), and a path that servers may read
//! differently is refused ([`PathChoice::Ambiguous`]) whenever any reading of it would
//! be guarded.

use crate::InvalidSetting;
use alloc::borrow::Cow;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// A route's path pattern: exact, `<path>/*` (the path and everything under it), or a
/// prefix ending in `*`, as [`check_pattern`] accepts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathPattern {
    pattern: String,
    case_sensitive: bool,
}

impl PathPattern {
    /// `pattern`, checked; it matches without regard to ASCII case.
    pub fn new(pattern: &str) -> Result<Self, InvalidSetting> {
        check_pattern(pattern)?;
        Ok(PathPattern {
            pattern: pattern.into(),
            case_sensitive: false,
        })
    }

    /// Whether case matters: `/V1/Payouts` is not `/v1/payouts`. Off by default, since
    /// most frameworks route without regard to case; turn it on only in front of an API
    /// whose router is case-sensitive too.
    pub fn case_sensitive(mut self, yes: bool) -> Self {
        self.case_sensitive = yes;
        self
    }

    /// Whether case matters for this pattern.
    pub fn is_case_sensitive(&self) -> bool {
        self.case_sensitive
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether `path` (as sent) is one this pattern names, in its normal form.
    pub fn matches(&self, path: &str) -> bool {
        matches_normal(&self.pattern, &normal_path(path), self.case_sensitive)
    }
}

/// The route a request's path selects, or why none may be chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathChoice {
    /// The first pattern that matches the path, or none (the defaults apply).
    Route(Option<usize>),
    /// Servers may read the path differently, and some reading of it is guarded:
    /// refuse it (`400 path-ambiguous`) whatever its method's fate in this reading.
    Ambiguous,
}

/// Chooses the route of a request to `path` (as sent) among `patterns`, tried in order.
/// `guarded(route)` says whether the request's method is guarded under that route's
/// settings (`None`: the defaults'). A path servers may read differently
/// ([`ambiguous_path`]) is [`PathChoice::Ambiguous`] as soon as one of its readings
/// ([`readings`]) would be guarded — the upstream may take it in that reading.
pub fn choose_route(
    patterns: &[PathPattern],
    path: &str,
    guarded: impl Fn(Option<usize>) -> bool,
) -> PathChoice {
    let first = |normal: &str| {
        patterns
            .iter()
            .position(|p| matches_normal(&p.pattern, normal, p.case_sensitive))
    };
    let written = first(&normal_path(path));
    if !ambiguous_path(path) {
        return PathChoice::Route(written);
    }
    if guarded(written) || readings(path).iter().any(|r| guarded(first(r))) {
        PathChoice::Ambiguous
    } else {
        PathChoice::Route(written)
    }
}

/// The paths servers may take `path` for, in normal form: with and without its `;`
/// parameters, with encoded `/`, `\` and `;` (and a plain `\`) read as such or not —
/// decoded before the parameters are dropped or after — with Unicode letters that
/// case-fold to ASCII ones (`ſ`, `K`, `ı`, `İ`) read as those or not, and its `.` and
/// `..` segments resolved or routed as written.
pub fn readings(path: &str) -> Vec<String> {
    let transforms: [fn(&str) -> String; 3] = [strip_params, decode_separators, fold_confusables];
    let mut spellings: Vec<String> = alloc::vec![path.into()];
    // Every transform after every other, in either order: two rounds.
    for _ in 0..2 {
        for i in 0..spellings.len() {
            for transform in transforms {
                let read = transform(&spellings[i]);
                if !spellings.contains(&read) {
                    spellings.push(read);
                }
            }
        }
    }
    let mut out: Vec<String> = Vec::new();
    for read in &spellings {
        for resolve_dots in [true, false] {
            let normal = normalize(read, resolve_dots).into_owned();
            if !out.contains(&normal) {
                out.push(normal);
            }
        }
    }
    out
}

/// `path` without the `;` parameters of its segments (`/a;x/b` is `/a/b`), as Tomcat and
/// Jetty route it.
fn strip_params(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for (i, segment) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.push_str(segment.split(';').next().unwrap_or(""));
    }
    out
}

/// `path` with `%2F`, `%5C` and `\` read as `/`, `%3B` as `;`, and the escapes of
/// legacy decoders (`%u002e`, overlong `%C0%AE`) as what they spell, as Go, WSGI, IIS,
/// old servlet containers or nginx decoding in front of one may route it.
fn decode_separators(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(c) = rest.chars().next() {
        let escape = rest.get(..3).map(str::to_ascii_lowercase);
        // Legacy decoders: IIS' `%uXXXX`, overlong UTF-8 (`%C0%AE` is `.`).
        if let Some((byte, len)) = legacy_escape(rest) {
            out.push(if byte == b'\\' { '/' } else { char::from(byte) });
            rest = &rest[len..];
            continue;
        }
        match escape.as_deref() {
            Some("%2f" | "%5c") => {
                out.push('/');
                rest = &rest[3..];
            }
            Some("%3b") => {
                out.push(';');
                rest = &rest[3..];
            }
            _ => {
                out.push(if c == '\\' { '/' } else { c });
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    out
}

/// The ASCII byte a legacy decoder reads at the start of `rest`, and the escape's
/// length: IIS' `%u00XX`, or overlong UTF-8 `%C0%XX` / `%C1%XX`.
fn legacy_escape(rest: &str) -> Option<(u8, usize)> {
    let hex =
        |at: core::ops::Range<usize>| rest.get(at).and_then(|h| u8::from_str_radix(h, 16).ok());
    let lead = rest.get(..3)?.to_ascii_lowercase();
    let byte = if rest.get(..2)?.eq_ignore_ascii_case("%u") {
        (rest.get(2..4)? == "00").then_some(())?;
        (hex(4..6)?, 6)
    } else if (lead == "%c0" || lead == "%c1") && rest.get(3..4)? == "%" {
        let high = hex(1..3)?;
        (((high & 0x1f) << 6) | (hex(4..6)? & 0x3f), 6)
    } else {
        return None;
    };
    byte.0.is_ascii_graphic().then_some(byte)
}

/// Letters outside ASCII that Unicode case folding (Go's `EqualFold`, Java's
/// `equalsIgnoreCase`) takes for ASCII ones, raw or percent-encoded, with the ASCII
/// letter they fold to.
const CONFUSABLES: [(&str, &str, char); 4] = [
    ("\u{17f}", "%c5%bf", 's'),
    ("\u{212a}", "%e2%84%aa", 'k'),
    ("\u{131}", "%c4%b1", 'i'),
    ("\u{130}", "%c4%b0", 'i'),
];

/// `path` with [`CONFUSABLES`] read as the ASCII letters they fold to.
fn fold_confusables(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    'next: while let Some(c) = rest.chars().next() {
        for (raw, encoded, ascii) in CONFUSABLES {
            let escaped = rest
                .get(..encoded.len())
                .is_some_and(|e| e.eq_ignore_ascii_case(encoded));
            if rest.starts_with(raw) || escaped {
                out.push(ascii);
                rest = &rest[if escaped { encoded.len() } else { raw.len() }..];
                continue 'next;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Whether `path` is one of `paths` (patterns as [`PathPattern`] reads them, matched
/// without regard to case): equal to one; under one that ends in `/*` (`/v1/*` lists
/// `/v1`, `/v1/charges` and `/v1/refunds/7`); or starting with one that ends in another
/// `*` (`/v1*` lists `/v10` too). Paths are compared in their [`normal_path`] form, so
/// that the spellings a server takes for one resource (`/v1//charges/`, `/v1/%63harges`,
/// `/V1/Charges`) get that resource's settings — and the same scope, where a route has
/// its own.
pub fn listed(paths: &[impl AsRef<str>], path: &str) -> bool {
    let path = normal_path(path);
    paths
        .iter()
        .any(|p| matches_normal(p.as_ref(), &path, false))
}

/// Whether `pattern` names `path`, a path already in normal form.
fn matches_normal(pattern: &str, path: &str, case_sensitive: bool) -> bool {
    let same = |a: &[u8], b: &[u8]| {
        if case_sensitive {
            a == b
        } else {
            a.eq_ignore_ascii_case(b)
        }
    };
    let path = path.as_bytes();
    let starts = |prefix: &[u8]| path.len() >= prefix.len() && same(&path[..prefix.len()], prefix);
    // `base` itself, or `base.<format>` (`/v1/charges.json`), which Rails' `(.:format)`
    // and Spring's suffix matching route to `base`'s handler.
    let itself = |base: &[u8]| {
        same(path, base)
            || (starts(base)
                && path.get(base.len()) == Some(&b'.')
                && path[base.len() + 1..]
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric())
                && path.len() > base.len() + 1)
    };
    if let Some(base) = pattern.strip_suffix("/*") {
        let base = normal_path(base);
        let base = base.trim_end_matches('/').as_bytes();
        itself(base) || (starts(base) && path.get(base.len()) == Some(&b'/'))
    } else if let Some(prefix) = pattern.strip_suffix('*') {
        starts(prefix.as_bytes())
    } else {
        itself(normal_path(pattern).as_bytes())
    }
}

/// Checks a path pattern as [`listed`] reads it: `*`, or a path that starts with `/`,
/// in visible ASCII without `?` or `#`, whose only `*` ends it, written in normal form
/// (a pattern written otherwise could never match, or not where it seems to). The
/// error says what to write.
pub fn check_pattern(pattern: &str) -> Result<(), InvalidSetting> {
    if pattern == "*" {
        return Ok(());
    }
    let visible = |c: char| c.is_ascii_graphic() && !matches!(c, '?' | '#');
    let star = pattern.find('*');
    if !pattern.starts_with('/')
        || star.is_some_and(|at| at != pattern.len() - 1)
        || !pattern.chars().all(visible)
    {
        return Err(InvalidSetting::from(format!("{pattern:?} must start with /, hold visible ASCII without ? or #, and may end in * (a prefix) or /* (a path and what is under it), e.g. \"/v1/payouts/*\"")));
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
    // (A pattern ending in `/*` is split above, so a plain prefix's base never ends in
    // a slash: `/v1/pay*` is `/v1/pay` and `*`, `/v1/x/*` is `/v1/x` and `/*`.)
    if normal != base || ambiguous_path(base) {
        return Err(InvalidSetting::from(format!(
            "{pattern:?} is matched as \"{normal}{star}\": write it so"
        )));
    }
    Ok(())
}

/// Whether servers disagree on what `path` names: it holds an encoded `/`, `\` or `;`
/// (Go and WSGI decode them, others don't), a plain `\` (IIS reads it as `/`), a `;`
/// parameter (Tomcat drops it), a `.` or `..` segment, plain, encoded or with
/// parameters (some resolve them, some route them as written), a letter that case-folds
/// to ASCII (`ſ`, `K` (Kelvin), `ı`, `İ`: raw or percent-encoded), or an escape some decoder reads otherwise (`%00`, `%u…`,
/// overlong UTF-8 `%C0`/`%C1`).
pub fn ambiguous_path(path: &str) -> bool {
    // Most paths: ASCII without an escape, a `;` or a `\` — then only a dot segment
    // can make them ambiguous (every confusable is non-ASCII or escaped).
    if path
        .bytes()
        .all(|b| b.is_ascii() && !matches!(b, b'%' | b';' | b'\\'))
    {
        return path.split('/').any(|s| s == "." || s == "..");
    }
    let lower = |i: usize| path.as_bytes().get(i).map(u8::to_ascii_lowercase);
    let odd_escape = path.match_indices('%').any(|(i, _)| {
        let pair = (lower(i + 1), lower(i + 2));
        matches!(
            pair,
            (Some(b'2'), Some(b'f'))
                | (Some(b'5'), Some(b'c'))
                | (Some(b'3'), Some(b'b'))
                | (Some(b'0'), Some(b'0'))
                | (Some(b'c'), Some(b'0' | b'1'))
                | (Some(b'u'), _)
        )
    });
    let dot_segment = |segment: &str| {
        let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
        let bare = decoded.split(';').next().unwrap_or("");
        bare == "." || bare == ".."
    };
    let lowered = path.to_ascii_lowercase();
    let confusable = CONFUSABLES
        .iter()
        .any(|(raw, encoded, _)| path.contains(raw) || lowered.contains(encoded));
    odd_escape
        || path.contains(';')
        || path.contains('\\')
        || confusable
        || path.split('/').any(dot_segment)
}

/// `path` as servers commonly take it (RFC 3986 §6.2.2): percent-encoded unreserved
/// characters decoded (`%63` is `c`; other escapes kept, their hex in capitals), `.`
/// and `..` segments removed, repeated slashes collapsed, no trailing slash (but `/`).
/// Borrowed when it is already so.
pub fn normal_path(path: &str) -> Cow<'_, str> {
    normalize(path, true)
}

/// [`normal_path`], with its `.` and `..` segments kept as written unless `resolve_dots`.
fn normalize(path: &str, resolve_dots: bool) -> Cow<'_, str> {
    let dots_to_resolve = resolve_dots && path.split('/').any(|s| s == "." || s == "..");
    let plain = path.starts_with('/')
        && !path.contains("//")
        && !path.contains('%')
        && (path.len() == 1 || !path.ends_with('/'))
        && !dots_to_resolve;
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
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" => {}
            "." if resolve_dots => {}
            ".." if resolve_dots => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// Found untested by cargo-mutants (docs/mutants.md).
    #[wasm_bindgen_test::wasm_bindgen_test(unsupported = test)]
    fn parameters_are_stripped_segment_by_segment_and_patterns_say_what_they_are() {
        assert_eq!(strip_params("/a;x/b;y=1;z"), "/a/b");
        assert_eq!(strip_params("a;x"), "a");
        let p = PathPattern::new("/v1/Charges/*").unwrap();
        assert_eq!(p.as_str(), "/v1/Charges/*");
        assert!(!p.is_case_sensitive());
        assert!(p.case_sensitive(true).is_case_sensitive());
    }

    /// Found untested by cargo-mutants (docs/mutants.md): each legacy escape reads as
    /// the byte a legacy decoder makes of it, and nothing else does.
    #[wasm_bindgen_test::wasm_bindgen_test(unsupported = test)]
    fn legacy_escapes_read_as_legacy_decoders_read_them() {
        // (And a reading that keeps dot segments keeps `.` too.)
        assert_eq!(normalize("/a//./b", false), "/a/./b");
        assert_eq!(normalize("/a//./b", true), "/a/b");
        assert_eq!(legacy_escape("%c0%ae/x"), Some((b'.', 6)));
        assert_eq!(legacy_escape("%C1%9C"), Some((b'\\', 6)));
        assert_eq!(legacy_escape("%C0%AF"), Some((b'/', 6)));
        assert_eq!(legacy_escape("%u005C"), Some((b'\\', 6)));
        assert_eq!(legacy_escape("%u002e"), Some((b'.', 6)));
        for not_one in [
            "%C0AE", "%C2%AE", "%u0100", "%u00", "%C0%", "%2e", "%C0%0A", "%20%2e", "%E1%81",
        ] {
            assert_eq!(legacy_escape(not_one), None, "{not_one}");
        }
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
            let error = check_pattern(bad).unwrap_err().to_string();
            assert!(error.contains(says), "{bad}: {error}");
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
            listed(&["/v1/charges"], "/V1/Charges"),
            "lists match without regard to case, as most routers do"
        );
    }

    fn payouts() -> Vec<PathPattern> {
        vec![
            PathPattern::new("/v1/payouts/*").unwrap(),
            PathPattern::new("/v1/exact").unwrap().case_sensitive(true),
        ]
    }

    /// Route 0 guards PUT; the defaults guard POST and PATCH.
    fn choose(method: &str, path: &str) -> PathChoice {
        choose_route(&payouts(), path, |route| match route {
            Some(0) => method == "PUT",
            _ => ["POST", "PATCH"].contains(&method),
        })
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_path_guarded_in_any_reading_is_refused_in_every_spelling() {
        assert_eq!(choose("PUT", "/v1/payouts/7"), PathChoice::Route(Some(0)));
        for spelling in [
            "/v1/payouts;x/7",
            "/v1/payouts/7;jsessionid=1",
            "/v1%2Fpayouts/7",
            "/v1%2fpayouts/7",
            "/v1%5Cpayouts/7",
            "/v1\\payouts/7",
            "/v1/other/../payouts/7",
            "/v1/other/%2e%2e/payouts/7",
            "/v1/payouts/../../v1/payouts/7",
            "/V1;a/PAYOUTS/7",
            "/v1;x%2Fpayouts/7",
            "/v1/payouts%3Bx/7",
            "/v1/x/..;/payouts/7",
            "/v1/payout%C5%BF/7",
            "/v1/payout\u{17f}/7",
            "/v1/payouts/..%00/x",
            "/v1/x/%u002e%u002e/payouts/7",
            "/v1/x/%c0%ae%c0%ae/payouts/7",
        ] {
            assert_eq!(choose("PUT", spelling), PathChoice::Ambiguous, "{spelling}");
            assert!(
                !matches!(choose("GET", spelling), PathChoice::Ambiguous),
                "{spelling}: a reading no route guards is not idem's business"
            );
        }
        assert_eq!(
            choose("POST", "/v2;x/7"),
            PathChoice::Ambiguous,
            "the defaults guard POST on every path no route takes"
        );
        assert_eq!(
            choose("POST", "/v1/payouts/7;x=1"),
            PathChoice::Route(Some(0)),
            "every reading is under the payouts route, which guards PUT only"
        );
        // As written, this one is under /v1/payouts/*; resolved, it is not.
        assert_eq!(choose("PUT", "/v1/payouts/../x"), PathChoice::Ambiguous);
        assert_eq!(
            choose("DELETE", "/v1/payouts;x/7"),
            PathChoice::Route(None),
            "no reading guards DELETE"
        );
        assert_eq!(
            choose("PUT", "/v2;x/7"),
            PathChoice::Route(None),
            "no reading is under a route that guards PUT"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_format_suffix_names_the_route_s_resource() {
        for spelling in ["/v1/payouts.json", "/v1/payouts/7.json", "/v1/exact.xml"] {
            assert!(
                matches!(choose("PUT", spelling), PathChoice::Route(Some(_))),
                "{spelling}"
            );
        }
        assert_eq!(choose("PUT", "/v1/exact.xml"), PathChoice::Route(Some(1)));
        assert_eq!(choose("PUT", "/v1/exact.x/y"), PathChoice::Route(None));
        assert_eq!(choose("PUT", "/v1/exactly"), PathChoice::Route(None));
        assert_eq!(choose("PUT", "/v1/exact."), PathChoice::Route(None));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn routes_match_without_regard_to_case_unless_told() {
        for spelling in [
            "/v1/Payouts/7",
            "/V1/PAYOUTS/7",
            "/v1/payouts/7/",
            "/v1/%70ayouts/7",
        ] {
            assert_eq!(
                choose("PUT", spelling),
                PathChoice::Route(Some(0)),
                "{spelling}"
            );
        }
        assert_eq!(choose("PUT", "/v1/exact"), PathChoice::Route(Some(1)));
        assert_eq!(
            choose("PUT", "/v1/Exact"),
            PathChoice::Route(None),
            "a case-sensitive route"
        );
        assert!(PathPattern::new("/v1/payouts/*")
            .unwrap()
            .matches("/V1/payouts"));
        assert!(!PathPattern::new("/v1/x")
            .unwrap()
            .case_sensitive(true)
            .matches("/v1/X"));
        assert!(PathPattern::new("/v1/x/").is_err(), "checked as written");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn readings_of_a_path() {
        let read = readings("/a;p/b%2Fc/../d");
        for expected in [
            "/a;p/b%2Fc/../d",
            "/a;p/d",
            "/a/b%2Fc/../d",
            "/a/d",
            "/a/b/c/../d",
            "/a/b/d",
        ] {
            assert!(read.iter().any(|r| r == expected), "{expected} in {read:?}");
        }
        assert_eq!(readings("/v1/charges"), vec![String::from("/v1/charges")]);
        assert_eq!(
            readings("/caf\u{e9}\\x"),
            vec![String::from("/caf\u{e9}\\x"), String::from("/caf\u{e9}/x")]
        );
    }
}
