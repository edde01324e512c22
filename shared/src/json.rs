//! Canonical JSON, so that key order and insignificant whitespace don't change a
//! fingerprint.
//!
//! The canonical form of a JSON text is:
//! * no whitespace between tokens;
//! * object members sorted by key (by the key's UTF-8 bytes, i.e. by code point);
//! * strings re-encoded with the fewest escapes: `\"`, `\\`, `\b \f \n \r \t`, other
//!   control characters as `\u00xx`, everything else as raw UTF-8 (so `"\u00e9"` and
//!   `"é"` are the same string);
//! * numbers kept exactly as written (`1`, `1.0` and `1e0` stay different: an API
//!   may well treat them differently, and a fingerprint must not hide that).
//!
//! Input that is not a single valid JSON value (including duplicate object keys, lone
//! surrogates, or nesting deeper than [`MAX_DEPTH`]) is an error; the fingerprint then
//! falls back to the raw bytes.

use alloc::borrow::Cow;
use alloc::vec::Vec;
use core::ops::Range;

/// Deepest nesting of arrays and objects accepted.
pub const MAX_DEPTH: usize = 128;

/// Why a body is not canonicalisable JSON. Carries the byte offset of the problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonError {
    /// Offset into the input where parsing stopped.
    pub offset: usize,
}

/// Returns the canonical encoding of the JSON text `input`.
pub fn canonicalize(input: &[u8]) -> Result<Vec<u8>, JsonError> {
    let mut p = Parser {
        s: input,
        i: 0,
        members: Vec::new(),
        scratch: Vec::new(),
    };
    let mut out = Vec::with_capacity(input.len());
    p.ws();
    p.value(&mut out, 0)?;
    p.ws();
    if p.i != input.len() {
        return Err(p.err());
    }
    Ok(out)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    /// Member lists by nesting depth, reused from object to object.
    members: Vec<Vec<Member<'a>>>,
    /// Where an out-of-order object's members are rearranged; reused.
    scratch: Vec<u8>,
}

/// An object member already written out: its decoded key, and where its canonical
/// `"key":value` bytes are in the output.
struct Member<'a> {
    key: Cow<'a, [u8]>,
    bytes: Range<usize>,
}

