//! The HTTP load: `concurrency` keep-alive connections, each sending its next request
//! as soon as the last is answered (closed loop), for a fixed time.

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{header, Request, StatusCode};
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// Which idempotency key each request carries.
#[derive(Clone, Debug)]
pub enum Keys {
    /// A new key every request: the claim path.
    Unique { prefix: String },
    /// `count` keys, each sent once and expected to run (seeds the replay phase).
    Seed { prefix: String, count: usize },
    /// The seeded keys again, over and over: the replay path.
    Replay { prefix: String, count: usize },
    /// Keys `<prefix>-0` … `<prefix>-<count-1>`, stored in bulk beforehand, replayed in
    /// a scattered order: every lookup lands somewhere else in the store's index.
    Preloaded { prefix: String, count: u64 },
}

impl Keys {
    fn key(&self, worker: usize, seq: usize, concurrency: usize) -> Option<String> {
        match self {
            Keys::Unique { prefix } => Some(format!("{prefix}-{worker}-{seq}")),
            Keys::Seed { prefix, count } => {
                let i = worker + seq * concurrency;
                (i < *count).then(|| format!("{prefix}-{i}"))
            }
            Keys::Replay { prefix, count } => {
                Some(format!("{prefix}-{}", (worker + seq * concurrency) % count))
            }
            Keys::Preloaded { prefix, count } => {
                let n = (worker + seq * concurrency) as u64;
                Some(format!("{prefix}-{}", scatter(n) % count))
            }
        }
    }

    fn expects_replay(&self) -> bool {
        matches!(self, Keys::Replay { .. } | Keys::Preloaded { .. })
    }
}

/// splitmix64's finaliser: a bijection on u64 that spreads consecutive numbers apart.
fn scatter(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The request body for `key`: the same bytes every time a key is sent.
pub fn body(key: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"amount":1999,"currency":"usd","customer":"cus_{key}"}}"#
    ))
}

/// What one load phase measured.
pub struct LoadResult {
    /// Requests answered as expected inside the measured window.
    pub ok: u64,
    /// Requests answered otherwise inside it (wrong status, missing replay header).
    pub unexpected: u64,
    /// One of those answers, to show.
    pub unexpected_sample: Option<String>,
    /// Length of the measured window.
    pub window: Duration,
    /// Latency of the measured requests, in microseconds.
    pub latency_us: Histogram<u64>,
}

impl LoadResult {
    pub fn requests_per_s(&self) -> f64 {
        (self.ok + self.unexpected) as f64 / self.window.as_secs_f64()
    }
    pub fn quantile_ms(&self, q: f64) -> f64 {
        self.latency_us.value_at_quantile(q) as f64 / 1000.0
    }
}

/// Sends each key of a `Keys::Seed` once, unmeasured: what the replay phases replay.
pub async fn seed(addr: SocketAddr, concurrency: usize, keys: Keys) -> Result<LoadResult> {
    seed_to(addr, Target::default(), concurrency, keys).await
}

/// [`seed`] at `target`.
pub async fn seed_to(
    addr: SocketAddr,
    target: Target,
    concurrency: usize,
    keys: Keys,
) -> Result<LoadResult> {
    let none = Duration::ZERO;
    drive_to(
        addr,
        target,
        concurrency,
        keys,
        none,
        none,
        Arc::new(AtomicU64::new(0)),
    )
    .await
}

/// Where the load goes, and what a right answer looks like there.
#[derive(Clone, Debug)]
pub struct Target {
    /// The path every request is sent to.
    pub path: String,
    /// Whether the server marks a replay (`Idempotent-Replayed: true`) — idem and the
    /// `idempotent` crate's app do; idempotent-proxy does not, and its replays are told
    /// by the upstream's count of calls instead.
    pub marks_replays: bool,
}

impl Default for Target {
    fn default() -> Self {
        Target {
            path: "/v1/charges".into(),
            marks_replays: true,
        }
    }
}

