//! Purges and the in-progress listing for the admin API, and the purge channel: the
//! deleting script `PUBLISH`es the key on `<namespace>:purges` (a cluster broadcasts it
//! to every node), and listeners subscribe on a connection of their own to any node.

use super::{unavailable, Conn, RedisStore};
use crate::store::purge::{forward, Deletion, InProgressPage, PurgeChannel, QUEUE};
use crate::store::StoreError;
use async_trait::async_trait;
use futures_util::StreamExt;
use idem_core::{Millis, Record, RecordKey};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Script, Value};
use std::sync::LazyLock;
use std::time::Duration;
use tokio::sync::mpsc;

static DELETE_IF_SAME: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&super::lua::link(
        include_str!("delete_if_same.lua"),
        super::RedisLayout::String,
    ))
});

/// Keys one listing page asks `SCAN` for at a time, and the most `SCAN` calls one page
/// makes: a page's work is bounded however few of the keys are in progress.
const SCAN_COUNT: usize = 1000;
const SCANS_PER_PAGE: usize = 20;

/// Bytes of a record's encoding up to and including its token: version, state,
/// fingerprint, token (`Record::encode`).
const HEADER_LEN: usize = 1 + 1 + 32 + 8;

/// Whether a record's first bytes say: version 1, in progress, token below `token_before`.
fn header_in_progress_before(header: &[u8], token_before: u64) -> bool {
    match header {
        [1, 0, _fingerprint @ .., t0, t1, t2, t3, t4, t5, t6, t7] if header.len() == HEADER_LEN => {
            u64::from_be_bytes([*t0, *t1, *t2, *t3, *t4, *t5, *t6, *t7]) < token_before
        }
        _ => false,
    }
}

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
        not_before: Millis,
    ) -> Result<Deletion, StoreError> {
        let mut invocation = DELETE_IF_SAME.key(self.redis_key(key));
        invocation
            .arg(expected.encode())
            .arg(self.purge_channel_name())
            .arg(key.as_str())
            .arg(not_before);
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
        Ok(match deleted {
            1 => Deletion::Deleted,
            2 => Deletion::TooEarly,
            _ => Deletion::Changed,
        })
    }

    async fn masters(&self) -> Result<Vec<String>, StoreError> {
        masters(&self.conn, self.timeout).await
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
                let reply: Value = h.nodes.query(node, &cmd).await?;
                redis::from_redis_value(reply)
                    .map_err(|e| StoreError::corrupt(format!("SCAN answered {e}")))
            }
        }
    }

    /// The in-progress records among `keys` (all on `node`) claimed before
    /// `claimed_before`, sorted by key: their states and tokens first, in one pipeline
    /// to the node, then only the matching records' bytes.
    async fn in_progress_among(
        &self,
        node: &str,
        keys: &[String],
        claimed_before: Millis,
    ) -> Result<Vec<(RecordKey, Record)>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // Each record's first 42 bytes: version, state, fingerprint, token.
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for key in keys {
            pipe.cmd("GETRANGE").arg(key).arg(0).arg(HEADER_LEN - 1);
        }
        let replies = self.pipeline_on(node, pipe).await?;
        let token_before = claimed_before.saturating_mul(idem_core::TOKENS_PER_MS);
        let mut candidates = Vec::new();
        let mut hashes = Vec::new();
        for (key, reply) in keys.iter().zip(&replies) {
            match reply {
                Value::BulkString(header) if header_in_progress_before(header, token_before) => {
                    candidates.push(key);
                }
                Value::ServerError(e) => match e.code() {
                    "WRONGTYPE" => hashes.push(key),
                    // Its slot is moving, or moved, or this node is a replica now: the
                    // record is read below through the cluster connection, which
                    // follows the redirection (a record listed twice is allowed).
                    "MOVED" | "ASK" | "TRYAGAIN" => candidates.push(key),
                    _ => return Err(StoreError::unavailable(format!("redis: {node}: {e}"))),
                },
                _ => {}
            }
        }
        if !hashes.is_empty() {
            // Records idem 0.1 wrote, as hashes: their state and token fields.
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for key in &hashes {
                pipe.cmd("HMGET").arg(key).arg("s").arg("t");
            }
            let replies = self.pipeline_on(node, pipe).await?;
            for (key, reply) in hashes.into_iter().zip(&replies) {
                // An error here: moved, or rewritten as a string just now (not orphaned).
                if let Ok((Some(state), Some(token))) =
                    redis::from_redis_value_ref::<(Option<String>, Option<u64>)>(reply)
                {
                    if state == "0" && token < token_before {
                        candidates.push(key);
                    }
                }
            }
        }
        let mut found = Vec::new();
        for key in candidates {
            let Some(record_key) = self.record_key_of(key) else {
                continue;
            };
            // The record itself decides (it may have changed since).
            if let Some(record) = self.read(&record_key).await? {
                if record.in_progress_claimed_before(claimed_before) {
                    found.push((record_key, record));
                }
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(found)
    }

    /// `pipe` on one node, each command's reply or error.
    async fn pipeline_on(
        &self,
        node: &str,
        pipe: redis::Pipeline,
    ) -> Result<Vec<Value>, StoreError> {
        match &self.conn {
            Conn::Single(c) => self.bounded(pipe.query_async(&mut c.clone())).await,
            Conn::Cluster(h) => h.nodes.pipeline(node, &pipe).await,
        }
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
        // A cursor is `<node>/<SCAN cursor>/<last key listed>`: the node by address, so
        // that listing goes on where it stopped even if the masters changed in between;
        // the last key, because a page that fills up in the middle of a SCAN batch
        // resumes that batch after it (SCAN returns the same batch for a cursor unless
        // keys moved; records purged meanwhile shift nothing).
        let (mut node, mut scan, mut after) = match cursor {
            None => match masters.first() {
                Some(first) => (first.clone(), 0, None),
                None => return Ok(InProgressPage::default()),
            },
            Some(c) => {
                let (node, scan, after) = parse_cursor(c)
                    .ok_or_else(|| StoreError::corrupt(format!("listing cursor {c:?}")))?;
                if masters.contains(&node) {
                    (node, scan, after)
                } else {
                    // Not a master now (failed over, removed) — or never one: a cursor is
                    // the caller's text, and a node it names is connected to with the
                    // store's credentials. The listing goes on from the next master.
                    match masters.iter().find(|m| **m > node) {
                        Some(next) => (next.clone(), 0, None),
                        None => return Ok(InProgressPage::default()),
                    }
                }
            }
        };
        let mut records: Vec<(RecordKey, Record)> = Vec::new();
        for _ in 0..SCANS_PER_PAGE {
            let (next, keys) = self.scan(&node, scan).await?;
            let found = self.in_progress_among(&node, &keys, claimed_before).await?;
            let fresh: Vec<_> = found
                .into_iter()
                .filter(|(k, _)| after.as_ref().is_none_or(|a| k > a))
                .collect();
            let room = limit.saturating_sub(records.len());
            if fresh.len() > room && !records.is_empty() {
                // The page ends before this batch: the next one starts it afresh, so
                // nothing depends on SCAN giving the same batch twice.
                return Ok(InProgressPage {
                    next: Some(format!("{node}/{scan}/-")),
                    records,
                });
            }
            if fresh.len() > room {
                // One batch holds more than a page: it is split after its last key listed.
                records.extend(fresh.into_iter().take(room));
                let last = records.last().map_or("-", |(k, _)| k.as_str());
                return Ok(InProgressPage {
                    next: Some(format!("{node}/{scan}/{last}")),
                    records,
                });
            }
            records.extend(fresh);
            (scan, after) = (next, None);
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
            if records.len() >= limit {
                break;
            }
        }
        Ok(InProgressPage {
            records,
            next: Some(format!("{node}/{scan}/-")),
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
            subscribed: std::sync::Mutex::new(Vec::new()),
        }
    }
}

/// [`PurgeChannel`] over Redis pub/sub. In a cluster it subscribes on every master:
/// a purge is announced by the master holding its key, and heard there directly, not
/// through the cluster bus, which drops messages while a link between nodes is down.
pub(super) struct RedisPurgeChannel {
    conn: Conn,
    nodes: Vec<String>,
    ca: Option<Vec<u8>>,
    channel: String,
    timeout: Duration,
    /// The masters subscribed on; a probe fails once they are not the masters any more.
    subscribed: std::sync::Mutex<Vec<String>>,
}

impl RedisPurgeChannel {
    /// Subscribes on one server; the task forwarding its messages stops when `stop`
    /// is cancelled, and cancels it when its connection ends.
    async fn subscribe_on(
        &self,
        client: redis::Client,
        to_listener: mpsc::Sender<String>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<(), StoreError> {
        let subscribing = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&self.channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let pubsub = match tokio::time::timeout(self.timeout, subscribing).await {
            Ok(subscribed) => subscribed.map_err(unavailable)?,
            Err(_) => return Err(StoreError::unavailable("redis: SUBSCRIBE timed out")),
        };
        let mut messages = pubsub.into_on_message();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    message = messages.next() => {
                        let Some(message) = message else { break };
                        let Ok(payload) = message.get_payload::<String>() else {
                            continue;
                        };
                        if !forward(&to_listener, payload) {
                            break;
                        }
                    }
                }
            }
            // One connection gone is the whole subscription gone.
            stop.cancel();
        });
        Ok(())
    }
}