impl<'a> Parser<'a> {
    fn err(&self) -> JsonError {
        JsonError { offset: self.i }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn expect(&mut self, b: u8) -> Result<(), JsonError> {
        if self.peek() == Some(b) {
            self.i += 1;
            Ok(())
        } else {
            Err(self.err())
        }
    }

    fn literal(&mut self, lit: &[u8], out: &mut Vec<u8>) -> Result<(), JsonError> {
        if self.s[self.i..].starts_with(lit) {
            self.i += lit.len();
            out.extend_from_slice(lit);
            Ok(())
        } else {
            Err(self.err())
        }
    }

    fn value(&mut self, out: &mut Vec<u8>, depth: usize) -> Result<(), JsonError> {
        match self.peek() {
            Some(b'{') => self.object(out, depth + 1),
            Some(b'[') => self.array(out, depth + 1),
            Some(b'"') => {
                let s = self.string()?;
                write_decoded(&s, out);
                Ok(())
            }
            Some(b't') => self.literal(b"true", out),
            Some(b'f') => self.literal(b"false", out),
            Some(b'n') => self.literal(b"null", out),
            Some(b'-' | b'0'..=b'9') => self.number(out),
            _ => Err(self.err()),
        }
    }

    /// Members are written straight to `out`, then rearranged only if their keys
    /// came out of order — no allocation per member.
    fn object(&mut self, out: &mut Vec<u8>, depth: usize) -> Result<(), JsonError> {
        if depth > MAX_DEPTH {
            return Err(self.err());
        }
        self.expect(b'{')?;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            out.extend_from_slice(b"{}");
            return Ok(());
        }
        out.push(b'{');
        let body = out.len();
        while self.members.len() <= depth {
            self.members.push(Vec::new());
        }
        let mut members = core::mem::take(&mut self.members[depth]);
        members.clear();
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(self.err());
            }
            let key = self.string()?;
            self.ws();
            self.expect(b':')?;
            self.ws();
            if !members.is_empty() {
                out.push(b',');
            }
            let start = out.len();
            write_decoded(&key, out);
            out.push(b':');
            self.value(out, depth)?;
            members.push(Member {
                key,
                bytes: start..out.len(),
            });
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    break;
                }
                _ => return Err(self.err()),
            }
        }
        // Strictly ascending keys: already canonical, and no duplicates.
        if !members.windows(2).all(|w| w[0].key < w[1].key) {
            members.sort_unstable_by(|a, b| a.key.cmp(&b.key));
            if members.windows(2).any(|w| w[0].key == w[1].key) {
                return Err(self.err());
            }
            self.scratch.clear();
            self.scratch.extend_from_slice(&out[body..]);
            out.truncate(body);
            for (n, m) in members.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&self.scratch[m.bytes.start - body..m.bytes.end - body]);
            }
        }
        out.push(b'}');
        members.clear();
        self.members[depth] = members;
        Ok(())
    }

    fn array(&mut self, out: &mut Vec<u8>, depth: usize) -> Result<(), JsonError> {
        if depth > MAX_DEPTH {
            return Err(self.err());
        }
        self.expect(b'[')?;
        self.ws();
        out.push(b'[');
        if self.peek() == Some(b']') {
            self.i += 1;
            out.push(b']');
            return Ok(());
        }
        loop {
            self.ws();
            self.value(out, depth)?;
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.i += 1;
                    out.push(b',');
                }
                Some(b']') => {
                    self.i += 1;
                    out.push(b']');
                    return Ok(());
                }
                _ => return Err(self.err()),
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self, out: &mut Vec<u8>) -> Result<(), JsonError> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.err()),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(self.err());
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(self.err());
            }
        }
        out.extend_from_slice(&self.s[start..self.i]);
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let mut v = 0u32;
        for _ in 0..4 {
            let d = match self.peek() {
                Some(c @ b'0'..=b'9') => c - b'0',
                Some(c @ b'a'..=b'f') => c - b'a' + 10,
                Some(c @ b'A'..=b'F') => c - b'A' + 10,
                _ => return Err(self.err()),
            };
            v = v * 16 + u32::from(d);
            self.i += 1;
        }
        Ok(v)
    }

    /// Parses a string literal and returns its decoded UTF-8 bytes.
    /// A string's decoded bytes: borrowed from the input when it has no escapes (the
    /// common case), built only when it has.
    fn string(&mut self) -> Result<Cow<'a, [u8]>, JsonError> {
        self.expect(b'"')?;
        let start = self.i;
        let s: &'a [u8] = self.s;
        while let Some(b) = self.peek() {
            if b == b'"' || b == b'\\' || b < 0x20 {
                break;
            }
            self.i += 1;
        }
        let run = &s[start..self.i];
        if core::str::from_utf8(run).is_err() {
            return Err(JsonError { offset: start });
        }
        if self.peek() == Some(b'"') {
            self.i += 1;
            return Ok(Cow::Borrowed(run));
        }
        let mut out = run.to_vec();
        loop {
            let start = self.i;
            // Copy the run of plain bytes up to the next quote, backslash or control byte.
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.i += 1;
            }
            let run = &self.s[start..self.i];
            if core::str::from_utf8(run).is_err() {
                return Err(JsonError { offset: start });
            }
            out.extend_from_slice(run);
            match self.peek() {
                Some(b'"') => {
                    self.i += 1;
                    return Ok(Cow::Owned(out));
                }
                Some(b'\\') => {
                    self.i += 1;
                    let c = match self.peek() {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            self.i += 1;
                            let c = self.unicode_escape()?;
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                            continue;
                        }
                        _ => return Err(self.err()),
                    };
                    self.i += 1;
                    out.push(c as u8);
                }
                _ => return Err(self.err()), // end of input or raw control character
            }
        }
    }

    /// After `\u`: one code point, joining a surrogate pair; lone surrogates are errors.
    fn unicode_escape(&mut self) -> Result<char, JsonError> {
        let hi = self.hex4()?;
        let cp = if (0xD800..0xDC00).contains(&hi) {
            if !self.s[self.i..].starts_with(b"\\u") {
                return Err(self.err());
            }
            self.i += 2;
            let lo = self.hex4()?;
            if !(0xDC00..0xE000).contains(&lo) {
                return Err(self.err());
            }
            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
        } else {
            hi
        };
        char::from_u32(cp).ok_or(self.err())
    }
}

