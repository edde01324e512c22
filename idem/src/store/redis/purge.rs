//! Purges and the in-progress listing for the admin API, and the purge channel: the
//! deleting script `PUBLISH`es the key on `<namespace>:purges` (a cluster broadcasts it
//! to every node), and listeners subscribe on a connection of their own to any node.

use super::{unavailable, Conn, RedisStore};
use crate::store::purge::{forward, InProgressPage, PurgeChannel, QUEUE};
use crate::store::StoreError;
use async_trait::async_trait;
use futures_util::StreamExt;
use idem_core::{Millis, Record, RecordKey};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Script, Value};
use std::sync::LazyLock;
use std::time::Duration;
use tokio::sync::mpsc;

static DELETE_IF_SAME: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("delete_if_same.lua")));

/// Keys one listing page asks `SCAN` for at a time, and the most `SCAN` calls one page
/// makes: a page's work is bounded however few of the keys are in progress.
const SCAN_COUNT: usize = 1000;
const SCANS_PER_PAGE: usize = 20;

/// The standalone server's name in a listing cursor.
const STANDALONE: &str = "-";

impl RedisStore {
    /// The channel purges are announced on.
    pub(super) fn purge_channel_name(&self) -> String {
        format!("{}:purges", self.namespace)
    }

    pub(super) async fn delete_record_if_same(
        &self,
        key: &RecordKey,
        expected: &Record,
    ) -> Result<bool, StoreError> {
        let mut invocation = DELETE_IF_SAME.key(self.redis_key(key));
        invocation
            .arg(expected.encode())
            .arg(self.purge_channel_name())
            .arg(key.as_str());
        let deleted: i64 = match &self.conn {
            Conn::Single(c) => {
                self.bounded(invocation.invoke_async(&mut c.clone()))
                    .await?
            }
            Conn::Cluster(h) => {
                let result = self
                    .bounded(invocation.invoke_async(&mut h.connection()))
                    .await;
                h.observe(&result);
                result?
            }
        };
        Ok(deleted == 1)
    }

    /// The masters' addresses (`host:port`), sorted; the standalone server's name alone
    /// when not a cluster.
    async fn masters(&self) -> Result<Vec<String>, StoreError> {
        let Conn::Cluster(h) = &self.conn else {
            return Ok(vec![STANDALONE.to_owned()]);
        };
        let reply: Value = self
            .bounded(h.connection().route_command(
                redis::cmd("CLUSTER").arg("NODES").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            ))
            .await?;
        let nodes = match reply {
            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            Value::VerbatimString { text, .. } => text,
            other => return Err(StoreError::Corrupt(format!("CLUSTER NODES: {other:?}"))),
        };
        let mut masters: Vec<String> = nodes
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                let flags = fields.get(2)?;
                let serving = flags.split(',').any(|f| f == "master")
                    && !flags.contains("fail")
                    && !flags.contains("noaddr");
                let address = fields.get(1)?.split('@').next()?;
                serving.then(|| address.to_owned())
            })
            .collect();
        masters.sort();
        Ok(masters)
    }

    /// `SCAN` one node: the next cursor and the keys.
    async fn scan(&self, node: &str, cursor: u64) -> Result<(u64, Vec<String>), StoreError> {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(format!("{}:{{*}}", self.namespace))
            .arg("COUNT")
            .arg(SCAN_COUNT);
        match &self.conn {
            Conn::Single(c) => self.bounded(cmd.query_async(&mut c.clone())).await,
            Conn::Cluster(h) => {
                let (host, port) = node
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h.to_owned(), p.parse().ok()?)))
                    .ok_or_else(|| StoreError::Corrupt(format!("node address {node:?}")))?;
                let routing =
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                let reply = self
                    .bounded(h.connection().route_command(cmd, routing))
                    .await?;
                redis::from_redis_value(reply)
                    .map_err(|e| StoreError::Corrupt(format!("SCAN answered {e}")))
            }
        }
    }

    /// The in-progress records among `keys` claimed before `claimed_before`: their
    /// states and tokens first, then only the matching records' bytes.
    async fn in_progress_among(
        &self,
        keys: &[String],
        claimed_before: Millis,
    ) -> Result<Vec<(RecordKey, Record)>, StoreError> {
        let mut found = Vec::new();
        for key in keys {
            let Some(record_key) = self.record_key_of(key) else {
                continue;
            };
            // One short script per key keeps each read on its own slot; a listing is
            // an operator's request, not a hot path.
            let Some(record) = self.read(&record_key).await? else {
                continue;
            };
            if record.in_progress_claimed_before(claimed_before) {
                found.push((record_key, record));
            }
        }
        Ok(found)
    }

    /// The record key inside a Redis key `<namespace>:{<record key>}`.
    fn record_key_of(&self, redis_key: &str) -> Option<RecordKey> {
        let inner = redis_key
            .strip_prefix(self.namespace.as_str())?
            .strip_prefix(":{")?
            .strip_suffix('}')?;
        RecordKey::from_stored(inner)
    }

    pub(super) async fn in_progress_records(
        &self,
        claimed_before: Millis,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<InProgressPage, StoreError> {
        let masters = self.masters().await?;
        // A cursor is `<node>/<SCAN cursor>/<matches to skip>`: the node by address, so
        // that listing goes on where it stopped even if the masters changed in between;
        // the skip, because a page that fills up in the middle of a SCAN batch resumes
        // that batch (SCAN returns the same batch for a cursor unless keys moved).
        let (mut node, mut scan, mut skip) = match cursor {
            None => match masters.first() {
                Some(first) => (first.clone(), 0, 0),
                None => return Ok(InProgressPage::default()),
            },
            Some(c) => parse_cursor(c)
                .ok_or_else(|| StoreError::Corrupt(format!("listing cursor {c:?}")))?,
        };
        let mut records = Vec::new();
        for _ in 0..SCANS_PER_PAGE {
            let (next, keys) = self.scan(&node, scan).await?;
            let found = self.in_progress_among(&keys, claimed_before).await?;
            let room = limit - records.len();
            let fresh: Vec<_> = found.into_iter().skip(skip).collect();
            if fresh.len() > room {
                records.extend(fresh.into_iter().take(room));
                return Ok(InProgressPage {
                    records,
                    next: Some(format!("{node}/{scan}/{}", skip + room)),
                });
            }
            records.extend(fresh);
            (scan, skip) = (next, 0);
            if scan == 0 {
                match masters.iter().find(|m| **m > node) {
                    Some(next_node) => node = next_node.clone(),
                    None => {
                        return Ok(InProgressPage {
                            records,
                            next: None,
                        })
                    }
                }
            }
            if records.len() == limit {
                break;
            }
        }
        Ok(InProgressPage {
            records,
            next: Some(format!("{node}/{scan}/0")),
        })
    }

    /// The purge channel: its own connections, sharing none of the store's state.
    pub(super) fn channel(&self) -> RedisPurgeChannel {
        RedisPurgeChannel {
            conn: self.conn.clone(),
            nodes: self.nodes.clone(),
            ca: self.ca.clone(),
            channel: self.purge_channel_name(),
            timeout: self.timeout,
        }
    }
}

