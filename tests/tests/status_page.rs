//! The admin listener's status page, rendered by headless Chromium (Debian's package,
//! which `scripts/test` installs) against a real origin after real traffic: every
//! number the page shows is compared with what `/metrics` says at the same moment, and
//! a screenshot is kept (`target/idem-reports/status-page.png`; `docs/status-page.png`
//! is one such).

use idem_tests::{charge_body, client, proof, report, OriginProcess, TestDb};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

const TOKEN: &str = "status-page-token-0123456789";

fn chromium() -> String {
    for candidate in ["chromium", "chromium-browser", "google-chrome"] {
        if Command::new(candidate)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return candidate.to_owned();
        }
    }
    panic!("headless Chromium is missing: scripts/test installs it (apt-get install chromium)")
}

/// Chromium as the machine's notes say it runs here: no sandbox as root, no network
/// besides loopback, a fresh profile; the page gets 8 s of virtual time to fetch.
fn headless(extra: &[&str], url: &str) -> std::process::Output {
    let profile = std::env::temp_dir().join(format!("idem-chromium-{}", std::process::id()));
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--virtual-time-budget=8000",
            "--window-size=1200,860",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(profile);
    out
}

/// `data-metric` → `data-value` of every element the page filled in.
fn page_values(dom: &str) -> BTreeMap<String, String> {
    let mut values = BTreeMap::new();
    let mut rest = dom;
    while let Some(at) = rest.find("data-metric=\"") {
        rest = &rest[at + 13..];
        let name = &rest[..rest.find('"').unwrap()];
        let tag_end = rest.find('>').unwrap();
        let tag = &rest[..tag_end];
        if let Some(v) = tag.find("data-value=\"") {
            let v = &tag[v + 12..];
            values.insert(name.to_owned(), v[..v.find('"').unwrap()].to_owned());
        }
    }
    values
}

/// (name, labels, value) of every sample in a Prometheus exposition: parsed here on its
/// own, not with the code under test.
fn scrape(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
            let labels = labels
                .trim_end_matches('}')
                .split("\",")
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once("=\"").unwrap();
                    (k.to_owned(), v.trim_end_matches('"').to_owned())
                })
                .collect();
            let value = if value == "+Inf" {
                f64::INFINITY
            } else {
                value.parse().unwrap()
            };
            (name.to_owned(), labels, value)
        })
        .collect()
}

