//! The stored state of one (scope, key) and its versioned binary encoding.

use crate::{Fingerprint, Millis};
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

/// Tokens are never below the claim's time × this ([`crate::decide`]'s floor), so a
/// token also tells when its holder claimed the key ([`Record::claimed_at`]).
pub const TOKENS_PER_MS: u64 = 1024;

/// How long past its expiry a record is kept by stores that delete records by
/// themselves ([`Record::delete_after`]).
pub const EXPIRY_GRACE_MS: Millis = 1_000;

/// A response as stored for replay: status, the allow-listed headers, the body.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// Header names (lower-case) and raw values, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The whole body.
    pub body: Vec<u8>,
}

/// The record of one (scope, key).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Record {
    /// An attempt is running. Its holder owns `token` until `lease_until`; after that
    /// the next attempt may take over with a higher token.
    InProgress {
        /// The fingerprint of the request being executed.
        fingerprint: Fingerprint,
        /// The fencing token of the current holder.
        token: u64,
        /// The holder's lease; renewed by heartbeats.
        lease_until: Millis,
        /// When the record may be deleted if nobody completes it.
        expires_at: Millis,
    },
    /// The attempt finished; its response is replayed until `expires_at`.
    Completed {
        /// The fingerprint of the request that produced `response`.
        fingerprint: Fingerprint,
        /// The token of the holder that completed it (later tokens are always higher).
        token: u64,
        /// What to replay.
        response: StoredResponse,
        /// After this instant the key is free again.
        expires_at: Millis,
    },
}

impl Record {
    /// The fingerprint of the request this record belongs to.
    pub fn fingerprint(&self) -> &Fingerprint {
        match self {
            Record::InProgress { fingerprint, .. } | Record::Completed { fingerprint, .. } => {
                fingerprint
            }
        }
    }

    /// The fencing token of the holder that wrote it.
    pub fn token(&self) -> u64 {
        match self {
            Record::InProgress { token, .. } | Record::Completed { token, .. } => *token,
        }
    }

    /// When the record stops counting: from this instant on, [`crate::decide`] treats
    /// the key as free. Stores delete a record only once this instant is strictly in
    /// the past, so a claim in the same millisecond still sees its token. An in-progress
    /// record never expires while its lease runs.
    pub fn expires_at(&self) -> Millis {
        match self {
            Record::InProgress {
                lease_until,
                expires_at,
                ..
            } => (*expires_at).max(*lease_until),
            Record::Completed { expires_at, .. } => *expires_at,
        }
    }

    /// When a store that deletes records by itself (Redis' expiry, the edge's alarm)
    /// may delete this one: [`EXPIRY_GRACE_MS`] after it expires, so that a claim in the
    /// same instant still sees its token and small clock differences don't matter.
    pub fn delete_after(&self) -> Millis {
        self.expires_at().saturating_add(EXPIRY_GRACE_MS)
    }

    /// When the holder that wrote this record claimed the key (store time, ms), read
    /// off its token: a token is the claim's time × [`TOKENS_PER_MS`], or one more than
    /// the token it replaced if that was higher (then this is a bound from above).
    pub fn claimed_at(&self) -> Millis {
        self.token() / TOKENS_PER_MS
    }

    /// Whether this is an in-progress record whose holder claimed the key before
    /// `instant`: what an operator lists to find attempts orphaned by a crash.
    pub fn in_progress_claimed_before(&self, instant: Millis) -> bool {
        !self.is_completed() && self.claimed_at() < instant
    }

    /// Whether the record holds a final response.
    pub fn is_completed(&self) -> bool {
        matches!(self, Record::Completed { .. })
    }

    /// Whether this is a released claim: its holder freed the key (nothing happened),
    /// its lease and its expiry one instant. Claims and renewals expire a TTL — at
    /// least a millisecond — after their lease ([`crate::Policy::claim_expires_at`]),
    /// so no other record looks so. A released claim is its token's last record: no
    /// write of its holder's (a heartbeat landing late) comes after it.
    pub fn is_released(&self) -> bool {
        matches!(self, Record::InProgress { lease_until, expires_at, .. } if lease_until == expires_at)
    }

