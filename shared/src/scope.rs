//! Who a key belongs to, and the storage key of its record.

use crate::IdempotencyKey;
use alloc::string::String;
use sha2::{Digest, Sha256};

/// The owner of a key: a hash of the caller's credential, or a tenant id.
///
/// Records are stored per (scope, key), so one caller can never replay another
/// caller's response by guessing its key. The credential itself is never stored.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Scope([u8; 32]);

impl Scope {
    /// The scope of a caller identified by `credential` (for example a bearer token).
    pub fn from_credential(credential: &[u8]) -> Self {
        Scope(tagged_hash(b"idem/scope/credential/v1", &[credential]))
    }

    /// The scope of a tenant named by the application (not a secret).
    pub fn from_tenant(tenant: &str) -> Self {
        Scope(tagged_hash(b"idem/scope/tenant/v1", &[tenant.as_bytes()]))
    }

    /// The scope of a caller named by a header: a principal a trusted gateway sets, or
    /// an API key (hashed, never stored).
    pub fn from_header(name: &str, value: &[u8]) -> Self {
        Scope(tagged_hash(
            b"idem/scope/header/v1",
            &[name.as_bytes(), value],
        ))
    }

    /// The scope of a verified JWT's `claim`, by the claim's canonical JSON value: every
    /// token of one principal, refreshed or not, has it.
    pub fn from_claim(claim: &str, canonical_value: &[u8]) -> Self {
        Scope(tagged_hash(
            b"idem/scope/jwt-claim/v1",
            &[claim.as_bytes(), canonical_value],
        ))
    }

    /// The scope of a verified JWT's `claim` in a token of `issuer` (the canonical JSON
    /// of its `iss`), where the verifier pins no issuer and tokens of several may be
    /// accepted: two issuers' `sub = 42` are two callers. `None` (no `iss`, or an issuer
    /// the verifier pins, the same for every token it accepts) is [`Scope::from_claim`].
    pub fn from_issued_claim(issuer: Option<&[u8]>, claim: &str, canonical_value: &[u8]) -> Self {
        match issuer {
            None => Scope::from_claim(claim, canonical_value),
            Some(issuer) => Scope(tagged_hash(
                b"idem/scope/jwt-issuer-claim/v1",
                &[issuer, claim.as_bytes(), canonical_value],
            )),
        }
    }

    /// The shared scope of unauthenticated callers.
    pub fn anonymous() -> Self {
        Scope(tagged_hash(b"idem/scope/anonymous/v1", &[]))
    }

    /// The scope of a request from its `Authorization` header: the bearer token (or,
    /// for another scheme, the whole value), hashed; anonymous without one. The edge
    /// and the origin both scope this way, so they agree on every record key.
    pub fn from_authorization(value: Option<&[u8]>) -> Self {
        match value {
            None => Scope::anonymous(),
            Some(v) => match v.get(..7) {
                Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => {
                    Scope::from_credential(v[7..].trim_ascii())
                }
                _ => Scope::from_credential(v),
            },
        }
    }

    /// The scope's 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// Where a (scope, key) pair's record is stored: 64 lower-case hex characters.
///
/// Fixed-length and free of user-controlled characters, so it is safe as a
/// Postgres primary key, inside a Redis hash tag, or as a Durable Object name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct RecordKey(String);

impl RecordKey {
    /// The record key of `key` in `scope`.
    pub fn new(scope: &Scope, key: &IdempotencyKey) -> Self {
        let digest = tagged_hash(
            b"idem/record/v1",
            &[scope.as_bytes(), key.as_str().as_bytes()],
        );
        RecordKey(crate::hex(&digest))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A key for a downstream service's own idempotency (a payment processor's
    /// `Idempotency-Key`, a message's deduplication id): the same for every attempt at
    /// this request — a takeover after a crash included — and different per scope, per
    /// key and per `purpose` (one per distinct downstream call the handler makes).
    /// `idem_` and 40 hex digits: within every processor's limits.
    pub fn downstream_key(&self, purpose: &str) -> String {
        let digest = tagged_hash(
            b"idem/downstream/v1",
            &[self.0.as_bytes(), purpose.as_bytes()],
        );
        let mut out = String::with_capacity(45);
        out.push_str("idem_");
        out.push_str(&crate::hex(&digest[..20]));
        out
    }

    /// The tag that names this record where its key must not appear: the origin's
    /// disposition header ([`crate::contract::OriginDisposition`]), by which a cache in
    /// front checks that it keeps an answer under the record the origin stored it in.
    pub fn tag(&self) -> RecordTag {
        let digest = tagged_hash(b"idem/record-tag/v1", &[self.0.as_bytes()]);
        let mut tag = [0; 16];
        tag.copy_from_slice(&digest[..16]);
        RecordTag(tag)
    }

    /// Rebuilds a key read back from storage; `None` unless it is 64 lower-case hex digits.
    pub fn from_stored(s: &str) -> Option<Self> {
        let ok = s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        ok.then(|| RecordKey(s.into()))
    }
}

/// 128 bits of a hash of a [`RecordKey`] ([`RecordKey::tag`]): 32 lower-case hex
/// characters in a header.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RecordTag(pub [u8; 16]);

impl RecordTag {
    /// The tag as 32 lower-case hex characters.
    pub fn to_hex(&self) -> String {
        crate::hex(&self.0)
    }

