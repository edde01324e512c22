//! Which answers free their key: statuses a route names as "nothing happened"
//! ([`ReleaseOn`]), beside idem's private release signal. Only client errors (4xx) can
//! be named: a 2xx or 3xx says the request was acted on, and a 5xx can follow a
//! committed effect (a crash after the write, a gateway timeout), so those are always
//! stored — whatever a route file says.

use crate::InvalidSetting;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// A set of 4xx statuses on which an answer is not stored and its key is freed, so a
/// corrected retry with the same key runs (Stripe does not keep a request that failed
/// validation; Powertools deletes the record when the handler raises).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReleaseOn {
    /// Bit `n` is status `400 + n`.
    bits: u128,
}

/// Proxy mode's default ([`ReleaseOn::proxy_default`]), each status with why an API
/// answers it before acting. Left out: 404 (an API may look up a resource after an
/// effect, and a corrected request names another path, so another fingerprint, anyway),
/// 410 (gone for good: the same answer every time), 409 and 412 (the request met the
/// state the API holds — possibly state the first attempt made: "already paid" is its
/// true result), 417, 421, 425, 426 (about the connection, not the request, which a
/// proxy's upstream does not answer), 451 (a legal refusal, to be replayed as is).
pub const PROXY_DEFAULT_RELEASE: [(u16, &str); 11] = [
    (
        400,
        "the request failed validation: the client corrects it and retries",
    ),
    (
        401,
        "authentication middleware refused it before any handler ran",
    ),
    (403, "authorization refused it before any effect"),
    (405, "the method is not served on this path: nothing ran"),
    (406, "no acceptable representation: refused before acting"),
    (
        408,
        "the upstream timed out reading the request: it never had all of it",
    ),
    (411, "a length was required: the body was not read"),
    (413, "the body was too large: not read"),
    (415, "the media type is not accepted: not read"),
    (
        422,
        "the body was well-formed but invalid: refused before acting",
    ),
    (
        429,
        "rate limited: refused before any handler ran, retry after Retry-After",
    ),
];

impl ReleaseOn {
    /// No status: only the private signal releases (the library's default).
    pub const NONE: ReleaseOn = ReleaseOn { bits: 0 };

    /// Proxy mode's default: [`PROXY_DEFAULT_RELEASE`].
    pub fn proxy_default() -> ReleaseOn {
        let mut set = ReleaseOn::NONE;
        for (status, _) in PROXY_DEFAULT_RELEASE {
            set.bits |= 1 << (status - 400);
        }
        set
    }

    /// The set of `statuses`; an error names the first that is not a 4xx.
    pub fn new(statuses: impl IntoIterator<Item = u16>) -> Result<ReleaseOn, InvalidSetting> {
        let mut set = ReleaseOn::NONE;
        for status in statuses {
            if !(400..=499).contains(&status) {
                return Err(InvalidSetting::from(format!(
                    "{status} cannot free a key: only client errors (4xx) can — a 2xx or 3xx \
                     says the request was acted on, and a 5xx can follow a committed effect"
                )));
            }
            set.bits |= 1 << (status - 400);
        }
        Ok(set)
    }

    /// Parses a list as a flag or a variable gives it: statuses separated by commas,
    /// `none`, or `default` (proxy mode's, [`PROXY_DEFAULT_RELEASE`]), with `default`
    /// combinable with more statuses (`default,404`).
    pub fn parse(list: &str) -> Result<ReleaseOn, InvalidSetting> {
        let mut set = ReleaseOn::NONE;
        let items: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if items.is_empty() {
            return Err(InvalidSetting::from(String::from(
                "an empty list: write `none` to release on no status",
            )));
        }
        for item in &items {
            match *item {
                "none" if items.len() == 1 => {}
                "none" => {
                    return Err(InvalidSetting::from(String::from(
                        "`none` cannot be combined with statuses",
                    )))
                }
                "default" => set.bits |= ReleaseOn::proxy_default().bits,
                digits => {
                    let status = digits
                        .parse::<u16>()
                        .ok()
                        .filter(|_| digits.len() == 3)
                        .ok_or_else(|| {
                            format!(
                                "{digits:?} is not a status (three digits), `default` or `none`"
                            )
                        })?;
                    set.bits |= ReleaseOn::new([status])?.bits;
                }
            }
        }
        Ok(set)
    }

    /// Whether an answer of `status` frees its key.
    pub fn contains(self, status: u16) -> bool {
        (400..=499).contains(&status) && self.bits & (1 << (status - 400)) != 0
    }

    /// The statuses, ascending.
    pub fn statuses(self) -> impl Iterator<Item = u16> {
        (400..=499).filter(move |s| self.contains(*s))
    }

    /// Those of its statuses an API often answers after it acted (409 "already paid", a
    /// lookup's 404 after a write, 410, 412, 451): freeing the key on them lets a retry
    /// run the request again, so idem warns about them at start-up.
    pub fn risky(self) -> impl Iterator<Item = u16> {
        self.statuses()
            .filter(|s| [404, 409, 410, 412, 451].contains(s))
    }

    /// The statuses as `parse` reads them back (`none` for no status).
    pub fn to_list(self) -> String {
        let list: Vec<String> = self.statuses().map(|s| format!("{s}")).collect();
        if list.is_empty() {
            String::from("none")
        } else {
            list.join(",")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn only_client_errors_can_free_a_key() {
        let default = ReleaseOn::proxy_default();
        for status in [400, 401, 403, 405, 406, 408, 411, 413, 415, 422, 429] {
            assert!(default.contains(status), "{status}");
        }
        for status in [
            200, 201, 302, 404, 409, 410, 412, 500, 502, 503, 504, 399, 0, 600,
        ] {
            assert!(!default.contains(status), "{status}");
        }
        assert!(!ReleaseOn::NONE.contains(400));
        for bad in [200u16, 302, 500, 503, 399, 500] {
            assert!(ReleaseOn::new([bad]).is_err(), "{bad}");
        }
        assert!(ReleaseOn::new([499, 400]).unwrap().contains(499));
        assert_eq!(default.risky().count(), 0, "the default holds none of them");
        let more = ReleaseOn::parse("default,404,409").unwrap();
        assert_eq!(more.risky().collect::<alloc::vec::Vec<_>>(), [404, 409]);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn lists_parse_as_written() {
        assert_eq!(ReleaseOn::parse("none"), Ok(ReleaseOn::NONE));
        assert_eq!(ReleaseOn::parse("default"), Ok(ReleaseOn::proxy_default()));
        let more = ReleaseOn::parse("default, 404").unwrap();
        assert!(more.contains(404) && more.contains(422));
        assert_eq!(ReleaseOn::parse(" 400 ,422").unwrap().to_list(), "400,422");
        assert_eq!(ReleaseOn::NONE.to_list(), "none");
        for (bad, says) in [
            ("", "empty"),
            ("500", "5xx"),
            ("4000", "three digits"),
            ("40x", "three digits"),
            ("none,400", "cannot be combined"),
            ("+400", "three digits"),
        ] {
            let error = ReleaseOn::parse(bad).unwrap_err().to_string();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
        let listed = ReleaseOn::proxy_default().to_list();
        assert_eq!(ReleaseOn::parse(&listed), Ok(ReleaseOn::proxy_default()));
    }
}