/// histogram_quantile, as Prometheus documents it.
fn histogram_quantile(q: f64, mut buckets: Vec<(f64, f64)>) -> f64 {
    buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    let rank = q * buckets.last().unwrap().1;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return lower;
            }
            return lower + (le - lower) * (rank - below) / (count - below);
        }
        (lower, below) = (le, count);
    }
    lower
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_what_metrics_say() {
    let db = TestDb::new("status_page").await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/idem-reports");
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join(format!("status-{}.tokens", std::process::id()));
    std::fs::write(&tokens, format!("oncall:{TOKEN}\n")).unwrap();
    let admin_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let admin_addr = format!("127.0.0.1:{admin_port}");
    let (mut origin, url) = OriginProcess::spawn(&[
        "--store",
        "postgres",
        "--database-url",
        &db.url,
        "--admin-listen",
        &admin_addr,
        "--admin-token-file",
        tokens.to_str().unwrap(),
    ])
    .await;
    let http = client();
    let post = |key: String, body: String| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            http.post(format!("{url}/v1/charges"))
                .header("content-type", "application/json")
                .header("idempotency-key", key)
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // Four sampling intervals of traffic, a little more of it each time: new keys,
    // replays (from the store, then from the cache), a key reused for another body,
    // a malformed key, and a retry while the first attempt still runs.
    for round in 0..4u64 {
        for i in 0..(5 + 3 * round) {
            let key = format!("r{round}-{i}");
            assert_eq!(post(key.clone(), charge_body("c", 100, 0)).await, 201);
            for _ in 0..(1 + round) {
                assert_eq!(post(key.clone(), charge_body("c", 100, 0)).await, 201);
            }
        }
        assert_eq!(
            post(format!("r{round}-0"), charge_body("c", 999, 0)).await,
            422
        );
        assert_eq!(
            post("\"unterminated".into(), charge_body("c", 1, 0)).await,
            400
        );
        let slow = tokio::spawn(post(format!("slow-{round}"), charge_body("c", 100, 600)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            post(format!("slow-{round}"), charge_body("c", 100, 600)).await,
            409
        );
        assert_eq!(slow.await.unwrap(), 201);
        tokio::time::sleep(Duration::from_millis(4_400)).await;
    }
    // Quiet now: the page and a scrape must agree.
    let metrics = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let page = format!("http://{admin_addr}/admin/status#token={TOKEN}");
    let out = headless(&["--dump-dom"], &page);
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        dom.contains("data-loaded=\"true\""),
        "the page never loaded its numbers:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = page_values(&dom);
    let samples = scrape(&metrics);
    let value = |name: &str, label: Option<(&str, &str)>| -> f64 {
        samples
            .iter()
            .filter(|(n, l, _)| {
                n == name && label.is_none_or(|(k, v)| l.get(k).map(String::as_str) == Some(v))
            })
            .map(|(_, _, v)| v)
            .sum()
    };
    let num = |key: &str| -> f64 {
        shown
            .get(key)
            .unwrap_or_else(|| panic!("the page shows no {key}: {shown:?}"))
            .parse()
            .unwrap()
    };
    let mut compared = 0;
    for outcome in [
        "executed",
        "replayed",
        "in_flight",
        "mismatch",
        "invalid",
        "unavailable",
    ] {
        let scraped = value("idem_requests_total", Some(("outcome", outcome)));
        assert_eq!(
            num(&format!("outcomes.{outcome}.total")),
            scraped,
            "{outcome}"
        );
        compared += 1;
    }
    assert_eq!(
        num("outcomes.executed.total"),
        4.0 * 5.0 + 3.0 * 6.0 + 4.0,
        "38 new keys and 4 slow ones"
    );
    assert_eq!(num("outcomes.in_flight.total"), 4.0);
    assert_eq!(num("outcomes.mismatch.total"), 4.0);
    let ops: std::collections::BTreeSet<String> = samples
        .iter()
        .filter(|(n, _, _)| n == "idem_store_duration_seconds_count")
        .filter_map(|(_, l, _)| l.get("op").cloned())
        .collect();
    assert!(ops.contains("claim"), "{ops:?}");
    for op in &ops {
        let buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter(|(n, l, _)| {
                n == "idem_store_duration_seconds_bucket"
                    && l.get("op").map(String::as_str) == Some(op)
            })
            .map(|(_, l, v)| {
                (
                    if l["le"] == "+Inf" {
                        f64::INFINITY
                    } else {
                        l["le"].parse().unwrap()
                    },
                    *v,
                )
            })
            .collect();
        assert_eq!(
            num(&format!("store_latency.{op}.count")),
            value("idem_store_duration_seconds_count", Some(("op", op)))
        );
        for (q, name) in [(0.5, "p50_ms"), (0.99, "p99_ms")] {
            let expected = histogram_quantile(q, buckets.clone()) * 1000.0;
            let on_page = num(&format!("store_latency.{op}.{name}"));
            assert!(
                (on_page - expected).abs() < 1e-6 * expected.max(1.0),
                "{op} {name}: page {on_page}, metrics {expected}"
            );
        }
        compared += 3;
    }
    let hits = value("idem_replay_cache_hits_total", None);
    assert!(hits > 0.0, "the replay cache answered some replays");
    let rate = num("replay_cache.hit_rate");
    assert!(
        (rate
            - hits
                / (value("idem_requests_total", Some(("outcome", "replayed")))
                    + value("idem_requests_total", Some(("outcome", "mismatch")))))
        .abs()
            < 1e-9,
        "hit rate {rate}, {hits} hits"
    );
    assert_eq!(num("running_here"), 0.0);
    compared += 2;
    // The last minute holds most of the traffic; the five minutes all of it.
    assert_eq!(
        num("outcomes.replayed.last_5m"),
        num("outcomes.replayed.total")
    );
    assert!(num("outcomes.replayed.last_1m") > 0.0);

    let shot = dir.join("status-page.png");
    let out = headless(&[&format!("--screenshot={}", shot.display())], &page);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let (w, h) = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (1200, 860));
    // A wrong token: the page asks for one and shows nothing.
    let wrong = headless(
        &["--dump-dom"],
        &format!("http://{admin_addr}/admin/status#token=wrong-token-0123456789"),
    );
    let wrong = String::from_utf8_lossy(&wrong.stdout);
    assert!(
        wrong.contains("That token is not accepted") && !wrong.contains("data-loaded=\"true\"")
    );
    let _ = origin.kill();
    let _ = origin.wait();
    proof::record(
        "admin",
        "status-page",
        &[&format!("rendered; {compared} numbers on the page equal to `/metrics`; a wrong token shows none; `docs/status-page.png`")],
    );
    report(
        "status page",
        &format!(
            "headless Chromium rendered it; {compared} numbers equal to /metrics; screenshot {}",
            shot.display()
        ),
    );
}