/// Runs one phase: `warmup` unmeasured, then `measure`; a `Seed` phase instead runs
/// until its keys are used up. `sent` counts every answered request, for progress.
pub async fn drive(
    addr: SocketAddr,
    concurrency: usize,
    keys: Keys,
    warmup: Duration,
    measure: Duration,
    sent: Arc<AtomicU64>,
) -> Result<LoadResult> {
    drive_to(
        addr,
        Target::default(),
        concurrency,
        keys,
        warmup,
        measure,
        sent,
    )
    .await
}

/// [`drive`] to `target`.
pub async fn drive_to(
    addr: SocketAddr,
    target: Target,
    concurrency: usize,
    keys: Keys,
    warmup: Duration,
    measure: Duration,
    sent: Arc<AtomicU64>,
) -> Result<LoadResult> {
    let target = Arc::new(target);
    let start = Instant::now();
    let measure_from = start + warmup;
    let stop_at = measure_from + measure;
    let keys = Arc::new(keys);
    let mut tasks = Vec::with_capacity(concurrency);
    for worker in 0..concurrency {
        let keys = keys.clone();
        let sent = sent.clone();
        let target = target.clone();
        tasks.push(tokio::spawn(async move {
            connection(
                addr,
                &target,
                worker,
                concurrency,
                &keys,
                measure_from,
                stop_at,
                &sent,
            )
            .await
        }));
    }
    let mut total = Tally::new()?;
    for t in tasks {
        let tally = t.await.context("a load task panicked")??;
        total.merge(tally)?;
    }
    let window = if matches!(*keys, Keys::Seed { .. }) {
        start.elapsed()
    } else {
        stop_at.saturating_duration_since(measure_from)
    };
    Ok(LoadResult {
        ok: total.ok,
        unexpected: total.unexpected,
        unexpected_sample: total.sample,
        window,
        latency_us: total.latency_us,
    })
}

struct Tally {
    ok: u64,
    unexpected: u64,
    sample: Option<String>,
    latency_us: Histogram<u64>,
}