#[async_trait]
impl PurgeChannel for RedisPurgeChannel {
    async fn subscribe(&self) -> Result<mpsc::Receiver<String>, StoreError> {
        let servers = match &self.conn {
            Conn::Cluster(_) => masters(&self.conn, self.timeout).await?,
            Conn::Single(_) => vec![STANDALONE.to_owned()],
        };
        let (to_listener, received) = mpsc::channel(QUEUE);
        let stop = tokio_util::sync::CancellationToken::new();
        for server in &servers {
            let subscribed = async {
                let client = match &self.conn {
                    Conn::Cluster(h) => h.nodes.client(server)?,
                    Conn::Single(_) => {
                        let url = self.nodes.first().map_or("", String::as_str);
                        super::client_for(url, self.ca.as_deref()).map_err(unavailable)?
                    }
                };
                self.subscribe_on(client, to_listener.clone(), stop.clone())
                    .await
            };
            if let Err(e) = subscribed.await {
                stop.cancel();
                return Err(e);
            }
        }
        *self.subscribed.lock().unwrap_or_else(|p| p.into_inner()) = servers;
        Ok(received)
    }

    /// One probe from each master: a purge is announced by the master holding its
    /// key, so each master's path to the subscriber must be proven.
    async fn probe(&self, id: &str) -> Result<Vec<String>, StoreError> {
        let Conn::Cluster(h) = &self.conn else {
            self.publish(id).await?;
            return Ok(vec![id.to_owned()]);
        };
        let masters = masters(&self.conn, self.timeout).await?;
        if *self.subscribed.lock().unwrap_or_else(|p| p.into_inner()) != masters {
            // A master this subscription does not listen on: subscribe again.
            return Err(StoreError::unavailable(
                "redis: the cluster's masters changed since subscribing",
            ));
        }
        let mut sent = Vec::new();
        for node in masters {
            let message = format!("{id}@{node}");
            let mut cmd = redis::cmd("PUBLISH");
            cmd.arg(&self.channel).arg(&message);
            h.nodes.query::<i64>(&node, &cmd).await?;
            sent.push(message);
        }
        Ok(sent)
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
            Err(_) => Err(StoreError::unavailable("redis: PUBLISH timed out")),
        }
    }
}

