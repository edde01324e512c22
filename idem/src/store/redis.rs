//! Records in Redis — standalone or Redis Cluster.
//!
//! Each record is one string, `idem:{<record key>}`, holding the core's encoding of the
//! record and expiring by `PEXPIREAT` (idem 0.1 kept a hash of `t` token, `s` state and
//! `r` that encoding; both are read, see [`RedisLayout`]). Every operation is one Lua
//! script on that
//! one key; the braces are a hash tag, so a cluster never sees a cross-slot call, and
//! the fencing token lives inside the record rather than in a second key.
//!
//! The scripts are primitives — insert-if-absent, compare-and-swap on the whole record,
//! the holder precondition, supersede-only mirroring — and the core decides which to
//! run. Time is the server's: each script reads `TIME`, returns it, and refuses a
//! record computed further than the tolerance from it (see [`super::clock`]). In a
//! cluster, a key is judged on the clock of the master that holds it.

use super::{
    claim_by_cas, decode, holder_write_at, CasRecords, HolderWrite, Insert, Stamp, Store,
    StoreClock, StoreError, Swap, Written,
};
use async_trait::async_trait;
use eval::Eval;
use idem_core::{Decision, Fingerprint, Holder, Millis, Policy, Record, RecordKey, Transition};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Script, Value};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// How records are written. Either layout is read: the scripts start with the
/// functions of `redis/layout.lua` they call, which read both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RedisLayout {
    /// The record's encoding itself, as a string: ~35 % less memory per record than
    /// a hash (`idem-bench --scale`).
    #[default]
    String,
    /// A hash of `t`, `s`, `r`, as idem 0.1 wrote it. For the first step of a rolling
    /// upgrade from 0.1: its replicas fail on a record written as a string, so a holder
    /// of theirs could lose its lease to a retry (a second execution) if a new replica
    /// rewrote its record. Roll out with this, then roll again with `String`.
    Hash,
}

/// One script, as it writes in each layout.
struct LayoutScripts {
    string: Script,
    hash: Script,
}

impl LayoutScripts {
    fn of(&self, layout: RedisLayout) -> &Script {
        match layout {
            RedisLayout::String => &self.string,
            RedisLayout::Hash => &self.hash,
        }
    }
}

/// A script with the record layout's functions it calls before it (`redis/lua.rs`).
macro_rules! script {
    ($file:literal) => {
        LazyLock::new(|| {
            let body = include_str!(concat!("redis/", $file));
            LayoutScripts {
                string: Script::new(&lua::link(body, RedisLayout::String)),
                hash: Script::new(&lua::link(body, RedisLayout::Hash)),
            }
        })
    };
}
static INSERT_IF_ABSENT: LazyLock<LayoutScripts> = script!("insert_if_absent.lua");
static REPLACE_IF_SAME: LazyLock<LayoutScripts> = script!("replace_if_same.lua");
static HOLDER_WRITE: LazyLock<LayoutScripts> = script!("holder_write.lua");
#[cfg_attr(not(feature = "tiered"), allow(dead_code))]
static MIRROR: LazyLock<LayoutScripts> = script!("mirror.lua");
static GET: LazyLock<LayoutScripts> = script!("get.lua");

/// Connection settings of [`RedisStore`].
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct RedisOptions {
    /// `Some(true)`: Redis Cluster; `Some(false)`: standalone; `None`: a list of URLs
    /// means a cluster, a single URL is asked (`INFO cluster`).
    pub cluster: Option<bool>,
    /// Bound on connecting and on every operation.
    pub timeout: Duration,
    /// Prefix of every key (`<namespace>:{<record key>}`), so several deployments
    /// can share one Redis.
    pub namespace: String,
    /// CA certificates (PEM) to verify `rediss://` servers with (else the system's).
    pub ca_file: Option<std::path::PathBuf>,
    /// Start even if a master evicts keys when full. Refused by default: an evicted
    /// claim or answer lets a retry run the handler again.
    pub allow_eviction: bool,
    /// Replicas that must acknowledge each claim and holder write (`WAIT`); 0: none.
    pub wait_replicas: u32,
    /// How records are written (both layouts are read).
    pub layout: RedisLayout,
    /// Besides the nodes of the URLs given, where a cluster's credentials may go
    /// (`--redis-allow-host`: hosts, `host:port`, networks). A cluster that announces
    /// a master elsewhere is refused at start-up when the URLs carry credentials, and
    /// such a node is never sent them later.
    pub allow_hosts: Vec<String>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            cluster: None,
            timeout: Duration::from_secs(2),
            namespace: "idem".into(),
            ca_file: None,
            allow_eviction: false,
            wait_replicas: 0,
            layout: RedisLayout::String,
            allow_hosts: Vec::new(),
        }
    }
}

