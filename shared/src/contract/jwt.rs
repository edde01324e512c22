//! The keys a JWT's signature is checked with: an HS256 secret, or the RS256 and ES256
//! public keys of a JWKS (RFC 7517) — an identity provider's published keys, so that
//! idem needs no secret of its own.
//!
//! With a JWKS only RS256 and ES256 are accepted: an HS256 token is refused whatever it
//! says (an attacker who signs with the public key as an HMAC secret gets nowhere). A
//! token's `kid` picks the key (of the token's type); without one, the JWKS must hold
//! exactly one key of that type. Keys that are not for verifying signatures (`use`
//! other than `sig`, `key_ops` without `verify`), of other types (`oct`, `OKP`, other
//! curves), for other algorithms, or of an RSA size outside 2048–4096 bits are left
//! out; a key that is malformed makes the whole JWKS an error, so a broken file fails
//! at start-up.
//!
//! A provider's keys sign tokens for every application of every tenant it serves, so a
//! [`JwtVerifier`] with a JWKS also requires the issuer (`iss`) and the audience (`aud`)
//! the tokens must name.

use super::scope::{b64url, hmac_sha256, member, same, value_end};
use crate::json;
use crate::InvalidSetting;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use p256::ecdsa::signature::Verifier;
use sha2::{Digest, Sha256};

/// What a JWT's signature is checked with.
#[derive(Clone, PartialEq, Eq)]
pub enum JwtKeys {
    /// HS256 with this secret.
    Hs256(Vec<u8>),
    /// RS256 or ES256 with one of these public keys.
    Jwks(Vec<Jwk>),
}

/// One public key of a JWKS.
#[derive(Clone, PartialEq, Eq)]
pub struct Jwk {
    /// Its `kid`, as canonical JSON (with its quotes), if it has one.
    kid: Option<Vec<u8>>,
    key: PublicKey,
}

#[derive(Clone, PartialEq, Eq)]
enum PublicKey {
    Rs256(rsa::RsaPublicKey),
    Es256(p256::ecdsa::VerifyingKey),
}

impl core::fmt::Debug for JwtKeys {
    /// Names the kind of keys and their ids; never shows a secret.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            JwtKeys::Hs256(_) => f.write_str("HS256 secret"),
            JwtKeys::Jwks(keys) => {
                f.write_str("JWKS [")?;
                for (i, k) in keys.iter().enumerate() {
                    let kind = match k.key {
                        PublicKey::Rs256(_) => "RS256",
                        PublicKey::Es256(_) => "ES256",
                    };
                    let kid = k.kid.as_deref().map(String::from_utf8_lossy);
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{kind} {}", kid.as_deref().unwrap_or("(no kid)"))?;
                }
                f.write_str("]")
            }
        }
    }
}

/// RFC 7518 §3.2: an HS256 key is at least as long as the hash's output, 32 bytes.
pub const MIN_HS256_SECRET: usize = 32;

/// RFC 7518 §3.3: an RS256 key is at least 2048 bits; the verifier takes at most 4096.
const RSA_BITS: core::ops::RangeInclusive<usize> = 2048..=4096;

/// How a JWT is accepted: the keys its signature is checked with, and the issuer and
/// audience it must name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtVerifier {
    keys: JwtKeys,
    /// `iss` must be this (canonical JSON, with its quotes).
    issuer: Option<Vec<u8>>,
    /// `aud` must be this, or an array holding it (canonical JSON).
    audience: Option<Vec<u8>>,
    /// Whether a token without `exp` is accepted (never, unless said so).
    exp_optional: bool,
}

