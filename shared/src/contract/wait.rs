//! `Prefer: wait=N` (RFC 7240) and the schedule on which a waiting request asks
//! again whether the attempt that holds its key has finished.

use crate::Millis;

/// The first poll comes this soon: most executions are short.
pub const FIRST_POLL_MS: u64 = 10;
/// Polls back off, doubling, to at most this far apart.
pub const MAX_POLL_MS: u64 = 200;

/// The `wait` preference of one `Prefer` header value, in seconds, if present and
/// well-formed. With several `wait` preferences the first wins, as RFC 7240 says.
pub fn prefer_wait(prefer: &[u8]) -> Option<u64> {
    first_wait([prefer])?
}

/// The first `wait` preference across `values` (repeated `Prefer` headers read as one
/// folded list, as a runtime that folds them hands them over): `None` when there is
/// none, `Some(None)` when the first one is malformed.
fn first_wait<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<Option<u64>> {
    for pref in values
        .into_iter()
        .flat_map(|value| value.split(|&b| b == b','))
    {
        // A preference may carry parameters after ';' — only its head matters here.
        let head = pref.split(|&b| b == b';').next().unwrap_or(pref);
        let mut kv = head.splitn(2, |&b| b == b'=');
        let name = super::trim_ows(kv.next().unwrap_or_default());
        if !name.eq_ignore_ascii_case(b"wait") {
            continue;
        }
        let Some(value) = kv.next() else {
            return Some(None);
        };
        let value = super::trim_ows(value);
        let value = value
            .strip_prefix(b"\"")
            .and_then(|v| v.strip_suffix(b"\""))
            .unwrap_or(value);
        return Some(super::parse_digits(value, 9));
    }
    None
}

/// How long a request may wait for the attempt holding its key, in ms: the first
/// `wait` preference of its `Prefer` headers (all of them, in order, as one list),
/// capped at `max_wait_ms`; 0 without one or when it is malformed.
pub fn wait_ms<'a>(prefer: impl IntoIterator<Item = &'a [u8]>, max_wait_ms: u64) -> u64 {
    wait_ms_or(prefer, 0, max_wait_ms)
}

/// [`wait_ms`], with `default_ms` for a request that states no `wait` (a route whose
/// clients should wait unless they say otherwise). A stated `wait`, `wait=0` or a
/// malformed one included, is the client's own choice and wins.
pub fn wait_ms_or<'a>(
    prefer: impl IntoIterator<Item = &'a [u8]>,
    default_ms: u64,
    max_wait_ms: u64,
) -> u64 {
    match first_wait(prefer) {
        None => default_ms.min(max_wait_ms),
        Some(stated) => stated.map_or(0, |secs| secs.saturating_mul(1000).min(max_wait_ms)),
    }
}

/// The response header that says which preferences were honoured (RFC 7240 §3).
pub const PREFERENCE_APPLIED: &str = "preference-applied";

/// Whether a request's `Prefer: wait=N` is honoured — stated, well-formed, and waited
/// for (up to `max_wait_ms`, which must allow some wait): then its answer says so with
/// `Preference-Applied: wait`. A default wait the client did not ask for is not its
/// preference, and a malformed one is not applied.
pub fn wait_applied<'a>(prefer: impl IntoIterator<Item = &'a [u8]>, max_wait_ms: u64) -> bool {
    max_wait_ms > 0 && matches!(first_wait(prefer), Some(Some(_)))
}

/// A request that found its key in flight, waiting for it on a monotonic clock of
/// the runtime's choosing (only differences matter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiting {
    deadline: Millis,
    next_poll_ms: u64,
}

impl Waiting {
    /// Starts waiting at `now` for at most `wait_ms`.
    pub fn new(now: Millis, wait_ms: u64) -> Waiting {
        Waiting {
            deadline: now.saturating_add(wait_ms),
            next_poll_ms: FIRST_POLL_MS,
        }
    }

    /// The key was found in flight at `now`: how long to sleep before asking again,
    /// or `None` when the wait is over and the answer is `409`.
    pub fn poll_after(&mut self, now: Millis) -> Option<u64> {
        let left = self.deadline.checked_sub(now).filter(|&ms| ms > 0)?;
        let sleep = self.next_poll_ms.min(left);
        self.next_poll_ms = (self.next_poll_ms * 2).min(MAX_POLL_MS);
        Some(sleep)
    }
}

#[cfg(test)]
mod applied_tests {
    use super::*;

