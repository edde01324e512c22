//! Who may use the admin API: bearer tokens read from a file, compared in constant time.

use idem_core::InvalidSetting;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Shortest token accepted: a guessable token would make the admin listener a way in.
pub(crate) const MIN_TOKEN_LEN: usize = 16;

/// The operators' tokens, kept as SHA-256 digests.
#[derive(Clone)]
pub struct Tokens {
    operators: Vec<(String, [u8; 32])>,
}

impl std::fmt::Debug for Tokens {
    /// Names the operators, never their tokens.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.operators.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Tokens").field("operators", &names).finish()
    }
}

impl Tokens {
    /// Parses a token file: one token per line, as `<operator>:<token>` or a bare
    /// token (operator `admin`); blank lines and lines starting with `#` are skipped.
    /// The error names the line, never the token.
    pub fn parse(text: &str) -> Result<Tokens, InvalidSetting> {
        let mut operators = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, token) = match line.split_once(':') {
                Some((name, token)) => (name.trim(), token.trim()),
                None => ("admin", line),
            };
            let line_no = n + 1;
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
            {
                return Err(InvalidSetting::from(format!(
                    "line {line_no}: an operator's name is letters, digits and - _ . @"
                )));
            }
            if token.len() < MIN_TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(InvalidSetting::from(format!(
                    "line {line_no}: a token is at least {MIN_TOKEN_LEN} visible ASCII characters"
                )));
            }
            operators.push((name.to_owned(), digest(token.as_bytes())));
        }
        if operators.is_empty() {
            return Err(InvalidSetting::new("no token in the file"));
        }
        Ok(Tokens { operators })
    }

    /// Reads and parses a token file.
    pub fn from_file(path: &std::path::Path) -> Result<Tokens, InvalidSetting> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the admin token file {}: {e}", path.display()))?;
        Tokens::parse(&text)
            .map_err(|e| InvalidSetting::new(format!("admin token file {}: {e}", path.display())))
    }

    /// The operator whose token `presented` is. Every token is compared, each in
    /// constant time over fixed-length digests: neither the length nor the position of
    /// a match shows in the time taken.
    pub fn operator(&self, presented: &[u8]) -> Option<&str> {
        let presented = digest(presented);
        let mut found = None;
        for (name, expected) in &self.operators {
            if constant_time_eq(&presented, expected) {
                found = Some(name.as_str());
            }
        }
        found
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    std::hint::black_box(difference) == 0
}

/// Failed logins per peer: past [`FailedLogins::LIMIT`] in a window of
/// [`FailedLogins::WINDOW`], every request from that peer is refused until the window
/// ends — the right token too, or guessing would go on at full speed between two
/// successes. A success clears the peer's count. IPv6 peers count by their /64, which
/// one client usually holds whole. At most [`FailedLogins::PEERS`] peers are tracked;
/// past that, the one tracked longest is forgotten.
#[derive(Debug, Default)]
pub(crate) struct FailedLogins {
    peers: std::sync::Mutex<HashMap<IpAddr, Failures>>,
}

#[derive(Clone, Copy, Debug)]
struct Failures {
    count: u32,
    since: Instant,
    /// Whether a refusal in this window was logged.
    logged: bool,
}

impl FailedLogins {
    /// Failed logins a peer may make in one window.
    pub(crate) const LIMIT: u32 = 10;
    /// The window failures are counted over, from the first.
    pub(crate) const WINDOW: Duration = Duration::from_secs(60);
    /// Peers tracked at once.
    pub(crate) const PEERS: usize = 10_000;

    /// How long `peer` must wait, if it made [`Self::LIMIT`] failures in the window.
    pub(crate) fn blocked(&self, peer: IpAddr, now: Instant) -> Option<Duration> {
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let failures = peers.get(&counted(peer))?;
        let left = Self::WINDOW.checked_sub(now.saturating_duration_since(failures.since))?;
        (failures.count >= Self::LIMIT && !left.is_zero()).then_some(left)
    }

    /// Counts a failed login by `peer`; returns its failures in the window.
    pub(crate) fn failed(&self, peer: IpAddr, now: Instant) -> u32 {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let peer = counted(peer);
        if !peers.contains_key(&peer) && peers.len() >= Self::PEERS {
            peers.retain(|_, f| now.saturating_duration_since(f.since) < Self::WINDOW);
            if peers.len() >= Self::PEERS {
                let oldest = peers.iter().min_by_key(|(_, f)| f.since).map(|(p, _)| *p);
                if let Some(oldest) = oldest {
                    peers.remove(&oldest);
                }
            }
        }
        let failures = peers.entry(peer).or_insert(Failures {
            count: 0,
            since: now,
            logged: false,
        });
        if now.saturating_duration_since(failures.since) >= Self::WINDOW {
            *failures = Failures {
                count: 0,
                since: now,
                logged: false,
            };
        }
        failures.count = failures.count.saturating_add(1);
        failures.count
    }