    /// Parses 32 hex characters (either case); `None` for anything else.
    pub fn parse(text: &[u8]) -> Option<RecordTag> {
        if text.len() != 32 {
            return None;
        }
        let nibble = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
        let mut tag = [0; 16];
        for (i, pair) in text.chunks(2).enumerate() {
            tag[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
        }
        Some(RecordTag(tag))
    }
}

/// SHA-256 over a domain tag and length-prefixed parts: no two different inputs
/// share an encoding, and hashes made for one purpose can't be confused with another.
pub(crate) fn tagged_hash(tag: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((tag.len() as u64).to_be_bytes());
    h.update(tag);
    for part in parts {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn key(s: &str) -> IdempotencyKey {
        IdempotencyKey::parse(s.as_bytes()).unwrap()
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn scopes_separate_records() {
        let k = key("k1");
        let a = RecordKey::new(&Scope::from_credential(b"alice"), &k);
        let b = RecordKey::new(&Scope::from_credential(b"bob"), &k);
        let anon = RecordKey::new(&Scope::anonymous(), &k);
        assert_ne!(a, b);
        assert_ne!(a, anon);
        assert_eq!(
            a,
            RecordKey::new(&Scope::from_credential(b"alice"), &key("\"k1\""))
        );
        // A tenant named like a credential is still a different scope.
        assert_ne!(
            Scope::from_tenant("alice"),
            Scope::from_credential(b"alice")
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn downstream_keys_are_stable_and_distinct() {
        let alice = RecordKey::new(&Scope::from_credential(b"alice"), &key("k1"));
        let bob = RecordKey::new(&Scope::from_credential(b"bob"), &key("k1"));
        let d = alice.downstream_key("charge");
        assert_eq!(d, alice.clone().downstream_key("charge"));
        assert!(d.starts_with("idem_") && d.len() == 45, "{d}");
        assert_ne!(d, bob.downstream_key("charge"));
        assert_ne!(d, alice.downstream_key("refund"));
        // The record key never leaks into it.
        assert!(!d.contains(&alice.as_str()[..8]));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn authorization_scopes_by_bearer_token() {
        assert_eq!(Scope::from_authorization(None), Scope::anonymous());
        assert_eq!(
            Scope::from_authorization(Some(b"Bearer sk_1")),
            Scope::from_credential(b"sk_1")
        );
        assert_eq!(
            Scope::from_authorization(Some(b"bearer  sk_1 ")),
            Scope::from_credential(b"sk_1")
        );
        assert_eq!(
            Scope::from_authorization(Some(b"Basic abc")),
            Scope::from_credential(b"Basic abc")
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn record_keys_round_trip_and_reject_junk() {
        let rk = RecordKey::new(&Scope::anonymous(), &key("x"));
        assert_eq!(rk.as_str().len(), 64);
        assert_eq!(RecordKey::from_stored(rk.as_str()), Some(rk));
        assert_eq!(RecordKey::from_stored("ABC"), None);
        assert_eq!(RecordKey::from_stored(&"G".repeat(64)), None);
    }
}
