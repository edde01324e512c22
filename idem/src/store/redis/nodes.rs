//! Connections of their own to single nodes of a Redis Cluster, named by address.
//!
//! The in-progress listing (`SCAN` is per node) and the purge probe (a `PUBLISH` from
//! each master) talk to a node by address. Asked through the cluster connection,
//! redis-rs 1.8 answers a node outside its slot map — a master that has joined and
//! holds no slot yet — with "connection not found" and reconnects from the initial
//! nodes, pausing every request on the data connection meanwhile; a reconnect racing
//! in-flight requests can wedge that connection until it is rebuilt (thousands of
//! 503s during a rebalance: tests/tests/reshard.rs). A node's own connection leaves
//! the data path alone.

use super::{client_for, unavailable, NodeAllowList};
use crate::store::StoreError;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, FromRedisValue, Value};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// How a request to one node failed.
pub(super) enum NodeFailure {
    /// The node answered with an error (a redirect, a script's error).
    Answered(redis::RedisError),
    /// No connection, or no answer in time: the connection is closed.
    Unreachable(StoreError),
}

pub(super) struct NodeConnections {
    /// The first URL given: every node shares its scheme, credentials and database.
    template: String,
    /// Where the template's credentials may go.
    allowed: NodeAllowList,
    /// The nodes refused for not being allowed, each logged once.
    refused: Mutex<std::collections::HashSet<String>>,
    ca: Option<Vec<u8>>,
    timeout: Duration,
    open: Mutex<HashMap<String, MultiplexedConnection>>,
}

impl NodeConnections {
    pub(super) fn new(template: &str, ca: Option<Vec<u8>>, timeout: Duration) -> Self {
        NodeConnections {
            template: template.to_owned(),
            allowed: NodeAllowList::default(),
            refused: Mutex::default(),
            ca,
            timeout,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// These connections, sending credentials only to the nodes `allowed` names.
    pub(super) fn allowing(mut self, allowed: NodeAllowList) -> Self {
        self.allowed = allowed;
        self
    }

    /// Whether the URLs carry credentials (a user or a password).
    pub(super) fn sends_credentials(&self) -> bool {
        let rest = self
            .template
            .split_once("://")
            .map_or(self.template.as_str(), |(_, r)| r);
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        authority.contains('@')
    }

    /// Whether credentials may be sent to `node`.
    pub(super) fn allows(&self, node: &str) -> bool {
        self.allowed.allows(node)
    }

    /// The template URL pointed at `node` (`host:port`).
    pub(super) fn url_for(&self, node: &str) -> String {
        let (scheme, rest) = self
            .template
            .split_once("://")
            .unwrap_or(("redis", &self.template));
        let (userinfo, hostpart) = match rest.split_once('@') {
            Some((u, h)) => (format!("{u}@"), h),
            None => (String::new(), rest),
        };
        let tail = hostpart
            .find(['/', '?', '#'])
            .map_or("", |at| &hostpart[at..]);
        // CLUSTER NODES writes an IPv6 host without brackets (`::1:7000`); a URL needs them.
        let node = match node.rsplit_once(':') {
            Some((host, port)) if host.contains(':') && !host.starts_with('[') => {
                format!("[{host}]:{port}")
            }
            _ => node.to_owned(),
        };
        format!("{scheme}://{userinfo}{node}{tail}")
    }

    /// A client for `node`, verifying TLS servers with the configured CA; refused for
    /// a node the credentials may not go to.
    pub(super) fn client(&self, node: &str) -> Result<redis::Client, StoreError> {
        if self.sends_credentials() && !self.allows(node) {
            let first = self
                .refused
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(node.to_owned());
            let why = format!(
                "redis: the cluster names {node}, which no --redis-url names and \
                 --redis-allow-host does not allow: it is not sent the credentials"
            );
            if first {
                tracing::error!("{why}");
            }
            return Err(StoreError::unavailable(why));
        }
        client_for(self.url_for(node), self.ca.as_deref()).map_err(unavailable)
    }

    async fn connection(&self, node: &str) -> Result<MultiplexedConnection, StoreError> {
        if let Some(open) = self.lock().get(node) {
            return Ok(open.clone());
        }
        let client = self.client(node)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let connecting = client.get_multiplexed_async_connection_with_config(&config);
        let conn = tokio::time::timeout(self.timeout, connecting)
            .await
            .map_err(|_| {
                StoreError::unavailable(format!(
                    "redis: no connection to {node} within {:?}",
                    self.timeout
                ))
            })?
            .map_err(unavailable)?;
        self.lock().insert(node.to_owned(), conn.clone());
        Ok(conn)
    }

    /// `cmd` on `node`. A connection that failed is closed; the next call opens one.
    pub(super) async fn query<T: FromRedisValue>(
        &self,
        node: &str,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        let mut conn = self.connection(node).await?;
        let result = tokio::time::timeout(self.timeout, cmd.query_async(&mut conn)).await;
        self.settle(node, result)
    }

    /// `eval` (a script, loaded when the node does not have it) on `node`.
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        node: &str,
        eval: &super::eval::Eval<'_>,
    ) -> Result<T, NodeFailure> {
        let mut conn = self
            .connection(node)
            .await
            .map_err(NodeFailure::Unreachable)?;
        match tokio::time::timeout(self.timeout, eval.query(&mut conn)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) if !(e.is_io_error() || e.is_timeout()) => Err(NodeFailure::Answered(e)),
            result => Err(NodeFailure::Unreachable(
                self.settle::<T>(node, result).err().unwrap_or_else(|| {
                    StoreError::unavailable(format!("redis: {node}: no answer"))
                }),
            )),
        }
    }