impl JwtVerifier {
    /// Tokens signed with `keys`, naming `issuer` and `audience` when given — both
    /// required with a JWKS.
    pub fn new(
        keys: JwtKeys,
        issuer: Option<&str>,
        audience: Option<&str>,
    ) -> Result<JwtVerifier, InvalidSetting> {
        let canonical = |what: &str, value: Option<&str>| match value {
            Some("") => Err(InvalidSetting::from(format!("the {what} is empty"))),
            Some(value) => {
                let mut out = Vec::with_capacity(value.len() + 2);
                json::write_string(value.as_bytes(), &mut out);
                Ok(Some(out))
            }
            None => Ok(None),
        };
        let (issuer, audience) = (
            canonical("issuer", issuer)?,
            canonical("audience", audience)?,
        );
        if matches!(keys, JwtKeys::Jwks(_)) && (issuer.is_none() || audience.is_none()) {
            return Err(InvalidSetting::new("a JWKS's keys sign tokens for every application of their issuer: give the issuer (iss) and the audience (aud) the tokens must name"));
        }
        if let JwtKeys::Hs256(secret) = &keys {
            if secret.len() < MIN_HS256_SECRET {
                return Err(InvalidSetting::from(format!(
                    "the HS256 secret is {} bytes: give at least {MIN_HS256_SECRET} (RFC 7518 §3.2: a key as long as the hash), e.g. `openssl rand -base64 32`",
                    secret.len()
                )));
            }
        }
        Ok(JwtVerifier {
            keys,
            issuer,
            audience,
            exp_optional: false,
        })
    }

    /// Accepts tokens without `exp` (`--jwt-require-exp false`): such a token never
    /// expires, and whoever holds it is its principal for ever. Off by default.
    pub fn exp_optional(mut self, yes: bool) -> Self {
        self.exp_optional = yes;
        self
    }

    /// Whether every token accepted names one issuer (`iss`), given at start-up.
    pub fn pins_issuer(&self) -> bool {
        self.issuer.is_some()
    }

    /// Whether tokens without `exp` are accepted.
    pub fn is_exp_optional(&self) -> bool {
        self.exp_optional
    }

    /// The keys.
    pub fn keys(&self) -> &JwtKeys {
        &self.keys
    }

    /// Whether the canonical payload names the issuer and the audience.
    pub(crate) fn check_claims(&self, payload: &[u8]) -> Result<(), &'static str> {
        if let Some(issuer) = &self.issuer {
            if member(payload, "iss") != Some(issuer.as_slice()) {
                return Err("its iss is not the issuer expected");
            }
        }
        if let Some(audience) = &self.audience {
            let named = match member(payload, "aud") {
                Some(aud) if aud.first() == Some(&b'[') => {
                    elements(aud).contains(&audience.as_slice())
                }
                Some(aud) => aud == audience.as_slice(),
                None => false,
            };
            if !named {
                return Err("its aud does not name this audience");
            }
        }
        Ok(())
    }
}

impl JwtKeys {
    /// The keys a deployment gives: an HS256 secret, a JWKS, or neither — not both (a
    /// verifier that took either would let an HS256 token signed with a public key
    /// through).
    pub fn either(
        secret: Option<Vec<u8>>,
        jwks: Option<&[u8]>,
    ) -> Result<Option<JwtKeys>, InvalidSetting> {
        match (secret, jwks) {
            (Some(_), Some(_)) => Err(InvalidSetting::new(
                "give the HS256 secret or the JWKS, not both",
            )),
            (Some(secret), None) => Ok(Some(JwtKeys::Hs256(secret))),
            (None, Some(jwks)) => JwtKeys::from_jwks(jwks)
                .map(Some)
                .map_err(|e| InvalidSetting::new(format!("the JWKS: {e}"))),
            (None, None) => Ok(None),
        }
    }