/// [`PurgeChannel`] over Redis pub/sub.
pub(super) struct RedisPurgeChannel {
    conn: Conn,
    nodes: Vec<String>,
    ca: Option<Vec<u8>>,
    channel: String,
    timeout: Duration,
}

#[async_trait]
impl PurgeChannel for RedisPurgeChannel {
    async fn subscribe(&self) -> Result<mpsc::Receiver<String>, StoreError> {
        let mut last = StoreError::Unavailable("no Redis node to subscribe on".into());
        // Any node hears a cluster's PUBLISH: the first that answers will do.
        for node in &self.nodes {
            let client = match &self.ca {
                Some(ca) => {
                    redis::Client::build_with_tls(node.as_str(), super::tls_certificates(ca))
                }
                None => redis::Client::open(node.as_str()),
            }
            .map_err(unavailable)?;
            let subscribing = async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(&self.channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            match tokio::time::timeout(self.timeout, subscribing).await {
                Ok(Ok(pubsub)) => {
                    let (to_listener, received) = mpsc::channel(QUEUE);
                    let mut messages = pubsub.into_on_message();
                    tokio::spawn(async move {
                        while let Some(message) = messages.next().await {
                            let Ok(payload) = message.get_payload::<String>() else {
                                continue;
                            };
                            if !forward(&to_listener, payload) {
                                break;
                            }
                        }
                    });
                    return Ok(received);
                }
                Ok(Err(e)) => last = unavailable(e),
                Err(_) => {
                    last = StoreError::Unavailable(format!("redis: SUBSCRIBE on {node} timed out"))
                }
            }
        }
        Err(last)
    }

    async fn publish(&self, message: &str) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(&self.channel).arg(message);
        let publishing = async {
            match &self.conn {
                Conn::Single(c) => cmd.query_async::<i64>(&mut c.clone()).await,
                Conn::Cluster(h) => cmd.query_async::<i64>(&mut h.connection()).await,
            }
        };
        match tokio::time::timeout(self.timeout, publishing).await {
            Ok(r) => r.map(drop).map_err(unavailable),
            Err(_) => Err(StoreError::Unavailable("redis: PUBLISH timed out".into())),
        }
    }
}

/// `<node>/<SCAN cursor>/<skip>`.
fn parse_cursor(cursor: &str) -> Option<(String, u64, usize)> {
    let (rest, skip) = cursor.rsplit_once('/')?;
    let (node, scan) = rest.rsplit_once('/')?;
    Some((node.to_owned(), scan.parse().ok()?, skip.parse().ok()?))
}
