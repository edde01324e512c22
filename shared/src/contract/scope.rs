//! Who a key belongs to, read from the request — the same way at the edge and the
//! origin, so both name the same record:
//!
//! * `authorization` — the bearer token (or `Basic` credentials, or a lone token: the
//!   whole `Authorization` value), hashed: a refreshed token is a new caller. Another
//!   scheme is refused (401): a signature scheme signs each attempt anew, and every
//!   retry would be a new caller;
//! * `header:<name>` — a header's value, hashed: a principal id set by a trusted
//!   gateway, or an API key;
//! * `jwt:<claim>` — a claim of the bearer JWT, once its signature (HS256 with a
//!   secret, or RS256 / ES256 with a JWKS: [`JwtKeys`]), `exp` and `nbf` are checked: a
//!   refreshed token of the same principal keeps its scope.
//!
//! A request with no identity is scoped `anonymous` or refused (401), as configured; a
//! JWT that does not verify is always refused, never taken for anonymous.

pub use super::jwt::{JwtKeys, JwtVerifier};
use super::{Problem, Rejection};
use crate::json;
use crate::InvalidSetting;
use crate::Scope;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use sha2::{Digest, Sha256};

/// Where the scope comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum ScopeSource {
    /// The `Authorization` value (its bearer token), hashed.
    Authorization,
    /// This header's value (a lower-case name), hashed.
    Header(String),
    /// This claim of the bearer JWT, once `jwt` accepts the token.
    JwtClaim {
        /// The claim, e.g. `sub`.
        claim: String,
        /// Its keys (an HS256 secret, or a JWKS's public keys), issuer and audience.
        jwt: JwtVerifier,
    },
}

impl core::fmt::Debug for ScopeSource {
    /// Never shows the secret.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ScopeSource::Authorization => f.write_str("authorization"),
            ScopeSource::Header(name) => write!(f, "header:{name}"),
            ScopeSource::JwtClaim { claim, .. } => write!(f, "jwt:{claim}"),
        }
    }
}

/// What a request without an identity gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anonymous {
    /// The shared `anonymous` scope.
    Scoped,
    /// A 401 problem; nothing is claimed or stored.
    Refused,
}

/// How a request's scope is found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopeRule {
    /// Where the identity is read.
    pub source: ScopeSource,
    /// A request without one.
    pub anonymous: Anonymous,
}

impl Default for ScopeRule {
    /// The `Authorization` value; a request without one refused (401). Sharing one
    /// `anonymous` scope between callers idem can't tell apart — an app that
    /// authenticates by cookie or mTLS — would replay one caller's answer to another:
    /// that is chosen on purpose ([`ScopeRule::by_authorization`] with
    /// [`Anonymous::Scoped`]), never a default.
    fn default() -> Self {
        ScopeRule::by_authorization(Anonymous::Refused)
    }
}

impl ScopeRule {
    /// The `Authorization` value, and `anonymous` for a request without one.
    pub fn by_authorization(anonymous: Anonymous) -> Self {
        ScopeRule {
            source: ScopeSource::Authorization,
            anonymous,
        }
    }
}

impl ScopeSource {
    /// Parses `authorization`, `header:<name>` or `jwt:<claim>`; a JWT needs `jwt`.
    /// The error names what is wrong.
    pub fn parse(spec: &str, jwt: Option<JwtVerifier>) -> Result<ScopeSource, InvalidSetting> {
        let spec = spec.trim();
        if spec.eq_ignore_ascii_case("authorization") {
            return Ok(ScopeSource::Authorization);
        }
        if let Some(name) = spec.strip_prefix("header:") {
            let name = name.trim();
            let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            if name.is_empty() || !name.bytes().all(token) {
                return Err(InvalidSetting::from(format!(
                    "{name:?} is not a header name"
                )));
            }
            let name = name.to_ascii_lowercase();
            // idem's own request headers: the key (every key its own caller), or one idem
            // sets or takes off before the scope is read — absent, every caller would
            // be the anonymous one.
            if name == super::IDEMPOTENCY_KEY || name.starts_with("idem-") {
                return Err(InvalidSetting::from(format!(
                    "header:{name} is one of idem's own headers, not a caller's identity"
                )));
            }
            return Ok(ScopeSource::Header(name));
        }
        if let Some(claim) = spec.strip_prefix("jwt:") {
            let claim = claim.trim();
            if claim.is_empty() {
                return Err(InvalidSetting::new("jwt: needs a claim, e.g. jwt:sub"));
            }
            // A name a payload's member can hold as written (it is compared with the
            // member's canonical, escaped bytes).
            if claim
                .chars()
                .any(|c| c == '"' || c == '\\' || c.is_control())
            {
                return Err(InvalidSetting::from(format!(
                    "jwt:{claim:?}: a claim's name has no quote, backslash or control character"
                )));
            }
            // (A verifier's HS256 secret is 32 bytes at least: `JwtVerifier::new`.)
            return match jwt {
                Some(jwt) => Ok(ScopeSource::JwtClaim {
                    claim: claim.into(),
                    jwt,
                }),
                None => Err(InvalidSetting::new(
                    "jwt:<claim> needs the HS256 secret or a JWKS",
                )),
            };
        }
        Err(InvalidSetting::from(format!(
            "{spec:?}: use authorization, header:<name> or jwt:<claim>"
        )))
    }
}