/// Each setting, from [`RedisOptions::default`] on (the struct is non-exhaustive: it
/// will grow).
impl RedisOptions {
    /// Sets `cluster`: `Some(true)`: Redis Cluster; `Some(false)`: standalone; `None`:
    /// a list of URLs means a cluster, a single URL is asked (`INFO cluster`).
    #[must_use]
    pub fn cluster(mut self, cluster: Option<bool>) -> Self {
        self.cluster = cluster;
        self
    }

    /// Sets `timeout`: bound on connecting and on every operation.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets `namespace`: prefix of every key (`<namespace>:{<record key>}`), so several
    /// deployments can share one Redis.
    #[must_use]
    pub fn namespace(mut self, namespace: String) -> Self {
        self.namespace = namespace;
        self
    }

    /// Sets `ca_file`: the CA certificates (PEM) to verify `rediss://` servers with
    /// (else the system's).
    #[must_use]
    pub fn ca_file(mut self, ca_file: Option<std::path::PathBuf>) -> Self {
        self.ca_file = ca_file;
        self
    }

    /// Sets `allow_eviction`: start even if a master evicts keys when full.
    #[must_use]
    pub fn allow_eviction(mut self, allow_eviction: bool) -> Self {
        self.allow_eviction = allow_eviction;
        self
    }

    /// Sets `wait_replicas`: replicas that must acknowledge each claim and holder write
    /// (`WAIT`); 0: none.
    #[must_use]
    pub fn wait_replicas(mut self, wait_replicas: u32) -> Self {
        self.wait_replicas = wait_replicas;
        self
    }

    /// Sets `layout`: how records are written (both layouts are read).
    #[must_use]
    pub fn layout(mut self, layout: RedisLayout) -> Self {
        self.layout = layout;
        self
    }

    /// Sets `allow_hosts`: besides the nodes of the URLs given, where a cluster's
    /// credentials may go (`--redis-allow-host`: hosts, `host:port`, networks).
    #[must_use]
    pub fn allow_hosts(mut self, allow_hosts: Vec<String>) -> Self {
        self.allow_hosts = allow_hosts;
        self
    }
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(Arc<SelfHealingCluster>),
}

/// A cluster connection that is rebuilt from scratch after repeated failures.
///
/// redis-rs's cluster connection can wedge after a failover under load — every later
/// request times out although the cluster is healthy again (seen here with 1.8: a
/// master killed under 100 concurrent writers; see redis-rs issues #2092 and #1528
/// for the family of bugs). A fresh connection reads the new topology, so after
/// `REBUILD_AFTER` consecutive failures one is built in the background and swapped in.
struct SelfHealingCluster {
    client: redis::cluster::ClusterClient,
    conn: std::sync::RwLock<ClusterConnection>,
    consecutive_failures: AtomicU32,
    rebuilding: AtomicBool,
    timeout: Duration,
    /// Single nodes by address, on connections of their own (see `nodes`).
    nodes: Arc<nodes::NodeConnections>,
    /// Where each key's master is, for requests sent to it directly (see `slots`);
    /// `None` with `--redis-wait-replicas`, whose `WAIT` must follow its write on one
    /// connection.
    slots: Option<Arc<slots::SlotRouter>>,
}

const REBUILD_AFTER: u32 = 3;

impl SelfHealingCluster {
    fn connection(&self) -> ClusterConnection {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn observe<T>(self: &Arc<Self>, result: &Result<T, StoreError>) {
        if result.is_ok() {
            self.consecutive_failures.store(0, Ordering::Relaxed);
            return;
        }
        let failures = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= REBUILD_AFTER && !self.rebuilding.swap(true, Ordering::AcqRel) {
            let this = self.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(this.timeout * 2, this.client.get_async_connection())
                    .await
                {
                    Ok(Ok(fresh)) => {
                        *this.conn.write().unwrap_or_else(|p| p.into_inner()) = fresh;
                        this.consecutive_failures.store(0, Ordering::Relaxed);
                        metrics::counter!("idem_redis_cluster_reconnects_total").increment(1);
                        tracing::warn!(failures, "rebuilt the Redis Cluster connection");
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "rebuilding the Redis Cluster connection failed")
                    }
                    Err(_) => tracing::warn!("rebuilding the Redis Cluster connection timed out"),
                }
                this.rebuilding.store(false, Ordering::Release);
            });
        }
    }
}