    /// Whether this is the first refusal of `peer` in its window (to log it once).
    pub(crate) fn first_refusal(&self, peer: IpAddr) -> bool {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers
            .get_mut(&counted(peer))
            .is_some_and(|f| !std::mem::replace(&mut f.logged, true))
    }

    /// Clears `peer`'s failures (it presented a valid token).
    pub(crate) fn succeeded(&self, peer: IpAddr) {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers.remove(&counted(peer));
    }
}

/// The address failures are counted by: an IPv4 address, or an IPv6 address's /64.
fn counted(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => peer,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(std::net::Ipv6Addr::from(prefix))
            }
        },
    }
}

/// What an `Authorization` header presents.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Presented<'a> {
    /// No header, or not a bearer token.
    Nothing,
    /// A bearer token.
    Bearer(&'a [u8]),
}

/// Reads the bearer token of an `Authorization` value.
pub(crate) fn presented(value: Option<&[u8]>) -> Presented<'_> {
    match value {
        Some(v) if v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ") => {
            Presented::Bearer(v[7..].trim_ascii())
        }
        _ => Presented::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_past_its_failures_waits_out_the_window() {
        let logins = FailedLogins::default();
        let t0 = Instant::now();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for n in 1..FailedLogins::LIMIT {
            assert_eq!(logins.failed(a, t0), n);
            assert_eq!(logins.blocked(a, t0), None, "after {n}");
        }
        logins.failed(a, t0);
        let later = t0 + Duration::from_secs(20);
        assert_eq!(logins.blocked(a, later), Some(Duration::from_secs(40)));
        assert_eq!(logins.blocked(b, later), None, "another peer");
        let after = t0 + FailedLogins::WINDOW;
        assert_eq!(logins.blocked(a, after), None, "the window is over");
        assert_eq!(logins.failed(a, after), 1, "a new window");
        logins.succeeded(a);
        assert_eq!(logins.failed(a, after), 1, "a success clears the count");
    }

    #[test]
    fn an_ipv6_client_counts_as_its_64() {
        let logins = FailedLogins::default();
        let t0 = Instant::now();
        for n in 0..FailedLogins::LIMIT {
            let peer: IpAddr = format!("2001:db8:1:2::{n:x}").parse().unwrap();
            logins.failed(peer, t0);
        }
        let same_64: IpAddr = "2001:db8:1:2:ffff::1".parse().unwrap();
        let other_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert!(logins.blocked(same_64, t0).is_some());
        assert!(logins.blocked(other_64, t0).is_none());
        let mapped: IpAddr = "::ffff:192.0.2.9".parse().unwrap();
        logins.failed(mapped, t0);
        assert_eq!(logins.failed("192.0.2.9".parse().unwrap(), t0), 2);
    }

    #[test]
    fn tracking_is_bounded() {
        let logins = FailedLogins::default();
        let t0 = Instant::now();
        for n in 0..(FailedLogins::PEERS as u32 + 5) {
            logins.failed(IpAddr::V4(std::net::Ipv4Addr::from(n)), t0);
        }
        assert_eq!(
            logins.peers.lock().unwrap().len(),
            FailedLogins::PEERS,
            "never more peers than the bound"
        );
    }

    #[test]
    fn names_operators_and_refuses_short_or_missing_tokens() {
        let t = Tokens::parse("# on-call\nalice:0123456789abcdef0123\n\n0123456789abcdefXYZW\n")
            .unwrap();
        assert_eq!(t.operator(b"0123456789abcdef0123"), Some("alice"));
        assert_eq!(t.operator(b"0123456789abcdefXYZW"), Some("admin"));
        assert_eq!(t.operator(b"0123456789abcdef012"), None);
        assert_eq!(t.operator(b""), None);
        assert!(Tokens::parse("bob:short")
            .unwrap_err()
            .message()
            .contains("line 1"));
        assert!(Tokens::parse("# nothing\n")
            .unwrap_err()
            .message()
            .contains("no token"));
        assert!(Tokens::parse("b b:0123456789abcdef0123").is_err());
        assert!(!format!("{t:?}").contains("0123"));
    }

    #[test]
    fn reads_bearer_tokens_only() {
        assert_eq!(presented(Some(b"Bearer  abc ")), Presented::Bearer(b"abc"));
        assert_eq!(presented(Some(b"bearer x")), Presented::Bearer(b"x"));
        assert_eq!(presented(Some(b"Basic abc")), Presented::Nothing);
        assert_eq!(presented(Some(b"Bearer ")), Presented::Nothing);
        assert_eq!(presented(None), Presented::Nothing);
    }
}
