//! End to end through the edge: the worker under real workerd (`wrangler dev`) in
//! front of an origin on real Postgres. Needs the worker built (`scripts/test` does it:
//! `edge/build/`) and `edge/node_modules` (scripts/edge-toolchain).

use idem_tests::upstream::sqlite as try_sqlite;
use idem_tests::{charge_body, client, proof, report, TestDb, TestOrigin};
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;

const KEYS: usize = 100;
const RETRIES: usize = 8;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A test var's value with this prefix is written into wrangler.toml unquoted (a
/// number, as a user might write it), not as a string.
const UNQUOTED: &str = "unquoted:";

/// `wrangler dev` on a free port, with fresh Durable Object state, against `origin`.
struct Edge {
    child: Child,
    base: String,
    state: PathBuf,
}

impl Edge {
    async fn start(origin: &str, vars: &[(&str, &str)]) -> Edge {
        Self::launch(origin, vars, |status| status == 200).await
    }

    /// Starts it and waits until `/healthz` answers a status that `ready` accepts.
    async fn launch(origin: &str, vars: &[(&str, &str)], ready: fn(u16) -> bool) -> Edge {
        let state = std::env::temp_dir().join(format!(
            "idem-edge-state-{}-{}",
            std::process::id(),
            idem_tests::procs::free_port()
        ));
        Self::launch_in(state, origin, vars, ready).await
    }

    /// The directory of the Durable Objects' SQLite files, one per object.
    fn objects_dir(&self) -> PathBuf {
        self.state.join("state/v3/do/idem-edge-IdemRecord")
    }