    /// Where the record stands in its token's life: claimed (0), released (1),
    /// completed (2). A token's records only move forward.
    fn phase(&self) -> u8 {
        match self {
            Record::Completed { .. } => 2,
            r if r.is_released() => 1,
            Record::InProgress { .. } => 0,
        }
    }

    /// Whether this record may replace `current` when a copy of the authority's state
    /// is written to a cache or written behind: it never moves a key backwards — not to
    /// an older token, nor under the same token from completed or released back to a
    /// live claim (a heartbeat queued or mirrored after its holder's release).
    pub fn supersedes(&self, current: &Record) -> bool {
        (self.token(), self.phase()) >= (current.token(), current.phase())
    }

    /// Whether this record, written behind into the authority (the tiered async
    /// outbox, or a written-behind claim before a transactional completion), may
    /// replace `current` there: it supersedes it, and it never buries a completion that
    /// had not expired when this record's attempt claimed the key — a stale claim must
    /// not hide an answer, nor may a holder's later completion replace the one its
    /// handler's transaction committed. Expiry is judged at this record's claim time
    /// (its token), on the clock that decided the claim, not on the authority's: an
    /// authority whose clock runs behind would otherwise refuse, silently, a reuse the
    /// deciding store rightly allowed. (Postgres states exactly this in SQL.)
    pub fn may_write_behind(&self, current: Option<&Record>) -> bool {
        match current {
            None => true,
            Some(current) => {
                self.supersedes(current)
                    && !(current.is_completed() && current.expires_at() > self.claimed_at())
            }
        }
    }

    /// Whether this record is strictly further along than `other`: a higher token, or
    /// the same token released or completed where `other` is a live claim (or completed
    /// where `other` is released).
    pub fn is_newer_than(&self, other: &Record) -> bool {
        (self.token(), self.phase()) > (other.token(), other.phase())
    }

    /// The state as a small integer, for stores that index or filter on it
    /// (0 = in progress, 1 = completed). Same values as in the encoding.
    pub fn state_code(&self) -> u8 {
        match self {
            Record::InProgress { .. } => STATE_IN_PROGRESS,
            Record::Completed { .. } => STATE_COMPLETED,
        }
    }
}

const VERSION: u8 = 1;
const STATE_IN_PROGRESS: u8 = 0;
const STATE_COMPLETED: u8 = 1;

/// Why stored bytes could not be decoded as a [`Record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ended early.
    Truncated,
    /// An encoding version this build does not know (written by a newer idem?).
    UnknownVersion(u8),
    /// An unknown state byte.
    UnknownState(u8),
    /// A header name that is not UTF-8.
    BadHeaderName,
    /// Bytes left over after the record.
    TrailingBytes,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => f.write_str("record truncated"),
            DecodeError::UnknownVersion(v) => write!(f, "unknown record encoding version {v}"),
            DecodeError::UnknownState(s) => write!(f, "unknown record state {s}"),
            DecodeError::BadHeaderName => f.write_str("record holds a non-UTF-8 header name"),
            DecodeError::TrailingBytes => f.write_str("trailing bytes after record"),
        }
    }
}

impl core::error::Error for DecodeError {}

