//! Origins under test: served by this process on a loopback port, or run as
//! `idem-origin` processes; the HTTP client and the demo's requests.

use clap::Parser;
use idem_origin::app::Origin;
use idem_origin::config::Config;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// An origin served on an ephemeral loopback port by this process.
pub struct TestOrigin {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it was built from.
    pub origin_store: Arc<dyn idem::Store>,
    server: JoinHandle<()>,
}

impl TestOrigin {
    /// Builds an origin from command-line style arguments and serves it.
    /// Unless `args` name one, the origin takes [`EDGE_SECRET`] as its edge's secret,
    /// as a deployment with an edge in front does.
    pub async fn start(args: &[&str]) -> TestOrigin {
        let mut argv = vec!["idem-origin"];
        argv.extend_from_slice(args);
        let secret_file = edge_secret_file();
        if !args.contains(&"--edge-secret-file") {
            argv.extend(["--edge-secret-file", &secret_file]);
        }
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

    /// Serves any router, on `idem-origin`'s own listener (its default limits, but
    /// a minute for a request's head: a test's client may leave a pooled connection
    /// idle longer than the default 10 s between two requests, and a POST sent as the
    /// server closes it would fail the test, not the code).
    pub async fn serve_router(router: axum::Router, store: Arc<dyn idem::Store>) -> TestOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = idem_origin::serve::Limits {
            header_read: Duration::from_secs(60),
            ..Config::try_parse_from(["idem-origin"]).unwrap().limits()
        };
        let server = tokio::spawn(idem_origin::serve::serve(
            listener,
            router,
            limits,
            std::future::pending(),
        ));
        TestOrigin {
            addr,
            origin_store: store,
            server,
        }
    }

    /// The demo API behind the layer on `store`, with its charges kept in memory — so a
    /// handler that ran without the store's protection is still counted.
    pub async fn demo_on(
        store: Arc<dyn idem::Store>,
    ) -> (TestOrigin, Arc<idem_origin::charges::MemoryLedger>) {
        let ledger = Arc::new(idem_origin::charges::MemoryLedger::default());
        let layer = idem::IdempotencyLayer::new(store.clone())
            .scope_rule(idem_core::contract::ScopeRule::by_authorization(
                idem_core::contract::Anonymous::Scoped,
            ))
            .require_key_on(["/v1/charges"])
            .edge_secret(EDGE_SECRET)
            .unwrap();
        let demo = idem_origin::charges::Demo::new(ledger.clone());
        let router = idem_origin::app::router(layer, store.clone(), demo);
        (Self::serve_router(router, store).await, ledger)
    }

