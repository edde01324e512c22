//! Where a Redis Cluster's password may go: the addresses the operator listed
//! (`--redis-url`) or allowed (`--redis-allow-host`). A cluster announces its nodes
//! itself (`CLUSTER SLOTS`); one that announces an address nobody listed — a node added
//! by someone else, or a forged answer — must not get the password.

use std::net::IpAddr;

/// One allowed address: `host:port`, a host on any port, or a network (CIDR).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Allowed {
    HostPort(String),
    Host(String),
    Net(IpAddr, u8),
}

/// The addresses a cluster's credentials may be sent to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeAllowList {
    entries: Vec<Allowed>,
}

impl NodeAllowList {
    /// `host:port` nodes (the URLs given) and `--redis-allow-host` entries: a host
    /// name or an IP address (any port), `host:port`, or a network `10.0.0.0/8`.
    pub(crate) fn new<'a>(
        listed: impl IntoIterator<Item = String>,
        allowed: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, String> {
        let mut entries: Vec<Allowed> = listed
            .into_iter()
            .map(|n| Allowed::HostPort(n.to_ascii_lowercase()))
            .collect();
        for spec in allowed {
            entries.push(parse(spec.trim())?);
        }
        Ok(NodeAllowList { entries })
    }

    /// Whether `node` (`host:port`, an IPv6 host with or without brackets) is allowed.
    pub(crate) fn allows(&self, node: &str) -> bool {
        let Some((host, port)) = split(node) else {
            return false;
        };
        let ip = host.parse::<IpAddr>().ok();
        self.entries.iter().any(|allowed| match allowed {
            Allowed::HostPort(listed) => split(listed).is_some_and(|(h, p)| h == host && p == port),
            Allowed::Host(listed) => *listed == host,
            Allowed::Net(net, bits) => ip.is_some_and(|ip| within(ip, *net, *bits)),
        })
    }
}

fn parse(spec: &str) -> Result<Allowed, String> {
    let spec = spec.to_ascii_lowercase();
    let bad = || {
        format!("--redis-allow-host {spec:?}: give a host, host:port or a network like 10.0.0.0/8")
    };
    if spec.is_empty() {
        return Err(bad());
    }
    if let Some((net, bits)) = spec.split_once('/') {
        let net: IpAddr = net.parse().map_err(|_| bad())?;
        let bits: u8 = bits.parse().map_err(|_| bad())?;
        let most = if net.is_ipv4() { 32 } else { 128 };
        if bits > most {
            return Err(bad());
        }
        return Ok(Allowed::Net(net, bits));
    }
    if spec.parse::<IpAddr>().is_ok() {
        return Ok(Allowed::Host(spec));
    }
    if let Some((host, port)) = split(&spec) {
        if port.parse::<u16>().is_ok() && !host.is_empty() {
            return Ok(Allowed::HostPort(format!("{host}:{port}")));
        }
        return Err(bad());
    }
    match spec
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        true => Ok(Allowed::Host(spec)),
        false => Err(bad()),
    }
}

/// `host:port` → (host without brackets, lower-cased; port).
fn split(node: &str) -> Option<(String, &str)> {
    let (host, port) = node.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_ascii_lowercase(), port))
}

fn within(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    let (ip, net, width) = match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => (u128::from(u32::from(a)), u128::from(u32::from(n)), 32),
        (IpAddr::V6(a), IpAddr::V6(n)) => (u128::from(a), u128::from(n), 128),
        _ => return false,
    };
    let shift = width - u32::from(bits);
    let mask = match shift {
        128 => 0,
        s => {
            (u128::MAX >> s << s)
                & if width == 32 {
                    u128::from(u32::MAX)
                } else {
                    u128::MAX
                }
        }
    };
    ip & mask == net & mask
}

#[cfg(test)]
mod tests {
    use super::NodeAllowList;

    #[test]
    fn listed_nodes_hosts_and_networks_are_allowed_nothing_else() {
        let list = NodeAllowList::new(
            ["a.example:7000".to_owned(), "[::1]:7000".to_owned()],
            ["b.example", "10.1.0.0/16", "c.example:7001", "fd00::/8"],
        )
        .unwrap();
        for allowed in [
            "a.example:7000",
            "A.example:7000",
            "::1:7000",
            "[::1]:7000",
            "b.example:1",
            "10.1.200.3:7000",
            "c.example:7001",
            "fd12::5:7000",
        ] {
            assert!(list.allows(allowed), "{allowed}");
        }
        for refused in [
            "a.example:7001",
            "::1:7001",
            "10.2.0.1:7000",
            "c.example:7000",
            "evil.example:7000",
            "a.example.evil:7000",
            "fe80::1:7000",
            "",
            "no-port",
        ] {
            assert!(!list.allows(refused), "{refused}");
        }
        let everything = NodeAllowList::new([], ["0.0.0.0/0"]).unwrap();
        assert!(everything.allows("203.0.113.9:6379"));
        assert!(
            !everything.allows("::2:6379"),
            "an IPv4 network holds no IPv6 host"
        );
    }

    #[test]
    fn a_malformed_entry_is_refused_by_name() {
        for bad in ["", "10.0.0.0/33", "::/129", "a b", "host:port", "x/8"] {
            let err = NodeAllowList::new([], [bad]).unwrap_err();
            assert!(err.starts_with("--redis-allow-host"), "{bad}: {err}");
        }
    }
}