mod allow;
mod eval;
mod lua;
mod nodes;
mod purge;
mod slots;

pub(crate) use allow::NodeAllowList;

/// Redis-backed [`Store`].
pub struct RedisStore {
    conn: Conn,
    /// The URLs given, and the CA that verifies them: the purge channel subscribes on
    /// a connection of its own.
    nodes: Vec<String>,
    ca: Option<Vec<u8>>,
    timeout: Duration,
    namespace: String,
    clock: StoreClock,
    wait_replicas: u32,
    layout: RedisLayout,
}

fn tls_certificates(ca: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(ca.to_vec()),
    }
}

/// A client for `url`, verifying a TLS server with `ca` when given (else the system's).
fn client_for<T: redis::IntoConnectionInfo>(
    url: T,
    ca: Option<&[u8]>,
) -> redis::RedisResult<redis::Client> {
    match ca {
        Some(ca) => redis::Client::build_with_tls(url, tls_certificates(ca)),
        None => redis::Client::open(url),
    }
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::unavailable("redis").with_source(e)
}

fn pexpire_at(record: &Record) -> u64 {
    // Kept past its logical expiry: see `Record::delete_after`.
    record.delete_after()
}

impl RedisStore {
    /// Connects to `urls` — one URL, or a comma-separated list of cluster nodes.
    pub async fn connect(urls: &str, options: RedisOptions) -> Result<Self, StoreError> {
        let nodes: Vec<&str> = urls
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if nodes.is_empty() {
            return Err(StoreError::unavailable("no Redis URL given"));
        }
        if nodes.iter().any(|url| url.ends_with("#insecure")) {
            tracing::warn!(
                "a Redis URL ends in #insecure: its TLS certificate is not verified, and \
                 anyone on the path can read and change the records. Give the CA with \
                 --redis-ca-file instead"
            );
        }
        let timeout = options.timeout;
        let ca = match &options.ca_file {
            Some(path) => {
                crate::store::tls::load_ca(path).map_err(StoreError::unavailable)?;
                Some(std::fs::read(path).map_err(|e| StoreError::unavailable(e.to_string()))?)
            }
            None => None,
        };
        let cluster = match options.cluster {
            Some(c) => c,
            None if nodes.len() > 1 => true,
            None => {
                let probe = RedisStore {
                    conn: Self::single(nodes[0], timeout, ca.as_ref()).await?,
                    nodes: Vec::new(),
                    ca: None,
                    timeout,
                    namespace: String::new(),
                    clock: StoreClock::new(),
                    wait_replicas: 0,
                    layout: RedisLayout::String,
                };
                probe.cluster_enabled().await?
            }
        };
        let conn = if cluster {
            let allowed = NodeAllowList::new(
                nodes.iter().filter_map(|url| slots::host_port(url)),
                options.allow_hosts.iter().map(String::as_str),
            )
            .map_err(StoreError::unavailable)?;
            Self::cluster(&nodes, timeout, ca.as_ref(), options.wait_replicas, allowed).await?
        } else {
            Self::single(nodes[0], timeout, ca.as_ref()).await?
        };
        let store = RedisStore {
            conn,
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            ca,
            timeout,
            namespace: options.namespace,
            clock: StoreClock::new(),
            wait_replicas: options.wait_replicas,
            layout: options.layout,
        };
        store.ping().await?;
        store.check_eviction(options.allow_eviction).await?;
        store.check_coverage().await;
        Ok(store)
    }

    /// `<namespace>:{<record key>}` — the braces make the record key a hash tag.
    fn redis_key(&self, key: &RecordKey) -> String {
        format!("{}:{{{}}}", self.namespace, key.as_str())
    }

