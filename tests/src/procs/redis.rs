//! A Redis server, and a Redis Cluster, of a test's own.

use super::{free_port, temp_dir, wait_until, TestCa};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `redis-cli -p PORT args…`, its output.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One redis-server process.
pub struct RedisProc {
    /// Its port.
    pub port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
    /// `Some(CA file)` when it listens with TLS only.
    tls_ca: Option<PathBuf>,
}

impl RedisProc {
    /// Starts a standalone Redis without persistence.
    pub fn start(label: &str) -> RedisProc {
        Self::start_with(label, free_port(), &[])
    }

    fn start_with(label: &str, port: u16, extra: &[&str]) -> RedisProc {
        let mut p = RedisProc {
            port,
            dir: temp_dir(label),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
            tls_ca: None,
        };
        p.restart();
        p
    }

    /// `redis-cli` against this node (with TLS when it speaks TLS), its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut all: Vec<String> = self.tls_args();
        all.extend(args.iter().map(|a| a.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        redis_cli(self.port, &all)
    }

    fn tls_args(&self) -> Vec<String> {
        match &self.tls_ca {
            Some(ca) => vec!["--tls".into(), "--cacert".into(), ca.display().to_string()],
            None => vec![],
        }
    }

    /// Starts a standalone Redis that speaks TLS only, with `ca`'s server certificate.
    pub fn start_tls(label: &str, ca: &TestCa) -> RedisProc {
        let port = free_port();
        let extra = [
            "--port".to_owned(),
            "0".to_owned(),
            "--tls-port".to_owned(),
            port.to_string(),
            "--tls-cert-file".to_owned(),
            ca.server_cert.display().to_string(),
            "--tls-key-file".to_owned(),
            ca.server_key.display().to_string(),
            "--tls-ca-cert-file".to_owned(),
            ca.ca.display().to_string(),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ];
        let mut p = RedisProc {
            port,
            dir: temp_dir(label),
            extra: extra.to_vec(),
            child: None,
            tls_ca: Some(ca.ca.clone()),
        };
        p.restart();
        p
    }

    /// `redis://127.0.0.1:PORT` (`rediss://localhost:PORT` with TLS).
    pub fn url(&self) -> String {
        match self.tls_ca {
            None => format!("redis://127.0.0.1:{}", self.port),
            Some(_) => format!("rediss://localhost:{}", self.port),
        }
    }

    /// Freezes it (`SIGSTOP`): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws it (`SIGCONT`).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let c = self.child.as_ref().expect("the server runs");
        let sent = Command::new("kill")
            .args([sig, &c.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill {sig} {}", c.id());
    }

    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and directory (a cluster node rejoins from its nodes.conf).
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--dir", self.dir.to_str().unwrap()])
            .args(&self.extra)
            .args(server_log(self.port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs (scripts/services-start installs it)");
        self.child = Some(child);
        let port = self.port;
        let mut ping: Vec<String> = match &self.tls_ca {
            Some(ca) => vec!["--tls".into(), "--cacert".into(), ca.display().to_string()],
            None => vec![],
        };
        ping.push("ping".into());
        let ping: Vec<&str> = ping.iter().map(String::as_str).collect();
        wait_until("redis answers PING", Duration::from_secs(10), || {
            redis_cli(port, &ping).trim() == "PONG"
        });
    }
}

impl Drop for RedisProc {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A 3-master, 3-replica Redis Cluster with a short node timeout (fast failover).
pub struct RedisClusterProc {
    /// Its nodes.
    pub nodes: Vec<RedisProc>,
}

impl RedisClusterProc {
    /// Starts six nodes and creates the cluster.
    pub fn start(label: &str) -> RedisClusterProc {
        Self::start_with(label, None)
    }

    /// The same, speaking TLS only (clients, the cluster bus and replication).
    pub fn start_tls(label: &str, ca: &TestCa) -> RedisClusterProc {
        Self::start_with(label, Some(ca))
    }

    fn start_with(label: &str, tls: Option<&TestCa>) -> RedisClusterProc {
        let nodes: Vec<RedisProc> = (0..6).map(|i| cluster_node(label, i, tls)).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(nodes[0].tls_args())
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let c = RedisClusterProc { nodes };
        c.wait_ok(Duration::from_secs(20));
        c.wait_replicas_synced(Duration::from_secs(30));
        c
    }

    /// The nodes' URLs, comma-separated.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(RedisProc::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until every live node says `cluster_state:ok`.
    pub fn wait_ok(&self, timeout: Duration) {
        wait_until("the cluster is ok", timeout, || {
            self.nodes
                .iter()
                .filter(|n| n.child.is_some())
                .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"))
        });
    }

    /// Waits until every live replica's link to its master is up.
    pub fn wait_replicas_synced(&self, timeout: Duration) {
        wait_until("every replica is in sync", timeout, || {
            self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                let info = n.cli(&["info", "replication"]);
                info.contains("role:master") || info.contains("master_link_status:up")
            })
        });
    }

    /// Starts a seventh (eighth…) node and joins it as a master holding no slot yet
    /// (`redis-cli --cluster add-node`). Returns its index in `nodes`.
    pub fn add_master(&mut self, label: &str) -> usize {
        let tls = self.nodes[0].tls_ca.clone();
        assert!(tls.is_none(), "add_master speaks plain TCP only");
        let node = cluster_node(label, self.nodes.len(), None);
        let entry = format!("127.0.0.1:{}", self.nodes[self.a_master()].port);
        let new = format!("127.0.0.1:{}", node.port);
        // Right after slots moved the nodes may not agree yet, and add-node refuses.
        self.wait_agreed(&entry, Duration::from_secs(20));
        self.cluster_cli(&["add-node", &new, &entry]);
        self.nodes.push(node);
        let index = self.nodes.len() - 1;
        wait_until(
            "every node knows the new master",
            Duration::from_secs(20),
            || {
                let id = self.node_id(index);
                self.nodes
                    .iter()
                    .filter(|n| n.child.is_some())
                    .all(|n| n.cli(&["cluster", "nodes"]).contains(&id))
            },
        );
        // A node that has not learnt the slots yet refuses the migrations: CLUSTERDOWN.
        self.wait_ok(Duration::from_secs(20));
        index
    }

    /// The node's cluster id (`CLUSTER MYID`).
    pub fn node_id(&self, index: usize) -> String {
        self.nodes[index]
            .cli(&["cluster", "myid"])
            .trim()
            .to_owned()
    }

    /// Indexes of the live masters holding at least one slot, in `nodes` order.
    pub fn masters_with_slots(&self) -> Vec<usize> {
        let view = self.nodes[self.a_master()].cli(&["cluster", "nodes"]);
        let ids: Vec<String> = view
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail") && l.split(' ').count() > 8)
            .map(|l| l.split(' ').next().unwrap_or_default().to_owned())
            .collect();
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].child.is_some() && ids.contains(&self.node_id(i)))
            .collect()
    }

