//! Dedicated service processes for fault tests — a Redis, a Redis Cluster, a Postgres —
//! each on free loopback ports and in its own temporary directory, so a test can
//! kill -9, flush or stop them without disturbing the shared services. Everything is
//! killed when the handle drops.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback port that is free now (and whose cluster-bus port, +10000, is too).
pub fn free_port() -> u16 {
    for _ in 0..200 {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair found");
}

fn temp_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "idem-fault-{label}-{}-{}",
        std::process::id(),
        free_port()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

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
        let nodes: Vec<RedisProc> = (0..6)
            .map(|i| {
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
            })
            .collect();
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

/// A Postgres server of its own (initdb in a temporary directory).
pub struct PgProc {
    /// Its port.
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
}

fn pg_bin() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("Postgres server binaries under /usr/lib/postgresql (scripts/services-start installs them)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("pg_ctl").exists())
        .collect();
    dirs.sort();
    dirs.pop().expect("a Postgres version with pg_ctl")
}

/// Runs a Postgres tool as the `postgres` OS user when we are root (it refuses root).
fn as_postgres(bin: &Path, tool: &str, args: &[&str]) -> std::process::Output {
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false);
    let mut cmd = if is_root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
        c
    } else {
        Command::new(bin.join(tool))
    };
    cmd.args(args).output().expect("Postgres tool runs")
}

impl PgProc {
    /// initdb and start.
    pub fn start(label: &str) -> PgProc {
        Self::start_with(label, None)
    }

    /// initdb and start with `ssl = on`, serving `ca`'s server certificate.
    pub fn start_tls(label: &str, ca: &TestCa) -> PgProc {
        Self::start_with(label, Some(ca))
    }

    fn start_with(label: &str, tls: Option<&TestCa>) -> PgProc {
        let dir = temp_dir(label);
        let _ = Command::new("chown")
            .args(["-R", "postgres:postgres", dir.to_str().unwrap()])
            .status();
        let bin = pg_bin();
        let data = dir.join("data");
        let out = as_postgres(
            &bin,
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(ca) = tls {
            std::fs::copy(&ca.server_cert, data.join("server.crt")).unwrap();
            std::fs::copy(&ca.server_key, data.join("server.key")).unwrap();
            let mut conf = std::fs::OpenOptions::new()
                .append(true)
                .open(data.join("postgresql.conf"))
                .unwrap();
            std::io::Write::write_all(
                &mut conf,
                b"\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
            )
            .unwrap();
            let _ = Command::new("chown")
                .args(["-R", "postgres:postgres", data.to_str().unwrap()])
                .status();
            let _ = Command::new("chmod")
                .args(["600", data.join("server.key").to_str().unwrap()])
                .status();
        }
        let p = PgProc {
            port: free_port(),
            dir,
            bin,
        };
        p.start_server();
        p
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn start_server(&self) {
        let data = self.dir.join("data");
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("log");
        let out = as_postgres(
            &self.bin,
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-o",
                &opts,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "30",
                "start",
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops it abruptly (`-m immediate`: like a crash).
    pub fn stop(&self) {
        let data = self.dir.join("data");
        let _ = as_postgres(
            &self.bin,
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    /// Starts it again (crash recovery included).
    pub fn restart(&self) {
        self.start_server();
    }
}

impl Drop for PgProc {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A throwaway certificate authority (openssl): a CA, a server certificate for
/// `localhost` and 127.0.0.1 signed by it, and an unrelated CA that must be refused.
pub struct TestCa {
    dir: PathBuf,
    /// The CA certificate (PEM).
    pub ca: PathBuf,
    /// The server certificate (PEM), signed by `ca`.
    pub server_cert: PathBuf,
    /// Its key.
    pub server_key: PathBuf,
    /// A CA that did not sign the server certificate.
    pub wrong_ca: PathBuf,
}

impl TestCa {
    /// Makes the certificates in a temporary directory.
    pub fn new(label: &str) -> TestCa {
        let dir = temp_dir(label);
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("openssl runs");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ca_subject = "/CN=idem test CA";
        run(&[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", ca_subject,
            "-keyout", "ca.key", "-out", "ca.pem",
        ]);
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]);
        let ext = "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
                   keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n";
        std::fs::write(dir.join("ext.cnf"), ext).unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
        ]
        .into_iter()
        .chain(["-extfile", "ext.cnf", "-out", "server.pem"])
        .collect::<Vec<_>>());
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=some other CA",
            "-keyout",
            "wrong.key",
            "-out",
            "wrong.pem",
        ]);
        // Readable by the postgres user, which copies them.
        let _ = Command::new("chmod")
            .args(["-R", "a+rX", dir.to_str().unwrap()])
            .status();
        TestCa {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            wrong_ca: dir.join("wrong.pem"),
            dir,
        }
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