    async fn single(
        url: &str,
        timeout: Duration,
        ca: Option<&Vec<u8>>,
    ) -> Result<Conn, StoreError> {
        let invalid =
            |e: redis::RedisError| StoreError::unavailable(format!("invalid Redis URL: {e}"));
        let client = client_for(url, ca.map(Vec::as_slice)).map_err(invalid)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let conn =
            tokio::time::timeout(timeout, ConnectionManager::new_with_config(client, config))
                .await
                .map_err(|_| {
                    StoreError::unavailable(format!(
                        "redis: no connection to {url} within {timeout:?}"
                    ))
                })?
                .map_err(unavailable)?;
        Ok(Conn::Single(conn))
    }

    async fn cluster(
        nodes: &[&str],
        timeout: Duration,
        ca: Option<&Vec<u8>>,
        wait_replicas: u32,
        allowed: NodeAllowList,
    ) -> Result<Conn, StoreError> {
        let node_connections =
            Arc::new(nodes::NodeConnections::new(nodes[0], ca.cloned(), timeout).allowing(allowed));
        let seeds: Vec<String> = nodes
            .iter()
            .filter_map(|url| slots::host_port(url))
            .collect();
        // redis-rs's cluster client sends the URLs' credentials to every node the
        // cluster announces as soon as it connects: what the cluster announces is
        // checked first, through the seeds alone.
        if node_connections.sends_credentials() {
            Self::check_announced(&node_connections, &seeds).await?;
        }
        let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.to_vec());
        if let Some(ca) = ca {
            builder = builder.certs(tls_certificates(ca));
        }
        // Every wait inside the client bounded on its own: redis-rs refreshes its slot
        // map with the whole connection paused, and without a response timeout one
        // unanswered CLUSTER SLOTS or PING during a reshard stalls every request until
        // our own bound fails them all (seen in tests/tests/reshard.rs: thousands of
        // 503s). A stuck wait now costs at most a second, then a retry.
        // (A `WAIT` for replicas may take up to half the store timeout: its attempts get
        // that long.)
        let attempt = match wait_replicas {
            0 => timeout.min(Duration::from_secs(1)),
            _ => timeout.min(timeout / 2 + Duration::from_millis(500)),
        };
        let client = builder
            .connection_timeout(attempt)
            .response_timeout(attempt)
            .overall_response_timeout(Some(timeout))
            .retries(6)
            .min_retry_wait(50)
            .max_retry_wait(1_000)
            .build()
            .map_err(|e| {
                StoreError::unavailable(format!("invalid Redis Cluster configuration: {e}"))
            })?;
        let conn = tokio::time::timeout(timeout, client.get_async_connection())
            .await
            .map_err(|_| {
                StoreError::unavailable(format!("redis cluster: no connection within {timeout:?}"))
            })?
            .map_err(unavailable)?;
        let router = Arc::new(slots::SlotRouter::new(seeds));
        if let Err(e) = router.refresh(&node_connections).await {
            // Requests go through the cluster connection until a reading works.
            tracing::warn!(error = %e, "reading the Redis Cluster's slots failed");
        }
        let slots = match wait_replicas {
            0 => Some(router),
            _ => None,
        };
        Ok(Conn::Cluster(Arc::new(SelfHealingCluster {
            client,
            conn: std::sync::RwLock::new(conn),
            consecutive_failures: AtomicU32::new(0),
            rebuilding: AtomicBool::new(false),
            timeout,
            nodes: node_connections,
            slots,
        })))
    }

    /// Refuses a cluster that announces a node (master or replica) the URLs' credentials
    /// may not go to, or whose nodes no seed would tell.
    async fn check_announced(
        node_connections: &nodes::NodeConnections,
        seeds: &[String],
    ) -> Result<(), StoreError> {
        let mut last = StoreError::unavailable("redis: no seed node to ask");
        for seed in seeds {
            let reply: Result<Value, StoreError> = node_connections
                .query(seed, redis::cmd("CLUSTER").arg("SLOTS"))
                .await;
            let announced = match reply.and_then(|r| slots::announced_nodes(&r, seed)) {
                Ok(announced) => announced,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let outside: Vec<String> = announced
                .into_iter()
                .filter(|n| !node_connections.allows(n))
                .collect();
            if !outside.is_empty() {
                return Err(StoreError::unavailable(format!(
                    "the Redis Cluster announces nodes at {} that no --redis-url names: idem \
                     sends the URLs' credentials only to addresses you list — add them to \
                     --redis-url, or allow them with --redis-allow-host (a host, host:port \
                     or network)",
                    outside.join(", ")
                )));
            }
            return Ok(());
        }
        Err(StoreError::unavailable(format!(
            "redis: no seed told which nodes the cluster has, so idem cannot check where \
             the URLs' credentials would go: {last}"
        )))
    }

    async fn cluster_enabled(&self) -> Result<bool, StoreError> {
        let info: String = self.cmd(redis::cmd("INFO").arg("cluster")).await?;
        Ok(info.lines().any(|l| l.trim() == "cluster_enabled:1"))
    }

    /// Refuses a Redis that evicts keys when full (every master, in a cluster): records
    /// expire by their own TTL, and an eviction before that is a lost claim or answer.
    /// A Redis that won't say (`CONFIG` disabled, as on some managed services) is
    /// accepted with a warning.
    async fn check_eviction(&self, allowed: bool) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("maxmemory*");
        let reply: Result<Value, StoreError> = match &self.conn {
            Conn::Single(c) => self.bounded(cmd.query_async(&mut c.clone())).await,
            Conn::Cluster(h) => {
                let routing = redis::cluster_routing::RoutingInfo::MultiNode((
                    redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
                    None,
                ));
                self.bounded(h.connection().route_command(cmd, routing))
                    .await
            }
        };
        let reply = match reply {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read Redis' maxmemory-policy (CONFIG GET refused?): make sure every master has maxmemory-policy noeviction or maxmemory 0, or a full Redis loses claims");
                return Ok(());
            }
        };
        let nodes = per_node(&reply);
        let unbounded: Vec<&str> = nodes
            .iter()
            .filter(|(_, config)| config.iter().any(|(k, v)| k == "maxmemory" && v == "0"))
            .map(|(node, _)| node.as_str())
            .collect();
        if !unbounded.is_empty() {
            tracing::warn!(
                nodes = %unbounded.join(", "),
                "Redis maxmemory is unset (0): nothing bounds its memory but the machine's, \
                 and the kernel may kill it when that runs out, with every claim and answer \
                 not yet replicated. Set maxmemory, with maxmemory-policy noeviction: a full \
                 Redis then refuses new claims (503) and keeps what it holds"
            );
        }
        let evicting: Vec<String> = nodes
            .into_iter()
            .filter_map(|(node, config)| evicts(&config).map(|why| format!("{node}: {why}")))
            .collect();
        if evicting.is_empty() {
            return Ok(());
        }
        let found = evicting.join("; ");
        if allowed {
            tracing::warn!(%found, "Redis may evict records (accepted with --redis-allow-eviction): an evicted claim lets a retry run the handler again");
            return Ok(());
        }
        Err(StoreError::unsafe_config(format!(
            "Redis evicts keys when full ({found}): an evicted claim or answer lets a retry run the handler again. \
             Set maxmemory-policy noeviction (or maxmemory 0), or pass --redis-allow-eviction to accept the risk"
        )))
    }

    /// Warns when a cluster's masters stop serving every slot while any slot has no
    /// master (`cluster-require-full-coverage yes`, Redis' default): then one master's
    /// death turns every key away (`CLUSTERDOWN`) until its replica is promoted, not
    /// only its own keys.
    async fn check_coverage(&self) {
        let Conn::Cluster(h) = &self.conn else {
            return;
        };
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("cluster-require-full-coverage");
        let routing = redis::cluster_routing::RoutingInfo::MultiNode((
            redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
            None,
        ));
        let Ok(reply) = self
            .bounded(h.connection().route_command(cmd, routing))
            .await
        else {
            return;
        };
        let full: Vec<String> = per_node(&reply)
            .into_iter()
            .filter(|(_, config)| {
                config
                    .iter()
                    .any(|(k, v)| k == "cluster-require-full-coverage" && v == "yes")
            })
            .map(|(node, _)| node)
            .collect();
        if !full.is_empty() {
            tracing::warn!(
                masters = %full.join(", "),
                "cluster-require-full-coverage is yes: while one master is down and not yet \
                 replaced, every master refuses every key (CLUSTERDOWN), so every request gets \
                 503. With `no`, only the dead master's keys do"
            );
        }
    }

    /// `WAIT` for the configured replicas after a write on `key`, on the connection to
    /// the key's master; fewer acknowledgements than asked is a failed write.
    async fn wait_for_replicas(&self, key: &RecordKey) -> Result<(), StoreError> {
        if self.wait_replicas == 0 {
            return Ok(());
        }
        let wait_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX) / 2;
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.wait_replicas).arg(wait_ms);
        let acked: i64 = match &self.conn {
            Conn::Single(c) => self.bounded(cmd.query_async(&mut c.clone())).await?,
            Conn::Cluster(h) => {
                let route = redis::cluster_routing::Route::with_key(
                    self.redis_key(key),
                    redis::cluster_routing::SlotAddr::Master,
                );
                let routing = redis::cluster_routing::RoutingInfo::SingleNode(
                    redis::cluster_routing::SingleNodeRoutingInfo::SpecificNode(route),
                );
                let result = self
                    .bounded(h.connection().route_command(cmd, routing))
                    .await
                    .and_then(|v| {
                        redis::from_redis_value(v)
                            .map_err(|e| StoreError::corrupt(format!("WAIT answered {e}")))
                    });
                h.observe(&result);
                result?
            }
        };
        if acked < i64::from(self.wait_replicas) {
            return Err(StoreError::unavailable(format!(
                "redis: the write reached {acked} of {} replicas within {wait_ms} ms",
                self.wait_replicas
            )));
        }
        Ok(())
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    async fn bounded<T>(
        &self,
        op: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, op).await {
            Ok(r) => r.map_err(unavailable),
            Err(_) => Err(StoreError::unavailable(format!(
                "redis: no answer within {:?}",
                self.timeout
            ))),
        }
    }

    async fn cmd<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> Result<T, StoreError> {
        match &self.conn {
            Conn::Single(c) => self.bounded(cmd.query_async(&mut c.clone())).await,
            Conn::Cluster(h) => {
                let result = self.bounded(cmd.query_async(&mut h.connection())).await;
                h.observe(&result);
                result
            }
        }
    }

    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        key: &RecordKey,
        args: ScriptArgs<'_>,
    ) -> Result<T, StoreError> {
        let redis_key = self.redis_key(key);
        let mut eval = Eval::new(script, &redis_key);
        args.apply(&mut eval);
        match &self.conn {
            Conn::Single(c) => self.bounded(eval.query(&mut c.clone())).await,
            Conn::Cluster(h) => {
                // Straight to the key's master: one master down is its keys' problem,
                // not every shard's (see `slots`).
                if let Some(router) = &h.slots {
                    if let Some(node) = router.owner(redis_key.as_bytes()) {
                        match h.nodes.invoke(&node, &eval).await {
                            Ok(value) => return Ok(value),
                            Err(nodes::NodeFailure::Answered(e)) if slots::redirected(&e) => {
                                router.refresh_soon(&h.nodes);
                            }
                            Err(nodes::NodeFailure::Answered(e)) => {
                                if slots::topology_changing(&e) {
                                    router.refresh_soon(&h.nodes);
                                }
                                return Err(unavailable(e));
                            }
                            Err(nodes::NodeFailure::Unreachable(e)) => {
                                router.refresh_soon(&h.nodes);
                                return Err(e);
                            }
                        }
                    } else {
                        router.refresh_soon(&h.nodes);
                    }
                }
                let result = self.bounded(eval.query(&mut h.connection())).await;
                h.observe(&result);
                result
            }
        }
    }

    /// Stores `record` at `key` unless Redis already holds a record that supersedes it.
    #[cfg_attr(not(feature = "tiered"), allow(dead_code))]
    pub(crate) async fn mirror(
        &self,
        key: &RecordKey,
        record: &Record,
    ) -> Result<bool, StoreError> {
        let written: i64 = self
            .run(MIRROR.of(self.layout), key, ScriptArgs::record(record))
            .await?;
        Ok(written == 1)
    }

    /// The holder write under the core's precondition and the clock check, executed
    /// by the script; recomputed at the server's time when the clocks disagree.
    pub(crate) async fn holder_write(
        &self,
        key: &RecordKey,
        holder: &Holder,
        change: &Transition,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        let written = holder_write_at(holder, change, now, policy, |next, at| async move {
            let reply: Vec<Value> = self
                .run(
                    HOLDER_WRITE.of(self.layout),
                    key,
                    ScriptArgs::Holder(holder.token, &next, at),
                )
                .await?;
            let (code, rest) = self.reply(&reply)?;
            match code {
                1 => Ok(Written::Done),
                2 => Ok(Written::Skewed(self.clock.now())),
                _ => Ok(Written::Refused(match rest.first() {
                    Some(Value::BulkString(bytes)) => Some(decode(bytes)?),
                    _ => None,
                })),
            }
        })
        .await?;
        if written.is_written() {
            self.wait_for_replicas(key).await?;
        }
        Ok(written)
    }

    /// A script's `{code, server time, …}` reply: records the server's clock.
    fn reply<'v>(&self, reply: &'v [Value]) -> Result<(i64, &'v [Value]), StoreError> {
        match reply {
            [Value::Int(code), Value::Int(now), rest @ ..] => {
                self.clock.observe(u64::try_from(*now).unwrap_or(0));
                Ok((*code, rest))
            }
            other => Err(StoreError::corrupt(format!(
                "unexpected script reply {other:?}"
            ))),
        }
    }

    /// Reads a record.
    pub(crate) async fn read(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        let bytes: Option<Vec<u8>> = self.run(GET.of(self.layout), key, ScriptArgs::None).await?;
        bytes.map(|b| decode(&b)).transpose()
    }
}