/// A string from [`Parser::string`]: one borrowed from the input holds nothing that
/// needs escaping (the scan stopped at no `\\` and no control character), so it is
/// copied as is.
#[allow(clippy::ptr_arg)] // the variant is the point: it says whether to escape
fn write_decoded(s: &Cow<'_, [u8]>, out: &mut Vec<u8>) {
    match s {
        Cow::Borrowed(raw) => {
            out.push(b'"');
            out.extend_from_slice(raw);
            out.push(b'"');
        }
        Cow::Owned(decoded) => write_string(decoded, out),
    }
}

/// Writes `s` (UTF-8) as a canonical JSON string, quotes included.
pub(crate) fn write_string(s: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    // Copy runs that need no escape in one go.
    let mut run = 0;
    for (i, &b) in s.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 15) as usize],
            ],
            _ => continue,
        };
        out.extend_from_slice(&s[run..i]);
        out.extend_from_slice(escape);
        run = i + 1;
    }
    out.extend_from_slice(&s[run..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::String;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// Found untested by cargo-mutants (docs/mutants.md): control characters, however
    /// a body escapes them, come out in one canonical form (short escapes where JSON
    /// has them), so two spellings of one body share a fingerprint.
    #[wasm_bindgen_test::wasm_bindgen_test(unsupported = test)]
    fn control_characters_have_one_canonical_spelling() {
        let canonical: &[u8] = br#""\b\f\n\r\t\u0001""#;
        assert_eq!(canonicalize(canonical).unwrap(), canonical);
        assert_eq!(
            canonicalize(br#""\u0008\u000C\u000a\u000D\u0009\u0001""#).unwrap(),
            canonical
        );
    }

    fn canon(s: &str) -> String {
        String::from_utf8(canonicalize(s.as_bytes()).unwrap()).unwrap()
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn sorts_keys_and_drops_whitespace() {
        assert_eq!(
            canon(" { \"b\" : 1 ,\n\"a\":[ true,false , null ] } "),
            r#"{"a":[true,false,null],"b":1}"#
        );
        assert_eq!(
            canon(r#"{"z":{"y":1,"x":2},"a":{}}"#),
            r#"{"a":{},"z":{"x":2,"y":1}}"#
        );
        assert_eq!(canon("[]"), "[]");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn normalises_string_escapes_but_keeps_numbers() {
        assert_eq!(canon(r#""\u00e9\/\u0041\ud83d\ude00""#), "\"é/A😀\"");
        assert_eq!(
            canon(r#""tab\u0009 nl\n ctl\u0001""#),
            r#""tab\t nl\n ctl\u0001""#
        );
        assert_eq!(
            canon("[1, 1.0, -0, 1e5, 1E+5, 2.5e-3]"),
            "[1,1.0,-0,1e5,1E+5,2.5e-3]"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn rejects_invalid_json() {
        for bad in [
            "",
            "{",
            "{\"a\" 1}",
            "[1,]",
            "01",
            "1.",
            "-",
            "tru",
            "\"\\x\"",
            "\"\\ud800\"",
            "{\"a\":1,\"a\":2}",
            "\"raw\u{1}ctl\"",
            "1 2",
            "{a:1}",
            "+1",
            ".5",
        ] {
            assert!(
                canonicalize(bad.as_bytes()).is_err(),
                "{bad:?} should be rejected"
            );
        }
        assert!(canonicalize(b"\"\xff\"").is_err());
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(canonicalize(deep.as_bytes()).is_err());
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(canonicalize(ok.as_bytes()).is_ok());
        // Objects count too, exactly at the bound (cargo-mutants found them
        // untested: docs/mutants.md); unbounded nesting would overflow the stack.
        let objects = |n: usize| "{\"a\":".repeat(n) + "1" + &"}".repeat(n);
        assert!(canonicalize(objects(MAX_DEPTH).as_bytes()).is_ok());
        assert!(canonicalize(objects(MAX_DEPTH + 1).as_bytes()).is_err());
        let mixed = "[{\"a\":".repeat(MAX_DEPTH / 2) + "1" + &"}]".repeat(MAX_DEPTH / 2);
        assert!(canonicalize(mixed.as_bytes()).is_ok());
        let mixed = "[{\"a\":".repeat(MAX_DEPTH / 2 + 1) + "1" + &"}]".repeat(MAX_DEPTH / 2 + 1);
        assert!(canonicalize(mixed.as_bytes()).is_err());
    }
}
