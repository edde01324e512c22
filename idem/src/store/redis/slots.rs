//! Requests routed by slot to each master on a connection of its own.
//!
//! redis-rs's cluster connection pauses every request while it recovers from one
//! node's failure: it refreshes its slot map and reconnects with the whole connection
//! held (redis-rs issue #2092). A master killed under load then stalled the requests
//! for every shard until the failover was over — 1 476 of 1 600 answers were 503 in
//! tiered async, though the dead master owned a third of the slots. Here each request
//! goes straight to its slot's master on that node's own connection: a dead master
//! fails its own keys only, and the slot map is read again in the background, never
//! in a request's path. A redirect (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`,
//! `READONLY` from a demoted master) sends that request through the cluster connection,
//! which knows how to follow it, and the map is read again. `CLUSTERDOWN` is the
//! cluster's own answer (a slot without a master, under
//! `cluster-require-full-coverage yes`): the request fails at once, as it would
//! through the cluster connection after its retries.

use super::nodes::NodeConnections;
use crate::store::StoreError;
use redis::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Redis Cluster's 16 384 slots.
const SLOTS: u16 = 16_384;

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (the first `{…}` with something
/// inside), or of the whole key, modulo 16 384 — as every Redis Cluster node computes it.
pub(super) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Which master serves each slot range, as `CLUSTER SLOTS` said.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct SlotMap {
    /// `(first slot, last slot, master's host:port)`, sorted by first slot.
    ranges: Vec<(u16, u16, String)>,
}

impl SlotMap {
    /// The master of `slot`, if the map has one.
    pub(super) fn owner(&self, slot: u16) -> Option<&str> {
        let at = self.ranges.partition_point(|(_, last, _)| *last < slot);
        match self.ranges.get(at) {
            Some((first, _, node)) if *first <= slot => Some(node),
            _ => None,
        }
    }

    /// The masters named, each once.
    fn masters(&self) -> Vec<String> {
        let mut all: Vec<String> = self.ranges.iter().map(|(_, _, n)| n.clone()).collect();
        all.sort();
        all.dedup();
        all
    }

    /// A `CLUSTER SLOTS` reply, as answered by `asked`. A master's host read as Redis
    /// and redis-rs read it: empty, null or a wildcard (`0.0.0.0`, `::`) is the node
    /// that answered; `?` (unknown) leaves its slots without an owner here, so their
    /// requests go through the cluster connection.
    pub(super) fn parse(reply: &Value, asked: &str) -> Result<SlotMap, StoreError> {
        let corrupt = || StoreError::corrupt(format!("CLUSTER SLOTS: {reply:?}"));
        let Value::Array(entries) = reply else {
            return Err(corrupt());
        };
        let asked_host = asked.rsplit_once(':').map_or(asked, |(host, _)| host);
        let mut ranges = Vec::with_capacity(entries.len());
        for entry in entries {
            let Value::Array(fields) = entry else {
                return Err(corrupt());
            };
            let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(master))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return Err(corrupt());
            };
            let (Ok(first), Ok(last)) = (u16::try_from(*first), u16::try_from(*last)) else {
                return Err(corrupt());
            };
            if first > last || last >= SLOTS {
                return Err(corrupt());
            }
            let Some(node) = node_address(master, asked_host).ok_or_else(corrupt)? else {
                continue;
            };
            ranges.push((first, last, node));
        }
        ranges.sort();
        Ok(SlotMap { ranges })
    }
}

/// A node of a `CLUSTER SLOTS` entry (`[host, port, id, …]`) as `host:port`: an empty,
/// null or wildcard host is the node that answered; `Some(None)` for `?` (unknown);
/// `None` when malformed.
fn node_address(node: &[Value], asked_host: &str) -> Option<Option<String>> {
    let host = match node.first()? {
        Value::BulkString(host) => String::from_utf8_lossy(host).into_owned(),
        Value::SimpleString(host) => host.clone(),
        Value::Nil => String::new(),
        _ => return None,
    };
    let Value::Int(port) = node.get(1)? else {
        return None;
    };
    let port = u16::try_from(*port).ok()?;
    let host = match host.as_str() {
        "?" => return Some(None),
        "" | "0.0.0.0" | "::" | "[::]" => asked_host.to_owned(),
        _ => host,
    };
    Some(Some(match host.contains(':') && !host.starts_with('[') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    }))
}