    /// Moves `slots` hash slots, with their keys, from the master at `from` to the
    /// master at `to` (`redis-cli --cluster reshard`), while clients keep writing.
    pub fn reshard(&self, from: usize, to: usize, slots: usize) {
        let entry = format!("127.0.0.1:{}", self.nodes[from].port);
        let (from, to, slots) = (self.node_id(from), self.node_id(to), slots.to_string());
        self.cluster_cli(&[
            "reshard",
            &entry,
            "--cluster-from",
            &from,
            "--cluster-to",
            &to,
            "--cluster-slots",
            &slots,
            "--cluster-yes",
        ]);
    }

    /// Spreads the slots evenly over every master, empty ones included
    /// (`redis-cli --cluster rebalance --cluster-use-empty-masters`).
    pub fn rebalance(&self) {
        let entry = format!("127.0.0.1:{}", self.nodes[self.a_master()].port);
        self.wait_agreed(&entry, Duration::from_secs(20));
        self.cluster_cli(&["rebalance", &entry, "--cluster-use-empty-masters"]);
    }

    /// Waits until `redis-cli --cluster check` through `entry` finds the nodes agreeing
    /// about the configuration (gossip settles a moment after slots move).
    fn wait_agreed(&self, entry: &str, timeout: Duration) {
        wait_until("the cluster's nodes agree", timeout, || {
            Command::new("redis-cli")
                .args(["--cluster", "check", entry])
                .output()
                .is_ok_and(|out| {
                    out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("[ERR]")
                })
        });
    }

    fn cluster_cli(&self, args: &[&str]) {
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .args(args)
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("[ERR]"),
            "redis-cli --cluster {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Index of a node that is a master now.
    pub fn a_master(&self) -> usize {
        self.nodes
            .iter()
            .position(|n| n.child.is_some() && n.cli(&["role"]).starts_with("master"))
            .expect("a live master")
    }

    /// Waits until the master at `index`, killed, has been replaced by a replica.
    pub fn wait_failover(&self, killed: usize, timeout: Duration) {
        let live: Vec<&RedisProc> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| *i != killed && n.child.is_some())
            .map(|(_, n)| n)
            .collect();
        wait_until("a replica takes over", timeout, || {
            let masters = live
                .iter()
                .filter(|n| n.cli(&["role"]).starts_with("master"))
                .count();
            masters == 3
                && live
                    .iter()
                    .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"))
        });
    }
}

/// `--logfile` under `$IDEM_TEST_REDIS_LOGS` when that is set (the test's own
/// directories are removed when it ends; a failed run's server logs are kept there).
fn server_log(port: u16) -> Vec<String> {
    match std::env::var_os("IDEM_TEST_REDIS_LOGS") {
        Some(dir) => {
            let _ = std::fs::create_dir_all(&dir);
            let file = std::path::Path::new(&dir).join(format!("redis-{port}.log"));
            vec!["--logfile".into(), file.display().to_string()]
        }
        None => vec![],
    }
}

/// A node with cluster mode on and a short node timeout (fast failover), started.
fn cluster_node(label: &str, i: usize, tls: Option<&TestCa>) -> RedisProc {
    let port = free_port();
    let tls_extra: Vec<String> = match tls {
        None => vec![],
        Some(ca) => [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cluster",
            "yes",
            "--tls-replication",
            "yes",
            "--tls-cert-file",
            &ca.server_cert.display().to_string(),
            "--tls-key-file",
            &ca.server_key.display().to_string(),
            "--tls-ca-cert-file",
            &ca.ca.display().to_string(),
            "--tls-auth-clients",
            "no",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    };
    let mut extra: Vec<&str> = tls_extra.iter().map(String::as_str).collect();
    extra.extend([
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "1500",
        // Let a replica take over even if its link was down a while: a test
        // wants the failover, not the safety margin.
        "--cluster-replica-validity-factor",
        "0",
    ]);
    let mut node = RedisProc {
        port,
        dir: temp_dir(&format!("{label}-{i}")),
        extra: extra.iter().map(|s| s.to_string()).collect(),
        child: None,
        tls_ca: tls.map(|ca| ca.ca.clone()),
    };
    node.restart();
    node
}