    /// Every stored record, as (object file, stored value's length, value as hex).
    fn stored_records(&self) -> Vec<(PathBuf, usize, String)> {
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
    async fn launch_in(
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
                ("EDGE_SECRET", idem_tests::EDGE_SECRET),
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
            let port = idem_tests::procs::free_port();
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
                    &idem_tests::procs::free_port().to_string(),
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
fn sqlite(db: &Path, query: &str) -> String {
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

async fn post(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    body: String,
    prefer_wait: bool,
) -> reqwest::Response {
    post_keyed(http, base, "idempotency-key", key, body, prefer_wait).await
}

/// [`post`], with the key in the header `key_header`.
async fn post_keyed(
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
fn handled_by(res: &reqwest::Response) -> String {
    res.headers()
        .get("idem-edge")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned()
}

fn tally(seen: &mut BTreeMap<String, usize>, res: &reqwest::Response) {
    let edge = handled_by(res);
    *seen
        .entry(format!("{} {edge}", res.status().as_u16()))
        .or_insert(0) += 1;
}

/// KEYS × RETRIES concurrent charges through the edge at `base`, every key's retries
/// released together (key `{key_prefix}{i}`, customer `{customer_prefix}{i}`, the
/// handler taking `latency_ms`): the answers counted by "status idem-edge", `-` when
/// the edge's code did not answer.
async fn race_through_edge(
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
struct EdgeShare {
    /// Claimed at the edge and forwarded.
    forwarded: usize,
    /// Refused in flight or replayed by the edge.
    at_edge: usize,
    /// Answers that did not come from the edge's code at all (no `idem-edge`): the
    /// local runtime's own 503, or a connection it dropped, when the machine is
    /// overloaded (a busy 2-core machine gave 0 to 50 of 800).
    runtime_own: usize,
}

impl EdgeShare {
    fn of(race: &BTreeMap<String, usize>) -> EdgeShare {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_edge_charges_once_replays_and_survives_losing_its_state() {
    let db = TestDb::new("edge").await;
    let origin = TestOrigin::start(&["--store", "postgres", "--database-url", &db.url]).await;
    // The edge holds no heartbeat: a forward slower than its lease (800 requests on a
    // loaded 2-core machine can take 5 s) lets a retry claim and forward again, which
    // the origin answers. A lease longer than any forward here makes the edge's own
    // work exact.
    let edge = Edge::start(&origin.url(""), &[("LEASE_MS", "60000")]).await;
    let http = client();
    let started = Instant::now();

    // Race: every key's retries released together, through the edge.
    let race = race_through_edge(&http, &edge.base, "edge-", "cus-e", 300).await;
    let race_time = started.elapsed();
    assert_eq!(
        db.charges().await,
        KEYS as i64,
        "exactly one charge per key through the edge"
    );
    // The edge itself did the work (an edge that forwarded everything would pass the
    // charge count alone: the origin dedups too).
    let EdgeShare {
        forwarded,
        at_edge,
        runtime_own,
    } = EdgeShare::of(&race);
    // With the lease outlasting every forward, a key is forwarded at most once (a
    // forward whose client got the runtime's 503 is counted among those); every
    // answer is accounted for (nothing degraded); most retries end at the edge.
    assert!(forwarded <= KEYS, "{race:?}");
    assert!(forwarded + runtime_own >= KEYS, "{race:?}");
    assert_eq!(
        forwarded + at_edge + runtime_own,
        KEYS * RETRIES,
        "{race:?}"
    );
    assert!(
        at_edge >= KEYS * (RETRIES - 1) / 2,
        "the edge answered the retries: {race:?}"
    );

    // Replays at the edge, with the header; mismatch and malformed keys refused there.
    let mut replays = BTreeMap::new();
    let mut first_ids = Vec::new();
    for i in 0..KEYS {
        let res = post(
            &http,
            &edge.base,
            &format!("edge-{i}"),
            charge_body(&format!("cus-e{i}"), 100, 300),
            true,
        )
        .await;
        assert_eq!(res.status(), 201);
        assert_eq!(res.headers()["idempotent-replayed"], "true");
        tally(&mut replays, &res);
        let json: serde_json::Value = res.json().await.unwrap();
        first_ids.push(json["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        replays.get("201 replayed").copied(),
        Some(KEYS),
        "every retry replayed by the edge: {replays:?}"
    );
    let mismatch = post(
        &http,
        &edge.base,
        "edge-0",
        charge_body("cus-e0", 999, 0),
        false,
    )
    .await;
    assert_eq!(mismatch.status(), 422);
    assert_eq!(
        mismatch.headers()["idem-edge"],
        "refused",
        "a 422 of the edge's own"
    );
    assert_eq!(
        mismatch.headers()["content-type"],
        "application/problem+json"
    );
    let malformed = post(
        &http,
        &edge.base,
        "two words",
        charge_body("c", 1, 0),
        false,
    )
    .await;
    assert_eq!(malformed.status(), 400);
    assert_eq!(
        malformed.headers()["idem-edge"],
        "refused",
        "a 400 of the edge's own"
    );
    let problem: serde_json::Value = malformed.json().await.unwrap();
    assert_eq!(
        problem["type"],
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#idempotency-key-malformed"
    );
    // A 400 the origin released is not kept at the edge: the corrected retry through
    // the edge runs (not a 422 for a different body, not the 400 replayed).
    let bad = post(
        &http,
        &edge.base,
        "edge-fix",
        r#"{"amount":-1,"currency":"usd","customer":"c"}"#.to_owned(),
        false,
    )
    .await;
    assert_eq!(bad.status(), 400);
    assert!(bad.headers().get("idem-disposition").is_none());
    let fixed = post(&http, &edge.base, "edge-fix", charge_body("c", 1, 0), false).await;
    assert_eq!(fixed.status(), 201, "the corrected retry runs");
    assert!(fixed.headers().get("idempotent-replayed").is_none());
    assert_eq!(db.charges_for("edge-fix").await, 1);
    let missing = http
        .post(format!("{}/v1/charges", edge.base))
        .body(charge_body("c", 1, 0))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 400);

    // A new edge with empty state: every retry goes to the origin, which replays. This
    // one stores nothing above 10 bytes, so it keeps sending retries on to the origin.
    drop(edge);
    let fresh = Edge::start(&origin.url(""), &[("MAX_STORED_BODY_BYTES", "10")]).await;
    let mut after = BTreeMap::new();
    for (i, id) in first_ids.iter().enumerate() {
        let res = post(
            &http,
            &fresh.base,
            &format!("edge-{i}"),
            charge_body(&format!("cus-e{i}"), 100, 300),
            true,
        )
        .await;
        assert_eq!(res.status(), 201);
        assert_eq!(
            res.headers()["idempotent-replayed"],
            "true",
            "the origin replays what the edge forgot"
        );
        tally(&mut after, &res);
        let json: serde_json::Value = res.json().await.unwrap();
        assert_eq!(
            json["id"].as_str(),
            Some(id.as_str()),
            "the same charge as before"
        );
    }
    assert_eq!(
        db.charges().await - db.charges_for("edge-fix").await,
        KEYS as i64,
        "still one charge per key"
    );
    let again = post(
        &http,
        &fresh.base,
        "edge-0",
        charge_body("cus-e0", 100, 300),
        false,
    )
    .await;
    assert_eq!(
        again.headers()["idem-edge"],
        "forwarded",
        "a response above the size cap is not kept at the edge"
    );
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    report(
        "edge",
        &format!(
            "{KEYS} keys x {RETRIES} retries through wrangler dev/workerd -> {} charges in {race_time:.1?}; answers {race:?}; retries {replays:?}; after an edge restart with empty state {after:?}; charges still {}",
            KEYS,
            KEYS
        ),
    );
    let doubled = db
        .count("SELECT count(*) FROM (SELECT idempotency_key FROM charges GROUP BY 1 HAVING count(*) > 1) d")
        .await;
    assert_eq!(doubled, 0);
    let tallied = |m: &BTreeMap<String, usize>| proof::counts(m.iter().map(|(k, n)| (k, *n)));
    let answers = format!(
        "{} (status and what the edge did); retries: {}; after an edge restart with empty state: {}",
        tallied(&race),
        tallied(&replays),
        tallied(&after)
    );
    proof::record(
        "race",
        "edge",
        &[&KEYS.to_string(), &doubled.to_string(), &answers],
    );
}

/// The edge stores exactly what the origin stored: an answer without the origin's
/// disposition (a proxy's 500, a CDN's 524, a WAF's 429 — here a bare service that is
/// not an idem origin) is passed through and never replayed from the edge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_keeps_nothing_the_origin_did_not_store() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let bare = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/v1/charges",
            axum::routing::post(move || {
                c.fetch_add(1, Ordering::SeqCst);
                async {
                    (
                        http::StatusCode::INTERNAL_SERVER_ERROR,
                        "{\"error\":\"from a proxy\"}",
                    )
                }
            }),
        );
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let origin = TestOrigin::serve_router(bare, store).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let res = post(&http, &edge.base, "bare-1", charge_body("c", 1, 0), false).await;
        assert_eq!(res.status(), 500);
        seen.push(res.headers()["idem-edge"].to_str().unwrap().to_owned());
    }
    report(
        "edge",
        &format!(
            "a 500 that no idem origin stored, sent twice through the edge: {seen:?}, {} calls",
            calls.load(Ordering::SeqCst)
        ),
    );
    assert_eq!(
        seen,
        ["forwarded", "forwarded"],
        "never replayed from the edge"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// idem tells only its own edge what it stored (`idem-disposition`, which the edge keeps
/// its copies by): an edge that does not send the origin's secret keeps nothing, and
/// every retry goes to the origin, which replays; a client's `idem-edge-secret` never
/// passes the edge; no client sees the private headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_edge_that_knows_the_origin_s_secret_is_told_what_it_stored() {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let (origin, ledger) = TestOrigin::demo_on(store).await;
    let http = client();
    let another = "another-edge-secret-0123456789";
    let mut seen = BTreeMap::new();
    for (edge_secret, client_sends) in [
        (idem_tests::EDGE_SECRET, None),
        (another, Some(idem_tests::EDGE_SECRET)),
    ] {
        let edge = Edge::start(&origin.url(""), &[("EDGE_SECRET", edge_secret)]).await;
        let key = format!("secret-{}", seen.len());
        let mut handled = Vec::new();
        for _ in 0..2 {
            let mut req = http
                .post(format!("{}/v1/charges", edge.base))
                .header("idempotency-key", &key)
                .header("content-type", "application/json")
                .body(charge_body("c", 1, 0));
            if let Some(secret) = client_sends {
                req = req.header("idem-edge-secret", secret);
            }
            let res = req.send().await.unwrap();
            assert_eq!(res.status(), 201);
            for private in ["idem-disposition", "idem-stored-headers"] {
                assert!(
                    res.headers().get(private).is_none(),
                    "{private} reached a client"
                );
            }
            handled.push(res.headers()["idem-edge"].to_str().unwrap().to_owned());
        }
        assert_eq!(ledger.count_for_key(&key), 1, "{key}: charged once");
        seen.insert(edge_secret == another, handled);
    }
    report(
        "edge",
        &format!(
            "a charge sent twice through an edge with the origin's secret, and through one \
             with another (the client sending the origin's): {seen:?} (false: the origin's)"
        ),
    );
    assert_eq!(seen[&false], ["forwarded", "replayed"], "the origin's edge");
    assert_eq!(
        seen[&true],
        ["forwarded", "forwarded"],
        "an edge with another secret kept the answer (the client's secret passed it)"
    );
}

/// A bare origin (not an idem origin) that records every request it gets: method and
/// path, and answers `/v1/charges` with a redirect, `/landing` with a page, and
/// anything else with the method it saw.
async fn recording_origin() -> (TestOrigin, Arc<std::sync::Mutex<Vec<String>>>) {
    use axum::extract::Request;
    use axum::response::IntoResponse;
    let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let s = seen.clone();
    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .fallback(move |req: Request| {
            let s = s.clone();
            async move {
                let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
                s.lock().unwrap().push(format!("{method} {path}"));
                match path.as_str() {
                    "/v1/charges" => (
                        http::StatusCode::SEE_OTHER,
                        [(http::header::LOCATION, "/landing")],
                        "see other",
                    )
                        .into_response(),
                    "/landing" => "the landing page".into_response(),
                    _ => method.into_response(),
                }
            }
        });
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    (TestOrigin::serve_router(app, store).await, seen)
}

/// A 3xx from the origin is the answer: the edge never follows it (a POST re-sent as a
/// bodiless GET, whose answer would be stored under the POST's key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_never_follows_a_redirect() {
    let (origin, seen) = recording_origin().await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let res = post(
        &no_redirects,
        &edge.base,
        "redirect-1",
        charge_body("c", 1, 0),
        false,
    )
    .await;
    let status = res.status().as_u16();
    let location = res
        .headers()
        .get("location")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = res.text().await.unwrap();
    let requests = seen.lock().unwrap().clone();
    report(
        "edge",
        &format!("an origin answering 303 to a POST: the client got {status} {location:?} {body:?}; the origin saw {requests:?}"),
    );
    assert_eq!(status, 303, "the redirect is the answer: {body}");
    assert_eq!(location.as_deref(), Some("/landing"));
    assert_eq!(requests, ["POST /v1/charges"], "nothing followed it");
}

/// Methods the runtime has no name for (WebDAV's, `QUERY`, `PURGE`) pass through as
/// themselves, not as GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_passes_unknown_methods_through_as_themselves() {
    let (origin, seen) = recording_origin().await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    let mut answered = Vec::new();
    for method in ["PROPFIND", "QUERY", "PURGE"] {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let res = http
            .request(m, format!("{}/dav", edge.base))
            .send()
            .await
            .unwrap();
        answered.push(res.text().await.unwrap());
    }
    let requests = seen.lock().unwrap().clone();
    report(
        "edge",
        &format!("PROPFIND, QUERY, PURGE through the edge: the origin saw {requests:?}"),
    );
    assert_eq!(requests, ["PROPFIND /dav", "QUERY /dav", "PURGE /dav"]);
    assert_eq!(answered, ["PROPFIND", "QUERY", "PURGE"]);
}

/// A client that hangs up while its request is at the origin: the edge still stores
/// the origin's answer, and the retry is a replay at the edge — not a 409 for as long
/// as the edge's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_finishes_when_the_client_leaves() {
    let db = TestDb::new("edge_gone").await;
    let origin = TestOrigin::start(&["--store", "postgres", "--database-url", &db.url]).await;
    let edge = Edge::start(&origin.url(""), &[("LEASE_MS", "20000")]).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let body = charge_body("cus-gone", 100, 1_500);
    let gave_up = impatient
        .post(format!("{}/v1/charges", edge.base))
        .header("idempotency-key", "gone-1")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await;
    assert!(gave_up.is_err(), "the client gave up");
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let retry = post(&client(), &edge.base, "gone-1", body, false).await;
    let status = retry.status().as_u16();
    let edge_did = retry
        .headers()
        .get("idem-edge")
        .map(|v| v.to_str().unwrap().to_owned());
    let charges = db.charges_for("gone-1").await;
    report(
        "edge",
        &format!("client gone after 300 ms of a 1.5 s charge, retry 3 s later: {status} {edge_did:?}; {charges} charge"),
    );
    assert_eq!(charges, 1);
    assert_eq!(
        (status, edge_did.as_deref()),
        (201, Some("replayed")),
        "the edge stored the answer after the client left"
    );
}

/// A misconfigured edge says so, naming the var, and forwards nothing — no loopback
/// default for a missing `ORIGIN_URL`, no silent default for a malformed number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misconfigured_edge_says_so_and_forwards_nothing() {
    let (origin, seen) = recording_origin().await;
    let mut answers = Vec::new();
    for (var, value, origin_url) in [
        ("ORIGIN_URL", "", ""),
        ("ORIGIN_URL", "http://bad host:8080", "http://bad host:8080"),
        (
            "TTL_MS",
            "unquoted:5000000000000",
            origin.url("").leak() as &str,
        ),
        ("TTL_MS", "junk", origin.url("").leak() as &str),
        ("EDGE_SECRET", "hunter2", origin.url("").leak() as &str),
        (
            "TTL_MS",
            "99999999999999999999",
            origin.url("").leak() as &str,
        ),
    ] {
        let edge = Edge::launch(origin_url, &[(var, value)], |_| true).await;
        let res = post(
            &client(),
            &edge.base,
            "misconfigured-1",
            charge_body("c", 1, 0),
            false,
        )
        .await;
        let status = res.status().as_u16();
        let problem: serde_json::Value = res.json().await.unwrap_or_default();
        answers.push(format!("{var}={value:?}: {status} {}", problem["detail"]));
        assert_eq!(status, 500, "{var}={value:?}: {problem}");
        assert_eq!(
            problem["type"],
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#edge-misconfigured"
        );
        assert!(
            problem["detail"].as_str().unwrap_or("").starts_with(var),
            "the detail names {var}: {problem}"
        );
    }
    let requests = seen.lock().unwrap().clone();
    report(
        "edge",
        &format!("misconfigured edges: {answers:?}; the origin saw {requests:?}"),
    );
    assert!(requests.is_empty(), "nothing was forwarded: {requests:?}");
}

/// An origin the edge cannot reach: the answer says the request may have run and a
/// retry with the same key gets its result (`origin-unreachable`, `Retry-After`), and
/// the edge keeps nothing, so the retry goes to the origin. Before, the edge answered
/// `handler-failed` — the type of a final answer, stored and never run again — while
/// the retry, once the origin answered, got the origin's `201`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_origin_is_an_answer_to_retry_not_a_final_one() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let edge = Edge::launch(&closed, &[], |_| true).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let res = post(
            &client(),
            &edge.base,
            "unreachable-1",
            charge_body("c", 1, 0),
            false,
        )
        .await;
        let status = res.status().as_u16();
        let retry_after = res
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let problem: serde_json::Value = res.json().await.unwrap_or_default();
        seen.push((
            status,
            problem["type"].as_str().unwrap_or("").to_owned(),
            retry_after,
        ));
    }
    report(
        "edge",
        &format!("an origin the edge cannot reach, asked twice: {seen:?}"),
    );
    for (status, kind, retry_after) in &seen {
        assert_eq!(*status, 502);
        assert_eq!(
            kind,
            "https://github.com/idem-rs/idem/blob/main/docs/problems.md#origin-unreachable"
        );
        assert_eq!(retry_after.as_deref(), Some("1"));
    }
    // A request the edge does not guard (no key) gets no invitation to retry: it may
    // have reached the origin, and nothing would recognise it a second time.
    let unguarded = client()
        .get(format!("{}/v1/charges/ch_1", edge.base))
        .send()
        .await
        .unwrap();
    let unguarded_retry_after = unguarded.headers().get("retry-after").cloned();
    let unguarded_status = unguarded.status().as_u16();
    let unguarded_type = unguarded.json::<serde_json::Value>().await.unwrap()["type"].clone();
    report(
        "edge",
        &format!("an unguarded GET to an origin the edge cannot reach: {unguarded_status} {unguarded_type}, Retry-After {unguarded_retry_after:?}"),
    );
    assert_eq!(unguarded_status, 502);
    assert_ne!(
        unguarded_type,
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#origin-unreachable"
    );
    assert!(unguarded_retry_after.is_none());
    // At most its claim, freed (an in-progress record: 58 bytes, and the storage's
    // framing); never an answer, which carries a status, headers and a body.
    let sizes: Vec<usize> = edge
        .stored_records()
        .iter()
        .map(|(_, len, _)| *len)
        .collect();
    assert!(
        sizes.iter().all(|&len| len < 80),
        "the edge kept no answer: {sizes:?}"
    );
}