impl ScopeRule {
    /// The scope of a request whose headers `values(name)` gives (every value, in
    /// order; the name in lower case), at `now_secs` (Unix seconds, for the JWT's `exp`
    /// and `nbf`).
    pub fn scope<'a, V: IntoIterator<Item = &'a [u8]>>(
        &self,
        values: impl Fn(&str) -> V,
        now_secs: u64,
    ) -> Result<Scope, Rejection> {
        // An identity sent twice is refused: a gateway that appends its header after
        // the client's would otherwise let the client's win. (A runtime that joins
        // repeated values with a comma shows the same thing, as a comma.)
        let single = |name: &str| -> Result<Option<&'a [u8]>, Rejection> {
            let mut all = values(name).into_iter();
            let first = all.next();
            match (first, all.next()) {
                (_, Some(_)) => Err(unaccepted(name, "it is sent more than once")),
                (Some(v), None) if v.contains(&b',') => {
                    Err(unaccepted(name, "it holds more than one value"))
                }
                (first, None) => Ok(first),
            }
        };
        match &self.source {
            // The first value, as it always was.
            ScopeSource::Authorization => match values("authorization").into_iter().next() {
                None => self.anonymous("send an Authorization header"),
                Some(value) => match stable_credential(value) {
                    Credential::Stable => Ok(Scope::from_authorization(Some(value))),
                    Credential::Empty => self.anonymous("send a credential in Authorization"),
                    Credential::OtherScheme => Err(Rejection::with_detail(
                        Problem::IdentityInvalid,
                        "an Authorization scheme other than Bearer or Basic was not accepted: \
                         a signed request (AWS SigV4, Digest, HTTP Message Signatures) carries \
                         a new signature on every attempt, so each retry would be a new caller \
                         and run again; scope such callers by a header or a JWT claim \
                         (scope-from header:<name> or jwt:<claim>)",
                    )),
                },
            },
            ScopeSource::Header(name) => match single(name)?.map(<[u8]>::trim_ascii) {
                Some(value) if !value.is_empty() => Ok(Scope::from_header(name, value)),
                _ => self.anonymous(&format!("send the {name} header")),
            },
            ScopeSource::JwtClaim { claim, jwt } => {
                let Some(value) = single("authorization")? else {
                    return self.anonymous("send Authorization: Bearer <JWT>");
                };
                let token = bearer(value).ok_or_else(|| invalid("not a bearer token"))?;
                let payload = verify_jwt(token, jwt, now_secs).map_err(invalid)?;
                // Tokens of several issuers are accepted unless the verifier pins one:
                // the issuer is then part of who is asking.
                let issuer = (!jwt.pins_issuer())
                    .then(|| member(&payload, "iss"))
                    .flatten();
                match member(&payload, claim) {
                    Some(v) if identity(v) => Ok(Scope::from_issued_claim(issuer, claim, v)),
                    _ => Err(invalid(&format!(
                        "the token has no {claim} claim that names someone (a non-empty string or an integer)"
                    ))),
                }
            }
        }
    }

    fn anonymous(&self, what: &str) -> Result<Scope, Rejection> {
        match self.anonymous {
            Anonymous::Scoped => Ok(Scope::anonymous()),
            Anonymous::Refused => Err(Rejection::with_detail(
                Problem::IdentityMissing,
                format!("{what}: keys are kept per caller"),
            )),
        }
    }
}

