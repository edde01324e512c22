//! What the origin exports is what the catalog declares (`idem::metrics::CATALOG`,
//! which the book's table is — `idem/tests/metrics_doc_table.rs`): every exported metric
//! is catalogued, with the catalogued type, only catalogued label names, and the
//! catalogued help text (described at start-up).

use idem::metrics::CATALOG;
use idem_tests::{
    charge_body, client, post_charge, redis_cluster_urls, unique_namespace, TestDb, TestOrigin,
};
use std::collections::{BTreeMap, BTreeSet};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_metrics_are_the_catalogued_ones() {
    let db = TestDb::new("metrics").await;
    let ns = unique_namespace("metrics");
    let urls = redis_cluster_urls();
    let origin = TestOrigin::start(&[
        "--store",
        "tiered",
        "--durability",
        "async",
        "--redis-url",
        &urls,
        "--redis-namespace",
        &ns,
        "--database-url",
        &db.url,
    ])
    .await;
    let http = client();
    let base = origin.url("");
    post_charge(&http, &base, Some("m-1"), &charge_body("c", 1, 0)).await;
    post_charge(&http, &base, Some("m-1"), &charge_body("c", 1, 0)).await;
    post_charge(&http, &base, Some("m-1"), &charge_body("c", 2, 0)).await;
    post_charge(&http, &base, Some("bad key"), &charge_body("c", 1, 0)).await;
    post_charge(
        &http,
        &base,
        Some("m-2"),
        r#"{"amount":-1,"currency":"usd","customer":"c"}"#,
    )
    .await;
    let text = http
        .get(origin.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();

    let types: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .filter(|(n, _)| n.starts_with("idem_"))
        .collect();
    let helps: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    assert!(types.len() >= 4, "the workload exports metrics: {types:?}");
    for (name, kind) in &types {
        let Some(m) = CATALOG.iter().find(|m| m.name == *name) else {
            panic!("{name} is exported but not catalogued (idem/src/metrics/catalog.rs)");
        };
        assert_eq!(*kind, m.kind.as_str(), "{name}: exported as {kind}");
        assert_eq!(
            helps.get(name).copied(),
            Some(m.help),
            "{name}: described at start-up"
        );
    }
    // Label names of every sample (histograms add `le` to their buckets).
    for line in text.lines().filter(|l| l.starts_with("idem_")) {
        let Some((series, _)) = line.split_once(' ') else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| types.contains_key(b)))
            .unwrap_or(name);
        let m = CATALOG
            .iter()
            .find(|m| m.name == base)
            .unwrap_or_else(|| panic!("{line}"));
        let names: BTreeSet<&str> = labels
            .trim_end_matches('}')
            .split(',')
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
            .filter(|k| *k != "le" && *k != "quantile")
            .collect();
        let allowed: BTreeSet<&str> = m.labels.iter().copied().collect();
        assert!(
            names.is_subset(&allowed),
            "{line}: labels {names:?}, catalogued {allowed:?}"
        );
    }
    for outcome in ["executed", "replayed", "mismatch", "invalid"] {
        assert!(
            text.contains(&format!("idem_requests_total{{outcome=\"{outcome}\"}}")),
            "outcome {outcome} exported"
        );
    }
}

/// A fresh process exports every counter of the catalog at 0, for each label value it
/// lists, and `idem_build_info`, before any request: a dashboard or an alert on
/// `rate(…)` sees its series from the first scrape after a deploy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_there_from_the_first_scrape() {
    let (mut child, base) = idem_tests::OriginProcess::spawn(&["--store", "memory"]).await;
    let text = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let mut missing = Vec::new();
    for m in CATALOG
        .iter()
        .filter(|m| m.kind == idem::metrics::Kind::Counter)
    {
        let values: Vec<&str> = m
            .values
            .split(", ")
            .map(|v| v.trim_matches('`'))
            .filter(|v| !v.is_empty())
            .collect();
        let series: Vec<String> = match (m.labels, values.is_empty()) {
            ([], _) => vec![format!("{} 0", m.name)],
            ([label], false) => values
                .iter()
                .map(|v| format!("{}{{{label}=\"{v}\"}} 0", m.name))
                .collect(),
            // Label values nobody can list in advance: none until recorded.
            _ => continue,
        };
        missing.extend(series.into_iter().filter(|s| !text.lines().any(|l| l == s)));
    }
    let version = env!("CARGO_PKG_VERSION");
    let build =
        format!("idem_build_info{{version=\"{version}\",store=\"memory\",mode=\"demo\"}} 1");
    if !text.lines().any(|l| l == build) {
        missing.push(build);
    }
    assert!(
        missing.is_empty(),
        "not exported before the first request: {missing:?}\n{text}"
    );
}