/// Every node a `CLUSTER SLOTS` reply from `asked` names, masters and replicas, each
/// once: where a cluster client would connect.
pub(super) fn announced_nodes(reply: &Value, asked: &str) -> Result<Vec<String>, StoreError> {
    let corrupt = || StoreError::corrupt(format!("CLUSTER SLOTS: {reply:?}"));
    let Value::Array(entries) = reply else {
        return Err(corrupt());
    };
    let asked_host = asked.rsplit_once(':').map_or(asked, |(host, _)| host);
    let mut nodes = Vec::new();
    for entry in entries {
        let Value::Array(fields) = entry else {
            return Err(corrupt());
        };
        for node in fields.iter().skip(2) {
            let Value::Array(node) = node else {
                return Err(corrupt());
            };
            if let Some(address) = node_address(node, asked_host).ok_or_else(corrupt)? {
                nodes.push(address);
            }
        }
    }
    nodes.sort();
    nodes.dedup();
    Ok(nodes)
}

/// The slot map, read again in the background when a request finds it wrong.
pub(super) struct SlotRouter {
    map: RwLock<Arc<SlotMap>>,
    /// The nodes first given: asked when no master of the map answers.
    seeds: Vec<String>,
    refreshing: AtomicBool,
    last_refresh: Mutex<Option<Instant>>,
    /// Where the next reading starts among the nodes to ask: a node with a stale view
    /// (cut off from the others, say) is not always the one believed.
    turn: std::sync::atomic::AtomicUsize,
}

/// The least time between two readings of the map: a master that is down fails every
/// request for its keys, and each would otherwise ask again.
const REFRESH_AT_MOST_EVERY: Duration = Duration::from_millis(100);

impl SlotRouter {
    pub(super) fn new(seeds: Vec<String>) -> Self {
        SlotRouter {
            map: RwLock::new(Arc::new(SlotMap::default())),
            seeds,
            refreshing: AtomicBool::new(false),
            last_refresh: Mutex::new(None),
            turn: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The master that serves `key`, as far as the map knows.
    pub(super) fn owner(&self, key: &[u8]) -> Option<String> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner()).clone();
        map.owner(slot(key)).map(str::to_owned)
    }

    /// Reads the map from the masters it names, then the seeds; the first answer
    /// replaces it.
    pub(super) async fn refresh(&self, nodes: &NodeConnections) -> Result<(), StoreError> {
        let mut ask = self.map.read().unwrap_or_else(|p| p.into_inner()).masters();
        ask.extend(
            self.seeds
                .iter()
                .filter(|s| !ask.contains(s))
                .cloned()
                .collect::<Vec<_>>(),
        );
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        if !ask.is_empty() {
            let by = turn % ask.len();
            ask.rotate_left(by);
        }
        let mut last_error = StoreError::unavailable("redis: no node to ask for its slots");
        for node in &ask {
            let asked: Result<Value, StoreError> =
                nodes.query(node, redis::cmd("CLUSTER").arg("SLOTS")).await;
            match asked.and_then(|reply| SlotMap::parse(&reply, node)) {
                Ok(map) if !map.ranges.is_empty() => {
                    *self.map.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(map);
                    return Ok(());
                }
                Ok(_) => {
                    last_error = StoreError::unavailable(format!("redis: {node} serves no slot"));
                }
                Err(e) => last_error = e,
            }
        }
        Err(last_error)
    }

    /// Starts a reading of the map unless one is running or one ended less than
    /// [`REFRESH_AT_MOST_EVERY`] ago; never waits for it.
    pub(super) fn refresh_soon(self: &Arc<Self>, nodes: &Arc<NodeConnections>) {
        {
            let last = self.last_refresh.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|at| at.elapsed() < REFRESH_AT_MOST_EVERY) {
                return;
            }
        }
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (router, nodes) = (self.clone(), nodes.clone());
        tokio::spawn(async move {
            if let Err(e) = router.refresh(&nodes).await {
                tracing::debug!(error = %e, "reading the Redis Cluster's slots failed");
            }
            *router
                .last_refresh
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            router.refreshing.store(false, Ordering::Release);
        });
    }
}

/// The `host:port` a Redis URL names (`redis://user:pw@host:7000/0` → `host:7000`;
/// port 6379 when it names none).
pub(super) fn host_port(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let node = rest.split(['/', '?', '#']).next().unwrap_or("");
    if node.is_empty() {
        return None;
    }
    let has_port = match node.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty() && !node.ends_with(']') && port.parse::<u16>().is_ok()
        }
        None => false,
    };
    Some(if has_port {
        node.to_owned()
    } else {
        format!("{node}:6379")
    })
}

/// Whether a node's answer says the cluster's view of its slots is changing
/// (`CLUSTERDOWN`, or a redirect): the map is read again.
pub(super) fn topology_changing(e: &redis::RedisError) -> bool {
    e.is_cluster_error() || e.code() == Some("READONLY")
}

