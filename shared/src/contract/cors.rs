//! What a browser needs to read idem's own answers — replays and refusals — across
//! origins ([`Cors`]), and which extra headers a replay may carry
//! ([`check_replay_header`]).
//!
//! An API's own answers carry its CORS headers, computed for the request's `Origin`.
//! idem's do not come from the API: a replay, a `409` while the first attempt runs, a
//! `422`. Without `Access-Control-Allow-Origin` a browser hides them from the page that
//! asked, so a retry from a browser could never learn its payment's result. The stored
//! `Access-Control-*` of the first answer are not replayed (they were computed for that
//! request's `Origin`); idem writes its own for the requesting `Origin`, if the route
//! allows it. Preflights (`OPTIONS`) are never guarded: they reach the API, which must
//! allow the `Idempotency-Key` header in them.

use crate::InvalidSetting;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// Whether an answer header may be added to the stored and replayed ones: not one
/// that describes the connection or the moment (`Date`, `Age`, hop-by-hop, framing),
/// not idem's own, not `Set-Cookie` (its own setting: a cookie is usually one
/// client's), and not `Access-Control-*` (see the [module docs](self)). Returns the
/// name lower-cased.
pub fn check_replay_header(name: &str) -> Result<String, InvalidSetting> {
    let name = name.trim().to_ascii_lowercase();
    let token = super::is_header_name(&name);
    if !token {
        return Err(InvalidSetting::from(format!(
            "{name:?} is not a header name"
        )));
    }
    const NEVER: [&str; 8] = [
        "content-length",
        "date",
        "age",
        super::IDEMPOTENT_REPLAYED,
        super::KEY_TTL,
        super::wait::PREFERENCE_APPLIED,
        "set-cookie",
        "access-control-allow-origin",
    ];
    if name.starts_with("access-control-") {
        return Err(InvalidSetting::from(format!(
            "{name} is not replayed as stored: it was computed for the first request's \
             Origin; list the origins browsers may read replays from instead (--cors-origin)"
        )));
    }
    if name == "set-cookie" {
        return Err(InvalidSetting::from(String::from(
            "set-cookie is replayed only with --replay-set-cookie: a cookie is usually one client's",
        )));
    }
    if NEVER.contains(&name.as_str())
        || name.starts_with("idem-")
        || !super::answer::relayed_answer_header(&name)
    {
        return Err(InvalidSetting::from(format!(
            "{name} cannot be replayed: it describes the connection or the moment of the \
             first answer, or idem sets it on each answer itself"
        )));
    }
    Ok(name)
}

/// The origins whose pages may read idem's own answers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cors {
    /// `None`: any origin (`*`); otherwise these, exactly as browsers send them.
    origins: Option<Vec<String>>,
    /// Whether the page may send and read credentials (cookies, `Authorization`).
    credentials: bool,
}

/// The headers a page needs to read from idem's answers, whether they carry them or
/// not (a `409`'s `Retry-After`, a replay's `Idempotent-Replayed`).
const EXPOSED: [&str; 5] = [
    super::IDEMPOTENT_REPLAYED,
    super::KEY_TTL,
    "retry-after",
    "location",
    super::wait::PREFERENCE_APPLIED,
];

impl Cors {
    /// Allows `origins` (`scheme://host[:port]`, or `*` alone for any) to read idem's
    /// answers, with credentials when `credentials` (never with `*`: browsers refuse
    /// it, and it would let any site read answers to its visitors' credentials).
    pub fn new(origins: &[impl AsRef<str>], credentials: bool) -> Result<Cors, InvalidSetting> {
        let origins: Vec<&str> = origins.iter().map(|o| o.as_ref().trim()).collect();
        let origins = match origins.as_slice() {
            [] => return Err(InvalidSetting::from(String::from("no origins"))),
            ["*"] if credentials => {
                return Err(InvalidSetting::from(String::from(
                    "`*` with credentials: name the origins that may read answers to \
                     their visitors' credentials",
                )))
            }
            ["*"] => None,
            list => {
                let mut out = Vec::new();
                for origin in list {
                    check_origin(origin)?;
                    out.push(origin.to_ascii_lowercase());
                }
                Some(out)
            }
        };
        Ok(Cors {
            origins,
            credentials,
        })
    }

