//! Proxy mode's cost: a plain charges API measured alone, then through
//! `idem-origin --upstream` on a store, in the same run, by the same load generator.
//!
//! The upstream is this binary under another name (`bench-upstream`, a hard link),
//! so that its CPU is told apart from the load generator's and the origin's. It
//! answers `POST /v1/charges` with `201` and counts the requests it got, which the
//! bench reads (`GET /calls`) to show that replays never reach it.

use crate::load::{self, Keys, Target};
use crate::mode::{Mode, Targets};
use crate::origin::OriginProcess;
use crate::served::{self, Served};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The environment variable that makes this binary the upstream, listening there.
pub const SERVE_ENV: &str = "IDEM_BENCH_SERVE_UPSTREAM";
/// The upstream's program name.
pub const PROGRAM: &str = "bench-upstream";

/// One measured phase: the upstream alone, or through idem on a store.
#[derive(Clone, Debug, Serialize)]
pub struct ProxyRow {
    /// The API behind idem: `builtin` or `python`.
    pub upstream: &'static str,
    /// `upstream alone`, or the store idem ran on.
    pub path: String,
    /// `unique` or `replay`.
    pub phase: &'static str,
    pub concurrency: usize,
    /// The round of the comparison with idempotent-proxy (0 elsewhere).
    pub round: usize,
    pub requests_per_s: f64,
    /// requests/s ÷ the upstream alone's, new keys, at the same concurrency.
    pub ratio: Option<f64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// CPU of idem-origin per request, µs.
    pub idem_cpu_us: f64,
    /// CPU of the upstream per request, µs.
    pub upstream_cpu_us: f64,
    /// Requests the upstream got per request answered.
    pub upstream_calls: f64,
    pub unexpected: u64,
}

/// Serves the plain charges API on `addr` until killed (the upstream's process).
pub async fn serve(addr: &str) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let calls = Arc::new(AtomicU64::new(0));
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let calls = calls.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| answer(req, calls.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(
    req: Request<Incoming>,
    calls: Arc<AtomicU64>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let (parts, body) = req.into_parts();
    body.collect().await?;
    let ok = |status: StatusCode, body: String| {
        let mut res = Response::new(Full::new(Bytes::from(body)));
        *res.status_mut() = status;
        res
    };
    Ok(match (parts.method.as_str(), parts.uri.path()) {
        ("GET", "/healthz") => ok(StatusCode::OK, "ok\n".into()),
        ("GET", "/calls") => ok(StatusCode::OK, calls.load(Ordering::SeqCst).to_string()),
        ("POST", "/v1/charges") => {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            let mut res = ok(
                StatusCode::CREATED,
                format!(r#"{{"id":"ch_{n}","amount":1999,"currency":"usd"}}"#),
            );
            let headers = res.headers_mut();
            headers.insert("content-type", "application/json".parse().unwrap());
            headers.insert("location", format!("/v1/charges/ch_{n}").parse().unwrap());
            res
        }
        _ => ok(StatusCode::NOT_FOUND, "not found\n".into()),
    })
}

/// Which API the proxy comparison puts behind idem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UpstreamKind {
    /// `bench-upstream`: parses and answers, nothing else — idem's cost laid bare.
    Builtin,
    /// The tests' Python payments API (`tests/upstream/payments.py`: stdlib HTTP
    /// server, a SQLite row per charge) — an API that does some work.
    Python,
}

impl UpstreamKind {
    fn label(self) -> &'static str {
        match self {
            UpstreamKind::Builtin => "builtin",
            UpstreamKind::Python => "python",
        }
    }

    /// Its program name, for its CPU.
    fn program(self) -> &'static str {
        match self {
            UpstreamKind::Builtin => PROGRAM,
            UpstreamKind::Python => "python3",
        }
    }
}

/// The upstream's process; killed on drop.
struct UpstreamProcess {
    /// Killed with this.
    _served: Served,
    addr: SocketAddr,
    kind: UpstreamKind,
}

