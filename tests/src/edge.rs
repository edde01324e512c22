//! The edge under real workerd (`wrangler dev`), for the end-to-end tests in
//! `tests/edge/`: started on a free port with fresh Durable Object state, its storage
//! read as workerd wrote it, requests sent and counted.

use crate::upstream::sqlite as try_sqlite;
use crate::{charge_body, client};
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;

pub const KEYS: usize = 100;

pub const RETRIES: usize = 8;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A test var's value with this prefix is written into wrangler.toml unquoted (a
/// number, as a user might write it), not as a string.
pub const UNQUOTED: &str = "unquoted:";

/// `wrangler dev` on a free port, with fresh Durable Object state, against `origin`.
pub struct Edge {
    child: Child,
    pub base: String,
    pub state: PathBuf,
}

impl Edge {
    pub async fn start(origin: &str, vars: &[(&str, &str)]) -> Edge {
        Self::launch(origin, vars, |status| status == 200).await
    }

    /// Starts it and waits until `/healthz` answers a status that `ready` accepts.
    pub async fn launch(origin: &str, vars: &[(&str, &str)], ready: fn(u16) -> bool) -> Edge {
        let state = std::env::temp_dir().join(format!(
            "idem-edge-state-{}-{}",
            std::process::id(),
            crate::procs::free_port()
        ));
        Self::launch_in(state, origin, vars, ready).await
    }

    /// The directory of the Durable Objects' SQLite files, one per object.
    pub fn objects_dir(&self) -> PathBuf {
        self.state.join("state/v3/do/idem-edge-IdemRecord")
    }

    /// Every stored record, as (object file, stored value's length, value as hex).
    pub fn stored_records(&self) -> Vec<(PathBuf, usize, String)> {
        let Ok(dir) = std::fs::read_dir(self.objects_dir()) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for file in dir.flatten().map(|e| e.path()) {
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            if !name.ends_with(".sqlite") || name == "metadata.sqlite" {
                continue;
            }
            // An object that never stored a value, or whose alarm just deleted
            // everything, has no key-value table.
            let row = match try_sqlite(
                &file,
                "SELECT length(value) || ' ' || hex(value) FROM _cf_KV WHERE key = 'record'",
            ) {
                Ok(row) => row,
                Err(e) if e.contains("no such table") => continue,
                Err(e) => panic!("{e}"),
            };
            if let Some((len, hex)) = row.trim().split_once(' ') {
                found.push((file, len.parse().unwrap(), hex.to_owned()));
            }
        }
        found
    }