    #[wasm_bindgen_test::wasm_bindgen_test(unsupported = test)]
    fn only_a_stated_wait_that_can_be_waited_is_applied() {
        assert!(wait_applied([&b"wait=5"[..]], 10_000));
        assert!(wait_applied([&b"respond-async, wait=0"[..]], 10_000));
        assert!(!wait_applied([&b"wait=5"[..]], 0), "no wait allowed");
        assert!(!wait_applied([&b"wait=soon"[..]], 10_000), "malformed");
        assert!(!wait_applied([&b"return=minimal"[..]], 10_000));
        assert!(!wait_applied(core::iter::empty(), 10_000));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// Found untested by cargo-mutants (docs/mutants.md): the sleeps double from the
    /// first poll up to the cap, never past the deadline, and the wait ends at it.
    #[wasm_bindgen_test(unsupported = test)]
    fn polls_double_to_the_cap_and_stop_at_the_deadline() {
        let mut w = Waiting::new(1_000, 700);
        let mut now = 1_000;
        let mut sleeps = Vec::new();
        while let Some(ms) = w.poll_after(now) {
            sleeps.push(ms);
            now += ms;
            assert!(sleeps.len() < 100, "the wait never ends: {sleeps:?}");
        }
        assert_eq!(sleeps, [10, 20, 40, 80, 160, 200, 190]);
        assert_eq!(now, 1_700);
        assert_eq!(Waiting::new(0, 0).poll_after(0), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn reads_prefer_wait() {
        assert_eq!(prefer_wait(b"wait=5"), Some(5));
        assert_eq!(prefer_wait(b"respond-async, Wait = 10"), Some(10));
        assert_eq!(
            prefer_wait(b"handling=lenient; x=1, wait=\"3\"; y"),
            Some(3)
        );
        assert_eq!(prefer_wait(b"wait=5, wait=9"), Some(5));
        assert_eq!(prefer_wait(b"wait"), None);
        assert_eq!(prefer_wait(b"wait=-1"), None);
        assert_eq!(prefer_wait(b"wait=99999999999999999999"), None);
        assert_eq!(prefer_wait(b"return=minimal"), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn caps_waits_and_takes_the_first_header_that_has_one() {
        assert_eq!(wait_ms([&b"wait=1"[..]], 2_000), 1_000);
        assert_eq!(wait_ms([&b"wait=60"[..]], 2_000), 2_000);
        assert_eq!(wait_ms([&b"return=minimal"[..], b"wait=2"], 9_000), 2_000);
        // Repeated headers read as the folded list a runtime may hand over instead.
        for (separate, folded) in [
            (&[&b"wait=x"[..], b"wait=5"][..], &b"wait=x, wait=5"[..]),
            (&[&b"wait=3"[..], b"wait=5"][..], &b"wait=3, wait=5"[..]),
            (
                &[&b"respond-async"[..], b"wait"][..],
                &b"respond-async, wait"[..],
            ),
        ] {
            assert_eq!(
                wait_ms(separate.iter().copied(), 9_000),
                wait_ms([folded], 9_000)
            );
        }
        assert_eq!(
            wait_ms([&b"wait=x"[..], b"wait=5"], 9_000),
            0,
            "the first one counts"
        );
        assert_eq!(wait_ms([&b"wait=999999999"[..]], u64::MAX), 999_999_999_000);
        assert_eq!(wait_ms([], 2_000), 0);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_default_wait_applies_only_when_the_client_states_none() {
        assert_eq!(wait_ms_or([], 3_000, 10_000), 3_000);
        assert_eq!(wait_ms_or([&b"return=minimal"[..]], 3_000, 10_000), 3_000);
        assert_eq!(wait_ms_or([], 30_000, 10_000), 10_000, "capped");
        assert_eq!(wait_ms_or([&b"wait=0"[..]], 3_000, 10_000), 0);
        assert_eq!(wait_ms_or([&b"wait=1"[..]], 3_000, 10_000), 1_000);
        assert_eq!(wait_ms_or([&b"wait=x"[..]], 3_000, 10_000), 0);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn polls_back_off_and_stop_at_the_deadline() {
        let mut w = Waiting::new(1_000, 1_000);
        let mut now = 1_000;
        let mut sleeps = Vec::new();
        while let Some(ms) = w.poll_after(now) {
            sleeps.push(ms);
            now += ms;
        }
        assert_eq!(sleeps, [10, 20, 40, 80, 160, 200, 200, 200, 90]);
        assert_eq!(now, 2_000);
        assert_eq!(
            Waiting::new(5, 0).poll_after(5),
            None,
            "no wait: 409 at once"
        );
        assert_eq!(Waiting::new(5, 100).poll_after(500), None);
    }
}