impl UpstreamProcess {
    async fn start(kind: UpstreamKind, out: &Path, payments_py: &Path) -> Result<Self> {
        let addr = served::free_addr()?;
        let cmd = match kind {
            UpstreamKind::Builtin => {
                let mut cmd = served::as_program(out, PROGRAM)?;
                cmd.env(SERVE_ENV, addr.to_string());
                cmd
            }
            UpstreamKind::Python => {
                let db = out.join("payments.sqlite");
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
                }
                let mut cmd = Command::new("python3");
                cmd.arg(payments_py)
                    .arg("--port")
                    .arg(addr.port().to_string())
                    .arg("--db")
                    .arg(db);
                cmd
            }
        };
        let served = Served::start(cmd, addr, &format!("the {} upstream", kind.label())).await?;
        Ok(UpstreamProcess {
            _served: served,
            addr,
            kind,
        })
    }

    async fn calls(&self) -> Result<u64> {
        let stream = tokio::net::TcpStream::connect(self.addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let req = Request::get("/calls")
            .header("host", "bench")
            .body(Full::new(Bytes::new()))?;
        let body = sender
            .send_request(req)
            .await?
            .into_body()
            .collect()
            .await?;
        Ok(String::from_utf8_lossy(&body.to_bytes()).trim().parse()?)
    }
}

/// What the proxy comparison needs from the bench's arguments.
pub struct Settings<'a> {
    pub bin: &'a Path,
    pub upstreams: &'a [UpstreamKind],
    pub payments_py: &'a Path,
    pub targets: &'a Targets,
    pub modes: &'a [Mode],
    pub concurrency: &'a [usize],
    pub warmup: Duration,
    pub duration: Duration,
    pub replay_keys: usize,
    pub out: &'a Path,
    pub nonce: u128,
    /// idempotent-proxy's server (1.2.2), to compare proxy mode with in the same run,
    /// in front of the builtin upstream, both on the standalone Redis.
    pub idempotent_proxy: Option<&'a Path>,
    /// nginx, to run idempotent-proxy behind as its users front it.
    pub nginx: Option<&'a Path>,
    /// Beside idempotent-proxy, the ceiling of proxy mode's new keys (`floor.rs`).
    pub floors: bool,
    /// Rounds of the comparison with idempotent-proxy (`--repeat`): a ratio is paired
    /// within a round, and the median round's is shown with the range.
    pub rounds: usize,
}

/// Each upstream alone, then through idem on each store, at each concurrency.
pub async fn run(s: &Settings<'_>) -> Result<Vec<ProxyRow>> {
    let mut rows = Vec::new();
    for &kind in s.upstreams {
        rows.extend(run_one(s, kind).await?);
    }
    Ok(rows)
}

async fn run_one(s: &Settings<'_>, kind: UpstreamKind) -> Result<Vec<ProxyRow>> {
    let upstream = UpstreamProcess::start(kind, s.out, s.payments_py).await?;
    let url = format!("http://{}", upstream.addr);
    let mut rows = Vec::new();
    let mut alone = Vec::new();
    for &c in s.concurrency {
        let keys = Keys::Unique {
            prefix: format!("pa{}-{}-{c}", s.nonce, kind.label()),
        };
        let row = measure(
            s,
            &upstream,
            &Server::idem(upstream.addr),
            "upstream alone",
            "unique",
            c,
            keys,
            None,
        )
        .await?;
        alone.push((c, row.requests_per_s));
        rows.push(row);
    }
    for &mode in s.modes {
        let mut args = mode.origin_args(s.targets);
        args.extend(
            [
                "--upstream",
                &url,
                "--anonymous",
                "scoped",
                "--require-key-on",
                "/v1/*",
            ]
            .map(String::from),
        );
        let log = s
            .out
            .join(format!("origin-proxy-{}-{}.log", kind.label(), mode.name()));
        let origin = OriginProcess::start(s.bin, &args, log).await?;
        for &c in s.concurrency {
            let base = alone.iter().find(|(ac, _)| *ac == c).map(|(_, rps)| *rps);
            let prefix = format!("p{}-{}-{}-{c}", s.nonce, kind.label(), mode.name());
            let unique = Keys::Unique {
                prefix: format!("u{prefix}"),
            };
            rows.push(
                measure(
                    s,
                    &upstream,
                    &Server::idem(origin.addr),
                    mode.name(),
                    "unique",
                    c,
                    unique,
                    base,
                )
                .await?,
            );
            let seed = Keys::Seed {
                prefix: format!("r{prefix}"),
                count: s.replay_keys,
            };
            let seeded = load::seed(origin.addr, c, seed).await?;
            if seeded.unexpected > 0 {
                bail!(
                    "proxy {}: seeding the replay keys got {} unexpected answers, e.g. {}",
                    mode.name(),
                    seeded.unexpected,
                    seeded.unexpected_sample.unwrap_or_default()
                );
            }
            let replay = Keys::Replay {
                prefix: format!("r{prefix}"),
                count: s.replay_keys,
            };
            rows.push(
                measure(
                    s,
                    &upstream,
                    &Server::idem(origin.addr),
                    mode.name(),
                    "replay",
                    c,
                    replay,
                    base,
                )
                .await?,
            );
        }
    }
    if let (UpstreamKind::Builtin, Some(bin)) = (kind, s.idempotent_proxy) {
        rows.extend(against_idempotent_proxy(s, &upstream, bin, &alone).await?);
    }
    Ok(rows)
}