/// Whether a node's answer says the key is served elsewhere (`MOVED`, `ASK`,
/// `TRYAGAIN` while a slot migrates, `READONLY` from a master demoted to replica): the
/// request is sent again through the cluster connection, which follows redirects.
pub(super) fn redirected(e: &redis::RedisError) -> bool {
    (e.is_cluster_error() && e.code() != Some("CLUSTERDOWN")) || e.code() == Some("READONLY")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_ones_redis_computes() {
        // The Redis Cluster specification's check value, and keys whose slots
        // `CLUSTER KEYSLOT` gives.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"{user1000}.followers"), slot(b"user1000"));
        // An empty tag is no tag; only the first `{` counts.
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"idem:{k}"), slot(b"k"));
    }

    #[test]
    fn seeds_are_read_from_the_urls_given() {
        assert_eq!(
            host_port("redis://127.0.0.1:7000").as_deref(),
            Some("127.0.0.1:7000")
        );
        assert_eq!(
            host_port("rediss://u:p@h.example:7001/0?protocol=resp3").as_deref(),
            Some("h.example:7001")
        );
        assert_eq!(
            host_port("redis://h.example").as_deref(),
            Some("h.example:6379")
        );
        assert_eq!(
            host_port("redis://[::1]:7000").as_deref(),
            Some("[::1]:7000")
        );
        assert_eq!(host_port("redis://[::1]").as_deref(), Some("[::1]:6379"));
        assert_eq!(
            host_port("127.0.0.1:7002").as_deref(),
            Some("127.0.0.1:7002")
        );
        assert_eq!(host_port("redis://"), None);
    }

    #[test]
    fn every_node_announced_is_listed_replicas_too() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(100),
                node("10.0.0.1", 7000),
                node("10.0.0.9", 7003),
            ]),
            Value::Array(vec![
                Value::Int(101),
                Value::Int(16383),
                node("", 7001),
                node("?", 7004),
                node("10.0.0.9", 7003),
            ]),
        ]);
        assert_eq!(
            announced_nodes(&reply, "seed.example:7001").unwrap(),
            ["10.0.0.1:7000", "10.0.0.9:7003", "seed.example:7001"]
        );
        assert!(announced_nodes(&Value::Int(1), "s:1").is_err());
    }

    #[test]
    fn a_slot_map_is_read_from_cluster_slots() {
        let node = |host: &[u8], port: i64| {
            Value::Array(vec![
                Value::BulkString(host.to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                node(b"10.0.0.2", 7001),
                node(b"10.0.0.5", 7004),
            ]),
            Value::Array(vec![Value::Int(0), Value::Int(5460), node(b"", 7000)]),
            Value::Array(vec![Value::Int(10923), Value::Int(12000), node(b"?", 7002)]),
            Value::Array(vec![
                Value::Int(12001),
                Value::Int(13000),
                node(b"0.0.0.0", 7003),
            ]),
            Value::Array(vec![
                Value::Int(13001),
                Value::Int(14000),
                node(b"::1", 7004),
            ]),
            Value::Array(vec![
                Value::Int(14001),
                Value::Int(16383),
                Value::Array(vec![Value::Nil, Value::Int(7005)]),
            ]),
        ]);
        let map = SlotMap::parse(&reply, "10.0.0.1:7000").unwrap();
        assert_eq!(map.owner(0), Some("10.0.0.1:7000"));
        assert_eq!(map.owner(5460), Some("10.0.0.1:7000"));
        assert_eq!(map.owner(5461), Some("10.0.0.2:7001"));
        assert_eq!(map.owner(10922), Some("10.0.0.2:7001"));
        // Unknown: no owner, never the answering node's host with another's port.
        assert_eq!(map.owner(11000), None);
        // A wildcard is the node that answered; IPv6 gets its brackets.
        assert_eq!(map.owner(12500), Some("10.0.0.1:7003"));
        assert_eq!(map.owner(13500), Some("[::1]:7004"));
        assert_eq!(map.owner(16383), Some("10.0.0.1:7005"));
        assert_eq!(map.masters().len(), 5);
        // A gap (slots moving, or not served) has no owner.
        let gap = Value::Array(vec![Value::Array(vec![
            Value::Int(100),
            Value::Int(200),
            node(b"h", 1),
        ])]);
        let map = SlotMap::parse(&gap, "h:1").unwrap();
        assert_eq!(
            (map.owner(99), map.owner(100), map.owner(201)),
            (None, Some("h:1"), None)
        );
        for bad in [
            Value::Nil,
            Value::Array(vec![Value::Array(vec![
                Value::Int(2),
                Value::Int(1),
                node(b"h", 1),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(16384),
                node(b"h", 1),
            ])]),
            Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(1)])]),
        ] {
            assert!(SlotMap::parse(&bad, "h:1").is_err(), "{bad:?}");
        }
    }
}