/// Keys kept per tenant by the host a client asked for, the same rule at the edge and
/// at the origin (`SCOPE_FROM=header:x-forwarded-host`): the origin reads the
/// `X-Forwarded-Host` the edge sets from the client's `Host`, and the edge now reads
/// the same. Before, the edge read the client's own `X-Forwarded-Host` — none, or a
/// forged one — so two tenants' requests with one key shared a scope at the edge: the
/// second tenant got a `422` (or the first tenant's answer) for a request the origin
/// would have run. Executions: one per tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_scopes_by_the_headers_the_origin_gets() {
    use idem_core::contract::{Anonymous, ScopeRule, ScopeSource};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let rule = ScopeRule {
        source: ScopeSource::Header("x-forwarded-host".into()),
        anonymous: Anonymous::Scoped,
    };
    let layer = idem::IdempotencyLayer::new(store.clone())
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(
            idem_core::contract::Anonymous::Scoped,
        ))
        .require_key_on(["/v1/charges"])
        .scope_rule(rule)
        .edge_secret(idem_tests::EDGE_SECRET)
        .unwrap();
    let app = axum::Router::new()
        .route(
            "/v1/charges",
            axum::routing::post(move || {
                r.fetch_add(1, Ordering::SeqCst);
                async move { (http::StatusCode::CREATED, "charged") }
            }),
        )
        .layer(layer)
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    let origin = TestOrigin::serve_router(app, store).await;
    let edge = Edge::start(
        &origin.url(""),
        &[("SCOPE_FROM", "header:x-forwarded-host")],
    )
    .await;
    let http = client();
    let mut seen = Vec::new();
    for (tenant, amount) in [("a.example", 1), ("b.example", 2)] {
        let res = http
            .post(format!("{}/v1/charges", edge.base))
            .header("host", tenant)
            .header("idempotency-key", "per-tenant-1")
            .header("content-type", "application/json")
            .body(charge_body("c", amount, 0))
            .send()
            .await
            .unwrap();
        seen.push(format!("{tenant}: {}", res.status().as_u16()));
    }
    report(
        "edge",
        &format!("two tenants (by Host), one key, through an edge scoping by X-Forwarded-Host: {seen:?}; {} executions", runs.load(Ordering::SeqCst)),
    );
    assert_eq!(seen, ["a.example: 201", "b.example: 201"]);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A scope rule naming a header the runtime sets and the edge does not forward
/// (`CF-Connecting-IP`: keys per client address) reads it as the edge got it. (Reading
/// every header as the origin gets it made it absent: with anonymous callers refused,
/// every guarded request was a 401.) The origin, which never gets the header, names
/// its records otherwise: the edge claims and forwards, and keeps none of the origin's
/// answers (before record tags, it kept them under its own per-address record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_scopes_by_a_header_its_runtime_sets() {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let (origin, ledger) = TestOrigin::demo_on(store).await;
    let edge = Edge::start(
        &origin.url(""),
        &[
            ("SCOPE_FROM", "header:cf-connecting-ip"),
            ("ANONYMOUS", "refused"),
        ],
    )
    .await;
    let http = client();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let res = post(
            &http,
            &edge.base,
            "per-address-1",
            charge_body("c", 1, 0),
            false,
        )
        .await;
        seen.push(format!(
            "{} {}",
            res.status().as_u16(),
            res.headers()
                .get("idem-edge")
                .map_or("-", |v| v.to_str().unwrap())
        ));
    }
    report(
        "edge",
        &format!(
            "SCOPE_FROM=header:cf-connecting-ip, anonymous refused: {seen:?}; {} charge",
            ledger.len()
        ),
    );
    assert_eq!(
        seen,
        ["201 forwarded; other-record", "201 forwarded; other-record"]
    );
    assert_eq!(ledger.len(), 1, "the origin replayed the retry");
}

/// The origin learns who asked from the edge, not from the client: the client's
/// `X-Forwarded-For` and `CF-*` headers are dropped, the edge sets `X-Forwarded-For`
/// (the address the runtime saw), `-Host` and `-Proto`; a header the origin's answer
/// names in `Connection` stops at the edge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_origin_gets_the_edge_s_forwarding_headers_not_the_client_s() {
    use axum::response::IntoResponse;
    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/headers",
            axum::routing::get(|headers: http::HeaderMap| async move {
                let seen: BTreeMap<String, String> = headers
                    .iter()
                    .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("?").to_owned()))
                    .collect();
                (
                    [
                        ("x-answer-private", "hop"),
                        ("connection", "x-answer-private"),
                    ],
                    axum::Json(seen),
                )
                    .into_response()
            }),
        );
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let origin = TestOrigin::serve_router(app, store).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let res = client()
        .get(format!("{}/headers", edge.base))
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-forwarded-host", "evil.example")
        .header("cf-ray", "forged")
        .header("connection", "x-private")
        .header("x-private", "secret")
        .send()
        .await
        .unwrap();
    let leaked_answer_header = res.headers().get("x-answer-private").is_some();
    let seen: BTreeMap<String, String> = res.json().await.unwrap();
    let edge_host = edge.base.trim_start_matches("http://").to_owned();
    report(
        "edge",
        &format!("forwarding headers at the origin: x-forwarded-for {:?}, -host {:?}, -proto {:?}, cf-ray {:?}, x-private {:?}; the answer's connection-named header reached the client: {leaked_answer_header}",
            seen.get("x-forwarded-for"), seen.get("x-forwarded-host"), seen.get("x-forwarded-proto"), seen.get("cf-ray"), seen.get("x-private")),
    );
    assert_ne!(
        seen.get("x-forwarded-for").map(String::as_str),
        Some("6.6.6.6"),
        "{seen:?}"
    );
    // The address workerd saw the client at: this machine's loopback.
    assert_eq!(
        seen.get("x-forwarded-for").map(String::as_str),
        Some("127.0.0.1"),
        "the edge sets X-Forwarded-For to the address it saw, not the client's say: {seen:?}"
    );
    assert_eq!(seen.get("x-forwarded-host"), Some(&edge_host), "{seen:?}");
    assert_eq!(
        seen.get("x-forwarded-proto").map(String::as_str),
        Some("http"),
        "{seen:?}"
    );
    assert_ne!(
        seen.get("cf-ray").map(String::as_str),
        Some("forged"),
        "{seen:?}"
    );
    // The client's `Connection` header is consumed by workerd before the worker sees
    // it, so what it named (`x-private`) can't be told apart here; the core drops such
    // headers whenever a runtime hands `Connection` over (its unit test).
    assert!(
        !leaked_answer_header,
        "named in the answer's Connection: hop-by-hop"
    );
}

/// A stream of `chunks`, each sent after its delay: a client or an origin that takes
/// its time.
fn paced(
    chunks: Vec<(Duration, Vec<u8>)>,
    sent: Arc<std::sync::Mutex<Vec<Instant>>>,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + 'static {
    futures_util::stream::unfold(chunks.into_iter(), move |mut rest| {
        let sent = sent.clone();
        async move {
            let (delay, chunk) = rest.next()?;
            tokio::time::sleep(delay).await;
            sent.lock().unwrap().push(Instant::now());
            Some((Ok(bytes::Bytes::from(chunk)), rest))
        }
    })
}

/// What the edge does not guard it streams, both ways: a server-sent event reaches
/// the client before the origin's answer ends, an upload reaches the origin before the
/// client has sent all of it, and the answer to HEAD keeps its `Content-Length`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_streams_what_it_does_not_guard() {
    use futures_util::StreamExt;
    let origin_got: Arc<std::sync::Mutex<Vec<Instant>>> = Arc::default();
    let got = origin_got.clone();
    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/events",
            axum::routing::get(|| async {
                let events = paced(
                    vec![
                        (Duration::ZERO, b"data: first\n\n".to_vec()),
                        (Duration::from_secs(4), b"data: second\n\n".to_vec()),
                    ],
                    Arc::default(),
                );
                (
                    [("content-type", "text/event-stream")],
                    axum::body::Body::from_stream(events),
                )
            }),
        )
        .route(
            "/upload",
            axum::routing::post(move |req: axum::extract::Request| {
                let got = got.clone();
                async move {
                    let mut chunks = req.into_body().into_data_stream();
                    let mut len = 0;
                    while let Some(chunk) = chunks.next().await {
                        got.lock().unwrap().push(Instant::now());
                        len += chunk.unwrap().len();
                    }
                    len.to_string()
                }
            }),
        )
        .route("/file", axum::routing::get(|| async { vec![b'x'; 12_345] }));
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let origin = TestOrigin::serve_router(app, store).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();

    let asked = Instant::now();
    let mut events = http
        .get(format!("{}/events", edge.base))
        .send()
        .await
        .unwrap();
    let first = events.chunk().await.unwrap().unwrap_or_default();
    let first_after = asked.elapsed();
    let mut rest = Vec::new();
    while let Some(chunk) = events.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }

    let client_sent: Arc<std::sync::Mutex<Vec<Instant>>> = Arc::default();
    let upload = paced(
        vec![
            (Duration::ZERO, vec![b'u'; 64 * 1024]),
            (Duration::from_secs(4), vec![b'v'; 64 * 1024]),
        ],
        client_sent.clone(),
    );
    let uploaded = http
        .post(format!("{}/upload", edge.base))
        .body(reqwest::Body::wrap_stream(upload))
        .send()
        .await
        .unwrap();
    let edge_did = uploaded.headers()["idem-edge"].to_str().unwrap().to_owned();
    let origin_counted = uploaded.text().await.unwrap();
    let origin_first_byte = origin_got.lock().unwrap()[0];
    let client_last_chunk = client_sent.lock().unwrap()[1];

    let head = http
        .head(format!("{}/file", edge.base))
        .send()
        .await
        .unwrap();
    let head_length = head
        .headers()
        .get("content-length")
        .map(|v| v.to_str().unwrap().to_owned());

    let upload_lead = client_last_chunk.saturating_duration_since(origin_first_byte);
    report(
        "edge",
        &format!(
            "pass-through: the first event after {first_after:?} (the next one 4 s later); \
             the upload's first byte at the origin {upload_lead:?} before the client sent its last \
             ({origin_counted} bytes, {edge_did}); HEAD's Content-Length {head_length:?}"
        ),
    );
    assert_eq!(&first[..], b"data: first\n\n");
    assert_eq!(&rest[..], b"data: second\n\n");
    assert!(
        first_after < Duration::from_secs(3),
        "the first event came after {first_after:?}: the edge held the stream until it ended"
    );
    assert_eq!(origin_counted, (128 * 1024).to_string());
    assert_eq!(edge_did, "passed");
    assert!(
        origin_first_byte < client_last_chunk,
        "the origin saw nothing until the client had sent everything: the edge read the upload whole"
    );
    assert_eq!(
        head_length.as_deref(),
        Some("12345"),
        "HEAD keeps its length"
    );
}

