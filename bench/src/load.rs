//! The HTTP load: `concurrency` keep-alive connections, each sending its next request
//! as soon as the last is answered (closed loop), for a fixed time.

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full};
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
    let none = Duration::ZERO;
    drive(
        addr,
        concurrency,
        keys,
        none,
        none,
        Arc::new(AtomicU64::new(0)),
    )
    .await
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
    let start = Instant::now();
    let measure_from = start + warmup;
    let stop_at = measure_from + measure;
    let keys = Arc::new(keys);
    let mut tasks = Vec::with_capacity(concurrency);
    for worker in 0..concurrency {
        let keys = keys.clone();
        let sent = sent.clone();
        tasks.push(tokio::spawn(async move {
            connection(
                addr,
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

async fn connection(
    addr: SocketAddr,
    worker: usize,
    concurrency: usize,
    keys: &Keys,
    measure_from: Instant,
    stop_at: Instant,
    sent: &AtomicU64,
) -> Result<Tally> {
    let mut sender = open(addr)
        .await
        .with_context(|| format!("connecting to the origin at {addr}"))?;
    let mut tally = Tally::new()?;
    let seeding = matches!(keys, Keys::Seed { .. });
    for seq in 0.. {
        if !seeding && Instant::now() >= stop_at {
            break;
        }
        let Some(key) = keys.key(worker, seq, concurrency) else {
            break;
        };
        let request = Request::post("/v1/charges")
            .header(header::HOST, "idem-bench")
            .header(header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", format!("\"{key}\""))
            .body(Full::new(body(&key)))?;
        sender
            .ready()
            .await
            .context("the origin closed the connection")?;
        let t0 = Instant::now();
        let response = sender
            .send_request(request)
            .await
            .context("the origin did not answer")?;
        let status = response.status();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        let body = response.into_body().collect().await?.to_bytes();
        let elapsed = t0.elapsed();
        sent.fetch_add(1, Ordering::Relaxed);
        if !seeding && t0 < measure_from {
            continue;
        }
        let latency = (elapsed.as_micros() as u64).clamp(1, 60_000_000);
        tally.latency_us.record(latency)?;
        if status == StatusCode::CREATED && replayed == keys.expects_replay() {
            tally.ok += 1;
        } else {
            tally.unexpected += 1;
            if tally.sample.is_none() {
                tally.sample = Some(format!(
                    "key {key}: {status}, replayed={replayed}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(300)])
                ));
            }
        }
    }
    Ok(tally)
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

    fn seed_key(k: &Keys, w: usize, s: usize) -> Option<String> {
        k.key(w, s, 3)
    }
}
