//! Every metric the origin exports is documented in README.md, and every metric the
//! README documents exists in the code.

use idem_tests::{
    charge_body, client, post_charge, redis_cluster_urls, unique_namespace, TestDb, TestOrigin,
};
use std::collections::BTreeSet;
use std::path::Path;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap()
}

/// The metric names in the README's metrics table.
fn documented() -> BTreeSet<String> {
    readme()
        .lines()
        .filter(|l| l.starts_with("| `idem_"))
        .flat_map(|l| {
            l.split('|')
                .nth(1)
                .unwrap_or("")
                .split('`')
                .filter(|s| s.starts_with("idem_"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn source_text(dir: &Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            source_text(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_metrics_are_documented_and_documented_metrics_exist() {
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
    let exported: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .filter(|n| n.starts_with("idem_"))
        .map(str::to_owned)
        .collect();
    let documented = documented();
    assert!(
        exported.len() >= 4,
        "the workload exports metrics: {exported:?}"
    );
    let undocumented: Vec<_> = exported.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "exported but not in README.md's metrics table: {undocumented:?}"
    );
    for outcome in ["executed", "replayed", "mismatch", "invalid"] {
        assert!(
            text.contains(&format!("idem_requests_total{{outcome=\"{outcome}\"}}")),
            "outcome {outcome} exported"
        );
    }

    let mut source = String::new();
    // What records metrics: the library, and the program around it.
    for crate_src in ["../idem/src", "../origin/src"] {
        source_text(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join(crate_src),
            &mut source,
        );
    }
    let phantom: Vec<_> = documented
        .iter()
        .filter(|name| !source.contains(&format!("\"{name}\"")))
        .collect();
    assert!(
        phantom.is_empty(),
        "documented in README.md but not recorded anywhere: {phantom:?}"
    );
}
