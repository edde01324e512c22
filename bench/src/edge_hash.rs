//! The edge's hash where the edge runs (`idem-bench --edge-hash`): the worker under
//! workerd (`wrangler dev`), its bench route (`edge/src/bench.rs`) fingerprinting a
//! posted body K times with SHA-256 in WASM or with WebCrypto over the same message.
//! workerd's clocks stand still while a request computes, so the time is taken here:
//! per fingerprint = (median time with K − median time with 0) ÷ K.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::{Fingerprint, RequestParts};
use serde::Serialize;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Body sizes asked for (a JSON body is the largest whole number of items below it).
const SIZES: [usize; 9] = [
    128,
    1024,
    2048,
    4096,
    8192,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
];

#[derive(Serialize, Clone)]
pub struct EdgeHashRow {
    pub kind: &'static str,
    pub bytes: usize,
    pub wasm_us: f64,
    pub webcrypto_us: f64,
}

impl EdgeHashRow {
    /// How many times faster WebCrypto is (below 1: slower).
    pub fn webcrypto_speedup(&self) -> f64 {
        self.wasm_us / self.webcrypto_us
    }
}

/// `wrangler dev` serving the built worker with its bench route on; killed on drop.
struct Workerd {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Workerd {
    /// wrangler leads a process group of its own, workerd in it: the whole group is
    /// ended, politely, then firmly.
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-s", "TERM", "--", &group])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && !matches!(self.child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &group])
            .status();
        // (And wrangler itself, should `kill` be missing.)
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn run(repo: &Path, out: &Path, rounds: usize) -> Result<Vec<EdgeHashRow>> {
    let workerd = start(repo, out).await?;
    let mut rows = Vec::new();
    for json in [true, false] {
        for size in SIZES {
            let body = Bytes::from(idem_bench_wasm::body(json, size));
            let content_type = if json {
                "application/json"
            } else {
                "application/octet-stream"
            };
            let expected = Fingerprint::of(&RequestParts {
                method: "POST",
                path_and_query: "/v1/charges",
                content_type: Some(content_type),
                body: &body,
            })
            .to_hex();
            // Fewer iterations for larger bodies: each timed request computes ~8 MiB.
            let iterations = ((8 << 20) / body.len()).clamp(4, 20_000);
            let mut per_op = [0.0; 2];
            for (i, implementation) in ["wasm", "webcrypto"].into_iter().enumerate() {
                let got = post(workerd.addr, implementation, 1, content_type, &body)
                    .await?
                    .1;
                if got != expected {
                    bail!(
                        "{implementation} fingerprinted {} bytes as {got}, natively {expected}",
                        body.len()
                    );
                }
                let (mut idle, mut busy) = (Vec::new(), Vec::new());
                for _ in 0..rounds {
                    idle.push(
                        post(workerd.addr, implementation, 0, content_type, &body)
                            .await?
                            .0,
                    );
                    busy.push(
                        post(
                            workerd.addr,
                            implementation,
                            iterations,
                            content_type,
                            &body,
                        )
                        .await?
                        .0,
                    );
                }
                let spent = median(&mut busy) - median(&mut idle);
                per_op[i] = (spent / iterations as f64).max(0.0) * 1e6;
            }
            rows.push(EdgeHashRow {
                kind: if json { "json" } else { "raw" },
                bytes: body.len(),
                wasm_us: per_op[0],
                webcrypto_us: per_op[1],
            });
        }
    }
    Ok(rows)
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// One bench request: its time in seconds and the fingerprint answered.
async fn post(
    addr: SocketAddr,
    implementation: &str,
    iterations: usize,
    content_type: &str,
    body: &Bytes,
) -> Result<(f64, String)> {
    let mut sender = crate::load::open(addr).await?;
    let request = Request::post(format!(
        "/__idem/bench/fingerprint?impl={implementation}&iters={iterations}"
    ))
    .header(header::HOST, "idem-bench")
    .header(header::CONTENT_TYPE, content_type)
    .body(Full::new(body.clone()))?;
    let started = Instant::now();
    let response = sender.send_request(request).await?;
    let status = response.status();
    let answer = response.into_body().collect().await?.to_bytes();
    let took = started.elapsed().as_secs_f64();
    if status != StatusCode::OK {
        bail!(
            "the worker's bench route answered {status}: {}",
            String::from_utf8_lossy(&answer)
        );
    }
    Ok((took, String::from_utf8_lossy(&answer).into_owned()))
}

/// The built worker (`edge/build`) under `wrangler dev`, with the repository's
/// wrangler.toml minus its build step and with `IDEM_BENCH = "fingerprint"`.
async fn start(repo: &Path, out: &Path) -> Result<Workerd> {
    let entry = repo.join("edge/build/index.js");
    let wrangler = repo.join("edge/node_modules/.bin/wrangler");
    for (path, how) in [
        (&entry, "build the worker: scripts/test does, or `edge/node_modules/.bin/wrangler deploy --dry-run`"),
        (&wrangler, "run scripts/edge-toolchain"),
    ] {
        if !path.exists() {
            bail!("{} is missing: {how}", path.display());
        }
    }
    let dir: PathBuf = std::path::absolute(out.join("edge-hash"))?;
    std::fs::create_dir_all(&dir)?;
    let toml =
        std::fs::read_to_string(repo.join("wrangler.toml")).context("reading wrangler.toml")?;
    let mut lines: Vec<String> = toml
        .lines()
        .filter(|l| !l.starts_with("[build]") && !l.starts_with("command ="))
        .map(|l| match l.starts_with("main =") {
            true => format!("main = {:?}", entry.display().to_string()),
            false => l.to_owned(),
        })
        .collect();
    let vars = lines
        .iter()
        .position(|l| l == "[vars]")
        .context("wrangler.toml has no [vars]")?;
    lines.insert(vars + 1, "IDEM_BENCH = \"fingerprint\"".into());
    let config = dir.join("wrangler.toml");
    std::fs::write(&config, lines.join("\n"))?;
    let port = free_port()?;
    let log = std::fs::File::create(out.join("wrangler-edge-hash.log"))?;
    let child = Command::new(&wrangler)
        .arg("dev")
        .arg("--config")
        .arg(&config)
        .args(["--ip", "127.0.0.1", "--port", &port.to_string()])
        .arg("--persist-to")
        .arg(dir.join("state"))
        .arg("--show-interactive-dev-session=false")
        .args(["--inspector-port", &free_port()?.to_string()])
        .env("WRANGLER_SEND_METRICS", "false")
        .env("WRANGLER_SEND_ERROR_REPORTS", "false")
        .env("CLOUDFLARE_CF_FETCH_ENABLED", "false")
        .env("CI", "true")
        .process_group(0)
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", wrangler.display()))?;
    let workerd = Workerd {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let probe = Bytes::from_static(b"{}");
    while post(workerd.addr, "wasm", 1, "application/json", &probe)
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            bail!(
                "wrangler dev did not serve the bench route within 90 s (see {})",
                out.join("wrangler-edge-hash.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(workerd)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub fn table(rows: &[EdgeHashRow]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "The edge's fingerprint under workerd (wrangler dev): SHA-256 in WASM vs WebCrypto over the same message, µs per fingerprint");
    let _ = writeln!(
        out,
        "{:<5} {:>9} {:>10} {:>14} {:>18}",
        "body", "bytes", "WASM µs", "WebCrypto µs", "WebCrypto speed-up"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<5} {:>9} {:>10.2} {:>14.2} {:>17.2}×",
            r.kind,
            r.bytes,
            r.wasm_us,
            r.webcrypto_us,
            r.webcrypto_speedup()
        );
    }
    out
}