impl Tally {
    fn new() -> Result<Self> {
        Ok(Tally {
            ok: 0,
            unexpected: 0,
            sample: None,
            // 1 µs to 60 s at 3 significant digits.
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3)?,
        })
    }
    fn merge(&mut self, other: Tally) -> Result<()> {
        self.ok += other.ok;
        self.unexpected += other.unexpected;
        self.sample = self.sample.take().or(other.sample);
        self.latency_us.add(&other.latency_us)?;
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
async fn connection(
    addr: SocketAddr,
    target: &Target,
    worker: usize,
    concurrency: usize,
    keys: &Keys,
    measure_from: Instant,
    stop_at: Instant,
    sent: &AtomicU64,
) -> Result<Tally> {
    let mut conn = RawConnection::open(addr)
        .await
        .with_context(|| format!("connecting to the origin at {addr}"))?;
    let mut tally = Tally::new()?;
    let seeding = matches!(keys, Keys::Seed { .. });
    let mut request = Vec::with_capacity(512);
    for seq in 0.. {
        if !seeding && Instant::now() >= stop_at {
            break;
        }
        let Some(key) = keys.key(worker, seq, concurrency) else {
            break;
        };
        render_request(&mut request, &target.path, &key);
        let t0 = Instant::now();
        let answer = conn
            .exchange(&request)
            .await
            .with_context(|| format!("key {key}: the origin did not answer"))?;
        let elapsed = t0.elapsed();
        sent.fetch_add(1, Ordering::Relaxed);
        if !seeding && t0 < measure_from {
            continue;
        }
        let latency = (elapsed.as_micros() as u64).clamp(1, 60_000_000);
        tally.latency_us.record(latency)?;
        let marked_right = !target.marks_replays || answer.replayed == keys.expects_replay();
        if answer.status == StatusCode::CREATED.as_u16() && marked_right {
            tally.ok += 1;
        } else {
            tally.unexpected += 1;
            if tally.sample.is_none() {
                let body = conn.body(&answer);
                tally.sample = Some(format!(
                    "key {key}: {}, replayed={}: {}",
                    answer.status,
                    answer.replayed,
                    String::from_utf8_lossy(&body[..body.len().min(300)])
                ));
            }
        }
    }
    Ok(tally)
}

/// `POST <path>` for `key`, with `body(key)`, into `out`.
fn render_request(out: &mut Vec<u8>, path: &str, key: &str) {
    use std::io::Write as _;
    let body = body(key);
    out.clear();
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        "POST {path} HTTP/1.1\r\nhost: idem-bench\r\ncontent-type: application/json\r\n\
         idempotency-key: \"{key}\"\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    out.extend_from_slice(&body);
}

/// The load generator's side of one keep-alive HTTP/1.1 connection, as lean as `wrk`'s:
/// one task writes a request and reads its answer on the socket itself. A hyper client
/// connection drives the socket from a second task, a wake-up each way per request; on
/// this 2-core machine the load generator's CPU is CPU the server under test does not
/// get, and that cost the bench's ratios.
struct RawConnection {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// What the load checks of an answer; its body is `buf[body]` until the next exchange.
struct RawAnswer {
    status: u16,
    replayed: bool,
    body: std::ops::Range<usize>,
}

impl RawConnection {
    async fn open(addr: SocketAddr) -> Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(RawConnection {
            stream,
            buf: Vec::with_capacity(16 * 1024),
        })
    }

    fn body(&self, answer: &RawAnswer) -> &[u8] {
        &self.buf[answer.body.clone()]
    }

    /// Sends `request` and reads one answer (Content-Length or chunked body).
    async fn exchange(&mut self, request: &[u8]) -> Result<RawAnswer> {
        use tokio::io::AsyncWriteExt as _;
        self.stream.write_all(request).await?;
        self.buf.clear();
        let (status, replayed, head_len, framing) = loop {
            self.fill().await?;
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut response = httparse::Response::new(&mut headers);
            let httparse::Status::Complete(head_len) = response.parse(&self.buf)? else {
                continue;
            };
            let status = response.code.unwrap_or(0);
            let mut replayed = false;
            let mut framing = Framing::Length(0);
            for h in response.headers.iter() {
                if h.name.eq_ignore_ascii_case("idempotent-replayed") {
                    replayed = h.value == b"true";
                } else if h.name.eq_ignore_ascii_case("content-length") {
                    let len = std::str::from_utf8(h.value)
                        .ok()
                        .and_then(|v| v.trim().parse().ok())
                        .ok_or_else(|| anyhow!("a bad Content-Length: {:?}", h.value))?;
                    framing = Framing::Length(len);
                } else if h.name.eq_ignore_ascii_case("transfer-encoding")
                    && h.value.eq_ignore_ascii_case(b"chunked")
                {
                    framing = Framing::Chunked;
                }
            }
            break (status, replayed, head_len, framing);
        };
        let body = match framing {
            Framing::Length(len) => {
                while self.buf.len() < head_len + len {
                    self.fill().await?;
                }
                head_len..head_len + len
            }
            Framing::Chunked => {
                // The bench only shows an unexpected body, so the chunks stay as sent.
                while !self.buf[head_len..].ends_with(b"0\r\n\r\n") {
                    self.fill().await?;
                }
                head_len..self.buf.len()
            }
        };
        if self.buf.len() > body.end {
            return Err(anyhow!(
                "{} bytes after the answer, which no request asked for",
                self.buf.len() - body.end
            ));
        }
        Ok(RawAnswer {
            status,
            replayed,
            body,
        })
    }

    /// Reads what the socket has into `buf`; the peer closing is an error.
    async fn fill(&mut self) -> Result<()> {
        use tokio::io::AsyncReadExt as _;
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(16 * 1024);
        }
        if self.stream.read_buf(&mut self.buf).await? == 0 {
            return Err(anyhow!("the origin closed the connection"));
        }
        Ok(())
    }
}

enum Framing {
    Length(usize),
    Chunked,
}