/// The program name idempotent-proxy's server runs under here, for its CPU.
pub const IPX_PROGRAM: &str = "bench-ipx";
/// The rows' labels.
pub const IPX_LABEL: &str = "idempotent-proxy";
const IPX_FRONTED_LABEL: &str = "nginx+idempotent-proxy";
const IDEM_VS_IPX_LABEL: &str = "idem on redis";
/// The ceiling of proxy mode's new keys: idem's store calls around the upstream's.
const FLOOR_LABEL: &str = "ceiling: store calls+upstream";

/// idempotent-proxy's server, run as its README says: environment variables, an
/// `.env` in its working directory, the upstream as `URL_CHARGES` (it forwards
/// `/URL_CHARGES` there, and nothing else), its Redis the same standalone Redis idem
/// uses; its cache lives as long as its request timeout, so 60 s (longer than a
/// phase). Killed on drop.
struct IpxProcess {
    child: Child,
    addr: SocketAddr,
}

impl IpxProcess {
    async fn start(bin: &Path, out: &Path, redis_url: &str, upstream: SocketAddr) -> Result<Self> {
        // Absolute: the child runs in `dir`, where a relative program path would be
        // looked up again (the default `--out` is relative).
        let dir = std::path::absolute(out.join("idempotent-proxy"))?;
        std::fs::create_dir_all(&dir)?;
        // It panics without a .env file; everything is given in its environment.
        std::fs::write(dir.join(".env"), "")?;
        let program = dir.join(IPX_PROGRAM);
        let _ = std::fs::remove_file(&program);
        std::fs::copy(bin, &program)
            .with_context(|| format!("copying {} to {}", bin.display(), program.display()))?;
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let log = std::fs::File::create(out.join("idempotent-proxy.log"))?;
        let child = Command::new(&program)
            .current_dir(&dir)
            .env("SERVER_ADDR", addr.to_string())
            .env("REDIS_URL", redis_url)
            .env("URL_CHARGES", format!("http://{upstream}/v1/charges"))
            .env("REQUEST_TIMEOUT", "60000")
            .env("LOG_LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let ipx = IpxProcess { child, addr };
        wait_listening(addr, "idempotent-proxy", "idempotent-proxy.log").await?;
        Ok(ipx)
    }
}

impl Drop for IpxProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits up to 10 s for a peer process to accept connections on `addr`.
async fn wait_listening(addr: SocketAddr, what: &str, logs: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if std::time::Instant::now() > deadline {
            bail!("{what} did not listen on {addr} within 10 s (its logs: {logs})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The program name nginx's processes run under, for their CPU.
pub const NGINX_PROGRAM: &str = "nginx";

/// nginx in front of idempotent-proxy, as its users deploy it in front of an API:
/// idempotent-proxy guards every request it is given and forwards only to the URLs
/// it is configured with (`/URL_CHARGES`), so a front sends it the guarded requests
/// and everything else to the API. Configured as a careful operator would: kept-alive
/// HTTP/1.1 connections to both, no access log, a worker per core. Stopped on drop.
struct NginxFront {
    child: Child,
    addr: SocketAddr,
}

impl NginxFront {
    async fn start(nginx: &Path, out: &Path, ipx: SocketAddr, api: SocketAddr) -> Result<Self> {
        let dir = out.join("nginx");
        std::fs::create_dir_all(&dir)?;
        let dir = dir.canonicalize()?;
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let conf = format!(
            r#"worker_processes auto;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  # The load keeps its connections open for the whole run (nginx closes one after
  # 1 000 requests by default).
  keepalive_requests 100000000;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  upstream ipx {{ server {ipx}; keepalive 64; keepalive_requests 100000000; }}
  upstream api {{ server {api}; keepalive 64; keepalive_requests 100000000; }}
  proxy_http_version 1.1;
  proxy_set_header Connection "";
  server {{
    listen {addr} reuseport;
    location = /v1/charges {{
      if ($request_method = POST) {{
        rewrite ^ /URL_CHARGES break;
        proxy_pass http://ipx;
      }}
      proxy_pass http://api;
    }}
    location / {{ proxy_pass http://api; }}
  }}
}}
"#,
            dir = dir.display()
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf)?;
        let log = std::fs::File::create(out.join("nginx.log"))?;
        let child = Command::new(nginx)
            .arg("-p")
            .arg(&dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(&conf_path)
            .args(["-g", "daemon off; master_process on; user root;"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", nginx.display()))?;
        let front = NginxFront { child, addr };
        wait_listening(addr, "nginx", "nginx.log, nginx/error.log").await?;
        Ok(front)
    }
}

impl Drop for NginxFront {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers (a SIGKILL would leave them serving).
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

/// idem on the standalone Redis and idempotent-proxy on the same Redis, in front of
/// the same upstream, by the same load, their order alternated by concurrency: new
/// keys, then replays of keys each stored once.
async fn against_idempotent_proxy(
    s: &Settings<'_>,
    upstream: &UpstreamProcess,
    bin: &Path,
    alone: &[(usize, f64)],
) -> Result<Vec<ProxyRow>> {
    let url = format!("http://{}", upstream.addr);
    let mut args = Mode::Redis.origin_args(s.targets);
    args.extend(
        [
            "--upstream",
            &url,
            "--anonymous",
            "scoped",
            "--require-key-on",
            "/v1/*",
        ]
        .map(String::from),
    );
    let origin = OriginProcess::start(
        s.bin,
        &args,
        s.out.join("origin-proxy-vs-idempotent-proxy.log"),
    )
    .await?;
    let ipx = IpxProcess::start(bin, s.out, &s.targets.redis_url, upstream.addr).await?;
    let front = match s.nginx {
        Some(nginx) => Some(NginxFront::start(nginx, s.out, ipx.addr, upstream.addr).await?),
        None => None,
    };
    let floor = match s.floors {
        true => Some(
            crate::floor::start(
                s.out,
                crate::floor::Floor::Proxy,
                &s.targets.redis_url,
                &format!("{}-floor", s.targets.namespace),
                Some(upstream.addr),
            )
            .await?,
        ),
        false => None,
    };
    let mut servers = vec![
        (IDEM_VS_IPX_LABEL, Server::idem(origin.addr)),
        (
            IPX_LABEL,
            Server {
                addr: ipx.addr,
                programs: &[IPX_PROGRAM],
                target: Target {
                    path: "/URL_CHARGES".into(),
                    marks_replays: false,
                },
            },
        ),
    ];
    if let Some(front) = &front {
        // The client sends what it sends to idem: `POST /v1/charges`.
        servers.push((
            IPX_FRONTED_LABEL,
            Server {
                addr: front.addr,
                programs: &[IPX_PROGRAM, NGINX_PROGRAM],
                target: Target {
                    marks_replays: false,
                    ..Target::default()
                },
            },
        ));
    }
    if let Some(floor) = &floor {
        servers.push((
            FLOOR_LABEL,
            Server {
                addr: floor.addr,
                programs: &["floor-proxy"],
                target: Target::default(),
            },
        ));
    }
    let mut rows = Vec::new();
    let steps = (0..s.rounds).flat_map(|round| s.concurrency.iter().map(move |&c| (round, c)));
    for (step, (round, c)) in steps.enumerate() {
        let base = alone.iter().find(|(ac, _)| *ac == c).map(|(_, rps)| *rps);
        // Each server first in turn: none always meets the machine's same minute.
        let first = step % servers.len();
        let order = servers[first..].iter().chain(&servers[..first]);
        for (n, (label, server)) in order.enumerate() {
            let prefix = format!("x{}-{round}-{n}-{c}", s.nonce);
            let unique = Keys::Unique {
                prefix: format!("u{prefix}"),
            };
            let row = measure(s, upstream, server, label, "unique", c, unique, base).await?;
            rows.push(ProxyRow { round, ..row });
            let seed = Keys::Seed {
                prefix: format!("r{prefix}"),
                count: s.replay_keys,
            };
            let seeded = load::seed_to(server.addr, server.target.clone(), c, seed).await?;
            if seeded.unexpected > 0 {
                bail!(
                    "{label}: seeding the replay keys got {} unexpected answers, e.g. {}",
                    seeded.unexpected,
                    seeded.unexpected_sample.unwrap_or_default()
                );
            }
            let replay = Keys::Replay {
                prefix: format!("r{prefix}"),
                count: s.replay_keys,
            };
            let row = measure(s, upstream, server, label, "replay", c, replay, base).await?;
            rows.push(ProxyRow { round, ..row });
        }
    }
    Ok(rows)
}

/// idem ÷ idempotent-proxy in req/s, from the rows of [`against_idempotent_proxy`]:
/// against idempotent-proxy behind nginx (how it is deployed in front of an API, and
/// what the targets are measured on) when it ran, and against it alone. Each ratio is
/// of one round (the two measured minutes apart at most); the median round's is shown,
/// with the range and every round's.
pub fn ipx_ratios(rows: &[ProxyRow]) -> Option<String> {
    let of = |path: &str, phase: &str, c: usize, round: usize| {
        rows.iter()
            .find(|r| r.path == path && r.phase == phase && r.concurrency == c && r.round == round)
    };
    let mut out = String::new();
    for (ours, peer) in [
        (IDEM_VS_IPX_LABEL, IPX_FRONTED_LABEL),
        (IDEM_VS_IPX_LABEL, IPX_LABEL),
        (FLOOR_LABEL, IPX_FRONTED_LABEL),
    ] {
        let name = match ours {
            IDEM_VS_IPX_LABEL => "idem",
            _ => "ceiling",
        };
        let mut keys: Vec<(&str, usize)> = rows
            .iter()
            .filter(|r| r.path == peer)
            .map(|r| (r.phase, r.concurrency))
            .collect();
        keys.sort_by_key(|&(phase, c)| (phase != "unique", c));
        keys.dedup();
        for (phase, c) in keys {
            let mut paired: Vec<(f64, &ProxyRow, &ProxyRow)> = rows
                .iter()
                .filter(|r| r.path == peer && r.phase == phase && r.concurrency == c)
                .filter_map(|theirs| {
                    let ours = of(ours, phase, c, theirs.round)?;
                    let ratio = ours.requests_per_s / theirs.requests_per_s.max(1e-9);
                    Some((ratio, ours, theirs))
                })
                .collect();
            let rounds: Vec<String> = paired.iter().map(|(r, ..)| format!("{r:.2}")).collect();
            paired.sort_by(|a, b| a.0.total_cmp(&b.0));
            let Some(&(ratio, idem, theirs)) = paired.get(paired.len() / 2) else {
                continue;
            };
            let (low, high) = (paired[0].0, paired[paired.len() - 1].0);
            let _ = writeln!(
                out,
                "  {phase:<6} {c:>3} conns: {name} {:>8.0} req/s, {peer} {:>8.0} req/s: {ratio:.2}x, rounds {low:.2}–{high:.2} ({}) (upstream calls per request {:.2} and {:.2}; CPU per request {:.1} and {:.1} µs)",
                idem.requests_per_s,
                theirs.requests_per_s,
                rounds.join(" "),
                idem.upstream_calls,
                theirs.upstream_calls,
                idem.idem_cpu_us,
                theirs.idem_cpu_us,
            );
        }
    }
    (!out.is_empty()).then(|| {
        format!("proxy mode vs idempotent-proxy 1.2.2, same upstream, same Redis, same run, the median round of each (targets: 2x on new keys, 5x on replays, against it behind nginx):\n{out}")
    })
}

/// Who answers the load, and where.
struct Server<'a> {
    addr: SocketAddr,
    /// Its programs' names, for its CPU: every process a request passes through on
    /// its way to the upstream.
    programs: &'a [&'a str],
    target: Target,
}

impl Server<'_> {
    /// idem-origin (or the upstream itself) at `addr`, on `/v1/charges`.
    fn idem(addr: SocketAddr) -> Server<'static> {
        Server {
            addr,
            programs: &["idem-origin"],
            target: Target::default(),
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    s: &Settings<'_>,
    upstream: &UpstreamProcess,
    server: &Server<'_>,
    path: &str,
    phase: &'static str,
    concurrency: usize,
    keys: Keys,
    base: Option<f64>,
) -> Result<ProxyRow> {
    let sent = Arc::new(AtomicU64::new(0));
    let (warmup, duration) = (s.warmup, s.duration);
    let (addr, target) = (server.addr, server.target.clone());
    let load = {
        let sent = sent.clone();
        tokio::spawn(async move {
            load::drive_to(addr, target, concurrency, keys, warmup, duration, sent).await
        })
    };
    tokio::time::sleep(warmup).await;
    let (sent_before, calls_before, cpu_before) = (
        sent.load(Ordering::Relaxed),
        upstream.calls().await?,
        crate::cpu::snapshot(),
    );
    let result = load.await.context("the load task panicked")??;
    let cpu = cpu_before.until(&crate::cpu::snapshot());
    let (sent_after, calls_after) = (sent.load(Ordering::Relaxed), upstream.calls().await?);
    let answered = sent_after.saturating_sub(sent_before).max(1) as f64;
    let rps = result.requests_per_s();
    Ok(ProxyRow {
        upstream: upstream.kind.label(),
        path: path.to_owned(),
        phase,
        concurrency,
        round: 0,
        requests_per_s: rps,
        ratio: base.filter(|b| *b > 0.0).map(|b| rps / b),
        p50_ms: result.quantile_ms(0.5),
        p99_ms: result.quantile_ms(0.99),
        idem_cpu_us: server
            .programs
            .iter()
            .map(|p| cpu.seconds_of(p))
            .sum::<f64>()
            / answered
            * 1e6,
        upstream_cpu_us: cpu.seconds_of(upstream.kind.program()) / answered * 1e6,
        upstream_calls: calls_after.saturating_sub(calls_before) as f64 / answered,
        unexpected: result.unexpected,
    })
    .inspect(|_| {
        if let Some(sample) = &result.unexpected_sample {
            eprintln!("proxy {path} {phase}: unexpected answer: {sample}");
        }
    })
}

/// The table printed at the end of a run.
pub fn table(rows: &[ProxyRow]) -> String {
    let mut s = String::from(
        "proxy mode: a plain charges API alone vs through idem-origin --upstream (ratio = req/s ÷ the API alone's, new keys, same conns)\n",
    );
    let _ = writeln!(
        s,
        "{:<8} {:<22} {:<6} {:>5} {:>5} {:>9} {:>6} {:>7} {:>7} {:>12} {:>16} {:>15}",
        "upstream",
        "path",
        "phase",
        "conns",
        "round",
        "req/s",
        "ratio",
        "p50 ms",
        "p99 ms",
        "idem µs/req",
        "upstream µs/req",
        "upstream calls"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<8} {:<22} {:<6} {:>5} {:>5} {:>9.0} {:>6} {:>7.2} {:>7.2} {:>12.1} {:>16.1} {:>15.2}",
            r.upstream,
            r.path,
            r.phase,
            r.concurrency,
            r.round,
            r.requests_per_s,
            r.ratio.map_or_else(|| "-".into(), |v| format!("{v:.2}")),
            r.p50_ms,
            r.p99_ms,
            r.idem_cpu_us,
            r.upstream_cpu_us,
            r.upstream_calls,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(path: &str, round: usize, requests_per_s: f64) -> ProxyRow {
        ProxyRow {
            upstream: "builtin",
            path: path.to_owned(),
            phase: "unique",
            concurrency: 32,
            round,
            requests_per_s,
            ratio: None,
            p50_ms: 1.0,
            p99_ms: 2.0,
            idem_cpu_us: 50.0,
            upstream_cpu_us: 10.0,
            upstream_calls: 1.0,
            unexpected: 0,
        }
    }

    #[test]
    fn a_ratio_is_paired_within_its_round_and_the_median_round_shown() {
        // Round 1's peer is slow: paired across rounds, idem's fastest over the
        // peer's slowest would read 4x; within rounds the ratios are 2, 4 and 1.5.
        let rows = vec![
            row(IDEM_VS_IPX_LABEL, 0, 10_000.0),
            row(IPX_FRONTED_LABEL, 0, 5_000.0),
            row(IDEM_VS_IPX_LABEL, 1, 8_000.0),
            row(IPX_FRONTED_LABEL, 1, 2_000.0),
            row(IDEM_VS_IPX_LABEL, 2, 9_000.0),
            row(IPX_FRONTED_LABEL, 2, 6_000.0),
        ];
        let text = ipx_ratios(&rows).unwrap();
        let line = text
            .lines()
            .find(|l| l.contains("idem") && l.contains(IPX_FRONTED_LABEL))
            .unwrap();
        assert!(line.contains("10000 req/s"), "{line}");
        assert!(
            line.contains(": 2.00x, rounds 1.50–4.00 (2.00 4.00 1.50)"),
            "{line}"
        );
        // Nothing to pair with: no line.
        assert!(!text.contains("ceiling"), "{text}");
    }
}
