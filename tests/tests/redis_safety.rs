//! A Redis that can lose acknowledged records: one that evicts keys when full is
//! refused at start-up (unless accepted explicitly), and `--redis-wait-replicas N`
//! makes a claim or completion count only once N replicas have it.

use idem::StoreExt;
use idem::{RedisOptions, RedisStore, Store, StoreErrorKind};
use idem_core::{Decision, Fingerprint, IdempotencyKey, Policy, RecordKey, Scope};
use idem_tests::procs::{RedisClusterProc, RedisProc};
use idem_tests::{redis_cluster_urls, unique_namespace, OriginProcess};

const P: Policy = Policy {
    lease_ms: 5_000,
    ttl_ms: 60_000,
};

fn key(name: &str) -> RecordKey {
    RecordKey::new(
        &Scope::anonymous(),
        &IdempotencyKey::parse(name.as_bytes()).unwrap(),
    )
}

fn options(allow_eviction: bool, wait_replicas: u32) -> RedisOptions {
    RedisOptions::default()
        .namespace(unique_namespace("safety"))
        .allow_eviction(allow_eviction)
        .wait_replicas(wait_replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_redis_is_refused_unless_accepted() {
    let redis = tokio::task::block_in_place(|| RedisProc::start("evicting"));
    redis.cli(&["config", "set", "maxmemory", "100mb"]);
    redis.cli(&["config", "set", "maxmemory-policy", "allkeys-lru"]);
    let err = RedisStore::connect(&redis.url(), options(false, 0))
        .await
        .err()
        .expect("an evicting Redis is refused");
    assert_eq!(err.kind(), StoreErrorKind::Unsafe, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("allkeys-lru")
            && msg.contains("noeviction")
            && msg.contains("--redis-allow-eviction"),
        "{msg}"
    );
    // The process says so and exits; with the flag it starts.
    let port = idem_tests::procs::free_port();
    let url = redis.url();
    let refused =
        OriginProcess::try_spawn_at(port, &["--store", "redis", "--redis-url", &url], &[]).await;
    assert!(refused.is_err(), "the origin refuses to start");
    let (mut accepted, _) = OriginProcess::try_spawn_at(
        port,
        &[
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--redis-allow-eviction",
        ],
        &[],
    )
    .await
    .expect("accepted explicitly");
    let _ = accepted.kill();
    // volatile-* evicts our records too (they all carry a TTL); noeviction is fine.
    redis.cli(&["config", "set", "maxmemory-policy", "volatile-ttl"]);
    assert!(RedisStore::connect(&redis.url(), options(false, 0))
        .await
        .is_err());
    redis.cli(&["config", "set", "maxmemory-policy", "noeviction"]);
    RedisStore::connect(&redis.url(), options(false, 0))
        .await
        .expect("noeviction is safe");
    redis.cli(&["config", "set", "maxmemory-policy", "allkeys-lru"]);
    redis.cli(&["config", "set", "maxmemory", "0"]);
    RedisStore::connect(&redis.url(), options(false, 0))
        .await
        .expect("no memory limit, no eviction");
    idem_tests::report(
        "redis_safety",
        &format!("evicting Redis refused at start-up: {msg}"),
    );
    idem_tests::proof::record(
        "faults",
        "evicting-redis",
        &["refused at start-up, naming the node and policy; accepted with `--redis-allow-eviction`, or with `noeviction` or no memory limit"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_one_evicting_master_is_refused() {
    let cluster = tokio::task::block_in_place(|| RedisClusterProc::start("evicting-cluster"));
    RedisStore::connect(&cluster.urls(), options(false, 0))
        .await
        .expect("no master evicts");
    let master = tokio::task::block_in_place(|| cluster.a_master());
    cluster.nodes[master].cli(&["config", "set", "maxmemory", "1gb"]);
    cluster.nodes[master].cli(&["config", "set", "maxmemory-policy", "allkeys-lfu"]);
    let err = RedisStore::connect(&cluster.urls(), options(false, 0))
        .await
        .err()
        .expect("one evicting master is enough to refuse");
    let msg = err.to_string();
    let port = cluster.nodes[master].port.to_string();
    assert!(
        msg.contains(&port) && msg.contains("allkeys-lfu"),
        "names the node: {msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_makes_a_write_count_only_once_replicated() {
    let fp = Fingerprint([4; 32]);
    // The cluster's masters have a replica each: claims and completions pass.
    let cluster = RedisStore::connect(&redis_cluster_urls(), options(false, 1))
        .await
        .unwrap();
    let k = key(&format!("wait-{}", idem::now()));
    let Decision::Execute(c) = cluster.claim(&k, &fp, cluster.now(), &P).await.unwrap() else {
        panic!("new key executes")
    };
    let done = idem_core::StoredResponse {
        status: 201,
        headers: vec![],
        body: b"ok".to_vec(),
    };
    assert_eq!(
        cluster
            .complete(&k, &c.holder(), done, cluster.now(), &P)
            .await
            .unwrap(),
        idem::HolderWrite::Written
    );
    // A standalone Redis has no replica: the claim is refused (503), never trusted.
    let single = tokio::task::block_in_place(|| RedisProc::start("no-replica"));
    let store = RedisStore::connect(&single.url(), options(false, 1))
        .await
        .unwrap();
    let err = store
        .claim(&key("wait-alone"), &fp, store.now(), &P)
        .await
        .expect_err("no replica acknowledged it");
    assert!(err.to_string().contains("0 of 1 replicas"), "{err}");
}

/// A Redis without `maxmemory` is accepted with a warning in the log (its memory is
/// bounded only by the machine's); with `maxmemory` and `noeviction`, no warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_without_maxmemory_is_warned_about() {
    let redis = tokio::task::block_in_place(|| RedisProc::start("maxmemory"));
    let mut warned = Vec::new();
    for maxmemory in ["0", "100mb"] {
        assert_eq!(
            redis.cli(&["config", "set", "maxmemory", maxmemory]).trim(),
            "OK"
        );
        let port = idem_tests::procs::free_port();
        let (mut origin, _) = OriginProcess::try_spawn_at(
            port,
            &["--store", "redis", "--redis-url", &redis.url()],
            &[],
        )
        .await
        .expect("the origin starts");
        let _ = origin.kill();
        let _ = origin.wait();
        let log = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../target/idem-reports/origin-{port}.log"));
        let log = std::fs::read_to_string(log).unwrap();
        warned.push(log.contains("Redis maxmemory is unset"));
    }
    assert_eq!(warned, [true, false], "warned with maxmemory 0, then 100mb");
}

/// A cluster whose URLs carry a password: the password goes only to the nodes the
/// operator listed (`--redis-url`) or allowed (`--redis-allow-host`). With one seed URL
/// of six, the cluster announces nodes nobody listed: refused at start-up, naming
/// them, before any of them is sent the password (logins counted on every other node).
/// Allowed by host, or with every node listed, it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_s_password_goes_only_to_nodes_listed_or_allowed() {
    const PASSWORD: &str = "s3cret-cluster-pw";
    let cluster = tokio::task::block_in_place(|| RedisClusterProc::start("password-cluster"));
    for node in &cluster.nodes {
        assert_eq!(
            node.cli(&["config", "set", "masterauth", PASSWORD]).trim(),
            "OK"
        );
        assert_eq!(
            node.cli(&["config", "set", "requirepass", PASSWORD]).trim(),
            "OK"
        );
    }
    let url = |n: &RedisProc| format!("redis://:{PASSWORD}@127.0.0.1:{}", n.port);
    let one = url(&cluster.nodes[0]);
    let all = cluster.nodes.iter().map(url).collect::<Vec<_>>().join(",");
    let mut started = Vec::new();
    for (label, urls, extra) in [
        ("one seed", &one, vec![]),
        (
            "one seed, 127.0.0.1 allowed",
            &one,
            vec!["--redis-allow-host", "127.0.0.1"],
        ),
        ("every node listed", &all, vec![]),
    ] {
        let port = idem_tests::procs::free_port();
        let mut args = vec!["--store", "redis", "--redis-cluster", "--redis-url", urls];
        args.extend(extra);
        let auth = ["-a", PASSWORD, "--no-auth-warning"];
        for node in &cluster.nodes {
            node.cli(&[&auth[..], &["config", "resetstat"]].concat());
        }
        let spawned = OriginProcess::try_spawn_at(port, &args, &[]).await;
        // Every node but the seed: did anything log in to it? (Less this query's own
        // login, counted before it reads the stats.)
        let logins: usize = cluster.nodes[1..]
            .iter()
            .map(|node| {
                let stats = node.cli(&[&auth[..], &["info", "commandstats"]].concat());
                stats
                    .lines()
                    .filter(|l| l.starts_with("cmdstat_auth:") || l.starts_with("cmdstat_hello:"))
                    .filter_map(|l| {
                        l.split("calls=")
                            .nth(1)?
                            .split(',')
                            .next()?
                            .parse::<usize>()
                            .ok()
                    })
                    .sum::<usize>()
                    .saturating_sub(1)
            })
            .sum();
        let log = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../target/idem-reports/origin-{port}.log"));
        let log = std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            !log.contains(PASSWORD),
            "{label}: the log shows the password"
        );
        match spawned {
            Ok((mut origin, base)) => {
                let ready = idem_tests::client()
                    .get(format!("{base}/readyz"))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16();
                let _ = origin.kill();
                let _ = origin.wait();
                started.push((label, format!("started, /readyz {ready}")));
            }
            Err(_) => {
                let named = log.contains("that no --redis-url names");
                started.push((
                    label,
                    format!("refused (names the nodes: {named}; logins elsewhere: {logins})"),
                ));
            }
        }
    }
    idem_tests::report(
        "redis",
        &format!("a password-protected cluster: {started:?}"),
    );
    assert_eq!(
        started,
        [
            (
                "one seed",
                "refused (names the nodes: true; logins elsewhere: 0)".to_owned()
            ),
            (
                "one seed, 127.0.0.1 allowed",
                "started, /readyz 200".to_owned()
            ),
            ("every node listed", "started, /readyz 200".to_owned()),
        ]
    );
}

/// A Redis that no longer knows idem's scripts (restarted, failed over, `SCRIPT FLUSH`)
/// is sent them again, and the call made again: a claim after the flush runs, and the
/// key claimed before it is still held. On a standalone Redis of its own, and on the
/// shared cluster (every node flushed: its calls go straight to each key's master).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_forgot_the_scripts_is_sent_them_again() {
    let redis = tokio::task::block_in_place(|| RedisProc::start("scripts"));
    let alone = RedisStore::connect(&redis.url(), options(false, 0))
        .await
        .unwrap();
    claims_survive_a_script_flush(&alone, || {
        assert_eq!(redis.cli(&["script", "flush"]).trim(), "OK");
    })
    .await;
    let cluster = RedisStore::connect(&redis_cluster_urls(), options(false, 0))
        .await
        .unwrap();
    claims_survive_a_script_flush(&cluster, || {
        for port in 7000..7006 {
            let flushed = idem_tests::procs::redis_cli(port, &["script", "flush"]);
            assert_eq!(flushed.trim(), "OK", "node {port}");
        }
    })
    .await;
}

async fn claims_survive_a_script_flush(store: &RedisStore, flush: impl Fn()) {
    let fp = Fingerprint([5; 32]);
    let before = store.claim(&key("before"), &fp, store.now(), &P).await;
    assert!(matches!(before, Ok(Decision::Execute(_))), "{before:?}");
    flush();
    let after = store.claim(&key("after"), &fp, store.now(), &P).await;
    assert!(matches!(after, Ok(Decision::Execute(_))), "{after:?}");
    let again = store.claim(&key("before"), &fp, store.now(), &P).await;
    assert!(matches!(again, Ok(Decision::InFlight { .. })), "{again:?}");
}