/// An HTTP/1.1 connection to `addr`, its driver spawned.
pub(crate) async fn open(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// Waits until `GET /healthz` answers 200, or `timeout` passes.
pub async fn wait_healthy(addr: SocketAddr, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if healthz(addr).await.unwrap_or(false) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(anyhow!(
                "the origin at {addr} is not healthy after {timeout:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn healthz(addr: SocketAddr) -> Result<bool> {
    let mut sender = open(addr).await?;
    let request = Request::get("/healthz")
        .header(header::HOST, "idem-bench")
        .body(Full::new(Bytes::new()))?;
    Ok(sender.send_request(request).await?.status() == StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_covers_every_key_once_and_replay_cycles_through_them() {
        let seed = Keys::Seed {
            prefix: "r".into(),
            count: 10,
        };
        let seed = &seed;
        let mut seen: Vec<String> = (0..3)
            .flat_map(|w| (0..).map_while(move |s| seed_key(seed, w, s)))
            .collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 10);
        let replay = Keys::Replay {
            prefix: "r".into(),
            count: 10,
        };
        assert_eq!(replay.key(2, 4, 3).as_deref(), Some("r-4"));
        assert!(seen.contains(&replay.key(1, 1000, 3).unwrap()));
        assert_eq!(body("k"), body("k"));
        let preloaded = Keys::Preloaded {
            prefix: "p".into(),
            count: 1_000_000,
        };
        let picked: std::collections::HashSet<_> =
            (0..1000).filter_map(|s| preloaded.key(0, s, 1)).collect();
        assert!(
            picked.len() > 990,
            "scattered keys repeat: {}",
            picked.len()
        );
        assert!(picked
            .iter()
            .all(|k| k[2..].parse::<u64>().unwrap() < 1_000_000));
        assert_ne!(body("k"), body("l"));
    }

    /// The raw client against canned answers, each written in pieces: the request it
    /// sent, both framings, and an answer followed by bytes nobody asked for.
    #[tokio::test]
    async fn the_raw_client_reads_each_framing_and_refuses_stray_bytes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let answers: [&[&[u8]]; 3] = [
                &[
                    b"HTTP/1.1 201 Created\r\nidempotent-replayed: true\r\ncon",
                    b"tent-length: 5\r\n\r\nhel",
                    b"lo",
                ],
                &[
                    b"HTTP/1.1 409 Conflict\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",
                    b"0\r\n\r\n",
                ],
                &[b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nokEXTRA"],
            ];
            let mut requests = Vec::new();
            for pieces in answers {
                let mut buf = vec![0u8; 4096];
                let n = socket.read(&mut buf).await.unwrap();
                requests.push(String::from_utf8(buf[..n].to_vec()).unwrap());
                for piece in pieces {
                    socket.write_all(piece).await.unwrap();
                    socket.flush().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            requests
        });
        let mut conn = RawConnection::open(addr).await.unwrap();
        let mut request = Vec::new();
        render_request(&mut request, "/v1/charges", "k-1");
        let first = within(conn.exchange(&request)).await.unwrap();
        assert_eq!((first.status, first.replayed), (201, true));
        assert_eq!(conn.body(&first), b"hello");
        let second = within(conn.exchange(&request)).await.unwrap();
        assert_eq!((second.status, second.replayed), (409, false));
        assert_eq!(conn.body(&second), b"3\r\nabc\r\n0\r\n\r\n");
        let third = within(conn.exchange(&request)).await;
        assert!(
            third.is_err_and(|e| e.to_string().contains("5 bytes after the answer")),
            "stray bytes after an answer must fail the load"
        );
        let sent = server.await.unwrap();
        let body = body("k-1");
        let expected = format!(
            "POST /v1/charges HTTP/1.1\r\nhost: idem-bench\r\ncontent-type: application/json\r\n\
             idempotency-key: \"k-1\"\r\ncontent-length: {}\r\n\r\n{}",
            body.len(),
            String::from_utf8_lossy(&body)
        );
        assert_eq!(sent, vec![expected.clone(), expected.clone(), expected]);
    }

    async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(5), f)
            .await
            .expect("the raw client waited more than 5 s for a complete answer")
    }

    fn seed_key(k: &Keys, w: usize, s: usize) -> Option<String> {
        k.key(w, s, 3)
    }
}