    /// The RS256 and ES256 signing keys of the JWKS `text`. The error says which key is
    /// wrong and how.
    pub fn from_jwks(text: &[u8]) -> Result<JwtKeys, InvalidSetting> {
        let doc =
            json::canonicalize(text).map_err(|e| format!("not JSON (at byte {})", e.offset))?;
        let keys = member(&doc, "keys")
            .filter(|k| k.first() == Some(&b'['))
            .ok_or("it has no \"keys\" array")?;
        let mut usable: Vec<Jwk> = Vec::new();
        for (i, key) in elements(keys).into_iter().enumerate() {
            let Some(jwk) = jwk(key).map_err(|why| format!("key {i}: {why}"))? else {
                continue;
            };
            // (A kid may name one key of each type: RFC 7517 §4.5.)
            let same = |k: &Jwk| k.kid == jwk.kid && k.is_rsa() == jwk.is_rsa();
            if jwk.kid.is_some() && usable.iter().any(same) {
                let kid = String::from_utf8_lossy(jwk.kid.as_deref().unwrap_or_default());
                return Err(InvalidSetting::from(format!(
                    "key {i}: kid {kid} is used twice"
                )));
            }
            usable.push(jwk);
        }
        if usable.is_empty() {
            return Err(InvalidSetting::new("it has no RS256 or ES256 signing key"));
        }
        Ok(JwtKeys::Jwks(usable))
    }

    /// Whether `signature` over `signed` holds for a token whose canonical header is
    /// `header`.
    pub(crate) fn check(
        &self,
        header: &[u8],
        signed: &[u8],
        signature: &[u8],
    ) -> Result<(), &'static str> {
        let alg = member(header, "alg");
        let keys = match self {
            JwtKeys::Hs256(secret) => {
                if alg != Some(b"\"HS256\"") {
                    return Err("only HS256 tokens are accepted");
                }
                return match same(signature, &hmac_sha256(secret, signed)) {
                    true => Ok(()),
                    false => Err("its signature does not verify"),
                };
            }
            JwtKeys::Jwks(keys) => keys,
        };
        let rsa = match alg {
            Some(b"\"RS256\"") => true,
            Some(b"\"ES256\"") => false,
            _ => return Err("only RS256 and ES256 tokens are accepted"),
        };
        let key = match member(header, "kid") {
            Some(kid) if kid.first() == Some(&b'"') => {
                let mut named = keys.iter().filter(|k| k.kid.as_deref() == Some(kid));
                let first = named
                    .next()
                    .ok_or("its kid names no signing key of the JWKS")?;
                // A kid may name a key of each type: the token's type picks.
                core::iter::once(first)
                    .chain(named)
                    .find(|k| k.is_rsa() == rsa)
                    .unwrap_or(first)
            }
            Some(_) => return Err("its kid is not a string"),
            None => {
                let mut of_type = keys.iter().filter(|k| k.is_rsa() == rsa);
                match (of_type.next(), of_type.next()) {
                    (Some(key), None) => key,
                    (None, _) => return Err("the JWKS has no key for its alg"),
                    (Some(_), Some(_)) => {
                        return Err("it names no kid and the JWKS has several keys for its alg")
                    }
                }
            }
        };
        let verified = match (&key.key, rsa) {
            (PublicKey::Rs256(k), true) => k
                .verify(
                    rsa::Pkcs1v15Sign::new::<Sha256>(),
                    &Sha256::digest(signed),
                    signature,
                )
                .is_ok(),
            (PublicKey::Es256(k), false) => p256::ecdsa::Signature::from_slice(signature)
                .is_ok_and(|sig| k.verify(signed, &sig).is_ok()),
            _ => return Err("its kid names a key of another type"),
        };
        verified
            .then_some(())
            .ok_or("its signature does not verify")
    }
}

impl Jwk {
    fn is_rsa(&self) -> bool {
        matches!(self.key, PublicKey::Rs256(_))
    }
}