/// A guarded body is read only up to the limit: one sent without a length is refused
/// as soon as it passes the limit, not once the client is done sending; one that
/// declares a huge length is refused before any of it is read. The origin sees
/// neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_stops_reading_a_guarded_body_at_its_limit() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (origin, seen) = recording_origin().await;
    let edge = Edge::start(&origin.url(""), &[("MAX_BODY_BYTES", "65536")]).await;
    let unending = paced(
        vec![
            (Duration::ZERO, vec![b' '; 100 * 1024]),
            (Duration::from_secs(10), b"{}".to_vec()),
        ],
        Arc::default(),
    );
    let asked = Instant::now();
    let res = client()
        .post(format!("{}/v1/charges", edge.base))
        .header("idempotency-key", "too-big-1")
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(unending))
        .send()
        .await
        .unwrap();
    let took = asked.elapsed();
    let status = res.status().as_u16();
    let problem: serde_json::Value = res.json().await.unwrap_or_default();

    // A huge body that declares its length: 8 MiB, all sent (the local runtime holds
    // back any answer until a declared body has arrived). The edge may stop reading
    // and close early, so a failed write is not the test's concern; the answer is.
    let huge = 8 * 1024 * 1024;
    let host = edge.base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(host).await.unwrap();
    let mut request = format!(
        "POST /v1/charges HTTP/1.1\r\nhost: {host}\r\nidempotency-key: too-big-2\r\n\
         content-type: application/json\r\ncontent-length: {huge}\r\n\r\n"
    )
    .into_bytes();
    request.resize(request.len() + huge, b' ');
    let _ = conn.write_all(&request).await;
    let mut head = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut head))
        .await
        .expect("the edge answers a huge body")
        .unwrap();
    let declared = String::from_utf8_lossy(&head[..n]).into_owned();
    let requests = seen.lock().unwrap().clone();
    report(
        "edge",
        &format!(
            "a guarded body past MAX_BODY_BYTES=65536, sent without a length and left open: \
             {status} {} after {took:?}; a declared 8 MiB: {:?}; the origin saw {requests:?}",
            problem["type"],
            declared.lines().next()
        ),
    );
    assert_eq!(status, 413, "{problem}");
    assert_eq!(
        problem["type"],
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#body-too-large"
    );
    assert!(
        took < Duration::from_secs(6),
        "refused after {took:?}: the edge waited for the whole body"
    );
    assert!(declared.starts_with("HTTP/1.1 413"), "{declared}");
    assert!(requests.is_empty(), "{requests:?}");
}

/// An idem origin keeping its answers for `ttl`, whose charge answers 201 with a body
/// of `body_len` bytes, counting its executions.
async fn origin_with_large_answers(
    ttl: Duration,
    body_len: usize,
) -> (TestOrigin, Arc<std::sync::atomic::AtomicUsize>) {
    origin_storing_at_most(ttl, body_len, None).await
}

/// The same, storing answers of at most `max_stored` bytes (a problem in their place).
async fn origin_storing_at_most(
    ttl: Duration,
    body_len: usize,
    max_stored: Option<usize>,
) -> (TestOrigin, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let layer = idem::IdempotencyLayer::new(store.clone())
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(
            idem_core::contract::Anonymous::Scoped,
        ))
        .require_key_on(["/v1/charges"])
        .ttl(ttl)
        .edge_secret(idem_tests::EDGE_SECRET)
        .unwrap();
    let layer = match max_stored {
        Some(limit) => layer.max_stored_body_bytes(limit),
        None => layer,
    };
    let app = axum::Router::new()
        .route(
            "/v1/charges",
            axum::routing::post(move || {
                r.fetch_add(1, Ordering::SeqCst);
                async move { (http::StatusCode::CREATED, vec![b'a'; body_len]) }
            }),
        )
        .layer(layer)
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    (TestOrigin::serve_router(app, store).await, runs)
}

/// An answer larger than the origin stores (16 KiB here) but not than the edge does:
/// the origin delivers it to the first attempt and stores a `response-not-stored`
/// problem in its place. Before the fix it told the edge the answer was `stored`, the
/// edge kept the whole answer, and a retry got the 201 from the edge where the origin
/// replays the problem — two answers to one request, by which layer answered. The edge
/// now keeps nothing of it, and its retries get what the origin stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_does_not_keep_an_answer_the_origin_stored_a_problem_for() {
    use std::sync::atomic::Ordering;
    let (origin, runs) =
        origin_storing_at_most(Duration::from_secs(60), 32 * 1024, Some(16 * 1024)).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    let body = charge_body("big", 1, 0);
    let first = post(&http, &edge.base, "too-large-1", body.clone(), false).await;
    assert_eq!(first.status(), 201);
    assert_eq!(
        first.bytes().await.unwrap().len(),
        32 * 1024,
        "delivered whole"
    );
    let through_edge = post(&http, &edge.base, "too-large-1", body.clone(), false).await;
    let edge_said = through_edge.headers()["idem-edge"]
        .to_str()
        .unwrap()
        .to_owned();
    let edge_status = through_edge.status().as_u16();
    let at_origin = post(&http, &origin.url(""), "too-large-1", body, false).await;
    let origin_status = at_origin.status().as_u16();
    report(
        "edge",
        &format!("an answer larger than the origin stores (32 KiB, origin 16 KiB): the retry through the edge {edge_status} ({edge_said}), directly at the origin {origin_status}; {} execution(s)", runs.load(Ordering::SeqCst)),
    );
    assert_eq!(
        edge_status, origin_status,
        "one answer, whichever layer answers"
    );
    assert_eq!(edge_said, "forwarded");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Bodies of 4 KiB and more are hashed by workerd's WebCrypto, smaller ones in WASM
/// (`RUNTIME_SHA256_FROM`): either way the edge stores exactly the fingerprint the
/// origin computes natively, replays the same body, and refuses another under the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_fingerprints_large_bodies_with_webcrypto_as_the_origin_does() {
    let (origin, runs) = origin_with_large_answers(Duration::from_secs(60), 100).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    let threshold = idem_edge::flow::RUNTIME_SHA256_FROM;
    let mut seen = Vec::new();
    for (i, size) in [threshold / 2, threshold, 256 * 1024]
        .into_iter()
        .enumerate()
    {
        // 61 bytes around the note: bodies of exactly 2 KiB, 4 KiB (the threshold), 256 KiB.
        let note = "n".repeat(size - 61);
        let body =
            format!(r#"{{"customer":"cus_{i}","amount":1000,"currency":"usd","note":"{note}"}}"#);
        assert_eq!(body.len(), size);
        let key = format!("webcrypto-{i}");
        let before = edge.stored_records().len();
        let first = post(&http, &edge.base, &key, body.clone(), false).await;
        assert_eq!(first.status(), 201, "{size}-byte body");
        let records = edge.stored_records();
        assert_eq!(records.len(), before + 1, "one more record at the edge");
        let native = idem_core::contract::fingerprint(
            "POST",
            "/v1/charges",
            [b"application/json".as_slice()],
            body.as_bytes(),
        );
        // The stored value is the record's encoding, V8-serialised: its 32 fingerprint
        // bytes appear in it as they are.
        assert!(
            records
                .iter()
                .any(|(_, _, hex)| hex.to_ascii_lowercase().contains(&native.to_hex())),
            "the edge's fingerprint of a {}-byte body is the origin's",
            body.len()
        );
        let retry = post(&http, &edge.base, &key, body.clone(), false).await;
        assert_eq!(retry.headers()["idem-edge"], "replayed");
        let mut other = body.clone();
        other.replace_range(other.len() - 3..other.len() - 2, "m");
        let refused = post(&http, &edge.base, &key, other, false).await;
        assert_eq!(refused.status(), 422, "another body under the key");
        seen.push(body.len());
    }
    let executions = runs.load(std::sync::atomic::Ordering::SeqCst);
    report(
        "edge",
        &format!(
            "bodies of {seen:?} bytes (WebCrypto from {threshold}): the edge's fingerprint \
             is the origin's for each; replayed, another body refused; {executions} executions"
        ),
    );
    assert_eq!(executions, 3, "one execution per key");
}

