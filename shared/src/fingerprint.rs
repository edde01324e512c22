//! What a request was, as 32 bytes: two requests with the same fingerprint are the
//! same request for idempotency purposes.

use crate::json;
use crate::scope::tagged_hash;
use alloc::vec::Vec;
use core::fmt;

/// The parts of a request that make up its fingerprint.
#[derive(Clone, Copy, Debug)]
pub struct RequestParts<'a> {
    /// The method, e.g. `POST` (compared case-sensitively, as HTTP does).
    pub method: &'a str,
    /// The path and query as sent, e.g. `/v1/charges?expand=customer`.
    pub path_and_query: &'a str,
    /// The `Content-Type` header value, if any.
    pub content_type: Option<&'a str>,
    /// The whole body.
    pub body: &'a [u8],
}

/// SHA-256 over a length-prefixed, domain-separated encoding of method, path and
/// query, media type and body. JSON bodies (`application/json`, `*/*+json`) are
/// canonicalised first ([`json::canonicalize`]); a body that is not valid JSON is
/// hashed as raw bytes under a different tag, so it can never collide with a JSON one.
///
/// The content type contributes its media type only (lower-cased, parameters such as
/// `charset` dropped): the body bytes already carry the encoding that matters.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

const TAG: &[u8] = b"idem/fingerprint/v1";

impl Fingerprint {
    /// Fingerprints a request.
    pub fn of(req: &RequestParts<'_>) -> Self {
        let mut essence = [0u8; 128];
        let mut canonical = None;
        Fingerprint(tagged_hash(TAG, &parts(req, &mut essence, &mut canonical)))
    }