/// The key of the canonical JWK object `key`; `None` when it is not an RS256 or ES256
/// key for verifying signatures.
fn jwk(key: &[u8]) -> Result<Option<Jwk>, String> {
    if key.first() != Some(&b'{') {
        return Err("not an object".into());
    }
    let field = |name: &str| member(key, name);
    let is = |name: &str, value: &[u8]| field(name) == Some(value);
    if field("use").is_some_and(|u| u != b"\"sig\"") {
        return Ok(None);
    }
    if field("key_ops").is_some_and(|ops| !elements(ops).contains(&&b"\"verify\""[..])) {
        return Ok(None);
    }
    let bytes = |name: &str| -> Result<Vec<u8>, String> {
        field(name)
            .and_then(|v| v.strip_prefix(b"\"")?.strip_suffix(b"\""))
            .and_then(b64url)
            .ok_or_else(|| format!("its {name} is missing or not base64url"))
    };
    let key = if is("kty", b"\"RSA\"") {
        if field("alg").is_some_and(|a| a != b"\"RS256\"") {
            return Ok(None);
        }
        let n = rsa::BigUint::from_bytes_be(&bytes("n")?);
        if !RSA_BITS.contains(&n.bits()) {
            // Too weak for RS256, or more than this verifier takes: not used.
            return Ok(None);
        }
        let e = rsa::BigUint::from_bytes_be(&bytes("e")?);
        let key = rsa::RsaPublicKey::new(n, e).map_err(|e| format!("not an RSA key: {e}"))?;
        PublicKey::Rs256(key)
    } else if is("kty", b"\"EC\"") && is("crv", b"\"P-256\"") {
        if field("alg").is_some_and(|a| a != b"\"ES256\"") {
            return Ok(None);
        }
        let (x, y) = (bytes("x")?, bytes("y")?);
        if x.len() > 32 || y.len() > 32 {
            return Err("a P-256 key's x and y are 32 bytes each".into());
        }
        // Some libraries drop leading zero bytes: put them back.
        let mut point = Vec::with_capacity(65);
        point.push(4);
        for coordinate in [&x, &y] {
            point.resize(point.len() + 32 - coordinate.len(), 0);
            point.extend_from_slice(coordinate);
        }
        let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&point)
            .map_err(|_| String::from("its point is not on P-256"))?;
        PublicKey::Es256(key)
    } else {
        return Ok(None);
    };
    let kid = match field("kid") {
        None => None,
        Some(kid) if kid.first() == Some(&b'"') => Some(kid.to_vec()),
        Some(_) => return Err("its kid is not a string".into()),
    };
    Ok(Some(Jwk { kid, key }))
}