/// The Durable Object's storage as workerd wrote it: the record is bytes (not hex, at
/// twice the size), and its alarm deletes it once the origin's record has expired —
/// not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_stores_records_as_bytes_and_its_alarm_deletes_them_at_expiry() {
    let ttl = Duration::from_secs(8);
    let body_len = 40 * 1024;
    let (origin, runs) = origin_with_large_answers(ttl, body_len).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    // The origin's record expires `ttl` after its write, which comes after this.
    let stored_at = Instant::now();
    let first = post(&http, &edge.base, "bytes-1", "{}".into(), false).await;
    assert_eq!(first.status(), 201);
    assert_eq!(first.headers()["idem-edge"], "forwarded");
    let records = edge.stored_records();
    let retry = post(&http, &edge.base, "bytes-1", "{}".into(), false).await;
    let retry_edge = retry.headers()["idem-edge"].to_str().unwrap().to_owned();
    assert_eq!(retry.bytes().await.unwrap().len(), body_len);
    // Half-way through the TTL it is still there; once past it (and the 1 s grace), the
    // alarm has removed it.
    tokio::time::sleep(ttl / 2).await;
    let halfway = edge.stored_records().len();
    let deadline = stored_at + ttl + Duration::from_secs(15);
    let gone_after = loop {
        if edge.stored_records().is_empty() {
            break Some(stored_at.elapsed());
        }
        if Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let sizes: Vec<usize> = records.iter().map(|(_, len, _)| *len).collect();
    report(
        "edge",
        &format!(
            "a {body_len}-byte answer kept at the edge: stored values of {sizes:?} bytes; \
             the retry {retry_edge}; records half-way through the {ttl:?} TTL: {halfway}; \
             deleted by the alarm after {gone_after:?}; {} execution",
            runs.load(std::sync::atomic::Ordering::SeqCst)
        ),
    );
    assert_eq!(sizes.len(), 1, "one record, in one object");
    assert!(
        sizes[0] > body_len && sizes[0] < body_len + 1024,
        "stored as bytes: {} bytes for a {body_len}-byte body",
        sizes[0]
    );
    assert_eq!(retry_edge, "replayed");
    assert_eq!(halfway, 1, "not deleted before it expired");
    let gone_after = gone_after.expect("the alarm deleted the expired record");
    assert!(
        gone_after >= ttl,
        "deleted after {gone_after:?}, before the TTL"
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A claim the edge lost track of — its release never landed (the object reset, the
/// write failed, the edge cut off), so its record is still the claim, past its lease —
/// does not bind the key at the edge: the corrected request (another body) is sent on,
/// unclaimed, and the origin, which released the key, runs it. Before, the edge refused it 422 for
/// the key's whole TTL while the origin would have run it. The lost release is made by
/// hand: the edge stopped, its object's record rewritten to the claim as it stood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_edge_lost_track_of_does_not_bind_the_key_there() {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let (origin, ledger) = TestOrigin::demo_on(store).await;
    let edge = Edge::start(&origin.url(""), &[("LEASE_MS", "1000")]).await;
    let http = client();
    // Rejected by the handler, which releases the key for the corrected request.
    let invalid = r#"{"amount":-5,"currency":"usd","customer":"cus-lost"}"#.to_owned();
    let first = post(&http, &edge.base, "lost-1", invalid, false).await;
    assert_eq!(first.status(), 400);
    let records = edge.stored_records();
    assert_eq!(records.len(), 1, "{records:?}");
    let (object, _, hex) = records[0].clone();
    let state = edge.state.clone();
    drop(edge);
    // The record as a claim whose release was lost: in progress, its lease over, kept
    // for the TTL. Found in the stored value by its layout (version 1, in progress, the
    // token of a claim made in the last two minutes).
    let mut value: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let now = idem::now();
    let at = (0..value.len().saturating_sub(57))
        .find(|&i| {
            let token = u64::from_be_bytes(value[i + 34..i + 42].try_into().unwrap());
            value[i] == 1
                && value[i + 1] == 0
                && (now.saturating_sub(120_000)..=now).contains(&(token / 1024))
        })
        .expect("the stored claim's record");
    value[at + 42..at + 50].copy_from_slice(&(now - 5_000).to_be_bytes());
    value[at + 50..at + 58].copy_from_slice(&(now + 86_400_000).to_be_bytes());
    let rewritten: String = value.iter().map(|b| format!("{b:02X}")).collect();
    sqlite(
        &object,
        &format!("UPDATE _cf_KV SET value = X'{rewritten}' WHERE key = 'record'"),
    );
    let edge = Edge::launch_in(state, &origin.url(""), &[("LEASE_MS", "1000")], |status| {
        status == 200
    })
    .await;
    let corrected = post(
        &http,
        &edge.base,
        "lost-1",
        charge_body("cus-lost", 100, 0),
        false,
    )
    .await;
    let status = corrected.status().as_u16();
    let from = handled_by(&corrected);
    let retry = post(
        &http,
        &edge.base,
        "lost-1",
        charge_body("cus-lost", 100, 0),
        false,
    )
    .await;
    let retried = (
        retry.status().as_u16(),
        handled_by(&retry),
        retry.headers().contains_key("idempotent-replayed"),
    );
    let charges = ledger.count_for_key("lost-1");
    report(
        "edge",
        &format!(
            "a claim whose release the edge lost, past its lease: the corrected request {status} ({from}), its retry {retried:?}; {charges} charge"
        ),
    );
    assert_eq!(
        (status, from.as_str()),
        (201, "forwarded"),
        "the origin runs it"
    );
    // Sent on again (the edge keeps its record for the attempt it lost track of), and
    // replayed by the origin.
    assert_eq!(retried, (201, "forwarded".to_owned(), true));
    assert_eq!(charges, 1);
}

/// A stored value the edge cannot decode (damaged, or a newer version's encoding) is
/// not "no record": a retry goes to the origin (which replays), nothing overwrites it,
/// and its alarm, fired, does not delete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_edge_cannot_read_is_neither_overwritten_nor_deleted() {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let (origin, ledger) = TestOrigin::demo_on(store).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    let body = charge_body("cus-damaged", 100, 0);
    let first = post(&http, &edge.base, "damaged-1", body.clone(), false).await;
    assert_eq!(first.status(), 201);
    let records = edge.stored_records();
    assert_eq!(records.len(), 1, "{records:?}");
    let object = records[0].0.clone();
    // Stopped, the value is replaced by a V8-serialised string that is no record
    // ("zz"), and the object's alarm (kept in the object's own `_cf_METADATA`, row 1,
    // in nanoseconds) is brought forward to now: it fires as soon as the edge is up
    // again on the same storage.
    let due;
    let edge = {
        let state = edge.state.clone();
        drop(edge);
        const DAMAGED: &str = "FF0F22027A7A";
        sqlite(
            &object,
            &format!("UPDATE _cf_KV SET value = X'{DAMAGED}' WHERE key = 'record'"),
        );
        let alarm = sqlite(&object, "SELECT value FROM _cf_METADATA WHERE key = 1");
        assert!(
            alarm.trim().parse::<u64>().unwrap() > idem::now() * 1_000_000,
            "the object's alarm is set, in ns: {alarm:?}"
        );
        due = idem::now() * 1_000_000;
        sqlite(
            &object,
            &format!("UPDATE _cf_METADATA SET value = {due} WHERE key = 1"),
        );
        sqlite(
            &object.with_file_name("metadata.sqlite"),
            &format!("UPDATE _cf_ALARM SET scheduled_time = {}", due / 1_000_000),
        );
        Edge::launch_in(state, &origin.url(""), &[], |status| status == 200).await
    };
    // The alarm fires at start-up: wait until it has (the object's alarm moves on, or
    // the record is gone).
    let due_text = due.to_string();
    let fired_by = Instant::now() + Duration::from_secs(20);
    loop {
        let alarm = try_sqlite(&object, "SELECT value FROM _cf_METADATA WHERE key = 1");
        let moved = alarm.as_deref().map(str::trim).ok() != Some(due_text.as_str());
        if moved || Instant::now() > fired_by {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after_alarm: Vec<String> = edge.stored_records().into_iter().map(|r| r.2).collect();
    let retry = post(&http, &edge.base, "damaged-1", body, false).await;
    let retry_status = retry.status().as_u16();
    let retry_edge = retry.headers()["idem-edge"].to_str().unwrap().to_owned();
    let retry_replayed = retry.headers().get("idempotent-replayed").is_some();
    let after: Vec<String> = edge.stored_records().into_iter().map(|r| r.2).collect();
    let rearmed = edge
        .stored_records()
        .first()
        .map(|(object, ..)| sqlite(object, "SELECT value FROM _cf_METADATA WHERE key = 1"));
    let charges = ledger.len();
    report(
        "edge",
        &format!(
            "a damaged edge record: the stored value once its alarm fired: {after_alarm:?}; \
             the retry {retry_status} {retry_edge} (replayed by the origin: {retry_replayed}); \
             the value after it: {after:?}; the alarm now at {rearmed:?} ns; {charges} charge"
        ),
    );
    assert_eq!(after_alarm, ["FF0F22027A7A"], "the alarm did not delete it");
    let rearmed_ms = rearmed
        .as_deref()
        .and_then(|ns| ns.trim().parse::<u64>().ok())
        .map(|ns| ns / 1_000_000)
        .unwrap_or(0);
    let now = idem::now();
    assert!(
        rearmed_ms > now + 30 * 60_000 && rearmed_ms < now + 2 * 3_600_000,
        "the alarm fired and looks again in an hour: {rearmed:?}"
    );
    assert_eq!(
        (retry_status, retry_edge.as_str(), retry_replayed),
        (201, "degraded", true),
        "the origin answers a key the edge cannot read"
    );
    assert_eq!(after, ["FF0F22027A7A"], "neither overwritten nor deleted");
    assert_eq!(charges, 1);
}

/// An origin slower than the edge's lease: a retry past the lease takes the key over at
/// the edge and reaches the origin, which refuses it (409, its own lease is live) and
/// charges once; the first holder's late completion is fenced out at the edge, the key
/// is freed, and the next retry is replayed — by the origin, then by the edge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_origin_past_the_edge_lease_still_charges_once() {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let (origin, ledger) = TestOrigin::demo_on(store).await;
    let edge = Edge::start(&origin.url(""), &[("LEASE_MS", "1000")]).await;
    let http = client();
    let body = charge_body("cus-slow", 100, 5_000);
    let first = {
        let (http, base, body) = (http.clone(), edge.base.clone(), body.clone());
        tokio::spawn(async move { post(&http, &base, "slow-1", body, false).await })
    };
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let mut answers = Vec::new();
    let mut seen = |res: &reqwest::Response| {
        answers.push(format!(
            "{} {} {}",
            res.status().as_u16(),
            res.headers()["idem-edge"].to_str().unwrap(),
            res.headers()
                .get("idempotent-replayed")
                .map_or("first", |_| "replayed")
        ))
    };
    let past_lease = post(&http, &edge.base, "slow-1", body.clone(), false).await;
    seen(&past_lease);
    let first = first.await.unwrap();
    seen(&first);
    for _ in 0..2 {
        let retry = post(&http, &edge.base, "slow-1", body.clone(), false).await;
        seen(&retry);
    }
    let charges = ledger.len();
    report(
        "edge",
        &format!("an origin taking 5 s behind a 1 s edge lease: {answers:?}; {charges} charge"),
    );
    assert_eq!(
        answers,
        [
            "409 forwarded first",
            "201 forwarded first",
            "201 forwarded replayed",
            "201 replayed replayed"
        ]
    );
    assert_eq!(charges, 1);
}

/// The Python payments API, and `idem-origin --upstream` in front of it guarding
/// `/v1/*` for anonymous callers too, with `extra` flags.
async fn proxy_to_payments(extra: &[&str]) -> (idem_tests::Payments, TestOrigin) {
    let payments = idem_tests::Payments::start().await;
    let upstream = payments.url();
    let mut args = vec![
        "--upstream",
        upstream.as_str(),
        "--require-key-on",
        "/v1/*",
        "--anonymous",
        "scoped",
    ];
    if !extra.contains(&"--store") {
        args.extend_from_slice(&["--store", "memory"]);
    }
    args.extend_from_slice(extra);
    let origin = TestOrigin::start(&args).await;
    (payments, origin)
}

/// The whole chain, in front of an API that knows nothing about idempotency: the
/// worker under workerd → `idem-origin --upstream` → the Python payments API. 100 keys
/// × 8 concurrent retries through the edge: 100 rows in the upstream's own database,
/// every retry answered at the edge, then replayed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_edge_and_the_proxy_charge_once_in_front_of_any_api() {
    let (payments, origin) = proxy_to_payments(&[]).await;
    let edge = Edge::start(&origin.url(""), &[("LEASE_MS", "60000")]).await;
    let http = client();
    let race = race_through_edge(&http, &edge.base, "chain-", "cus-c", 200).await;
    let charges = payments.count("SELECT count(*) FROM charges");
    let keys = payments.count("SELECT count(DISTINCT idempotency_key) FROM charges");
    let calls = payments.count("SELECT count(*) FROM calls");
    let mut replays = BTreeMap::new();
    for i in 0..KEYS {
        let res = post(
            &http,
            &edge.base,
            &format!("chain-{i}"),
            charge_body(&format!("cus-c{i}"), 100, 200),
            false,
        )
        .await;
        tally(&mut replays, &res);
    }
    let calls_after = payments.count("SELECT count(*) FROM calls");
    report(
        "edge",
        &format!(
            "edge -> idem-origin --upstream -> Python payments API, {KEYS} keys x {RETRIES} retries: \
             answers {race:?}; the upstream's database: {charges} charges for {keys} keys, {calls} calls; \
             retries after: {replays:?}, calls then {calls_after}"
        ),
    );
    assert_eq!(charges, KEYS as i64, "one charge per key: {race:?}");
    assert_eq!(keys, KEYS as i64);
    assert_eq!(calls, KEYS as i64, "the upstream saw each key once");
    let EdgeShare {
        forwarded,
        at_edge,
        runtime_own,
    } = EdgeShare::of(&race);
    assert!(forwarded <= KEYS, "{race:?}");
    assert_eq!(
        forwarded + at_edge + runtime_own,
        KEYS * RETRIES,
        "{race:?}"
    );
    assert!(at_edge >= KEYS * (RETRIES - 1) / 2, "{race:?}");
    assert_eq!(
        replays.get("201 replayed").copied(),
        Some(KEYS),
        "every retry replayed by the edge: {replays:?}"
    );
    assert_eq!(calls_after, calls, "replays never reach the upstream");
}

/// The edge keeps the headers the origin stored, not a list of its own: behind
/// `idem-origin --upstream … --replay-set-cookie`, a retry replayed at the edge carries
/// the upstream's two `Set-Cookie` values, as a retry sent straight to the origin does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_replays_the_headers_the_origin_stored() {
    let (payments, origin) = proxy_to_payments(&["--replay-set-cookie"]).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    let cookies = |res: &reqwest::Response| -> Vec<String> {
        res.headers()
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    let mut seen = Vec::new();
    for (label, base) in [
        ("first, through the edge", &edge.base),
        ("retry at the edge", &edge.base),
        ("retry at the origin", &origin.url("")),
    ] {
        let res = post(
            &http,
            base,
            "cookie-1",
            charge_body("cus-cookie", 100, 0),
            false,
        )
        .await;
        let from = handled_by(&res);
        let private = ["idem-disposition", "idem-stored-headers"]
            .iter()
            .filter(|h| res.headers().contains_key(**h) && base == &edge.base)
            .count();
        seen.push((label, res.status().as_u16(), from, cookies(&res), private));
    }
    let charges = payments.count("SELECT count(*) FROM charges");
    report(
        "edge",
        &format!(
            "--replay-set-cookie behind the edge: {seen:?} (label, status, idem-edge, Set-Cookie, idem's private headers shown); {charges} charge"
        ),
    );
    let want = vec!["seen=1".to_owned(), "lang=en".to_owned()];
    assert_eq!(
        (seen[0].1, seen[0].3.clone()),
        (201, want.clone()),
        "{seen:?}"
    );
    assert_eq!(
        seen[1].2, "replayed",
        "the retry is answered at the edge: {seen:?}"
    );
    assert_eq!(
        seen[1].3, want,
        "the edge's replay carries the stored Set-Cookie: {seen:?}"
    );
    assert_eq!(seen[2].3, want, "as the origin's does: {seen:?}");
    assert!(
        seen.iter().all(|s| s.4 == 0),
        "no private header reaches the client: {seen:?}"
    );
    assert_eq!(charges, 1);
}

/// The edge scopes as the origin does (the same core rule): by a verified JWT's `sub`,
/// a refreshed token's retry is replayed at the edge — behind an origin that scopes by
/// the token's value, where it would charge again; no identity, or a token that does
/// not verify, is refused there and never reaches the origin.
/// An identity provider's tokens at the edge: the JWKS written as a table in
/// wrangler's [vars] (the worker reads it as JSON), with its issuer and audience. One
/// principal's RS256 token, then its refreshed ES256 token, are one caller — the second
/// replayed at the edge, one charge; another issuer's token and an altered one are
/// refused there, and never forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_scopes_by_an_identity_provider_s_tokens() {
    use idem_core::contract::{Anonymous, JwtKeys, JwtVerifier, ScopeRule, ScopeSource};
    use idem_tests::scope_vectors::{authorization as token, document};
    let vectors = document();
    // JSON as a TOML inline table.
    fn inline(v: &serde_json::Value) -> String {
        match v {
            serde_json::Value::Object(m) => {
                let members: Vec<String> = m
                    .iter()
                    .map(|(k, v)| format!("{k} = {}", inline(v)))
                    .collect();
                format!("{{ {} }}", members.join(", "))
            }
            serde_json::Value::Array(a) => {
                format!("[{}]", a.iter().map(inline).collect::<Vec<_>>().join(", "))
            }
            other => other.to_string(),
        }
    }
    let jwks = format!("{UNQUOTED}{}", inline(&vectors["jwks"]));
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let keys = JwtKeys::either(None, Some(vectors["jwks"].to_string().as_bytes()))
        .unwrap()
        .unwrap();
    let jwt = JwtVerifier::new(keys, Some("https://id.example"), Some("payments")).unwrap();
    let rule = ScopeRule {
        source: ScopeSource::parse("jwt:sub", Some(jwt)).unwrap(),
        anonymous: Anonymous::Refused,
    };
    let (origin, ledger) = TestOrigin::demo_scoped(store, rule).await;
    let edge = Edge::start(
        &origin.url(""),
        &[
            ("SCOPE_FROM", "jwt:sub"),
            ("JWKS", &jwks),
            ("JWT_ISSUER", "https://id.example"),
            ("JWT_AUDIENCE", "payments"),
            ("ANONYMOUS", "refused"),
        ],
    )
    .await;
    let http = client();
    let mut seen = Vec::new();
    for name in [
        "jwks rs256",
        "jwks es256, refreshed",
        "jwks another issuer",
        "jwks rs256 payload changed",
    ] {
        let res = http
            .post(format!("{}/v1/charges", edge.base))
            .header("idempotency-key", "jwks-edge-1")
            .header("content-type", "application/json")
            .header("authorization", token(name))
            .body(charge_body("cus_1", 100, 0))
            .send()
            .await
            .unwrap();
        let edge_did = res.headers()["idem-edge"].to_str().unwrap().to_owned();
        let status = res.status().as_u16();
        let body: serde_json::Value = res.json().await.unwrap_or_default();
        let kind = body["type"].as_str().unwrap_or("-").to_owned();
        seen.push(format!("{status} {edge_did} {kind}"));
    }
    let charges = ledger.len();
    report(
        "edge",
        &format!("JWKS (a [vars] table) at the edge: {seen:?}; {charges} charge"),
    );
    assert_eq!(
        seen,
        [
            "201 forwarded -",
            "201 replayed -",
            "401 refused https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-invalid",
            "401 refused https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-invalid",
        ]
    );
    assert_eq!(charges, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_scopes_by_a_verified_jwt_claim() {
    use idem_core::contract::scope::sign_hs256;
    use idem_core::contract::{Anonymous, JwtKeys, JwtVerifier, ScopeRule, ScopeSource};
    const SECRET: &str = "the gateway's HS256 secret, 32 bytes or more";
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    // The origin scopes as the edge does: else it names other records, and the edge
    // keeps none of its answers.
    let jwt = JwtVerifier::new(JwtKeys::Hs256(SECRET.as_bytes().to_vec()), None, None).unwrap();
    let rule = ScopeRule {
        source: ScopeSource::parse("jwt:sub", Some(jwt)).unwrap(),
        anonymous: Anonymous::Refused,
    };
    let (origin, ledger) = TestOrigin::demo_scoped(store, rule).await;
    let edge = Edge::start(
        &origin.url(""),
        &[
            ("SCOPE_FROM", "jwt:sub"),
            ("JWT_SECRET", SECRET),
            ("ANONYMOUS", "refused"),
        ],
    )
    .await;
    let http = client();
    let send = |auth: Option<String>| {
        let (http, base) = (http.clone(), edge.base.clone());
        async move {
            let mut req = http
                .post(format!("{base}/v1/charges"))
                .header("idempotency-key", "jwt-edge-1")
                .header("content-type", "application/json")
                .body(charge_body("cus_1", 100, 0));
            if let Some(auth) = auth {
                req = req.header("authorization", auth);
            }
            let res = req.send().await.unwrap();
            let edge_did = res.headers()["idem-edge"].to_str().unwrap().to_owned();
            let status = res.status().as_u16();
            let body: serde_json::Value = res.json().await.unwrap_or_default();
            let kind = body["type"].as_str().unwrap_or("-").to_owned();
            format!("{status} {edge_did} {kind}")
        }
    };
    let token = |iat: u64| {
        format!(
            "Bearer {}",
            sign_hs256(
                &format!(r#"{{"sub":"cus_1","iat":{iat},"exp":4102444800}}"#),
                SECRET.as_bytes()
            )
        )
    };
    let first = send(Some(token(1))).await;
    let refreshed = send(Some(token(2))).await;
    let forged = send(Some(format!(
        "Bearer {}",
        sign_hs256(r#"{"sub":"cus_1"}"#, b"not the secret")
    )))
    .await;
    let nobody = send(None).await;
    let charges = ledger.len();
    report(
        "edge",
        &format!("SCOPE_FROM=jwt:sub at the edge: first {first}, refreshed token {refreshed}, forged {forged}, none {nobody}; {charges} charge"),
    );
    assert_eq!(first, "201 forwarded -");
    assert_eq!(refreshed, "201 replayed -", "the same caller at the edge");
    assert_eq!(
        forged,
        "401 refused https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-invalid"
    );
    assert_eq!(
        nobody,
        "401 refused https://github.com/idem-rs/idem/blob/main/docs/problems.md#identity-missing"
    );
    assert_eq!(charges, 1);
}

/// An idem origin whose charge answers `status` with no body, counting its executions.
async fn origin_answering_without_a_body(
    status: http::StatusCode,
) -> (TestOrigin, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let layer = idem::IdempotencyLayer::new(store.clone())
        .scope_rule(idem_core::contract::ScopeRule::by_authorization(
            idem_core::contract::Anonymous::Scoped,
        ))
        .require_key_on(["/v1/charges"])
        .edge_secret(idem_tests::EDGE_SECRET)
        .unwrap();
    let app = axum::Router::new()
        .route(
            "/v1/charges",
            axum::routing::post(move || {
                r.fetch_add(1, Ordering::SeqCst);
                async move { status }
            }),
        )
        .layer(layer)
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    (TestOrigin::serve_router(app, store).await, runs)
}

/// Answers whose status forbids a body (204, 205, 304): the edge forwards the first and
/// replays its retry from its own record with the same status, executing once — the
/// runtime refuses to build such a response with a body, even an empty one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_replays_answers_that_have_no_body() {
    use std::sync::atomic::Ordering;
    let http = client();
    let mut seen = Vec::new();
    for status in [204u16, 205, 304] {
        let (origin, runs) =
            origin_answering_without_a_body(http::StatusCode::from_u16(status).unwrap()).await;
        let edge = Edge::start(&origin.url(""), &[]).await;
        let key = format!("bodiless-{status}");
        let mut answers = Vec::new();
        for _ in 0..2 {
            let res = post(&http, &edge.base, &key, charge_body("c", 1, 0), false).await;
            let from = handled_by(&res);
            let code = res.status().as_u16();
            let body = res.bytes().await.map(|b| b.len()).unwrap_or(usize::MAX);
            answers.push((code, from, body));
        }
        seen.push((status, answers, runs.load(Ordering::SeqCst)));
    }
    report(
        "edge",
        &format!("answers without a body through the edge (status, [(status, idem-edge, body bytes)] first then retry, executions): {seen:?}"),
    );
    for (status, answers, runs) in &seen {
        assert_eq!(
            answers[0].0, *status,
            "the first attempt gets the origin's answer: {seen:?}"
        );
        assert_eq!(
            (answers[1].0, answers[1].1.as_str(), answers[1].2),
            (*status, "replayed", 0),
            "the retry is replayed at the edge with the same status: {seen:?}"
        );
        assert_eq!(*runs, 1, "executed once: {seen:?}");
    }
}

/// An answer whose status the edge's runtime cannot send (HTTP's final statuses are
/// 200-599; hyper, the origin's server, sends any three digits): before the fix the
/// worker threw building it and hung — a 500 "your Worker's code had hung" for the
/// first attempt and for every retry of the key. Now each gets a final problem saying
/// so; the origin executed once, and the edge goes on answering other keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_answers_an_origin_status_it_cannot_send_with_a_problem() {
    use std::sync::atomic::Ordering;
    let http = client();
    let mut seen = Vec::new();
    for status in [600u16, 999] {
        let (origin, runs) =
            origin_answering_without_a_body(http::StatusCode::from_u16(status).unwrap()).await;
        let edge = Edge::start(&origin.url(""), &[]).await;
        let key = format!("status-{status}");
        let mut answers = Vec::new();
        for _ in 0..2 {
            let res = post(&http, &edge.base, &key, charge_body("c", 1, 0), false).await;
            let from = handled_by(&res);
            let code = res.status().as_u16();
            let body = res.text().await.unwrap_or_default();
            let kind = serde_json::from_str::<serde_json::Value>(&body)
                .map(|v| v["type"].as_str().unwrap_or("").to_owned())
                .unwrap_or_else(|_| body.chars().take(80).collect());
            answers.push((code, from, kind));
        }
        let direct = post(&http, &origin.url(""), &key, charge_body("c", 1, 0), false).await;
        let other = post(&http, &edge.base, "another", charge_body("c", 1, 0), false).await;
        seen.push((
            status,
            answers,
            direct.status().as_u16(),
            other.status().as_u16(),
            runs.load(Ordering::SeqCst),
        ));
    }
    report(
        "edge",
        &format!("origin statuses the edge cannot send (status, [(status, idem-edge, problem)] first then retry, at the origin, another key at the edge, executions): {seen:?}"),
    );
    for (status, answers, direct, other, runs) in &seen {
        for answer in answers {
            assert_eq!(
                (answer.0, answer.2.as_str()),
                (
                    502,
                    "https://github.com/idem-rs/idem/blob/main/docs/problems.md#handler-failed"
                ),
                "a final problem, not a hung worker: {seen:?}"
            );
        }
        assert_eq!(*direct, *status, "the origin replays its answer: {seen:?}");
        assert_eq!(
            *other, 502,
            "the edge goes on answering (not hung): {seen:?}"
        );
        assert_eq!(*runs, 2, "one execution per key: {seen:?}");
    }
}

/// An edge scoped otherwise than its origin: `idem-origin --upstream … --scope-from
/// header:x-api-key` (README's proxy quick start) behind the repository's wrangler.toml
/// (`SCOPE_FROM = "authorization"`, anonymous callers scoped). Tenants `a` and `b` send
/// the same key and body with their own API key and no `Authorization`: the edge puts
/// both in one record, the origin in two. The origin names the record it stored each
/// answer in, so the edge keeps neither, and tenant `b` is charged on its own — never
/// replayed tenant `a`'s charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_scoped_otherwise_than_its_origin_never_replays_another_tenant_s_answer() {
    let (payments, origin) = proxy_to_payments(&["--scope-from", "header:x-api-key"]).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    let charge = |tenant: &'static str| {
        let req = http
            .post(format!("{}/v1/charges", edge.base))
            .header("idempotency-key", "tenants-1")
            .header("content-type", "application/json")
            .header("x-api-key", tenant)
            .body(charge_body("cus-t", 100, 0));
        async move {
            let res = req.send().await.expect("the edge answers");
            let handled = handled_by(&res);
            let replayed = res.headers().contains_key("idempotent-replayed");
            let status = res.status().as_u16();
            let body: serde_json::Value = res.json().await.unwrap_or_default();
            (
                status,
                replayed,
                handled,
                body["id"].as_str().unwrap_or("").to_owned(),
            )
        }
    };
    let a = charge("tenant-a").await;
    let a_again = charge("tenant-a").await;
    let b = charge("tenant-b").await;
    let b_again = charge("tenant-b").await;
    let charges = payments.charges_for("tenants-1");
    report(
        "edge",
        &format!(
            "edge SCOPE_FROM=authorization, origin --scope-from header:x-api-key, one key and body from tenants a and b: \
             a {a:?}, a again {a_again:?}, b {b:?}, b again {b_again:?}; the upstream made {charges} charges"
        ),
    );
    assert_eq!((a.0, a.1), (201, false), "{a:?}");
    assert_eq!(
        (b.0, b.1),
        (201, false),
        "tenant b was answered with tenant a's charge: {b:?}"
    );
    assert_ne!(b.3, a.3, "tenant b got tenant a's charge");
    assert_eq!(charges, 2, "one charge per tenant");
    assert_eq!(
        a.2, "forwarded; other-record",
        "the edge kept nothing: {a:?}"
    );
    for (again, first) in [(&a_again, &a), (&b_again, &b)] {
        assert_eq!(
            (again.0, again.1, &again.3),
            (201, true, &first.3),
            "each tenant's retry replays its own charge, from the origin"
        );
        assert_eq!(again.2, "forwarded; other-record", "{again:?}");
    }
    proof::record(
        "faults",
        "edge-other-scope",
        &[&format!("each tenant charged once ({charges} charges), each replayed its own from the origin; the edge kept neither (`forwarded; other-record`)")],
    );
}

