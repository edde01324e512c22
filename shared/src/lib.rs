//! The sans-I/O core of idem.
//!
//! Values in, decisions out: no clock, no network, no async. Every adapter — the
//! in-memory store, the Postgres statements, the Redis scripts, the edge's Durable
//! Object — asks these functions what to do and only executes the answer
//! atomically; the edge's worker and the origin's tower layer take every decision of
//! the HTTP contract from [`contract`] and only move bytes, so the two cannot drift
//! apart.
//!
//! * [`IdempotencyKey`] — the validated `Idempotency-Key` header.
//! * [`Scope`] and [`RecordKey`] — whose key it is, and where its record lives.
//! * [`Fingerprint`] — what the request was (method, target, content type, body).
//! * [`Record`] — `InProgress` or `Completed`, with a versioned binary encoding.
//! * [`decide`] — the whole protocol: execute, replay, wait, refuse or take over.
//! * [`contract`] — the HTTP contract: routing, keys, waits, stored headers, problems.
//!
//! Time is always passed in as [`Millis`] since the Unix epoch.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod contract;
mod decision;
mod fingerprint;
mod invalid;
pub mod json;
mod key;
mod purge;
mod record;
mod scope;
pub mod selection;
mod stamp;

pub use decision::{
    complete, decide, decide_at_edge, heartbeat, release, Claim, Decision, Holder, OverLostFront,
    Policy, Refusal, Transition,
};
pub use fingerprint::{Fingerprint, RequestParts};
pub use invalid::InvalidSetting;
pub use key::{IdempotencyKey, KeyError, MAX_KEY_LEN};
pub use purge::{
    decide_purge, purge_may_resend, purge_not_before, purge_not_before_given_copy, PurgeDecision,
    PurgeTarget,
};
pub use record::{DecodeError, Record, StoredResponse, EXPIRY_GRACE_MS, TOKENS_PER_MS};
pub use scope::{RecordKey, RecordTag, Scope};
pub use selection::{FingerprintRule, JsonPointer};
pub use stamp::Stamp;

/// Milliseconds since the Unix epoch. The core never reads a clock; callers pass this in.
pub type Millis = u64;

/// Lower-case hexadecimal of `bytes`.
pub fn hex(bytes: &[u8]) -> alloc::string::String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = alloc::string::String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}