/// The elements of the canonical JSON array `array`.
fn elements(array: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut i = 1;
    if array.get(i) == Some(&b']') {
        return out;
    }
    while let Some(end) = value_end(array, i) {
        out.push(&array[i..end]);
        if array[end] == b']' {
            break;
        }
        i = end + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use wasm_bindgen_test::wasm_bindgen_test;

    const VECTORS: &str = include_str!("../../testdata/scope-vectors.json");

    fn jwks() -> String {
        let doc: serde_json::Value = serde_json::from_str(VECTORS).unwrap();
        doc["jwks"].to_string()
    }

    /// Found untested by cargo-mutants (docs/mutants.md): how keys are given, and how
    /// a token's kid picks one.
    #[wasm_bindgen_test(unsupported = test)]
    fn keys_are_given_one_way_and_a_kid_picks_by_the_token_s_type() {
        assert!(matches!(
            JwtKeys::either(Some(b"s3cret".to_vec()), None),
            Ok(Some(JwtKeys::Hs256(_)))
        ));
        assert!(matches!(
            JwtKeys::either(None, Some(jwks().as_bytes())),
            Ok(Some(JwtKeys::Jwks(_)))
        ));
        assert!(JwtKeys::either(Some(b"s3cret".to_vec()), Some(jwks().as_bytes())).is_err());
        assert!(matches!(JwtKeys::either(None, None), Ok(None)));
        // One kid naming an RSA and an EC key: an ES256 token is checked with the EC one.
        let mut doc: serde_json::Value = serde_json::from_str(&jwks()).unwrap();
        for key in doc["keys"].as_array_mut().unwrap() {
            key["kid"] = "both".into();
        }
        let keys = JwtKeys::from_jwks(doc.to_string().as_bytes()).unwrap();
        let header = |h: &str| json::canonicalize(h.as_bytes()).unwrap();
        assert_eq!(
            keys.check(&header(r#"{"alg":"ES256","kid":"both"}"#), b"x.y", &[0; 64]),
            Err("its signature does not verify")
        );
        assert_eq!(
            keys.check(&header(r#"{"alg":"RS256","kid":5}"#), b"x.y", &[0; 64]),
            Err("its kid is not a string")
        );
    }

    /// Found untested by cargo-mutants (docs/mutants.md): an EC key is used only as a
    /// P-256 key, for ES256, with coordinates of 32 bytes at most.
    #[wasm_bindgen_test(unsupported = test)]
    fn ec_keys_are_p256_es256_keys_of_32_byte_coordinates() {
        let good: serde_json::Value = serde_json::from_str(&jwks()).unwrap();
        let ec = good["keys"][1].clone();
        let with_ec = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut key = ec.clone();
            f(&mut key);
            let doc = serde_json::json!({ "keys": [good["keys"][0].clone(), key] });
            JwtKeys::from_jwks(doc.to_string().as_bytes())
                .map(|k| format!("{k:?}"))
                .map_err(String::from)
        };
        let both = Ok("JWKS [RS256 \"rsa-1\", ES256 \"ec-1\"]".to_string());
        let rsa_only = Ok("JWKS [RS256 \"rsa-1\"]".to_string());
        assert_eq!(with_ec(&|_| {}), both);
        assert_eq!(with_ec(&|k| k["alg"] = "ES256".into()), both);
        assert_eq!(with_ec(&|k| k["alg"] = "ES384".into()), rsa_only);
        assert_eq!(with_ec(&|k| k["crv"] = "P-384".into()), rsa_only);
        // An x or a y of 33 bytes: refused as such.
        assert_eq!(
            with_ec(&|k| k["x"] = "AAK-mF6eZw2Qr41qWzZK45JngjDDmWosDpaQNUV7sXrK".into()),
            Err("key 1: a P-256 key's x and y are 32 bytes each".to_string())
        );
        assert_eq!(
            with_ec(&|k| k["y"] = "AAK-mF6eZw2Qr41qWzZK45JngjDDmWosDpaQNUV7sXrK".into()),
            Err("key 1: a P-256 key's x and y are 32 bytes each".to_string())
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn reads_the_signing_keys_and_leaves_the_rest_out() {
        let keys = JwtKeys::from_jwks(jwks().as_bytes()).unwrap();
        assert_eq!(
            format!("{keys:?}"),
            "JWKS [RS256 \"rsa-1\", ES256 \"ec-1\"]",
            "the encryption key is left out"
        );
        assert_eq!(
            format!("{:?}", JwtKeys::Hs256(b"s3cret".to_vec())),
            "HS256 secret"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_broken_jwks_is_an_error_that_says_why() {
        let good: serde_json::Value = serde_json::from_str(&jwks()).unwrap();
        let with = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut doc = good.clone();
            f(&mut doc);
            JwtKeys::from_jwks(doc.to_string().as_bytes())
                .unwrap_err()
                .to_string()
        };
        let cases: &[(&str, String)] = &[
            (
                "not JSON",
                JwtKeys::from_jwks(b"{").unwrap_err().to_string(),
            ),
            (
                "no \"keys\"",
                JwtKeys::from_jwks(b"{\"kty\":\"RSA\"}")
                    .unwrap_err()
                    .to_string(),
            ),
            (
                "no RS256 or ES256",
                JwtKeys::from_jwks(b"{\"keys\":[{\"kty\":\"oct\",\"k\":\"AA\"}]}")
                    .unwrap_err()
                    .to_string(),
            ),
            (
                "key 0: its n is missing",
                with(&|d| {
                    d["keys"][0].as_object_mut().unwrap().remove("n");
                }),
            ),
            (
                "key 0: its e is missing or not base64url",
                with(&|d| d["keys"][0]["e"] = "AQ=".into()),
            ),
            (
                "key 1: a P-256 key's x and y",
                with(&|d| d["keys"][1]["x"] = "A".repeat(46).into()),
            ),
            (
                "key 1: its point is not on P-256",
                with(&|d| {
                    let y = d["keys"][1]["y"].as_str().unwrap();
                    let flipped = if y.starts_with('A') {
                        y.replacen('A', "B", 1)
                    } else {
                        format!("A{}", &y[1..])
                    };
                    d["keys"][1]["y"] = flipped.into();
                }),
            ),
            (
                "key 1: kid \"ec-1\" is used twice",
                with(&|d| {
                    let ec = d["keys"][1].clone();
                    d["keys"][0] = ec;
                }),
            ),
            (
                "key 0: its kid is not a string",
                with(&|d| d["keys"][0]["kid"] = 7.into()),
            ),
            ("key 2: not an object", with(&|d| d["keys"][2] = "x".into())),
        ];
        for (expected, got) in cases {
            assert!(got.contains(expected), "expected {expected:?} in {got:?}");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn keys_it_cannot_use_are_left_out_not_refused() {
        let good: serde_json::Value = serde_json::from_str(&jwks()).unwrap();
        let keys = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut doc = good.clone();
            f(&mut doc);
            format!(
                "{:?}",
                JwtKeys::from_jwks(doc.to_string().as_bytes()).unwrap()
            )
        };
        // A 1024-bit RSA key: too weak for RS256.
        let weak = keys(&|d| {
            let n = b64url(d["keys"][0]["n"].as_str().unwrap().as_bytes()).unwrap();
            let mut short = n[..128].to_vec();
            short[127] |= 1;
            d["keys"][0]["n"] = super::super::scope::b64url_encode(&short).into();
        });
        assert_eq!(weak, "JWKS [ES256 \"ec-1\"]");
        let encrypting = keys(&|d| d["keys"][0]["key_ops"] = serde_json::json!(["encrypt"]));
        assert_eq!(encrypting, "JWKS [ES256 \"ec-1\"]");
        let verifying = keys(&|d| d["keys"][0]["key_ops"] = serde_json::json!(["verify"]));
        assert_eq!(verifying, "JWKS [RS256 \"rsa-1\", ES256 \"ec-1\"]");
        // One kid for a key of each type (RFC 7517 §4.5).
        let shared_kid = keys(&|d| d["keys"][1]["kid"] = "rsa-1".into());
        assert_eq!(shared_kid, "JWKS [RS256 \"rsa-1\", ES256 \"rsa-1\"]");
        // A key of another type is skipped before its kid is read.
        let odd = keys(&|d| {
            d["keys"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!({"kty": "oct", "kid": 7, "k": "AA"}))
        });
        assert_eq!(odd, "JWKS [RS256 \"rsa-1\", ES256 \"ec-1\"]");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_jwks_needs_an_issuer_and_an_audience() {
        let keys = JwtKeys::from_jwks(jwks().as_bytes()).unwrap();
        let err = JwtVerifier::new(keys.clone(), Some("https://id.example"), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("issuer (iss) and the audience (aud)"), "{err}");
        assert!(JwtVerifier::new(keys.clone(), None, Some("payments")).is_err());
        assert!(JwtVerifier::new(keys, Some("https://id.example"), Some("payments")).is_ok());
        let secret = JwtKeys::Hs256([7; MIN_HS256_SECRET].to_vec());
        assert!(
            JwtVerifier::new(secret.clone(), None, None).is_ok(),
            "optional with a secret"
        );
        let short = JwtVerifier::new(JwtKeys::Hs256(b"s3cret".to_vec()), None, None);
        assert!(
            short
                .unwrap_err()
                .to_string()
                .contains("the HS256 secret is 6 bytes: give at least 32"),
            "a guessable secret is refused"
        );
        assert!(JwtVerifier::new(secret, Some(""), None)
            .unwrap_err()
            .to_string()
            .contains("empty"));
    }
}