/// The demo charges API behind the layer on a memory store, scoped by `Authorization`
/// (anonymous callers scoped), telling the edge what it stored, with `configure`'s
/// settings: the origin and the ledger of its charges.
async fn demo_origin_with(
    configure: impl FnOnce(idem::IdempotencyLayer) -> idem::IdempotencyLayer,
) -> (TestOrigin, Arc<idem_origin::charges::MemoryLedger>) {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let ledger = Arc::new(idem_origin::charges::MemoryLedger::default());
    let layer = idem::IdempotencyLayer::new(store.clone()).scope_rule(
        idem_core::contract::ScopeRule::by_authorization(idem_core::contract::Anonymous::Scoped),
    );
    let layer = configure(layer)
        .edge_secret(idem_tests::EDGE_SECRET)
        .unwrap();
    let demo = idem_origin::charges::Demo::new(ledger.clone());
    let router = idem_origin::app::router(layer, store.clone(), demo);
    (TestOrigin::serve_router(router, store).await, ledger)
}

/// The fingerprint rule of the tests below: all of the body but the demo's latency.
fn all_but_latency() -> idem_core::FingerprintRule {
    idem_core::FingerprintRule::new(&[] as &[&str], &["/simulate_latency_ms"], &[] as &[&str])
        .unwrap()
}