    /// `pipe` on `node`: each command's reply or error.
    pub(super) async fn pipeline(
        &self,
        node: &str,
        pipe: &redis::Pipeline,
    ) -> Result<Vec<Value>, StoreError> {
        let mut conn = self.connection(node).await?;
        let result = tokio::time::timeout(self.timeout, pipe.query_async(&mut conn)).await;
        self.settle(node, result)
    }

    fn settle<T>(
        &self,
        node: &str,
        result: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
    ) -> Result<T, StoreError> {
        let failed = match result {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) if !(e.is_io_error() || e.is_timeout()) => return Err(unavailable(e)),
            Ok(Err(e)) => unavailable(e),
            Err(_) => StoreError::unavailable(format!(
                "redis: {node}: no answer within {:?}",
                self.timeout
            )),
        };
        self.lock().remove(node);
        Err(failed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, MultiplexedConnection>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::NodeConnections;
    use std::time::Duration;

    #[test]
    fn credentials_go_only_where_allowed() {
        let allowed = super::NodeAllowList::new(["127.0.0.1:7000".to_owned()], []).unwrap();
        let with_password =
            NodeConnections::new("redis://:pw@127.0.0.1:7000", None, Duration::from_secs(1))
                .allowing(allowed.clone());
        assert!(with_password.sends_credentials());
        assert!(with_password.client("127.0.0.1:7000").is_ok());
        let refused = with_password
            .client("10.9.9.9:7000")
            .err()
            .unwrap()
            .to_string();
        assert!(
            refused.contains("10.9.9.9:7000") && !refused.contains("pw"),
            "{refused}"
        );
        let without = NodeConnections::new("redis://127.0.0.1:7000", None, Duration::from_secs(1))
            .allowing(allowed);
        assert!(!without.sends_credentials());
        assert!(
            without.client("10.9.9.9:7000").is_ok(),
            "no credentials to keep"
        );
        let user_only =
            NodeConnections::new("rediss://idem@h:7000/0", None, Duration::from_secs(1));
        assert!(user_only.sends_credentials());
    }

    #[test]
    fn a_node_url_keeps_the_first_urls_scheme_credentials_and_database() {
        let at = |template: &str| {
            NodeConnections::new(template, None, Duration::from_secs(1)).url_for("10.0.0.7:7001")
        };
        assert_eq!(at("redis://127.0.0.1:7000"), "redis://10.0.0.7:7001");
        assert_eq!(
            at("rediss://user:pw@a.example:7000/0?protocol=resp3"),
            "rediss://user:pw@10.0.0.7:7001/0?protocol=resp3"
        );
        assert_eq!(at("127.0.0.1:7000"), "redis://10.0.0.7:7001");
        assert_eq!(
            at("rediss://h:7000#insecure"),
            "rediss://10.0.0.7:7001#insecure"
        );
        let ipv6 = NodeConnections::new("redis://[::1]:7000", None, Duration::from_secs(1));
        assert_eq!(ipv6.url_for("::1:7001"), "redis://[::1]:7001");
        assert!(ipv6.client("::1:7001").is_ok());
    }
}