    /// [`TestOrigin::demo_on`] with its keys scoped by `rule` — as an edge in front
    /// must scope them too, or it keeps none of the origin's answers.
    pub async fn demo_scoped(
        store: Arc<dyn idem::Store>,
        rule: idem_core::contract::ScopeRule,
    ) -> (TestOrigin, Arc<idem_origin::charges::MemoryLedger>) {
        let ledger = Arc::new(idem_origin::charges::MemoryLedger::default());
        let layer = idem::IdempotencyLayer::new(store.clone())
            .scope_rule(rule)
            .require_key_on(["/v1/charges"])
            .edge_secret(EDGE_SECRET)
            .unwrap();
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

/// A JSON `POST` to `url` with `Idempotency-Key: key`.
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: String,
) -> reqwest::Response {
    client
        .post(url)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{url} answers: {e}"))
}

/// POSTs a charge with `key` (already in header form, e.g. `"\"k1\""`).
pub async fn post_charge(
    client: &reqwest::Client,
    origin: &str,
    key: Option<&str>,
    body: &str,
) -> reqwest::Response {
    charge_request(client, origin, key, body)
        .send()
        .await
        .expect("origin answers")
}

fn charge_request(
    client: &reqwest::Client,
    origin: &str,
    key: Option<&str>,
    body: &str,
) -> reqwest::RequestBuilder {
    let req = client
        .post(format!("{origin}/v1/charges"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    match key {
        Some(key) => req.header("idempotency-key", key),
        None => req,
    }
}

/// The secret the tests' origins and edges share (`--edge-secret-file`, `EDGE_SECRET`).
pub const EDGE_SECRET: &str = "idem-tests-edge-secret-5d41402abc4b2a76";

/// A file holding [`EDGE_SECRET`], for `--edge-secret-file`.
pub fn edge_secret_file() -> String {
    // Once per test process (its tests run on threads side by side); written whole
    // under a name of this process's own, then renamed: another process never reads half.
    static FILE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/idem-reports");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("edge-secret");
        let tmp = dir.join(format!("edge-secret.{}", std::process::id()));
        std::fs::write(&tmp, format!("{EDGE_SECRET}\n")).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path.display().to_string()
    })
    .clone()
}

/// [`post_charge`] as the edge sends it, with its secret: the origin's answer then
/// says what it stored (`idem-disposition`).
pub async fn post_charge_as_edge(
    client: &reqwest::Client,
    origin: &str,
    key: Option<&str>,
    body: &str,
) -> reqwest::Response {
    charge_request(client, origin, key, body)
        .header(idem_core::contract::EDGE_SECRET, EDGE_SECRET)
        .send()
        .await
        .expect("origin answers")
}

/// An `idem-origin` process (the binary cargo built next to the test executables).
pub struct OriginProcess;

impl OriginProcess {
    /// The binary's path: `target/<profile>/idem-origin`, or `IDEM_TEST_ORIGIN_BINARY`
    /// (an older build, to see a test fail on the code before its fix).
    pub fn binary() -> std::path::PathBuf {
        if let Some(bin) = std::env::var_os("IDEM_TEST_ORIGIN_BINARY") {
            return bin.into();
        }
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

/// How many seconds the clock of the HTTP server at `base` (`http://host:port`) runs
/// ahead of this process' (negative: behind), read from its `Date` header — the
/// evidence that a skew injected with libfaketime took (a preload that fails does so
/// silently, and the process runs on the true clock).
pub async fn clock_ahead_secs(base: &str) -> i64 {
    let res = client()
        .get(format!("{base}/healthz"))
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{base} answers for its clock: {e}"));
    let date = res
        .headers()
        .get(http::header::DATE)
        .and_then(|d| d.to_str().ok())
        .unwrap_or_else(|| panic!("{base} sends no Date header"));
    let theirs = httpdate::parse_http_date(date).unwrap_or_else(|e| panic!("Date {date:?}: {e}"));
    let ours = std::time::SystemTime::now();
    match theirs.duration_since(ours) {
        Ok(ahead) => ahead.as_secs_f64().round() as i64,
        Err(behind) => -(behind.duration().as_secs_f64().round() as i64),
    }
}

/// Fails unless the server at `base` runs `secs` ahead of this process, within 2 s
/// (the `Date` header's whole seconds and the request's own time).
pub async fn assert_clock_ahead(base: &str, secs: i64) {
    let ahead = clock_ahead_secs(base).await;
    assert!(
        (ahead - secs).abs() <= 2,
        "{base} runs {ahead} s ahead, not {secs} s: the clock skew did not take (libfaketime not loaded?)"
    );
}

/// One HTTP/1.1 request written byte for byte to `addr` — its target exactly as given,
/// which an HTTP client would normalise (`url` resolves `..` and reads `\` as `/`) —
/// and its status and body. `Connection: close`; bounded by 10 s.
pub async fn raw_request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut request = format!(
            "{method} {target} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        conn.write_all(request.as_bytes()).await.unwrap();
        conn.write_all(body).await.unwrap();
        let mut answer = Vec::new();
        let _ = conn.read_to_end(&mut answer).await;
        answer
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("an answer within 10 s");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}