/// An origin whose route leaves a field out of its fingerprint, behind an edge that
/// fingerprints whole requests: the edge keeps nothing of its answers (the origin says
/// under which fingerprint it stored them, and it is not the edge's), so a retry with
/// another value there reaches the origin and gets the charge — where a copy kept at the
/// edge would refuse it with 422. A change to a kept field is still 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_keeps_nothing_of_an_origin_that_fingerprints_otherwise() {
    let (origin, ledger) = demo_origin_with(|l| l.fingerprint_rule(all_but_latency())).await;
    let edge = Edge::start(&origin.url(""), &[]).await;
    let http = client();
    // The demo refuses unknown fields: the field its retries change is the latency.
    let body = |amount: i64, varied: u64| charge_body("c", amount, varied);
    let mut seen = Vec::new();
    for (amount, varied) in [(300, 0), (300, 1), (300, 2), (301, 3)] {
        let res = post(&http, &edge.base, "fp-edge-1", body(amount, varied), false).await;
        seen.push((
            res.status().as_u16(),
            res.headers().contains_key("idempotent-replayed"),
            res.headers()["idem-edge"].to_str().unwrap().to_owned(),
        ));
    }
    let charges = ledger.count_for_key("fp-edge-1");
    // While the first attempt runs (1.5 s), a retry that differs only in the field left
    // out meets the edge's claim: the origin decides (it waits, then replays), where the
    // edge alone refused it with 422.
    let slow = {
        let (http, base) = (http.clone(), edge.base.clone());
        tokio::spawn(async move { post(&http, &base, "fp-edge-2", body(300, 1_500), false).await })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let in_flight = post(&http, &edge.base, "fp-edge-2", body(300, 0), true).await;
    let in_flight = (
        in_flight.status().as_u16(),
        in_flight.headers().contains_key("idempotent-replayed"),
    );
    let slow = slow.await.unwrap().status().as_u16();
    let in_flight_charges = ledger.count_for_key("fp-edge-2");
    report(
        "edge",
        &format!(
            "an origin fingerprinting all but /simulate_latency_ms, behind the edge: first, \
             two retries with other values of it, another amount: {seen:?}; {charges} charge; \
             a retry while the first runs (Prefer: wait): {in_flight:?}, the first {slow}, \
             {in_flight_charges} charge"
        ),
    );
    assert_eq!(
        (slow, in_flight, in_flight_charges),
        (201, (201, true), 1),
        "the retry in flight waited for the first and got its answer"
    );
    let other = "forwarded; other-fingerprint".to_owned();
    assert_eq!(
        seen,
        [
            (201, false, other.clone()),
            (201, true, other.clone()),
            (201, true, other),
            (422, false, "forwarded".to_owned()),
        ]
    );
    assert_eq!(charges, 1);
}