    /// Starts it on `state` and waits until `/healthz` answers a status that `ready`
    /// accepts.
    pub async fn launch_in(
        state: PathBuf,
        origin: &str,
        vars: &[(&str, &str)],
        ready: fn(u16) -> bool,
    ) -> Edge {
        let edge = repo().join("edge");
        let entry = edge.join("build/index.js");
        let wrangler = edge.join("node_modules/.bin/wrangler");
        assert!(
            entry.exists(),
            "{} is missing: build the worker (scripts/test does)",
            entry.display()
        );
        assert!(
            wrangler.exists(),
            "{} is missing: run scripts/edge-toolchain",
            wrangler.display()
        );
        std::fs::create_dir_all(&state).unwrap();
        // The repository's wrangler.toml, minus its [build] step (the worker is built
        // already), with this test's vars.
        let config = state.join("wrangler.toml");
        let toml = std::fs::read_to_string(repo().join("wrangler.toml")).unwrap();
        // The test's vars first: the first override of a name wins.
        let overrides: Vec<(&str, &str)> = vars
            .iter()
            .copied()
            .chain([
                ("ORIGIN_URL", origin),
                ("LEASE_MS", "5000"),
                ("EDGE_SECRET", crate::EDGE_SECRET),
            ])
            .collect();
        let line = |name: &str, value: &str| match value.strip_prefix(UNQUOTED) {
            Some(raw) => format!("{name} = {raw}"),
            None => format!("{name} = {value:?}"),
        };
        let mut written = Vec::new();
        let mut lines: Vec<String> = toml
            .lines()
            .filter(|l| !l.starts_with("[build]") && !l.starts_with("command ="))
            .map(|l| {
                if l.starts_with("main =") {
                    return format!("main = {:?}", entry.display().to_string());
                }
                match overrides
                    .iter()
                    .find(|(name, _)| l.starts_with(&format!("{name} =")))
                {
                    Some((name, value)) => {
                        written.push(*name);
                        line(name, value)
                    }
                    None => l.to_owned(),
                }
            })
            .collect();
        // Vars wrangler.toml does not set (SCOPE_FROM, JWT_SECRET…) go under [vars].
        let vars_at = lines.iter().position(|l| l == "[vars]").unwrap() + 1;
        for (name, value) in &overrides {
            if !written.contains(name) {
                written.push(name);
                lines.insert(vars_at, line(name, value));
            }
        }
        let toml = lines.join("\n");
        std::fs::write(&config, toml).unwrap();
        let logs = repo().join("target/idem-reports");
        std::fs::create_dir_all(&logs).unwrap();
        // A free port can be taken by another test between its choice and workerd's
        // bind ("Address already in use"): then wrangler gives up, and it is launched
        // again on other ports.
        for attempt in 1..=3 {
            let port = crate::procs::free_port();
            let log_path = logs.join(format!("wrangler-{port}.log"));
            let log = std::fs::File::create(&log_path).unwrap();
            let child = Command::new(&wrangler)
                .args([
                    "dev",
                    "--config",
                    config.to_str().unwrap(),
                    "--ip",
                    "127.0.0.1",
                    "--port",
                    &port.to_string(),
                ])
                .args([
                    "--persist-to",
                    state.join("state").to_str().unwrap(),
                    "--show-interactive-dev-session=false",
                    // Each instance its own inspector port: two at once would both take 9229.
                    "--inspector-port",
                    &crate::procs::free_port().to_string(),
                ])
                .env("WRANGLER_SEND_METRICS", "false")
                .env("WRANGLER_SEND_ERROR_REPORTS", "false")
                .env("CLOUDFLARE_CF_FETCH_ENABLED", "false")
                .env("CI", "true")
                .process_group(0)
                .current_dir(&state)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("wrangler runs");
            let base = format!("http://127.0.0.1:{port}");
            // Dropped on every path but success: ends wrangler's process group.
            let mut edge = Edge {
                child,
                base,
                state: state.clone(),
            };
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let log_says = std::fs::read_to_string(&log_path).unwrap_or_default();
                let port_taken = log_says.contains("Address already in use");
                // The edge's answer, not another test's server that took the port
                // (an origin's 404 once stood for a misconfigured edge's 500, in a CI
                // run here): the worker marks every answer `idem-edge`.
                if !port_taken {
                    if let Ok(r) = client().get(format!("{}/healthz", edge.base)).send().await {
                        if r.headers().contains_key("idem-edge") && ready(r.status().as_u16()) {
                            return edge;
                        }
                    }
                }
                if port_taken && attempt < 3 {
                    eprintln!(
                        "wrangler dev: a port was taken ({}); launching again",
                        log_path.display()
                    );
                    break;
                }
                let gone = matches!(edge.child.try_wait(), Ok(Some(_)));
                assert!(
                    !gone && Instant::now() < deadline,
                    "wrangler dev did not serve: it exited, or 60 s passed (see {})",
                    log_path.display()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        unreachable!("the last attempt returns or panics")
    }
}

/// One query's output on the Durable Objects' storage as workerd wrote it.
pub fn sqlite(db: &Path, query: &str) -> String {
    try_sqlite(db, query).unwrap_or_else(|e| panic!("{e}"))
}

impl Drop for Edge {
    fn drop(&mut self) {
        // wrangler runs workerd as a child: end the whole group (wrangler leads its
        // own, see `launch_in`) politely, then firmly.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-s", "TERM", "--", &group])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && !matches!(self.child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(50));
        }
        // Whatever of the group is left (workerd outliving wrangler, say).
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &group])
            .status();
        // (And wrangler itself, should `kill` be missing.)
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn post(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    body: String,
    prefer_wait: bool,
) -> reqwest::Response {
    post_keyed(http, base, "idempotency-key", key, body, prefer_wait).await
}

/// [`post`], with the key in the header `key_header`.
pub async fn post_keyed(
    http: &reqwest::Client,
    base: &str,
    key_header: &str,
    key: &str,
    body: String,
    prefer_wait: bool,
) -> reqwest::Response {
    // An overloaded local runtime may drop a connection, or answer 503 by itself (as in
    // the races): a client retries that with the same key, which is what the key is for.
    let mut attempts = 0;
    loop {
        let mut req = http
            .post(format!("{base}/v1/charges"))
            .header(key_header, key)
            .header("content-type", "application/json")
            .body(body.clone());
        if prefer_wait {
            req = req.header("prefer", "wait=10");
        }
        match req.send().await {
            // The local runtime's own 503 (no idem-edge header: neither the worker nor
            // the origin answered it) is retried the same way, with the same key.
            Ok(res)
                if res.status() == 503
                    && !res.headers().contains_key("idem-edge")
                    && attempts < 3 =>
            {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(res) => return res,
            Err(e) if (e.is_request() || e.is_connect()) && attempts < 3 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the edge answers: {e}"),
        }
    }
}

/// What the edge did with the request (`idem-edge`), `-` when its code did not answer.
pub fn handled_by(res: &reqwest::Response) -> String {
    res.headers()
        .get("idem-edge")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned()
}

pub fn tally(seen: &mut BTreeMap<String, usize>, res: &reqwest::Response) {
    let edge = handled_by(res);
    *seen
        .entry(format!("{} {edge}", res.status().as_u16()))
        .or_insert(0) += 1;
}

/// KEYS × RETRIES concurrent charges through the edge at `base`, every key's retries
/// released together (key `{key_prefix}{i}`, customer `{customer_prefix}{i}`, the
/// handler taking `latency_ms`): the answers counted by "status idem-edge", `-` when
/// the edge's code did not answer.
pub async fn race_through_edge(
    http: &reqwest::Client,
    base: &str,
    key_prefix: &str,
    customer_prefix: &str,
    latency_ms: u64,
) -> BTreeMap<String, usize> {
    let barrier = Arc::new(Barrier::new(KEYS * RETRIES));
    let mut tasks = Vec::new();
    for i in 0..KEYS {
        for _ in 0..RETRIES {
            let (http, base, barrier) = (http.clone(), base.to_owned(), barrier.clone());
            let key = format!("{key_prefix}{i}");
            let body = charge_body(&format!("{customer_prefix}{i}"), 100, latency_ms);
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let sent = http
                    .post(format!("{base}/v1/charges"))
                    .header("idempotency-key", key)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                // The overloaded local runtime may drop a connection, as it may answer
                // its own 503: no answer from the edge's code, counted with those.
                let res = match sent {
                    Ok(res) => res,
                    Err(e) if e.is_request() || e.is_connect() => return "reset -".to_owned(),
                    Err(e) => panic!("the edge answers: {e}"),
                };
                let edge = res
                    .headers()
                    .get("idem-edge")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned();
                assert!(
                    res.headers().get("idem-disposition").is_none(),
                    "the origin's disposition is for the edge alone"
                );
                format!("{} {edge}", res.status().as_u16())
            }));
        }
    }
    let mut race = BTreeMap::new();
    for t in tasks {
        *race.entry(t.await.unwrap()).or_insert(0) += 1;
    }
    race
}

/// Who answered a race through the edge.
pub struct EdgeShare {
    /// Claimed at the edge and forwarded.
    pub forwarded: usize,
    /// Refused in flight or replayed by the edge.
    pub at_edge: usize,
    /// Answers that did not come from the edge's code at all (no `idem-edge`): the
    /// local runtime's own 503, or a connection it dropped, when the machine is
    /// overloaded (a busy 2-core machine gave 0 to 50 of 800).
    pub runtime_own: usize,
}

impl EdgeShare {
    pub fn of(race: &BTreeMap<String, usize>) -> EdgeShare {
        let n = |k: &str| race.get(k).copied().unwrap_or(0);
        EdgeShare {
            forwarded: n("201 forwarded"),
            at_edge: n("409 refused") + n("201 replayed"),
            runtime_own: race
                .iter()
                .filter(|(k, _)| k.ends_with(" -"))
                .map(|(_, n)| *n)
                .sum(),
        }
    }
}
