//! Test harness: real Postgres (one fresh schema per test), origins served over real
//! HTTP on loopback — in this process or as a separate `idem-origin` process — and a
//! TCP proxy that can cut a store off mid-test.
//!
//! Postgres is found at `IDEM_TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/idem` (what `scripts/services-start` starts).

pub mod procs;

use clap::Parser;
use idem_origin::app::Origin;
use idem_origin::config::Config;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The Postgres the tests use.
pub fn database_url() -> String {
    std::env::var("IDEM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/idem".into())
}

/// The standalone Redis the tests use (`IDEM_TEST_REDIS_URL`).
pub fn redis_url() -> String {
    std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The Redis Cluster nodes the tests use (`IDEM_TEST_REDIS_CLUSTER_URLS`, comma-separated).
pub fn redis_cluster_urls() -> String {
    std::env::var("IDEM_TEST_REDIS_CLUSTER_URLS").unwrap_or_else(|_| {
        (7000..7006)
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// A Redis key namespace no other test (or earlier run) uses.
pub fn unique_namespace(label: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "test-{label}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A schema of its own for one test, so tests can count rows in parallel.
pub struct TestDb {
    /// The schema's name.
    pub schema: String,
    /// A URL whose connections use the schema.
    pub url: String,
}

impl TestDb {
    /// Creates a fresh, empty schema.
    pub async fn new(label: &str) -> TestDb {
        static N: AtomicU32 = AtomicU32::new(0);
        let schema = format!(
            "t_{label}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let client = connect(&database_url()).await;
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            ))
            .await
            .unwrap_or_else(|e| panic!("cannot create schema {schema}: {e}"));
        let url = with_search_path(&database_url(), &schema);
        TestDb { schema, url }
    }

    /// A client on the schema.
    pub async fn client(&self) -> tokio_postgres::Client {
        connect(&self.url).await
    }

    /// One integer from `sql`.
    pub async fn count(&self, sql: &str) -> i64 {
        self.client()
            .await
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    }

    /// Runs `sql` (statements without results).
    pub async fn exec(&self, sql: &str) {
        self.client()
            .await
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Rows in `charges`.
    pub async fn charges(&self) -> i64 {
        self.count("SELECT count(*) FROM charges").await
    }

    /// Charges made under `key`.
    pub async fn charges_for(&self, key: &str) -> i64 {
        let client = self.client().await;
        client
            .query_one(
                "SELECT count(*) FROM charges WHERE idempotency_key = $1",
                &[&key],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Records still in force (claimed or completed, not expired or released).
    pub async fn live_records(&self) -> i64 {
        let now = idem_origin::now() as i64;
        self.client()
            .await
            .query_one(
                "SELECT count(*) FROM idem_records WHERE expires_at > $1",
                &[&now],
            )
            .await
            .unwrap()
            .get(0)
    }
}

/// `url` with `search_path` set to `schema` for every connection.
pub fn with_search_path(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20search_path%3D{schema}")
}

/// A plain connection (panics with the reason when Postgres is not there).
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!("cannot connect to Postgres at {url}: {e} — run scripts/services-start")
        });
    tokio::spawn(conn);
    client
}

/// An origin served on an ephemeral loopback port by this process.
pub struct TestOrigin {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it was built from.
    pub origin_store: Arc<dyn idem_origin::store::Store>,
    server: JoinHandle<()>,
}

impl TestOrigin {
    /// Builds an origin from command-line style arguments and serves it.
    pub async fn start(args: &[&str]) -> TestOrigin {
        let mut argv = vec!["idem-origin"];
        argv.extend_from_slice(args);
        let config = Config::try_parse_from(argv).expect("valid test arguments");
        let origin = idem_origin::app::build(&config)
            .await
            .expect("origin builds");
        Self::serve(origin).await
    }

    /// Serves an already built origin.
    pub async fn serve(origin: Origin) -> TestOrigin {
        Self::serve_router(origin.router, origin.store).await
    }

    /// Serves any router.
    pub async fn serve_router(
        router: axum::Router,
        store: Arc<dyn idem_origin::store::Store>,
    ) -> TestOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        TestOrigin {
            addr,
            origin_store: store,
            server,
        }
    }

    /// The demo API behind the layer on `store`, with its charges kept in memory — so a
    /// handler that ran without the store's protection is still counted.
    pub async fn demo_on(
        store: Arc<dyn idem_origin::store::Store>,
    ) -> (TestOrigin, Arc<idem_origin::charges::MemoryLedger>) {
        let ledger = Arc::new(idem_origin::charges::MemoryLedger::default());
        let layer = idem_origin::idempotency::IdempotencyLayer::new(store.clone())
            .require_key_on(["/v1/charges"]);
        let demo = idem_origin::charges::Demo::new(ledger.clone());
        let router = idem_origin::app::router(layer, store.clone(), demo);
        (Self::serve_router(router, store).await, ledger)
    }

    /// Flushes the store (the async outbox) as a graceful shutdown does.
    pub async fn flush(&self) {
        self.origin_store.flush().await.expect("store flushes");
    }

    /// `http://addr` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for TestOrigin {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A client with a generous connection pool and a bound on every request.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(64)
        .build()
        .unwrap()
}

/// The demo's charge body.
pub fn charge_body(customer: &str, amount: i64, latency_ms: u64) -> String {
    serde_json::json!({ "amount": amount, "currency": "usd", "customer": customer, "simulate_latency_ms": latency_ms })
        .to_string()
}

/// POSTs a charge with `key` (already in header form, e.g. `"\"k1\""`).
pub async fn post_charge(
    client: &reqwest::Client,
    origin: &str,
    key: Option<&str>,
    body: &str,
) -> reqwest::Response {
    let mut req = client
        .post(format!("{origin}/v1/charges"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.send().await.expect("origin answers")
}

/// A TCP proxy to a real backend that the test can take down and bring back, to make
/// a store unreachable without stopping it for every other test.
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    down: Arc<AtomicBool>,
    generation: Arc<AtomicU32>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Proxies a fresh loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let down = Arc::new(AtomicBool::new(false));
        let generation = Arc::new(AtomicU32::new(0));
        let (d, g) = (down.clone(), generation.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if d.load(Ordering::SeqCst) {
                    drop(inbound); // refuse: close at once
                    continue;
                }
                let (d, g) = (d.clone(), g.clone());
                let born = g.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let copy = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
                    tokio::pin!(copy);
                    // Cut the connection when the proxy goes down.
                    loop {
                        tokio::select! {
                            _ = &mut copy => return,
                            _ = tokio::time::sleep(Duration::from_millis(20)) => {
                                if d.load(Ordering::SeqCst) || g.load(Ordering::SeqCst) != born { return; }
                            }
                        }
                    }
                });
            }
        });
        Proxy {
            addr,
            down,
            generation,
            task,
        }
    }

    /// Drops every connection and refuses new ones.
    pub fn take_down(&self) {
        self.down.store(true, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Accepts connections again.
    pub fn bring_up(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The socket address of a `postgres://…@host:port/…` URL.
pub fn pg_addr(url: &str) -> SocketAddr {
    let config: tokio_postgres::Config = url.parse().expect("valid URL");
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(_) => panic!("tests need a TCP Postgres URL"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let host = if host == "localhost" {
        "127.0.0.1".to_owned()
    } else {
        host
    };
    format!("{host}:{port}").parse().expect("an IP host")
}

/// `url` pointed at `addr` instead of its own host and port.
pub fn via(url: &str, addr: SocketAddr) -> String {
    let target = pg_addr(url);
    url.replacen(
        &format!("{}:{}", target.ip(), target.port()),
        &addr.to_string(),
        1,
    )
}

/// Appends a line to `target/idem-reports/<name>.txt`; `scripts/test` prints these at
/// the end, so the figures behind each claim are visible without `--nocapture`.
pub fn report(name: &str, line: &str) {
    use std::io::Write;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/idem-reports");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.txt")))
    {
        let _ = writeln!(f, "{line}");
    }
    eprintln!("[{name}] {line}");
}

/// An `idem-origin` process (the binary cargo built next to the test executables).
pub struct OriginProcess;

impl OriginProcess {
    /// The binary's path: `target/<profile>/idem-origin`.
    pub fn binary() -> std::path::PathBuf {
        let exe = std::env::current_exe().unwrap();
        let bin = exe
            .parent()
            .and_then(|d| d.parent())
            .unwrap()
            .join("idem-origin");
        assert!(
            bin.exists(),
            "{} is missing: build it with `cargo build -p idem-origin`",
            bin.display()
        );
        bin
    }

    /// Starts it on a free port with `args`; returns the child and its base URL once
    /// `/healthz` answers. Its log goes to `target/idem-reports/origin-<port>.log`.
    pub async fn spawn(args: &[&str]) -> (std::process::Child, String) {
        Self::spawn_env(args, &[]).await
    }

    /// [`OriginProcess::spawn`] with extra environment variables (e.g. libfaketime's).
    pub async fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> (std::process::Child, String) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self::try_spawn_at(port, args, env)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts it on `port` (a restart keeps its address); `Err` when it exits at
    /// start-up (its store unreachable, say) or is not serving within 20 s. The log is
    /// appended to `target/idem-reports/origin-<port>.log`.
    pub async fn try_spawn_at(
        port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<(std::process::Child, String), String> {
        let listen = format!("127.0.0.1:{port}");
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/idem-reports");
        let _ = std::fs::create_dir_all(&dir);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("origin-{port}.log")))
            .unwrap();
        let mut child = std::process::Command::new(Self::binary())
            .args(["--listen", &listen])
            .args(args)
            .envs(env.iter().copied())
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let base = format!("http://{listen}");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while client()
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_err()
        {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("origin process exited with {status} at start-up"));
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("origin process did not start within 20 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok((child, base))
    }
}

/// libfaketime's multi-threaded library, to run a process with its clock skewed
/// (`LD_PRELOAD` it with `FAKETIME`). `scripts/test` installs it.
pub fn faketime_lib() -> String {
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ] {
        let lib = format!("{dir}/faketime/libfaketimeMT.so.1");
        if std::path::Path::new(&lib).exists() {
            return lib;
        }
    }
    panic!("libfaketime is missing: apt-get install faketime (scripts/test installs it)")
}