    /// The exact bytes [`Fingerprint::of`] hashes with SHA-256, for a caller that
    /// hashes them elsewhere — the runtime's WebCrypto, say, whose native SHA-256 beats
    /// WASM on large bodies and loses on small ones (the bench compares them; the edge
    /// hands it bodies of 4 KiB and more). Wrap the 32-byte digest in [`Fingerprint`].
    pub fn message(req: &RequestParts<'_>) -> Vec<u8> {
        let mut essence = [0u8; 128];
        let mut canonical = None;
        let parts = parts(req, &mut essence, &mut canonical);
        let len = 8 + TAG.len() + parts.iter().map(|p| 8 + p.len()).sum::<usize>();
        let mut out = Vec::with_capacity(len);
        for part in core::iter::once(TAG).chain(parts) {
            out.extend_from_slice(&(part.len() as u64).to_be_bytes());
            out.extend_from_slice(part);
        }
        out
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> alloc::string::String {
        crate::hex(&self.0)
    }

    /// Parses 64 hex digits (either case); `None` for anything else.
    pub fn from_hex(text: &[u8]) -> Option<Fingerprint> {
        if text.len() != 64 {
            return None;
        }
        let digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
        let mut out = [0u8; 32];
        for (i, pair) in text.chunks(2).enumerate() {
            out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(Fingerprint(out))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

/// What is hashed, in order: method, path and query, media type, body kind, body.
fn parts<'a>(
    req: &RequestParts<'a>,
    essence: &'a mut [u8; 128],
    canonical: &'a mut Option<Vec<u8>>,
) -> [&'a [u8]; 5] {
    let media_type = req.content_type.map(media_type).unwrap_or_default();
    let essence = lowercase_into(media_type, essence);
    if is_json(essence) {
        *canonical = json::canonicalize(req.body).ok();
    }
    let (body_tag, body): (&[u8], &[u8]) = match canonical {
        Some(c) => (b"json", c),
        None => (b"raw", req.body),
    };
    [
        req.method.as_bytes(),
        req.path_and_query.as_bytes(),
        essence,
        body_tag,
        body,
    ]
}

fn media_type(content_type: &str) -> &str {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim_matches([' ', '\t'])
}

/// Lower-cases into `buf`; a media type longer than `buf` is kept as is (still exact,
/// just case-sensitive), since real media types are far shorter.
fn lowercase_into<'b>(s: &'b str, buf: &'b mut [u8; 128]) -> &'b [u8] {
    if s.len() > buf.len() {
        return s.as_bytes();
    }
    let out = &mut buf[..s.len()];
    out.copy_from_slice(s.as_bytes());
    out.make_ascii_lowercase();
    out
}

/// The media type of a `Content-Type` value, lower-cased whatever its length (the
/// selected fingerprint's; [`Fingerprint::of`] keeps its own buffer's limit).
pub(crate) fn media_essence(content_type: Option<&str>) -> alloc::string::String {
    content_type
        .map(media_type)
        .unwrap_or_default()
        .to_ascii_lowercase()
}

pub(crate) fn is_json(essence: &[u8]) -> bool {
    essence == b"application/json" || (essence.ends_with(b"+json") && essence.contains(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn fp(ct: Option<&str>, body: &[u8]) -> Fingerprint {
        Fingerprint::of(&RequestParts {
            method: "POST",
            path_and_query: "/v1/charges",
            content_type: ct,
            body,
        })
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_media_type_is_case_folded_up_to_its_buffer_and_kept_beyond() {
        // Found untested by cargo-mutants (docs/mutants.md): 128 bytes fold, 129 are
        // kept as they are (and must not overrun the buffer).
        let body = br#"{"a":1}"#;
        let at = |n: usize, upper: bool| {
            let sub = "x".repeat(n - "application/".len());
            let ct = alloc::format!("application/{sub}");
            let ct = if upper { ct.to_uppercase() } else { ct };
            fp(Some(&ct), body)
        };
        assert_eq!(at(128, true), at(128, false));
        assert_ne!(at(129, true), at(129, false));
        // What a log line shows of a fingerprint: its first 8 bytes.
        assert_eq!(
            alloc::format!("{:?}", Fingerprint([0xab; 32])),
            "Fingerprint(abababababababab)"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_message_is_what_is_hashed() {
        use sha2::{Digest, Sha256};
        for (ct, body) in [
            (Some("application/json"), &br#"{ "b": 1, "a": [true] }"#[..]),
            (Some("text/plain"), b"hello"),
            (None, b""),
            (Some("application/json"), b"{not json"),
        ] {
            let req = RequestParts {
                method: "POST",
                path_and_query: "/v1/charges?x=1",
                content_type: ct,
                body,
            };
            let digest: [u8; 32] = Sha256::digest(Fingerprint::message(&req)).into();
            assert_eq!(
                Fingerprint(digest),
                Fingerprint::of(&req),
                "{ct:?} {body:?}"
            );
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn json_bodies_are_canonical() {
        let a = fp(
            Some("application/json"),
            br#"{"amount":100,"currency":"usd"}"#,
        );
        let b = fp(
            Some("Application/JSON; charset=utf-8"),
            b"{ \"currency\": \"usd\",\n \"amount\": 100 }",
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            fp(
                Some("application/json"),
                br#"{"amount":101,"currency":"usd"}"#
            )
        );
        assert_eq!(
            fp(Some("application/problem+json"), b"[1, 2]"),
            fp(Some("application/problem+json"), b"[1,2]")
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn other_bodies_are_exact() {
        assert_ne!(
            fp(Some("text/plain"), b"{\"a\":1}"),
            fp(Some("text/plain"), b"{ \"a\":1}")
        );
        assert_ne!(fp(None, b"x"), fp(Some("text/plain"), b"x"));
        // Invalid JSON falls back to the raw bytes, and never equals a JSON body.
        assert_ne!(
            fp(Some("application/json"), b"{"),
            fp(Some("application/json"), b"{ ")
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn every_part_counts() {
        let base = RequestParts {
            method: "POST",
            path_and_query: "/a?x=1",
            content_type: None,
            body: b"",
        };
        let f = Fingerprint::of(&base);
        assert_ne!(
            f,
            Fingerprint::of(&RequestParts {
                method: "PATCH",
                ..base
            })
        );
        assert_ne!(
            f,
            Fingerprint::of(&RequestParts {
                path_and_query: "/a?x=2",
                ..base
            })
        );
        assert_ne!(
            f,
            Fingerprint::of(&RequestParts {
                body: b"\0",
                ..base
            })
        );
        // Length prefixes: moving bytes between fields changes the fingerprint.
        assert_ne!(
            Fingerprint::of(&RequestParts {
                method: "POST/",
                path_and_query: "a",
                ..base
            }),
            Fingerprint::of(&RequestParts {
                method: "POST",
                path_and_query: "/a",
                ..base
            }),
        );
    }
}