/// An edge given its origin's fingerprint rule and key header (`FINGERPRINT_EXCEPT`,
/// `KEY_HEADER`, as the origin's route has them) applies them itself: retries that
/// differ only in the field left out are replayed at the edge, a change to a kept field
/// is refused there (422), and a key sent in `Idempotency-Key`, which the route does not
/// read, is refused at the edge as at the origin. Without the vars (the test above) the
/// edge keeps nothing and every retry goes to the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_with_its_origin_s_fingerprint_rule_and_key_header_replays_at_the_edge() {
    let (origin, ledger) = demo_origin_with(|l| {
        l.key_headers(idem_core::contract::KeyHeaders::new(["x-idempotency-key"]).unwrap())
            .fingerprint_rule(all_but_latency())
    })
    .await;
    let edge = Edge::start(
        &origin.url(""),
        &[
            ("FINGERPRINT_EXCEPT", "/simulate_latency_ms"),
            ("KEY_HEADER", "X-Idempotency-Key"),
        ],
    )
    .await;
    let http = client();
    let body = |amount: i64, varied: u64| charge_body("c", amount, varied);
    let mut seen = Vec::new();
    for (amount, varied) in [(300, 0), (300, 1), (300, 2), (301, 3)] {
        let res = post_keyed(
            &http,
            &edge.base,
            "x-idempotency-key",
            "fp-rule-1",
            body(amount, varied),
            false,
        )
        .await;
        seen.push((
            res.status().as_u16(),
            res.headers().contains_key("idempotent-replayed"),
            handled_by(&res),
        ));
    }
    let standard = post(&http, &edge.base, "fp-rule-2", body(300, 0), false).await;
    let standard = (
        standard.status().as_u16(),
        handled_by(&standard),
        standard.text().await.unwrap(),
    );
    let charges = (
        ledger.count_for_key("fp-rule-1"),
        ledger.count_for_key("fp-rule-2"),
    );
    report(
        "edge",
        &format!(
            "an edge and origin both fingerprinting all but /simulate_latency_ms, keys in \
             X-Idempotency-Key: first, two retries with other values of it, another amount: \
             {seen:?}; {charges:?} charges; a key in Idempotency-Key: {} {}",
            standard.0, standard.1
        ),
    );
    assert_eq!(
        seen,
        [
            (201, false, "forwarded".to_owned()),
            (201, true, "replayed".to_owned()),
            (201, true, "replayed".to_owned()),
            (422, false, "refused".to_owned()),
        ],
        "the edge answered the retries itself"
    );
    assert_eq!(
        (standard.0, standard.1.as_str()),
        (400, "refused"),
        "{}",
        standard.2
    );
    assert!(
        standard.2.contains("idempotency-key-header-not-read"),
        "{}",
        standard.2
    );
    assert_eq!(charges, (1, 0));
}

/// An edge that reads the key from other headers than the origin's route keeps
/// nothing of the route's answers: the record key is the key's value alone, so the
/// same value in another header would be another request there. Before the origin
/// named its key headers in the record tag, the second request below — a new key in
/// the route's header, the first key's value in the edge's — was answered with the
/// first request's stored answer at the edge, and never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_reading_the_key_from_other_headers_than_the_route_keeps_nothing() {
    let (origin, ledger) = demo_origin_with(|l| {
        l.key_headers(idem_core::contract::KeyHeaders::new(["x-idempotency-key"]).unwrap())
    })
    .await;
    let edge = Edge::start(&origin.url(""), &[("KEY_HEADER", "paypal-request-id")]).await;
    let http = client();
    let send = |route_key: &'static str, edge_key: &'static str| {
        let (http, base) = (http.clone(), edge.base.clone());
        async move {
            let res = http
                .post(format!("{base}/v1/charges"))
                .header("x-idempotency-key", route_key)
                .header("paypal-request-id", edge_key)
                .header("content-type", "application/json")
                .body(charge_body("c", 500, 0))
                .send()
                .await
                .unwrap();
            (res.status().as_u16(), handled_by(&res))
        }
    };
    let first = send("pp-k", "pp-k").await;
    let second = send("pp-j", "pp-k").await;
    let charges = (ledger.count_for_key("pp-k"), ledger.count_for_key("pp-j"));
    report(
        "edge",
        &format!(
            "origin route reading X-Idempotency-Key, edge KEY_HEADER=PayPal-Request-Id: a \
             request with k in both {first:?}, then j in the route's header and k in the \
             edge's {second:?}; charges (k, j) {charges:?}"
        ),
    );
    assert_eq!(first, (201, "forwarded; other-record".to_owned()));
    assert_eq!(
        second,
        (201, "forwarded; other-record".to_owned()),
        "the edge replayed k's answer to a request the origin runs as j"
    );
    assert_eq!(charges, (1, 1), "each key ran once, at the origin");
}

/// With `CORS_ORIGINS`, a page of a listed origin can read the edge's own replay (and
/// the headers it carries); another origin's page cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_a_listed_origin_reads_the_edge_s_replay() {
    let store: Arc<dyn idem::Store> = Arc::new(idem::MemoryStore::new());
    let (origin, ledger) = TestOrigin::demo_on(store).await;
    let app = "https://app.example";
    let edge = Edge::start(&origin.url(""), &[("CORS_ORIGINS", app)]).await;
    let http = client();
    let mut seen = Vec::new();
    for from in [app, app, "https://evil.example"] {
        let res = http
            .post(format!("{}/v1/charges", edge.base))
            .header("idempotency-key", "cors-edge-1")
            .header("content-type", "application/json")
            .header("origin", from)
            .body(charge_body("c", 1, 0))
            .send()
            .await
            .unwrap();
        let header = |name: &str| {
            res.headers()
                .get(name)
                .map_or(String::new(), |v| v.to_str().unwrap().to_owned())
        };
        seen.push((
            header("idem-edge"),
            header("access-control-allow-origin"),
            header("access-control-expose-headers").contains("location"),
        ));
    }
    report(
        "edge",
        &format!("CORS_ORIGINS={app}: first, replay, replay to another origin: {seen:?}"),
    );
    assert_eq!(ledger.count_for_key("cors-edge-1"), 1);
    assert_eq!(
        seen,
        [
            ("forwarded".to_owned(), String::new(), false),
            ("replayed".to_owned(), app.to_owned(), true),
            ("replayed".to_owned(), String::new(), false),
        ]
    );
}