fn invalid(why: &str) -> Rejection {
    unaccepted("authorization", why)
}

/// The identity in header `name` was not accepted, for `why`.
fn unaccepted(name: &str, why: &str) -> Rejection {
    let what = if name == "authorization" {
        String::from("the bearer token")
    } else {
        format!("the {name} header")
    };
    Rejection::with_detail(
        Problem::IdentityInvalid,
        format!("{what} was not accepted: {why}"),
    )
}

/// What an `Authorization` value says about its caller under the default rule.
#[derive(Debug, PartialEq, Eq)]
enum Credential {
    /// The same on every attempt: a bearer token, `Basic` credentials, a lone token
    /// (a bearer token after a tab instead of a space is hashed with its scheme).
    Stable,
    /// A registered scheme without a credential (`Bearer`, `Negotiate`), or nothing: no
    /// identity.
    Empty,
    /// Another scheme with parameters: likely a signature, new on every attempt.
    OtherScheme,
}

/// The IANA HTTP Authentication Scheme Registry's names: one of them alone is a
/// scheme sent without its credential, never a credential shared by its senders.
const REGISTERED_SCHEMES: [&[u8]; 14] = [
    b"basic",
    b"bearer",
    b"concealed",
    b"digest",
    b"dpop",
    b"gnap",
    b"hoba",
    b"mutual",
    b"negotiate",
    b"oauth",
    b"privatetoken",
    b"scram-sha-1",
    b"scram-sha-256",
    b"vapid",
];

/// Reads an `Authorization` value the way `scopes.py` does: words split on spaces and
/// tabs (HTTP's whitespace); `Bearer <token>` and `Basic …` by their scheme, one word
/// alone as a credential of its own.
fn stable_credential(value: &[u8]) -> Credential {
    if let Some(token) = bearer(value) {
        return if token.is_empty() {
            Credential::Empty
        } else {
            Credential::Stable
        };
    }
    let mut words = value
        .split(|b| *b == b' ' || *b == b'\t')
        .filter(|w| !w.is_empty());
    match (words.next(), words.next()) {
        (None, _) => Credential::Empty,
        (Some(word), None)
            if REGISTERED_SCHEMES
                .iter()
                .any(|scheme| word.eq_ignore_ascii_case(scheme)) =>
        {
            Credential::Empty
        }
        (Some(_), None) => Credential::Stable,
        (Some(scheme), Some(_))
            if scheme.eq_ignore_ascii_case(b"basic") || scheme.eq_ignore_ascii_case(b"bearer") =>
        {
            Credential::Stable
        }
        (Some(_), Some(_)) => Credential::OtherScheme,
    }
}

/// The token of `Bearer <token>`.
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let scheme = value.get(..7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| value[7..].trim_ascii())
}

/// The canonical JSON payload of an HS256 JWT whose signature, `exp` and `nbf` hold.
pub fn verify_hs256(token: &[u8], secret: &[u8], now_secs: u64) -> Result<Vec<u8>, &'static str> {
    let jwt = JwtVerifier::new(JwtKeys::Hs256(secret.to_vec()), None, None)
        .map_err(|_| "no HS256 secret")?;
    verify_jwt(token, &jwt, now_secs)
}

