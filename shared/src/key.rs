//! The `Idempotency-Key` header: an RFC 8941 sf-string (`"abc"`), or a bare token.

use alloc::string::String;
use core::fmt;

/// Longest accepted key, in characters (after unquoting).
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key: 1–255 characters of visible ASCII (0x20–0x7E).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

/// Why a header value is not a valid key. The `Display` text is meant for API clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyError {
    /// The header is present but empty (or `""`).
    Empty,
    /// Longer than [`MAX_KEY_LEN`] characters after unquoting.
    TooLong,
    /// A character outside visible ASCII (a control character or non-ASCII byte).
    InvalidCharacter,
    /// Starts with `"` but is not a well-formed sf-string (unterminated, bad escape,
    /// or trailing characters after the closing quote).
    BadString,
    /// A bare token containing characters that need quoting (space, `"`, `\`, `,`, `;`).
    BadToken,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyError::Empty => "the Idempotency-Key header is empty",
            KeyError::TooLong => "the Idempotency-Key is longer than 255 characters",
            KeyError::InvalidCharacter => {
                "the Idempotency-Key may only contain visible ASCII characters"
            }
            KeyError::BadString => {
                "the Idempotency-Key is not a valid structured-field string (RFC 8941)"
            }
            KeyError::BadToken => {
                "an unquoted Idempotency-Key may not contain spaces, quotes, backslashes, commas or semicolons"
            }
        })
    }
}

impl core::error::Error for KeyError {}

impl IdempotencyKey {
    /// Parses a raw header value.
    ///
    /// Optional surrounding whitespace (SP, HTAB) is ignored, as HTTP field parsing does.
    /// A value starting with `"` must be an RFC 8941 sf-string: printable ASCII, with
    /// only `\"` and `\\` as escapes, and nothing after the closing quote. Anything else
    /// is taken as a bare token and must not contain characters that would need quoting.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        let raw = trim_ows(raw);
        if raw.is_empty() {
            return Err(KeyError::Empty);
        }
        let key = if raw[0] == b'"' {
            parse_sf_string(raw)?
        } else {
            parse_bare(raw)?
        };
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        Ok(IdempotencyKey(key))
    }

    /// The key's characters, unquoted.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

fn is_visible(b: u8) -> bool {
    (0x20..=0x7e).contains(&b)
}

fn parse_sf_string(raw: &[u8]) -> Result<String, KeyError> {
    let mut out = String::new();
    let mut i = 1;
    loop {
        let Some(&b) = raw.get(i) else {
            return Err(KeyError::BadString);
        };
        i += 1;
        match b {
            b'"' => break,
            b'\\' => match raw.get(i) {
                Some(&e @ (b'"' | b'\\')) => {
                    out.push(e as char);
                    i += 1;
                }
                _ => return Err(KeyError::BadString),
            },
            b if is_visible(b) => out.push(b as char),
            _ => return Err(KeyError::InvalidCharacter),
        }
        if out.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
    }
    if i != raw.len() {
        return Err(KeyError::BadString);
    }
    Ok(out)
}

fn parse_bare(raw: &[u8]) -> Result<String, KeyError> {
    if raw.len() > MAX_KEY_LEN {
        // Still report bad characters first: they are the more useful error.
        if raw.iter().any(|&b| !is_visible(b)) {
            return Err(KeyError::InvalidCharacter);
        }
        return Err(KeyError::TooLong);
    }
    let mut out = String::with_capacity(raw.len());
    for &b in raw {
        match b {
            b' ' | b'"' | b'\\' | b',' | b';' => return Err(KeyError::BadToken),
            b if is_visible(b) => out.push(b as char),
            _ => return Err(KeyError::InvalidCharacter),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// Found untested by cargo-mutants (docs/mutants.md): what a client, a log line
    /// and an operator read.
    #[wasm_bindgen_test(unsupported = test)]
    fn messages_say_what_they_are_about() {
        use alloc::format;
        use alloc::string::ToString;
        assert_eq!(
            KeyError::Empty.to_string(),
            "the Idempotency-Key header is empty"
        );
        let key = IdempotencyKey::parse(b"order-7").unwrap();
        assert_eq!(key.to_string(), "order-7");
        assert_eq!(format!("{key:?}"), "\"order-7\"");
        assert_eq!(
            crate::Refusal::Fenced { current: 7 }.to_string(),
            "fenced: the record now belongs to token 7"
        );
        assert_eq!(
            crate::record::DecodeError::Truncated.to_string(),
            "record truncated"
        );
    }

    fn ok(raw: &str) -> String {
        IdempotencyKey::parse(raw.as_bytes())
            .unwrap()
            .as_str()
            .into()
    }
    fn err(raw: &[u8]) -> KeyError {
        IdempotencyKey::parse(raw).unwrap_err()
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn accepts_sf_strings_and_bare_tokens() {
        assert_eq!(
            ok("\"8e03978e-40d5-43e8-bc93-6894a57f9324\""),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
        assert_eq!(ok("abc-123_X.y:z/+="), "abc-123_X.y:z/+=");
        assert_eq!(ok("  \"with space\"\t"), "with space");
        assert_eq!(ok(r#""esc \"q\" \\ b""#), r#"esc "q" \ b"#);
        assert_eq!(ok(&"k".repeat(255)), "k".repeat(255));
        assert_eq!(
            ok(&alloc::format!("\"{}\"", "k".repeat(255))),
            "k".repeat(255)
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn rejects_malformed_keys() {
        assert_eq!(err(b""), KeyError::Empty);
        assert_eq!(err(b"   "), KeyError::Empty);
        assert_eq!(err(b"\"\""), KeyError::Empty);
        assert_eq!(err("k".repeat(256).as_bytes()), KeyError::TooLong);
        assert_eq!(
            err(alloc::format!("\"{}\"", "k".repeat(256)).as_bytes()),
            KeyError::TooLong
        );
        assert_eq!(err("caf\u{e9}".as_bytes()), KeyError::InvalidCharacter);
        assert_eq!(err(b"a\x01b"), KeyError::InvalidCharacter);
        assert_eq!(err(b"\"a\x7fb\""), KeyError::InvalidCharacter);
        assert_eq!(err(b"\"unterminated"), KeyError::BadString);
        assert_eq!(err(b"\"bad \\n escape\""), KeyError::BadString);
        assert_eq!(err(b"\"a\" trailing"), KeyError::BadString);
        assert_eq!(err(b"two words"), KeyError::BadToken);
        assert_eq!(err(b"a,b"), KeyError::BadToken);
    }
}