impl Record {
    /// Encodes the record:
    /// `version:u8 state:u8 fingerprint:[32] token:u64`, then for in-progress
    /// `lease_until:u64 expires_at:u64`, for completed `expires_at:u64 status:u16
    /// n:u16 (name_len:u16 name value_len:u32 value)*n body_len:u32 body`. Big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.push(VERSION);
        out.push(self.state_code());
        out.extend_from_slice(&self.fingerprint().0);
        out.extend_from_slice(&self.token().to_be_bytes());
        match self {
            Record::InProgress {
                lease_until,
                expires_at,
                ..
            } => {
                out.extend_from_slice(&lease_until.to_be_bytes());
                out.extend_from_slice(&expires_at.to_be_bytes());
            }
            Record::Completed {
                response,
                expires_at,
                ..
            } => {
                out.reserve(response.body.len() + 16);
                out.extend_from_slice(&expires_at.to_be_bytes());
                out.extend_from_slice(&response.status.to_be_bytes());
                // Lengths are clamped when stored, so an absurd response can't corrupt
                // the framing; the layer caps sizes long before this.
                let headers = &response.headers[..response.headers.len().min(u16::MAX as usize)];
                out.extend_from_slice(&(headers.len() as u16).to_be_bytes());
                for (name, value) in headers {
                    let name = &name.as_bytes()[..name.len().min(u16::MAX as usize)];
                    let value = &value[..value.len().min(u32::MAX as usize)];
                    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
                    out.extend_from_slice(name);
                    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
                    out.extend_from_slice(value);
                }
                let body = &response.body[..response.body.len().min(u32::MAX as usize)];
                out.extend_from_slice(&(body.len() as u32).to_be_bytes());
                out.extend_from_slice(body);
            }
        }
        out
    }

    /// Decodes bytes written by [`Record::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != VERSION {
            return Err(DecodeError::UnknownVersion(version));
        }
        let state = r.u8()?;
        let fingerprint = Fingerprint(r.take(32)?.try_into().map_err(|_| DecodeError::Truncated)?);
        let token = r.u64()?;
        let record = match state {
            STATE_IN_PROGRESS => {
                let lease_until = r.u64()?;
                let expires_at = r.u64()?;
                Record::InProgress {
                    fingerprint,
                    token,
                    lease_until,
                    expires_at,
                }
            }
            STATE_COMPLETED => {
                let expires_at = r.u64()?;
                let status = r.u16()?;
                let n = r.u16()? as usize;
                let mut headers = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    let name_len = r.u16()? as usize;
                    let name = core::str::from_utf8(r.take(name_len)?)
                        .map_err(|_| DecodeError::BadHeaderName)?;
                    let value_len = r.u32()? as usize;
                    headers.push((String::from(name), r.take(value_len)?.to_vec()));
                }
                let body_len = r.u32()? as usize;
                let body = r.take(body_len)?.to_vec();
                Record::Completed {
                    fingerprint,
                    token,
                    response: StoredResponse {
                        status,
                        headers,
                        body,
                    },
                    expires_at,
                }
            }
            other => return Err(DecodeError::UnknownState(other)),
        };
        if !r.0.is_empty() {
            return Err(DecodeError::TrailingBytes);
        }
        Ok(record)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(
            self.take(2)?
                .try_into()
                .map_err(|_| DecodeError::Truncated)?,
        ))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(
            self.take(4)?
                .try_into()
                .map_err(|_| DecodeError::Truncated)?,
        ))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(
            self.take(8)?
                .try_into()
                .map_err(|_| DecodeError::Truncated)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    #[cfg(not(target_arch = "wasm32"))]
    use proptest::prelude::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn completed() -> Record {
        Record::Completed {
            fingerprint: Fingerprint([7; 32]),
            token: 42,
            response: StoredResponse {
                status: 201,
                headers: vec![
                    ("content-type".into(), b"application/json".to_vec()),
                    ("location".into(), b"/v1/charges/ch_1".to_vec()),
                ],
                body: br#"{"id":"ch_1"}"#.to_vec(),
            },
            expires_at: 1_700_000_000_000,
        }
    }

    /// Found untested by cargo-mutants (docs/mutants.md).
    #[wasm_bindgen_test(unsupported = test)]
    fn newer_and_deletable_records() {
        let claim = |token| Record::InProgress {
            fingerprint: Fingerprint([1; 32]),
            token,
            lease_until: 5_000,
            expires_at: 9_000,
        };
        let released = Record::InProgress {
            fingerprint: Fingerprint([1; 32]),
            token: 9,
            lease_until: 3_000,
            expires_at: 3_000,
        };
        let done = |token| match completed() {
            Record::Completed {
                fingerprint,
                response,
                expires_at,
                ..
            } => Record::Completed {
                fingerprint,
                token,
                response,
                expires_at,
            },
            r => r,
        };
        assert!(claim(10).is_newer_than(&claim(9)));
        assert!(!claim(9).is_newer_than(&claim(10)));
        assert!(!claim(9).is_newer_than(&claim(9)), "not newer than itself");
        assert!(released.is_newer_than(&claim(9)));
        assert!(!claim(9).is_newer_than(&released));
        assert!(done(9).is_newer_than(&released));
        assert!(!released.is_newer_than(&done(9)));
        assert_eq!(claim(9).delete_after(), 9_000 + EXPIRY_GRACE_MS);
        assert_eq!(done(9).delete_after(), 1_700_000_000_000 + EXPIRY_GRACE_MS);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn round_trips() {
        let ip = Record::InProgress {
            fingerprint: Fingerprint([1; 32]),
            token: 9,
            lease_until: 5,
            expires_at: 6,
        };
        assert_eq!(Record::decode(&ip.encode()), Ok(ip));
        assert_eq!(Record::decode(&completed().encode()), Ok(completed()));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn newer_tokens_and_completion_supersede() {
        let ip = |token| Record::InProgress {
            fingerprint: Fingerprint([1; 32]),
            token,
            lease_until: 5,
            expires_at: 6,
        };
        let done = completed(); // token 42
        assert!(done.supersedes(&ip(42)));
        assert!(
            !ip(42).supersedes(&done),
            "never back to in-progress under the same token"
        );
        assert!(
            ip(43).supersedes(&done),
            "a later claim (after expiry) wins"
        );
        assert!(!ip(41).supersedes(&ip(42)));
        let released = Record::InProgress {
            fingerprint: Fingerprint([1; 32]),
            token: 42,
            lease_until: 7,
            expires_at: 7,
        };
        assert!(released.is_released() && !ip(42).is_released());
        assert!(released.supersedes(&ip(42)), "a release follows its claim");
        assert!(
            !ip(42).supersedes(&released),
            "a heartbeat never follows its holder's release"
        );
        assert!(done.supersedes(&released) && !released.supersedes(&done));
        assert!(
            ip(42).supersedes(&ip(42)),
            "the same holder's newer write (a heartbeat) passes"
        );
    }

    /// Written behind over a live completion C: a claim made while C was live (by the
    /// clock that decided it: its token) is refused, one made after C expired passes —
    /// whatever the authority's own clock says, which is not asked.
    #[wasm_bindgen_test(unsupported = test)]
    fn written_behind_over_a_completion_judged_at_the_claim_time() {
        let c = Record::Completed {
            fingerprint: Fingerprint([7; 32]),
            token: 1_000 * TOKENS_PER_MS,
            response: StoredResponse::default(),
            expires_at: 4_000,
        };
        let claimed_at = |ms: u64| Record::InProgress {
            fingerprint: Fingerprint([2; 32]),
            token: ms * TOKENS_PER_MS,
            lease_until: ms + 30_000,
            expires_at: ms + 60_000,
        };
        assert!(!claimed_at(3_999).may_write_behind(Some(&c)), "C was live");
        assert!(
            claimed_at(4_000).may_write_behind(Some(&c)),
            "C had expired"
        );
        assert!(claimed_at(4_500).may_write_behind(Some(&c)));
        // The same attempt's later completion never replaces the committed one.
        let again = Record::Completed {
            fingerprint: Fingerprint([7; 32]),
            token: 1_000 * TOKENS_PER_MS,
            response: StoredResponse::default(),
            expires_at: 9_000,
        };
        assert!(!again.may_write_behind(Some(&c)));
        assert!(claimed_at(1).may_write_behind(None));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn rejects_damaged_bytes() {
        let bytes = completed().encode();
        for cut in 0..bytes.len() {
            assert!(Record::decode(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        let mut v2 = bytes.clone();
        v2[0] = 2;
        assert_eq!(Record::decode(&v2), Err(DecodeError::UnknownVersion(2)));
        let mut extra = bytes.clone();
        extra.push(0);
        assert_eq!(Record::decode(&extra), Err(DecodeError::TrailingBytes));
        let mut state = bytes;
        state[1] = 9;
        assert_eq!(Record::decode(&state), Err(DecodeError::UnknownState(9)));
    }

    #[cfg(not(target_arch = "wasm32"))]
    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Record::decode(&bytes);
        }

        #[test]
        fn completed_round_trips(status in 100u16..600, token: u64, expires_at: u64,
                                 body in proptest::collection::vec(any::<u8>(), 0..200),
                                 headers in proptest::collection::vec(("[a-z-]{1,20}", proptest::collection::vec(any::<u8>(), 0..40)), 0..5)) {
            let r = Record::Completed { fingerprint: Fingerprint([3; 32]), token, expires_at,
                response: StoredResponse { status, headers, body } };
            prop_assert_eq!(Record::decode(&r.encode()), Ok(r));
        }
    }
}