/// The canonical JSON payload of a JWT that `jwt` accepts: its signature, `exp`, `nbf`,
/// and the issuer and audience `jwt` requires.
pub fn verify_jwt(token: &[u8], jwt: &JwtVerifier, now_secs: u64) -> Result<Vec<u8>, &'static str> {
    let mut parts = token.split(|b| *b == b'.');
    let (Some(head), Some(body), Some(sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("not a JWT");
    };
    let header = b64url(head)
        .and_then(|h| json::canonicalize(&h).ok())
        .ok_or("its header is not JSON")?;
    // RFC 7515 §4.1.11: extensions the token says must be understood, and idem
    // understands none.
    if member(&header, "crit").is_some() {
        return Err("it names critical extensions (crit), which idem does not implement");
    }
    // Only the algorithms of `keys`: "none" and every other are refused, whatever the
    // token says.
    let signature = b64url(sig).ok_or("its signature is not base64url")?;
    let signed = &token[..head.len() + 1 + body.len()];
    jwt.keys().check(&header, signed, &signature)?;
    let payload = b64url(body)
        .and_then(|p| json::canonicalize(&p).ok())
        .filter(|p| p.first() == Some(&b'{'))
        .ok_or("its payload is not a JSON object")?;
    let exp = member(&payload, "exp");
    if exp.is_none() && !jwt.is_exp_optional() {
        return Err("it has no exp: a token that never expires is refused (--jwt-require-exp false, JWT_REQUIRE_EXP=false, accepts it)");
    }
    if let Some(exp) = exp {
        if seconds(exp).ok_or("its exp is not a number")? <= now_secs {
            return Err("it has expired");
        }
    }
    if let Some(nbf) = member(&payload, "nbf") {
        if seconds(nbf).ok_or("its nbf is not a number")? > now_secs {
            return Err("it is not valid yet");
        }
    }
    jwt.check_claims(&payload)?;
    Ok(payload)
}

/// Whether a claim's canonical value names someone: a non-empty string, or an integer.
fn identity(value: &[u8]) -> bool {
    let digits = value.strip_prefix(b"-").unwrap_or(value);
    (value.len() > 2 && value[0] == b'"')
        || (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit))
}

/// The whole seconds of a JSON number (`1700000000`, `1700000000.5`); `None` for a
/// negative one or one with an exponent (read as written, `1.9e9` would be 1).
fn seconds(number: &[u8]) -> Option<u64> {
    if number.iter().any(|b| matches!(b, b'e' | b'E' | b'-')) {
        return None;
    }
    let whole = number.split(|b| *b == b'.').next()?;
    if whole.is_empty() || !whole.iter().all(u8::is_ascii_digit) || whole.len() > 19 {
        return None;
    }
    core::str::from_utf8(whole).ok()?.parse().ok()
}

/// The canonical bytes of the value of the top-level member `name` of a canonical JSON
/// object ([`json::canonicalize`]: no whitespace, minimal escapes).
pub(crate) fn member<'a>(canonical: &'a [u8], name: &str) -> Option<&'a [u8]> {
    let mut i = 1;
    if canonical.first() != Some(&b'{') {
        return None;
    }
    while canonical.get(i) == Some(&b'"') {
        let key_end = string_end(canonical, i)?;
        let key = &canonical[i + 1..key_end];
        let value_start = key_end + 2; // past `":`
        let value_end = value_end(canonical, value_start)?;
        if key == name.as_bytes() {
            return canonical.get(value_start..value_end);
        }
        i = value_end + 1; // past `,` (or `}`, and the loop ends)
    }
    None
}

