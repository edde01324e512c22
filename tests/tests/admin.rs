//! The admin API through real `idem-origin` processes: who may use it, a purge on one
//! replica reaching another replica's replay cache (measured), an attempt orphaned by
//! `kill -9` listed and purged, and the CLI over the same API. Charges are counted in
//! the demo's `charges` table.

use idem_tests::procs::free_port;
use idem_tests::{charge_body, client, proof, report, OriginProcess, TestDb};
use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const TOKEN: &str = "0123456789abcdef-on-call";

/// A token file for operator `oncall`.
fn token_file(label: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/idem-reports");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("admin-{label}-{}.tokens", std::process::id()));
    std::fs::write(&path, format!("# test\noncall:{TOKEN}\n")).unwrap();
    path
}

/// A replica with the admin API on: its API's and its admin listener's base URLs.
struct Replica {
    child: Child,
    url: String,
    admin: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn replica(store_args: &[String], tokens: &std::path::Path) -> Replica {
    replica_env(store_args, tokens, &[]).await
}

async fn replica_env(
    store_args: &[String],
    tokens: &std::path::Path,
    env: &[(&str, &str)],
) -> Replica {
    let tokens = tokens.to_str().unwrap();
    // A free port may be taken by a test running beside this one before the origin
    // binds it: then it exits at start-up, and another pair of ports is tried.
    let mut last = String::new();
    for _ in 0..3 {
        let admin = format!("127.0.0.1:{}", free_port());
        let mut args: Vec<&str> = store_args.iter().map(String::as_str).collect();
        args.extend(["--admin-listen", &admin, "--admin-token-file", tokens]);
        match OriginProcess::try_spawn_at(free_port(), &args, env).await {
            Ok((child, url)) => {
                return Replica {
                    child,
                    url,
                    admin: format!("http://{admin}"),
                }
            }
            Err(e) => last = e,
        }
    }
    panic!("the replica did not start: {last}")
}

/// POSTs a charge: (status, replayed, charge id).
async fn charge(base: &str, key: &str, latency_ms: u64) -> (u16, bool, String) {
    let res = client()
        .post(format!("{base}/v1/charges"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("authorization", "Bearer customer-1")
        .body(charge_body("cus-admin", 100, latency_ms))
        .send()
        .await
        .expect("origin answers");
    let status = res.status().as_u16();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let body: serde_json::Value = res.json().await.unwrap_or_default();
    (
        status,
        replayed,
        body["id"].as_str().unwrap_or("").to_owned(),
    )
}

/// An admin request: (status, JSON body).
async fn admin(method: &str, url: &str, token: Option<&str>) -> (u16, serde_json::Value) {
    let mut req = client().request(method.parse().unwrap(), url);
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let res = req.send().await.expect("admin API answers");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or_default())
}

/// The record key of `key` for the test's caller, from the admin API.
async fn record_key(r: &Replica, key: &str) -> String {
    let res = client()
        .get(format!(
            "{}/admin/v1/records?key={key}&scope=authorization",
            r.admin
        ))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("idem-admin-identity", "Bearer customer-1")
        .send()
        .await
        .expect("admin API answers");
    let status = res.status().as_u16();
    let body: serde_json::Value = res.json().await.unwrap_or_default();
    assert_eq!(status, 200, "{body}");
    body["record"]["record_key"].as_str().unwrap().to_owned()
}

/// `idem_replay_cache_hits_total` on a replica's /metrics.
async fn cache_hits(r: &Replica) -> f64 {
    let text = client()
        .get(format!("{}/metrics", r.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("idem_replay_cache_hits_total "))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

fn postgres_args(db: &TestDb) -> Vec<String> {
    ["--store", "postgres", "--database-url", &db.url]
        .map(String::from)
        .to_vec()
}

fn redis_cluster_args(db: &TestDb, label: &str) -> Vec<String> {
    [
        "--store".into(),
        "redis".into(),
        "--redis-url".into(),
        idem_tests::redis_cluster_urls(),
        "--redis-namespace".into(),
        idem_tests::unique_namespace(label),
        "--database-url".into(),
        db.url.clone(),
    ]
    .to_vec()
}

fn tiered_args(db: &TestDb, label: &str, durability: &str) -> Vec<String> {
    [
        "--store".into(),
        "tiered".into(),
        "--durability".into(),
        durability.into(),
        "--redis-url".into(),
        idem_tests::redis_url(),
        "--redis-namespace".into(),
        idem_tests::unique_namespace(label),
        "--database-url".into(),
        db.url.clone(),
    ]
    .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_wrong_admin_token_is_refused_and_changes_nothing() {
    let db = TestDb::new("admin_auth").await;
    let tokens = token_file("auth");
    let mut args = postgres_args(&db);
    args.push("--metrics-on-admin".into());
    let r = replica(&args, &tokens).await;
    // /metrics moved to the admin listener (unauthenticated there, as it was).
    let moved = client()
        .get(format!("{}/metrics", r.url))
        .send()
        .await
        .unwrap();
    assert_eq!(moved.status().as_u16(), 404);
    let metrics = client()
        .get(format!("{}/metrics", r.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status().as_u16(), 200);
    assert!(metrics.text().await.unwrap().contains("idem_build_info"));
    let (status, _, id) = charge(&r.url, "auth-1", 0).await;
    assert_eq!(status, 201);
    let key = record_key(&r, "auth-1").await;
    let url = format!("{}/admin/v1/records/{key}?force=true", r.admin);

    let (status, body) = admin("DELETE", &url, None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        body["type"],
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#admin-unauthenticated"
    );
    let res = client().delete(&url).send().await.unwrap();
    assert_eq!(
        res.headers()["www-authenticate"],
        "Bearer realm=\"idem-admin\""
    );
    // Two wrong tokens are forbidden; `Bearer ` with nothing after it presents none.
    let mut refusals = Vec::new();
    for wrong in [&TOKEN[..TOKEN.len() - 1], "0123456789abcdef-on-calm", ""] {
        let (status, body) = admin("DELETE", &url, Some(wrong)).await;
        refusals.push((status, body["type"].as_str().unwrap_or("").to_owned()));
    }
    assert_eq!(
        refusals,
        [
            (
                403,
                "https://github.com/idem-rs/idem/blob/main/docs/problems.md#admin-forbidden"
                    .to_owned()
            ),
            (
                403,
                "https://github.com/idem-rs/idem/blob/main/docs/problems.md#admin-forbidden"
                    .to_owned()
            ),
            (
                401,
                "https://github.com/idem-rs/idem/blob/main/docs/problems.md#admin-unauthenticated"
                    .to_owned()
            ),
        ]
    );
    let (status, _) = admin(
        "GET",
        &format!("{}/admin/v1/in-progress", r.admin),
        Some("x"),
    )
    .await;
    assert_eq!(status, 403);

    // Nothing changed: the record is there and the retry replays the first charge.
    let (status, body) = admin(
        "GET",
        &format!("{}/admin/v1/records/{key}", r.admin),
        Some(TOKEN),
    )
    .await;
    assert_eq!(
        (status, body["record"]["state"].as_str()),
        (200, Some("completed"))
    );
    let (status, replayed, again) = charge(&r.url, "auth-1", 0).await;
    assert_eq!((status, replayed, again), (201, true, id));
    assert_eq!(db.charges_for("auth-1").await, 1);

    // Bad input is a problem, and changes nothing either.
    let seen = body["record"]["token"]
        .as_u64()
        .expect("a listing shows the token");
    let mut refused = 0;
    for (path, method) in [
        ("/admin/v1/records/not-a-key", "GET"),
        ("/admin/v1/records/not-a-key", "DELETE"),
        ("/admin/v1/in-progress?older_than=5x", "GET"),
        ("/admin/v1/in-progress?limit=0", "GET"),
        ("/admin/v1/in-progress?cursor=%00", "GET"),
        // Not a record key: Postgres's cursors are.
        ("/admin/v1/in-progress?cursor=zz", "GET"),
        ("/admin/v1/records?key=auth-1&scope=cookie", "GET"),
        // A customer's credential in a query string, which access logs keep: refused,
        // and not echoed.
        (
            "/admin/v1/records?key=auth-1&scope=authorization&identity=Bearer%20customer-1",
            "GET",
        ),
        ("/admin/v1/records?key=auth-1", "GET"),
        (&format!("/admin/v1/records/{key}?force=maybe"), "DELETE"),
        (&format!("/admin/v1/records/{key}?force="), "DELETE"),
        (&format!("/admin/v1/records/{key}?forse=true"), "DELETE"),
        (
            &format!("/admin/v1/records/{key}?token=abc&state=in_progress"),
            "DELETE",
        ),
        (&format!("/admin/v1/records/{key}?token=5"), "DELETE"),
        (
            &format!("/admin/v1/records/{key}?token=5&state=done"),
            "DELETE",
        ),
        // The record's own token, but not as a listing writes it, or given twice: either
        // would name this very record and purge it.
        (
            &format!("/admin/v1/records/{key}?token=%2B{seen}&state=completed"),
            "DELETE",
        ),
        (
            &format!("/admin/v1/records/{key}?token=1&token={seen}&state=completed"),
            "DELETE",
        ),
        (
            &format!("/admin/v1/records/{key}?force=false&force=true"),
            "DELETE",
        ),
    ] {
        let (status, body) = admin(method, &format!("{}{path}", r.admin), Some(TOKEN)).await;
        assert_eq!(status, 400, "{method} {path}: {body}");
        assert!(
            !body.to_string().contains("customer-1"),
            "the identity was echoed: {body}"
        );
        refused += 1;
        assert!(body["type"]
            .as_str()
            .unwrap()
            .starts_with("https://github.com/idem-rs/idem/blob/main/docs/problems.md#admin-"));
    }
    let (status, replayed, _) = charge(&r.url, "auth-1", 0).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(db.charges_for("auth-1").await, 1);

    // Guessing tokens: past 10 failures in a minute, the peer is refused (429) — its
    // right token too — and another peer is not.
    let listing = format!("{}/admin/v1/in-progress", r.admin);
    let mut guesses = BTreeMap::new();
    for n in 0..12 {
        let (status, _) = admin("GET", &listing, Some(&format!("guess-{n:016}"))).await;
        *guesses.entry(status).or_insert(0) += 1;
    }
    let res = client()
        .get(&listing)
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap();
    let (locked_out, retry_after) = (
        res.status().as_u16(),
        res.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok()),
    );
    let other_peer = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap()
        .get(&listing)
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    report(
        "admin",
        &format!("12 guessed tokens from one peer: {guesses:?}; then its right token {locked_out} (Retry-After {retry_after:?}), another peer's {other_peer}"),
    );
    assert_eq!(
        guesses,
        BTreeMap::from([(403, 10), (429, 2)]),
        "10 guesses a minute, then refused"
    );
    assert_eq!(locked_out, 429, "the guessing peer, with the right token");
    assert!(
        retry_after.is_some_and(|s| (1..=60).contains(&s)),
        "{retry_after:?}"
    );
    assert_eq!(other_peer, 200, "another peer");
    report(
        "admin",
        "a wrong or missing token: 401/403, the record unchanged, 1 charge",
    );
    proof::record(
        "admin",
        "auth",
        &[&format!("401 without a token and with an empty one, 403 with 2 wrong ones, 400 problems for {refused} bad requests; the record unchanged, the retry replayed, 1 charge; 12 guesses from one peer: 10 × 403, then 429 (its right token too), another peer 200")],
    );
}

/// Two replicas on one store. B replays `key` from its cache; a purge through A's admin
/// API must stop B's replays: B's next answers are polled until one executes afresh.
/// Returns how long that took after the purge answered.
async fn purge_reaches_the_other_replica(args: &[String], db: &TestDb, label: &str) -> Duration {
    let tokens = token_file(label);
    let a = replica(args, &tokens).await;
    let b = replica(args, &tokens).await;
    let key = format!("purge-{}", label.replace(' ', "-"));
    let (status, _, first) = charge(&a.url, &key, 0).await;
    assert_eq!(status, 201);
    // B replays it, twice: the second from its cache.
    let hits = cache_hits(&b).await;
    for _ in 0..2 {
        let (status, replayed, id) = charge(&b.url, &key, 0).await;
        assert_eq!((status, replayed, id.as_str()), (201, true, first.as_str()));
    }
    // The cache serves once it hears the purge channel (its first probe comes back).
    let deadline = Instant::now() + Duration::from_secs(10);
    while cache_hits(&b).await <= hits {
        assert!(
            Instant::now() < deadline,
            "{label}: B never replayed from its cache"
        );
        let _ = charge(&b.url, &key, 0).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let record_key = record_key(&a, &key).await;
    let (status, body) = admin(
        "DELETE",
        &format!("{}/admin/v1/records/{record_key}", a.admin),
        Some(TOKEN),
    )
    .await;
    assert_eq!(
        (status, body["purged"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    let purged = Instant::now();
    let stale_until = loop {
        let (status, replayed, id) = charge(&b.url, &key, 0).await;
        if !replayed {
            assert_eq!(status, 201);
            assert_ne!(id, first, "{label}: a fresh execution has a new charge");
            break purged.elapsed();
        }
        assert!(
            purged.elapsed() < Duration::from_secs(10),
            "{label}: B still replays the purged record 10 s later"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    // Counted: the first charge, and one after the purge freed the key.
    assert_eq!(db.charges_for(&key).await, 2, "{label}");
    // And the key is bound again: a retry on A replays the new charge.
    let (_, replayed, _) = charge(&a.url, &key, 0).await;
    assert!(replayed);
    assert_eq!(db.charges_for(&key).await, 2, "{label}");
    stale_until
}

/// What each store's purge channel took, against the documented bound.
async fn purge_test(args: Vec<String>, db: TestDb, label: &str) {
    let took = purge_reaches_the_other_replica(&args, &db, label).await;
    report(
        "admin",
        &format!("{label}: the other replica stopped replaying {} ms after the purge answered (bound {} ms)", took.as_millis(), idem::internal::STALENESS_BOUND.as_millis()),
    );
    assert!(
        took < idem::internal::STALENESS_BOUND,
        "{label}: {took:?} past the purge"
    );
    proof::record(
        "admin",
        &format!("purge-{}", label.replace(' ', "-")),
        &[&format!(
            "B stopped replaying {} ms after the purge answered (bound {} ms); 2 charges: the first, and one after the purge",
            took.as_millis(),
            idem::internal::STALENESS_BOUND.as_millis()
        )],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_purge_on_one_replica_stops_replays_on_another() {
    let db = TestDb::new("admin_purge_pg").await;
    purge_test(postgres_args(&db), db, "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_a_purge_on_one_replica_stops_replays_on_another() {
    let db = TestDb::new("admin_purge_rc").await;
    purge_test(redis_cluster_args(&db, "admin-rc"), db, "redis-cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_sync_a_purge_on_one_replica_stops_replays_on_another() {
    let db = TestDb::new("admin_purge_ts").await;
    purge_test(tiered_args(&db, "admin-ts", "sync"), db, "tiered sync").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_async_a_purge_on_one_replica_stops_replays_on_another() {
    let db = TestDb::new("admin_purge_ta").await;
    purge_test(tiered_args(&db, "admin-ta", "async"), db, "tiered async").await;
}

/// A replica whose subscription to the purge channel is cut (its `LISTEN` backend
/// terminated) must not go on replaying from memory what it can no longer hear about:
/// here the record is deleted in the table directly meanwhile, as a purge whose notice
/// it missed. B forgets its cache when it subscribes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_lost_the_purge_channel_forgets_its_cache() {
    let db = TestDb::new("admin_listen_cut").await;
    let tokens = token_file("listen-cut");
    let b = replica(&postgres_args(&db), &tokens).await;
    let key = "listen-cut";
    let (_, _, first) = charge(&b.url, key, 0).await;
    let hits = cache_hits(&b).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while cache_hits(&b).await <= hits {
        assert!(Instant::now() < deadline, "B never replayed from its cache");
        let _ = charge(&b.url, key, 0).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pg = db.client().await;
    let cut: i64 = pg
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = $1 AND datname = current_database()",
            &[&format!("idem purge listener {}", b.child.id())],
        )
        .await
        .unwrap()
        .get(0);
    assert!(cut >= 1, "no LISTEN backend found");
    db.exec("DELETE FROM idem_records").await;
    let cut_at = Instant::now();
    let took = loop {
        let (status, replayed, id) = charge(&b.url, key, 0).await;
        if !replayed {
            assert_eq!(status, 201);
            assert_ne!(id, first);
            break cut_at.elapsed();
        }
        assert!(
            cut_at.elapsed() < Duration::from_secs(10),
            "B replays for ever"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    report(
        "admin",
        &format!(
            "postgres: a replica whose LISTEN was cut stopped replaying from memory {} ms later",
            took.as_millis()
        ),
    );
    assert!(took < idem::internal::STALENESS_BOUND, "{took:?}");
    proof::record(
        "admin",
        "listen-cut",
        &[&format!(
            "B forgot its cache: a fresh execution {} ms after the cut",
            took.as_millis()
        )],
    );
}

fn cli(admin: &str, tokens: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    cli_with_stdin(admin, tokens, args, "")
}

/// [`cli`], with `stdin` written to its standard input.
fn cli_with_stdin(
    admin: &str,
    tokens: &std::path::Path,
    args: &[&str],
    stdin: &str,
) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new(OriginProcess::binary())
        .args([
            "admin",
            "--url",
            admin,
            "--token-file",
            tokens.to_str().unwrap(),
        ])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Replica A dies (`kill -9`) while its handler runs; its claim stays, leased for 30 s.
/// Replica B's admin API lists it; the CLI's purge is refused while the lease is live
/// and done with --force; then a retry runs, and the key is charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_orphaned_by_kill_9_is_listed_and_purged() {
    let db = TestDb::new("admin_orphan").await;
    let tokens = token_file("orphan");
    let mut args = postgres_args(&db);
    args.extend(["--lease".into(), "30s".into()]);
    let a = replica(&args, &tokens).await;
    let b = replica(&args, &tokens).await;
    let a_url = a.url.clone();
    let running = tokio::spawn(async move {
        client()
            .post(format!("{a_url}/v1/charges"))
            .header("content-type", "application/json")
            .header("idempotency-key", "orphan-1")
            .header("authorization", "Bearer customer-1")
            .body(charge_body("cus-admin", 100, 5_000))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    let record_key = first_in_progress(&b.admin).await;
    let mut a = a;
    a.child.kill().unwrap(); // SIGKILL
    a.child.wait().unwrap();
    assert!(
        running.await.unwrap().is_err(),
        "A's client lost its connection"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Listed by the CLI as older than 200 ms, lease live.
    let (code, out, err) = cli(
        &b.admin,
        &tokens,
        &["list", "--older-than", "200ms", "--all"],
    );
    assert_eq!(code, 0, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["count"], 1, "{out}");
    assert_eq!(listed["records"][0]["record_key"], record_key.as_str());
    assert_eq!(listed["records"][0]["lease_live"], true);
    let (code, out, _) = cli(&b.admin, &tokens, &["list", "--older-than", "1h"]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["records"],
        serde_json::json!([])
    );
    // A retry meanwhile is told the request is in flight.
    let (status, _, _) = charge(&b.url, "orphan-1", 5_000).await;
    assert_eq!(status, 409);

    let (code, _, err) = cli(&b.admin, &tokens, &["purge", &record_key]);
    assert_eq!(code, 1, "refused while the lease is live");
    assert!(err.contains("409") && err.contains("force"), "{err}");
    let (code, out, err) = cli(&b.admin, &tokens, &["purge", &record_key, "--force"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"purged\": true"), "{out}");
    let (code, _, err) = cli(&b.admin, &tokens, &["get", &record_key]);
    assert_eq!(code, 1);
    assert!(err.contains("404"), "{err}");
    let (code, _, err) = cli(&b.admin, &tokens, &["purge", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("400"), "{err}");

    let (status, replayed, _) = charge(&b.url, "orphan-1", 5_000).await;
    assert_eq!((status, replayed), (201, false));
    // The caller's credential from stdin, never an argument.
    let (code, out, err) = cli_with_stdin(
        &b.admin,
        &tokens,
        &[
            "get",
            "--key",
            "orphan-1",
            "--scope",
            "authorization",
            "--identity-file",
            "-",
            "--body",
        ],
        "Bearer customer-1\n",
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("\"state\": \"completed\"") && out.contains("cus-admin"),
        "{out}"
    );
    assert_eq!(db.charges_for("orphan-1").await, 1);
    let wrong = token_file("orphan-wrong");
    std::fs::write(&wrong, "someone:not-the-token-at-all\n").unwrap();
    let (code, _, err) = cli(&b.admin, &wrong, &["list"]);
    assert_eq!(code, 1);
    assert!(err.contains("403"), "{err}");
    report("admin", "kill -9 mid-handler: listed (1, lease live), purge refused (409) then forced, the retry charged once");
    proof::record(
        "admin",
        "orphan",
        &["listed (1, lease live); a retry 409; purge refused (exit 1, 409) then `--force`d; the retry 201; 1 charge"],
    );
}

/// The first in-progress record the listing shows, waiting up to 10 s for one. Every
/// page is read: on Redis a page can be empty and still have a next one (other keys
/// in the cluster take its scan), which a loop on the first page never got past.
async fn first_in_progress(admin_url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut cursor: Option<String> = None;
    loop {
        let listing = format!("{admin_url}/admin/v1/in-progress");
        let page = match &cursor {
            Some(c) => reqwest::Url::parse_with_params(&listing, [("cursor", c)])
                .unwrap()
                .to_string(),
            None => listing,
        };
        let (status, body) = admin("GET", &page, Some(TOKEN)).await;
        assert_eq!(status, 200, "{body}");
        if let Some(r) = body["records"].as_array().and_then(|r| r.first()) {
            return r["record_key"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "no claim listed within 10 s");
        cursor = body["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A purge through a replica whose clock runs 60 s ahead, which has made no claim (so
/// it has not seen the store's clock): it must not take a live 30 s lease for expired.
/// The store judges the lease on its own clock. Before that, the purge deleted the
/// live claim and a retry charged the customer a second time.
async fn a_fast_clock_cannot_purge_a_live_lease(args: Vec<String>, db: TestDb, label: &str) {
    let tokens = token_file(label);
    let mut args = args;
    args.extend(["--lease".into(), "30s".into()]);
    // Found before anything is started: a panic after a spawn would leave it running.
    let lib = idem_tests::faketime_lib();
    let a = replica(&args, &tokens).await;
    let ahead = replica_env(
        &args,
        &tokens,
        &[
            ("LD_PRELOAD", lib.as_str()),
            ("FAKETIME", "+60s"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    )
    .await;
    idem_tests::assert_clock_ahead(&ahead.url, 60).await;
    let key = format!("skewed-purge-{}", label.replace(' ', "-"));
    let a_url = a.url.clone();
    let first_key = key.clone();
    let first = tokio::spawn(async move { charge(&a_url, &first_key, 3_000).await });
    let record_key = first_in_progress(&a.admin).await;
    let (status, body) = admin(
        "DELETE",
        &format!("{}/admin/v1/records/{record_key}", ahead.admin),
        Some(TOKEN),
    )
    .await;
    // The retry a purge would let through, sent while the first attempt still runs.
    let (retry, _, _) = charge(&ahead.url, &key, 3_000).await;
    let (first_status, _, _) = first.await.unwrap();
    let charges = db.charges_for(&key).await;
    report(
        "admin",
        &format!("{label}: a purge from a replica 60 s ahead during a live 30 s lease answered {status}; the retry {retry}; {charges} charge(s)"),
    );
    assert_eq!(status, 409, "{label}: {body}");
    assert_eq!(
        body["type"],
        "https://github.com/idem-rs/idem/blob/main/docs/problems.md#admin-lease-live"
    );
    assert_eq!((first_status, retry), (201, 409));
    assert_eq!(charges, 1, "{label}");
    proof::record(
        "admin",
        &format!("skew-{}", label.replace(' ', "-")),
        &["409 `admin-lease-live`; the retry 409; 1 charge"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_fast_clock_cannot_purge_a_live_lease() {
    let db = TestDb::new("admin_skew_pg").await;
    a_fast_clock_cannot_purge_a_live_lease(postgres_args(&db), db, "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_a_fast_clock_cannot_purge_a_live_lease() {
    let db = TestDb::new("admin_skew_rc").await;
    a_fast_clock_cannot_purge_a_live_lease(
        redis_cluster_args(&db, "admin-skew-rc"),
        db,
        "redis-cluster",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_async_a_fast_clock_cannot_purge_a_live_lease() {
    let db = TestDb::new("admin_skew_ta").await;
    a_fast_clock_cannot_purge_a_live_lease(
        tiered_args(&db, "admin-skew-ta", "async"),
        db,
        "tiered async",
    )
    .await;
}

/// The admin API over TLS (`--admin-tls-cert`, `--admin-tls-key`): the CLI reaches it
/// with the CA that issued its certificate, by IP and by name; a CA that did not sign
/// it, no CA, and plain HTTP get nothing — so a token never crosses in clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_over_tls_is_reached_only_with_its_ca() {
    let ca = idem_tests::procs::TestCa::new("admin-tls");
    let db = TestDb::new("admin_tls").await;
    let tokens = token_file("tls");
    let mut args = postgres_args(&db);
    args.extend([
        "--admin-tls-cert".into(),
        ca.server_cert.display().to_string(),
        "--admin-tls-key".into(),
        ca.server_key.display().to_string(),
    ]);
    let r = replica(&args, &tokens).await;
    let port = r.admin.rsplit(':').next().unwrap().to_owned();
    let (ca_file, wrong_ca) = (
        ca.ca.display().to_string(),
        ca.wrong_ca.display().to_string(),
    );
    let mut seen = Vec::new();
    for (url, ca_args, ok) in [
        (
            format!("https://127.0.0.1:{port}"),
            vec!["--ca-file", &ca_file],
            true,
        ),
        (
            format!("https://localhost:{port}"),
            vec!["--ca-file", &ca_file],
            true,
        ),
        (
            format!("https://127.0.0.1:{port}"),
            vec!["--ca-file", &wrong_ca],
            false,
        ),
        (format!("https://127.0.0.1:{port}"), vec![], false),
        (format!("http://127.0.0.1:{port}"), vec![], false),
    ] {
        let mut cli_args = vec!["list"];
        cli_args.extend(ca_args.iter().copied());
        let (code, out, err) = cli(&url, &tokens, &cli_args);
        seen.push(format!("{url} {ca_args:?}: exit {code}"));
        match ok {
            true => {
                assert_eq!(code, 0, "{url}: {err}");
                assert!(out.contains("\"records\""), "{url}: {out}");
            }
            false => {
                assert_eq!(code, 2, "{url} {ca_args:?} reached the API: {out}");
                assert!(!err.is_empty());
            }
        }
    }
    let (_, _, no_ca) = cli(&format!("https://127.0.0.1:{port}"), &tokens, &["list"]);
    assert!(no_ca.contains("--ca-file"), "{no_ca}");
    let (_, _, wrong) = cli(
        &format!("https://127.0.0.1:{port}"),
        &tokens,
        &["list", "--ca-file", &wrong_ca],
    );
    assert!(wrong.contains("UnknownIssuer"), "{wrong}");
    // The CLI never sends a token in clear off this machine, nor "verifies" http://.
    let (code, _, off_host) = cli("http://192.0.2.1:9090", &tokens, &["list"]);
    assert!(
        code == 2 && off_host.contains("--insecure-http"),
        "{off_host}"
    );
    let (code, _, ca_on_http) = cli(&r.admin, &tokens, &["list", "--ca-file", &ca_file]);
    assert!(
        code == 2 && ca_on_http.contains("is for https://"),
        "{ca_on_http}"
    );
    report("admin", &format!("the admin API over TLS: {seen:?}"));
}