/// `<node>/<SCAN cursor>/<last key listed, or ->`.
fn parse_cursor(cursor: &str) -> Option<(String, u64, Option<RecordKey>)> {
    let (rest, after) = cursor.rsplit_once('/')?;
    let (node, scan) = rest.rsplit_once('/')?;
    let after = match after {
        "-" => None,
        key => Some(RecordKey::from_stored(key)?),
    };
    Some((node.to_owned(), scan.parse().ok()?, after))
}

/// The masters' addresses (`host:port`), sorted; the standalone server's name alone
/// when not a cluster. A master flagged as failed (not merely suspected) is left out.
async fn masters(conn: &Conn, timeout: Duration) -> Result<Vec<String>, StoreError> {
    let Conn::Cluster(h) = conn else {
        return Ok(vec![STANDALONE.to_owned()]);
    };
    let mut connection = h.connection();
    let asking = connection.route_command(
        redis::cmd("CLUSTER").arg("NODES").clone(),
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
    );
    let reply: Value = match tokio::time::timeout(timeout, asking).await {
        Ok(r) => r.map_err(unavailable)?,
        Err(_) => return Err(StoreError::unavailable("redis: CLUSTER NODES timed out")),
    };
    let nodes = match reply {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::VerbatimString { text, .. } => text,
        other => return Err(StoreError::corrupt(format!("CLUSTER NODES: {other:?}"))),
    };
    let mut masters: Vec<String> = nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let flags: Vec<&str> = fields.get(2)?.split(',').collect();
            let serving = flags.contains(&"master")
                && !flags
                    .iter()
                    .any(|f| matches!(*f, "fail" | "noaddr" | "handshake"));
            let address = fields.get(1)?.split('@').next()?;
            serving.then(|| address.to_owned())
        })
        .collect();
    masters.sort();
    Ok(masters)
}