    /// The CORS headers for idem's own answer to a request from `origin` (its `Origin`
    /// header's values), or none when it has none, several, or one not allowed. The
    /// page may read idem's headers and every header the answer `carries` (a replay's
    /// `ETag`, `Link`…).
    pub fn answer_headers<'a, 'b>(
        &self,
        origin: impl IntoIterator<Item = &'a [u8]>,
        carries: impl IntoIterator<Item = &'b str>,
    ) -> Vec<(&'static str, String)> {
        let mut values = origin.into_iter();
        let (Some(origin), None) = (values.next(), values.next()) else {
            return Vec::new();
        };
        let Ok(origin) = core::str::from_utf8(super::trim_ows(origin)) else {
            return Vec::new();
        };
        let allowed = match &self.origins {
            None => "*",
            Some(list) if list.iter().any(|o| o.eq_ignore_ascii_case(origin)) => origin,
            Some(_) => return Vec::new(),
        };
        let mut expose: Vec<String> = EXPOSED.iter().map(|h| String::from(*h)).collect();
        for name in carries {
            let name = name.to_ascii_lowercase();
            // Idem's private headers are never named to a page (nor sent to it).
            let hidden =
                name.starts_with("access-control-") || name == "vary" || name.starts_with("idem-");
            if !hidden && !expose.contains(&name) {
                expose.push(name);
            }
        }
        let mut out = Vec::with_capacity(4);
        out.push(("access-control-allow-origin", String::from(allowed)));
        out.push(("access-control-expose-headers", expose.join(", ")));
        if self.credentials {
            out.push(("access-control-allow-credentials", String::from("true")));
        }
        if self.origins.is_some() {
            // The answer differs by Origin: a cache must not give one origin's to another.
            out.push(("vary", String::from("Origin")));
        }
        out
    }
}

/// An origin as browsers serialize it: `https://host[:port]` (or `http://`), no path.
fn check_origin(origin: &str) -> Result<(), String> {
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or_else(|| {
            format!("{origin:?} is not an origin: scheme://host[:port], e.g. https://app.example")
        })?;
    let host_ok = !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b));
    if !host_ok {
        return Err(format!(
            "{origin:?} is not an origin: scheme://host[:port], no path, e.g. https://app.example"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn only_headers_of_the_answer_itself_can_be_replayed() {
        assert_eq!(check_replay_header(" ETag "), Ok(String::from("etag")));
        for ok in [
            "link",
            "retry-after",
            "x-ratelimit-remaining",
            "ratelimit-policy",
        ] {
            assert!(check_replay_header(ok).is_ok(), "{ok}");
        }
        for bad in [
            "date",
            "content-length",
            "connection",
            "transfer-encoding",
            "set-cookie",
            "access-control-allow-origin",
            "idempotent-replayed",
            "idempotency-ttl",
            "idem-disposition",
            "a b",
            "",
        ] {
            assert!(check_replay_header(bad).is_err(), "{bad}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn only_allowed_origins_read_idem_s_answers() {
        let cors = Cors::new(&["https://app.example"], true).unwrap();
        let none: [&str; 0] = [];
        let got = cors.answer_headers(
            [&b"https://app.example"[..]],
            ["ETag", "vary", "idem-disposition", "idem-stored-headers"],
        );
        assert_eq!(
            got[0],
            ("access-control-allow-origin", "https://app.example".into())
        );
        assert!(got[1].1.contains("idempotent-replayed") && got[1].1.contains("etag"));
        assert!(!got[1].1.contains("vary") && !got[1].1.contains("idem-"));
        assert!(got.contains(&("access-control-allow-credentials", "true".into())));
        assert!(got.contains(&("vary", "Origin".into())));
        assert!(cors
            .answer_headers([&b"https://evil.example"[..]], none)
            .is_empty());
        assert!(cors.answer_headers(core::iter::empty(), none).is_empty());
        assert!(
            cors.answer_headers([&b"https://app.example"[..], b"https://app.example"], none)
                .is_empty(),
            "two origins"
        );
        let any = Cors::new(&["*"], false).unwrap();
        let got = any.answer_headers([&b"https://anyone.example"[..]], none);
        assert_eq!(got[0].1, "*");
        assert!(!got
            .iter()
            .any(|(n, _)| *n == "vary" || *n == "access-control-allow-credentials"));
        assert!(Cors::new(&["*"], true).is_err());
        for bad in [
            "app.example",
            "https://app.example/path",
            "ftp://x",
            "https://",
        ] {
            assert!(Cors::new(&[bad], false).is_err(), "{bad}");
        }
    }
}