/// Each node's `CONFIG GET` pairs: a cluster's routed reply maps node addresses to
/// replies; a standalone reply is one node's.
fn per_node(reply: &Value) -> Vec<(String, Vec<(String, String)>)> {
    match reply {
        Value::Map(nodes)
            if nodes
                .iter()
                .all(|(_, v)| !matches!(v, Value::BulkString(_))) =>
        {
            nodes
                .iter()
                .map(|(node, config)| (text(node), pairs(config)))
                .collect()
        }
        other => vec![("redis".to_owned(), pairs(other))],
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        other => format!("{other:?}"),
    }
}

/// `CONFIG GET` pairs, from a RESP2 array or a RESP3 map.
fn pairs(v: &Value) -> Vec<(String, String)> {
    match v {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|kv| match kv {
                [k, v] => Some((text(k), text(v))),
                _ => None,
            })
            .collect(),
        Value::Map(kvs) => kvs.iter().map(|(k, v)| (text(k), text(v))).collect(),
        _ => Vec::new(),
    }
}

/// Why a node with this configuration evicts records, or `None` if it doesn't: it has
/// a memory limit and a policy other than `noeviction` (our records all carry a TTL,
/// so the `volatile-*` policies evict them too).
fn evicts(config: &[(String, String)]) -> Option<String> {
    let get = |name: &str| {
        config
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let limit = get("maxmemory")?;
    let policy = get("maxmemory-policy")?;
    (limit != "0" && policy != "noeviction")
        .then(|| format!("maxmemory {limit}, maxmemory-policy {policy}"))
}

/// The argument lists of the scripts.
enum ScriptArgs<'a> {
    None,
    /// record, pexpireat
    #[cfg_attr(not(feature = "tiered"), allow(dead_code))]
    Record(&'a Record),
    /// as `Record`, then now, tolerance
    Claim(&'a Record, Stamp),
    /// expected record, then as `Claim`
    Replace(&'a [u8], &'a Record, Stamp),
    /// holder token (8 bytes, big-endian, as in the record), then as `Claim`
    Holder(u64, &'a Record, Stamp),
}

impl<'a> ScriptArgs<'a> {
    fn record(r: &'a Record) -> Self {
        ScriptArgs::Record(r)
    }
    fn apply(self, inv: &mut Eval<'_>) {
        let (record, stamp) = match self {
            ScriptArgs::None => return,
            ScriptArgs::Record(r) => (r, None),
            ScriptArgs::Claim(r, at) => (r, Some(at)),
            ScriptArgs::Replace(expected, r, at) => {
                inv.arg(expected);
                (r, Some(at))
            }
            ScriptArgs::Holder(token, r, at) => {
                inv.arg(&token.to_be_bytes()[..]);
                (r, Some(at))
            }
        };
        inv.arg(record.encode()).arg(pexpire_at(record));
        if let Some(at) = stamp {
            inv.arg(at.now).arg(at.tolerance);
        }
    }
}

#[async_trait]
impl CasRecords for RedisStore {
    async fn insert_if_absent(
        &self,
        key: &RecordKey,
        record: &Record,
        at: Stamp,
    ) -> Result<(Insert, Millis), StoreError> {
        let reply: Vec<Value> = self
            .run(
                INSERT_IF_ABSENT.of(self.layout),
                key,
                ScriptArgs::Claim(record, at),
            )
            .await?;
        let (code, rest) = self.reply(&reply)?;
        let found = match (code, rest) {
            (0, _) => {
                self.wait_for_replicas(key).await?;
                Insert::Stored
            }
            (1, [Value::BulkString(bytes)]) => Insert::Existing(decode(bytes)?),
            (2, _) => Insert::Skewed,
            _ => {
                return Err(StoreError::corrupt(format!(
                    "unexpected insert reply {reply:?}"
                )))
            }
        };
        Ok((found, self.clock.now()))
    }

    async fn replace(
        &self,
        key: &RecordKey,
        expected: &Record,
        record: &Record,
        at: Stamp,
    ) -> Result<(Swap, Millis), StoreError> {
        let expected = expected.encode();
        let reply: Vec<Value> = self
            .run(
                REPLACE_IF_SAME.of(self.layout),
                key,
                ScriptArgs::Replace(&expected, record, at),
            )
            .await?;
        let swap = match self.reply(&reply)?.0 {
            1 => {
                self.wait_for_replicas(key).await?;
                Swap::Replaced
            }
            2 => Swap::Skewed,
            _ => Swap::Changed,
        };
        Ok((swap, self.clock.now()))
    }
}

#[async_trait]
impl Store for RedisStore {
    fn name(&self) -> &'static str {
        if self.is_cluster() {
            "redis-cluster"
        } else {
            "redis"
        }
    }

    fn now(&self) -> Millis {
        self.clock.now()
    }

    async fn claim_with_record(
        &self,
        key: &RecordKey,
        fp: &Fingerprint,
        now: Millis,
        policy: &Policy,
    ) -> Result<(Decision, Option<Record>), StoreError> {
        claim_by_cas(self, key, fp, now, policy).await
    }

    async fn write_as_holder(
        &self,
        key: &RecordKey,
        holder: &Holder,
        change: &Transition,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        self.holder_write(key, holder, change, now, policy).await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.read(key).await
    }

    /// Redis expires records itself.
    async fn delete_if_same(
        &self,
        key: &RecordKey,
        expected: &Record,
        not_before: Millis,
    ) -> Result<super::Deletion, StoreError> {
        self.delete_record_if_same(key, expected, not_before).await
    }

    async fn in_progress(
        &self,
        claimed_before: Millis,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<super::InProgressPage, StoreError> {
        self.in_progress_records(claimed_before, cursor, limit)
            .await
    }

    fn purge_channel(&self) -> Option<Arc<dyn super::PurgeChannel>> {
        Some(Arc::new(self.channel()))
    }

    async fn sweep(&self, _now: Millis, _batch: usize) -> Result<u64, StoreError> {
        Ok(0)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let pong: String = self.cmd(&mut redis::cmd("PING")).await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(StoreError::unavailable(format!(
                "redis answered {pong:?} to PING"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(limit: &str, policy: &str) -> Vec<(String, String)> {
        vec![
            ("maxmemory".into(), limit.into()),
            ("maxmemory-policy".into(), policy.into()),
        ]
    }

    #[test]
    fn only_noeviction_or_no_limit_keeps_every_record() {
        assert_eq!(
            evicts(&config("0", "allkeys-lru")),
            None,
            "no limit, no eviction"
        );
        assert_eq!(evicts(&config("100mb", "noeviction")), None);
        for policy in [
            "allkeys-lru",
            "volatile-lru",
            "volatile-ttl",
            "allkeys-random",
        ] {
            assert!(evicts(&config("104857600", policy)).is_some(), "{policy}");
        }
    }

    #[test]
    fn reads_standalone_and_cluster_replies() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let single = Value::Array(vec![
            b("maxmemory"),
            b("1"),
            b("maxmemory-policy"),
            b("allkeys-lru"),
        ]);
        assert_eq!(per_node(&single)[0].1, config("1", "allkeys-lru"));
        let cluster = Value::Map(vec![
            (
                b("127.0.0.1:7000"),
                Value::Map(vec![
                    (b("maxmemory"), b("0")),
                    (b("maxmemory-policy"), b("noeviction")),
                ]),
            ),
            (b("127.0.0.1:7001"), single),
        ]);
        let nodes = per_node(&cluster);
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[1].0, "127.0.0.1:7001");
        assert!(evicts(&nodes[1].1).is_some() && evicts(&nodes[0].1).is_none());
    }
}