/// The index of the `"` that closes the string opening at `start`.
fn string_end(s: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < s.len() {
        match s[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// The index just past the value starting at `start`: its `,` or closing `}`.
pub(crate) fn value_end(s: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = start;
    while i < s.len() {
        match s[i] {
            b'"' => i = string_end(s, i)?,
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth == 0 => return Some(i),
            b'}' | b']' => depth -= 1,
            b',' if depth == 0 => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// Base64url without padding (RFC 7515), strictly: no padding, no stray bits.
pub(crate) fn b64url(s: &[u8]) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'-' => Some(62),
        b'_' => Some(63),
        _ => None,
    };
    if s.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in s {
        acc = (acc << 6) | u32::from(digit(c)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    (acc == 0).then_some(out)
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| {
        let mut p = block;
        p.iter_mut().for_each(|b| *b ^= byte);
        p
    };
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// Equal, in time that does not depend on where they differ.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl core::fmt::Display for ScopeSource {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self, f)
    }
}

/// For tests and tools: an HS256 JWT of `payload` (JSON) signed with `secret`.
pub fn sign_hs256(payload: &str, secret: &[u8]) -> String {
    let enc = |bytes: &[u8]| b64url_encode(bytes);
    let head = enc(br#"{"alg":"HS256","typ":"JWT"}"#);
    let body = enc(payload.as_bytes());
    let signed = format!("{head}.{body}");
    let sig = enc(&hmac_sha256(secret, signed.as_bytes()));
    format!("{signed}.{sig}")
}

pub(crate) fn b64url_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len() * 4 / 3 + 2);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// Found untested by cargo-mutants (docs/mutants.md): whole seconds of up to 19
    /// digits, as written.
    #[wasm_bindgen_test(unsupported = test)]
    fn members_are_found_past_escaped_keys_and_values_end_where_they_end() {
        let doc = br#"{"a\"b":"c\"d","sub":"u","n":[1,{"x":2}]}"#;
        assert_eq!(member(doc, "sub"), Some(&br#""u""#[..]));
        assert_eq!(member(doc, "n"), Some(&br#"[1,{"x":2}]"#[..]));
        assert_eq!(member(doc, "x"), None, "top-level members only");
        assert_eq!(value_end(b"123", 0), None, "a value that never ends");
        assert_eq!(value_end(b"12,3", 0), Some(2));
        assert_eq!(string_end(br#""abc"#, 0), None, "a string that never ends");
        assert_eq!(string_end(br#""a\"b","#, 0), Some(5));
    }

    /// Found untested by cargo-mutants (docs/mutants.md): HMAC hashes a key longer
    /// than the block (64 bytes) and uses one of 64 as it is (RFC 4231 case 6, and
    /// Python's `hmac` for the 64-byte key); base64url of a length no encoding has.
    #[wasm_bindgen_test(unsupported = test)]
    fn hmac_keys_at_the_block_size_and_base64url_lengths() {
        assert_eq!(
            crate::hex(&hmac_sha256(&[0x0b; 64], b"Hi There")),
            "21cd586aeca0579d99a1c938127c92525a371f807bc5ba6eb78bc825bd4f2be3"
        );
        assert_eq!(
            crate::hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
        assert_eq!(b64url(b"A"), None);
        assert_eq!(b64url(b"AAAAA"), None);
        assert_eq!(b64url(b"AAAA"), Some(vec![0, 0, 0]));
        // A signature is the whole MAC: a prefix of it (none at all) is no match.
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"", b"abc") && !same(b"ab", b"abc") && !same(b"abd", b"abc"));
        // Two bytes off by the same bits: differences must add up, not cancel out.
        assert!(!same(b"\x01\x01", b"\x00\x00"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn seconds_are_read_as_written() {
        assert_eq!(seconds(b"1700000000.9"), Some(1_700_000_000));
        assert_eq!(
            seconds(b"1000000000000000000"),
            Some(1_000_000_000_000_000_000)
        );
        for not_seconds in [
            &b"12345678901234567890"[..],
            b"",
            b".5",
            b"12a",
            b"1e9",
            b"-1",
        ] {
            assert_eq!(seconds(not_seconds), None, "{not_seconds:?}");
        }
    }

    /// Found untested by cargo-mutants (docs/mutants.md): what logs and clients read
    /// of a scope source, and a claim's name with a backslash.
    #[wasm_bindgen_test(unsupported = test)]
    fn scope_sources_say_what_they_are() {
        assert_eq!(format!("{:?}", jwt()), "jwt:sub");
        assert_eq!(format!("{}", jwt()), "jwt:sub");
        assert_eq!(
            format!("{:?}", ScopeSource::Header("x-api-key".into())),
            "header:x-api-key"
        );
        assert_eq!(format!("{:?}", ScopeSource::Authorization), "authorization");
        let hs256 = JwtVerifier::new(JwtKeys::Hs256(SECRET.to_vec()), None, None).unwrap();
        assert!(ScopeSource::parse("jwt:a\\b", Some(hs256))
            .unwrap_err()
            .to_string()
            .contains("backslash"));
        assert!(unaccepted("authorization", "why")
            .detail
            .starts_with("the bearer token"));
        assert!(unaccepted("x-api-key", "why")
            .detail
            .starts_with("the x-api-key header"));
    }

    const SECRET: &[u8] = b"a secret of the gateway, of 32 bytes at least";

    fn rule(source: ScopeSource, anonymous: Anonymous) -> ScopeRule {
        ScopeRule { source, anonymous }
    }

    fn jwt() -> ScopeSource {
        ScopeSource::JwtClaim {
            claim: "sub".into(),
            jwt: JwtVerifier::new(JwtKeys::Hs256(SECRET.to_vec()), None, None).unwrap(),
        }
    }

    fn with<'a>(headers: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a [u8]> + 'a {
        move |name| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_bytes())
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_refreshed_token_of_the_same_principal_keeps_its_scope() {
        let r = rule(jwt(), Anonymous::Refused);
        let first = format!(
            "Bearer {}",
            sign_hs256(r#"{"sub":"cus_1","exp":2000,"iat":1}"#, SECRET)
        );
        let refreshed = format!(
            "Bearer {}",
            sign_hs256(r#"{"iat":900,"exp":3000, "sub":"cus_1"}"#, SECRET)
        );
        let other = format!(
            "Bearer {}",
            sign_hs256(r#"{"sub":"cus_2","exp":2000}"#, SECRET)
        );
        let a = r.scope(with(&[("authorization", &first)]), 1_000).unwrap();
        let b = r
            .scope(with(&[("authorization", &refreshed)]), 1_000)
            .unwrap();
        let c = r.scope(with(&[("authorization", &other)]), 1_000).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // By the Authorization value, the refreshed token is someone else.
        let by_value = ScopeRule::default();
        assert_ne!(
            by_value
                .scope(with(&[("authorization", &first)]), 0)
                .unwrap(),
            by_value
                .scope(with(&[("authorization", &refreshed)]), 0)
                .unwrap()
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_token_that_does_not_verify_is_refused_never_anonymous() {
        let r = rule(jwt(), Anonymous::Scoped);
        let refused = |token: String| {
            r.scope(
                with(&[("authorization", &format!("Bearer {token}"))]),
                1_000,
            )
            .unwrap_err()
            .problem
        };
        let good = sign_hs256(r#"{"sub":"u","exp":2000}"#, SECRET);
        assert_eq!(
            refused(sign_hs256(r#"{"sub":"u"}"#, b"another key")),
            Problem::IdentityInvalid
        );
        assert_eq!(
            refused(sign_hs256(r#"{"sub":"u","exp":1000}"#, SECRET)),
            Problem::IdentityInvalid,
            "expired"
        );
        assert_eq!(
            refused(sign_hs256(r#"{"sub":"u","nbf":1001}"#, SECRET)),
            Problem::IdentityInvalid,
            "not yet"
        );
        assert_eq!(
            refused(sign_hs256(r#"{"name":"u"}"#, SECRET)),
            Problem::IdentityInvalid,
            "no sub"
        );
        assert_eq!(
            refused(sign_hs256(r#"{"sub":null}"#, SECRET)),
            Problem::IdentityInvalid
        );
        // alg none, with the same payload and no signature.
        let body = good.split('.').nth(1).unwrap();
        let none = format!("{}.{body}.", b64url_encode(br#"{"alg":"none"}"#));
        assert_eq!(refused(none), Problem::IdentityInvalid);
        // A flipped byte of the payload.
        let mut tampered = good.clone().into_bytes();
        let i = tampered.iter().position(|b| *b == b'.').unwrap() + 3;
        tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            refused(String::from_utf8(tampered).unwrap()),
            Problem::IdentityInvalid
        );
        for junk in ["", "a.b", "a.b.c.d", "!!!.???.###"] {
            assert_eq!(refused(junk.into()), Problem::IdentityInvalid, "{junk:?}");
        }
        assert!(r
            .scope(with(&[("authorization", &format!("Bearer {good}"))]), 1_000)
            .is_ok());
        // Valid from its nbf's second on (cargo-mutants: docs/mutants.md).
        let from_now = sign_hs256(r#"{"sub":"u","nbf":1000,"exp":2000}"#, SECRET);
        assert!(r
            .scope(
                with(&[("authorization", &format!("Bearer {from_now}"))]),
                1_000
            )
            .is_ok());
        // No token at all: anonymous, as configured.
        assert_eq!(r.scope(with(&[]), 0), Ok(Scope::anonymous()));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_header_scope_and_anonymous_callers() {
        let r = rule(ScopeSource::Header("x-api-key".into()), Anonymous::Refused);
        let a = r.scope(with(&[("x-api-key", "key-a")]), 0).unwrap();
        let b = r.scope(with(&[("x-api-key", "key-b")]), 0).unwrap();
        assert_ne!(a, b);
        assert_ne!(
            a,
            Scope::from_authorization(Some(b"key-a")),
            "a header is not a token"
        );
        let missing = r
            .scope(with(&[("authorization", "Bearer x")]), 0)
            .unwrap_err();
        assert_eq!(missing.problem, Problem::IdentityMissing);
        assert_eq!(missing.status(), 401);
        assert!(
            r.scope(with(&[("x-api-key", "  ")]), 0).is_err(),
            "blank is none"
        );
        let open = rule(ScopeSource::Header("x-api-key".into()), Anonymous::Scoped);
        assert_eq!(open.scope(with(&[]), 0), Ok(Scope::anonymous()));
        let refused = ScopeRule::default().scope(with(&[]), 0).unwrap_err();
        assert_eq!(
            refused.problem,
            Problem::IdentityMissing,
            "no default puts strangers in one scope"
        );
        assert_eq!(
            ScopeRule::by_authorization(Anonymous::Scoped).scope(with(&[]), 0),
            Ok(Scope::anonymous()),
            "unless chosen on purpose"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn sources_parse_and_never_show_the_secret() {
        assert_eq!(
            ScopeSource::parse("authorization", None),
            Ok(ScopeSource::Authorization)
        );
        assert_eq!(
            ScopeSource::parse("header:X-Api-Key", None),
            Ok(ScopeSource::Header("x-api-key".into()))
        );
        let hs256 = |s: &[u8]| JwtVerifier::new(JwtKeys::Hs256(s.to_vec()), None, None).unwrap();
        let jwt = ScopeSource::parse("jwt:sub", Some(hs256(b"s3cret, s3cret, s3cret, s3cret!!")))
            .unwrap();
        assert!(ScopeSource::parse("jwt:a\"b", Some(hs256(&[1; 32])))
            .unwrap_err()
            .to_string()
            .contains("no quote"));
        assert!(!format!("{jwt:?}").contains("s3cret"));
        assert!(ScopeSource::parse("jwt:sub", None)
            .unwrap_err()
            .to_string()
            .contains("secret"));
        assert!(ScopeSource::parse("header:bad name", None).is_err());
        // Absent when the scope is read (taken off, or set by idem itself): every
        // caller would be the anonymous one.
        for own in [
            "header:Idem-Edge-Secret",
            "header:idem-fencing-token",
            "header:idem-downstream-key",
            "header:Idempotency-Key",
        ] {
            let err = ScopeSource::parse(own, None).unwrap_err().to_string();
            assert!(err.contains("idem's own headers"), "{own}: {err}");
        }
        assert!(ScopeSource::parse("header:idempotent-client", None).is_ok());
        assert!(ScopeSource::parse("cookie", None)
            .unwrap_err()
            .to_string()
            .contains("header:<name>"));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn members_and_base64url_are_read_strictly() {
        let doc =
            json::canonicalize(br#"{"b":{"sub":"inner"},"a":[1,{"x":"]"}],"sub":"u\"1","n":12}"#)
                .unwrap();
        assert_eq!(member(&doc, "sub"), Some(&br#""u\"1""#[..]));
        assert_eq!(member(&doc, "n"), Some(&b"12"[..]));
        assert_eq!(member(&doc, "b"), Some(&br#"{"sub":"inner"}"#[..]));
        assert_eq!(member(&doc, "x"), None, "top level only");
        assert_eq!(member(b"[1]", "a"), None);
        assert_eq!(b64url(b"aGk"), Some(b"hi".to_vec()));
        assert_eq!(b64url(b"aGl"), None, "stray bits");
        assert_eq!(b64url(b"aGk="), None, "padding");
        assert_eq!(b64url_encode(b"hi"), "aGk");
        // RFC 4231, test case 2.
        assert_eq!(
            crate::hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    fn signed_with_header(header: &str, payload: &str) -> String {
        let signed = format!(
            "{}.{}",
            b64url_encode(header.as_bytes()),
            b64url_encode(payload.as_bytes())
        );
        let sig = b64url_encode(&hmac_sha256(SECRET, signed.as_bytes()));
        format!("Bearer {signed}.{sig}")
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn only_hs256_by_its_exact_name_even_when_the_signature_holds() {
        let r = rule(jwt(), Anonymous::Scoped);
        let payload = r#"{"sub":"u","exp":2000}"#;
        for header in [
            r#"{"alg":"none"}"#,
            r#"{"alg":"hs256"}"#,
            r#"{"alg":"HS512"}"#,
            r#"{"typ":"JWT"}"#,
            r#"{"alg":"HS256","alg":"none"}"#,
            r#"[1]"#,
        ] {
            let auth = signed_with_header(header, payload);
            let got = r.scope(with(&[("authorization", &auth)]), 1_000);
            assert_eq!(
                got.map_err(|e| e.problem),
                Err(Problem::IdentityInvalid),
                "{header}"
            );
        }
        let ok = signed_with_header(r#"{"alg":"HS\u0032\u0035\u0036"}"#, payload);
        assert!(
            r.scope(with(&[("authorization", &ok)]), 1_000).is_ok(),
            "escapes decode"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn claims_and_times_are_read_as_written_or_refused() {
        let r = rule(jwt(), Anonymous::Scoped);
        let scope = |payload: &str| {
            let auth = format!("Bearer {}", sign_hs256(payload, SECRET));
            r.scope(with(&[("authorization", &auth)]), 1_000)
                .map_err(|e| e.problem)
        };
        for bad in [
            r#"{"sub":"","exp":2000}"#,
            r#"{"sub":false,"exp":2000}"#,
            r#"{"sub":{},"exp":2000}"#,
            r#"{"sub":[],"exp":2000}"#,
            r#"{"sub":1.5,"exp":2000}"#,
            r#"{"sub":1e2,"exp":2000}"#,
            r#"{"sub":"u","nbf":1.9e9,"exp":2000}"#,
            r#"{"sub":"u","exp":1e10}"#,
            r#"{"sub":"u","exp":-1}"#,
            r#"{"sub":"u","exp":true}"#,
            r#"{"sub":"u","exp":99999999999999999999}"#,
            r#"{"sub":"a","sub":"b","exp":2000}"#,
            // A token that never expires.
            r#"{"sub":"u"}"#,
        ] {
            assert_eq!(scope(bad), Err(Problem::IdentityInvalid), "{bad}");
        }
        let lenient = rule(
            ScopeSource::JwtClaim {
                claim: "sub".into(),
                jwt: JwtVerifier::new(JwtKeys::Hs256(SECRET.to_vec()), None, None)
                    .unwrap()
                    .exp_optional(true),
            },
            Anonymous::Scoped,
        );
        let auth = format!("Bearer {}", sign_hs256(r#"{"sub":"u"}"#, SECRET));
        assert!(
            lenient
                .scope(with(&[("authorization", &auth)]), 1_000)
                .is_ok(),
            "exp optional on purpose (--jwt-require-exp false)"
        );
        assert_ne!(
            scope(r#"{"sub":"42","exp":2000}"#),
            scope(r#"{"sub":42,"exp":2000}"#)
        );
        assert!(scope(r#"{"sub":"42","exp":2000}"#).is_ok());
        assert_eq!(
            scope(r#"{"sub":"\u0063us_1","exp":2000}"#),
            scope(r#"{"sub":"cus_1","exp":2000}"#)
        );
        assert!(
            scope(r#"{"sub":-7,"exp":1000.5}"#).is_err(),
            "expired at 1000"
        );
        assert!(scope(r#"{"sub":-7,"exp":1001.5}"#).is_ok());
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn an_identity_sent_twice_is_refused() {
        let key = rule(ScopeSource::Header("x-user".into()), Anonymous::Scoped);
        let twice = |name: &str| -> Vec<&[u8]> {
            if name == "x-user" {
                vec![b"client-says", b"gateway-says"]
            } else {
                vec![]
            }
        };
        assert_eq!(
            key.scope(twice, 0).map_err(|e| e.problem),
            Err(Problem::IdentityInvalid)
        );
        let joined = |name: &str| -> Option<&[u8]> {
            (name == "x-user").then_some(&b"client-says, gateway-says"[..])
        };
        assert_eq!(
            key.scope(joined, 0).map_err(|e| e.problem),
            Err(Problem::IdentityInvalid)
        );
        let token = format!("Bearer {}", sign_hs256(r#"{"sub":"u"}"#, SECRET));
        let two_tokens = |name: &str| -> Vec<&[u8]> {
            if name == "authorization" {
                vec![token.as_bytes(), token.as_bytes()]
            } else {
                vec![]
            }
        };
        assert!(rule(jwt(), Anonymous::Scoped).scope(two_tokens, 0).is_err());
        // The default keeps its old reading: the first value.
        assert!(ScopeRule::default().scope(two_tokens, 0).is_ok());
    }
}
