//! The book's metrics table (`docs/operations.md`) is the catalog the library records from
//! (`idem::metrics::CATALOG`), row for row; and every catalogued metric is recorded
//! somewhere in the code, under its name. Needs no service.

use std::path::Path;

fn sources(dir: &Path, skip: &Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, skip, out);
        } else if path.extension().is_some_and(|e| e == "rs") && path != skip {
            out.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
}

#[test]
fn the_book_s_metrics_table_is_the_catalog() {
    let readme = include_str!("../../docs/operations.md");
    let expected = idem::metrics::markdown_table();
    assert!(
        readme.contains(&expected),
        "docs/operations.md's metrics table must read, under ## Metrics:\n{expected}"
    );
}

#[test]
fn every_catalogued_metric_is_recorded_under_its_name() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let catalog = root.join("src/metrics/catalog.rs");
    let mut code = String::new();
    for dir in ["src", "../origin/src"] {
        sources(&root.join(dir), &catalog, &mut code);
    }
    let unrecorded: Vec<&str> = idem::metrics::CATALOG
        .iter()
        .map(|m| m.name)
        .filter(|name| !code.contains(&format!("\"{name}\"")))
        .collect();
    assert!(
        unrecorded.is_empty(),
        "catalogued but never recorded: {unrecorded:?}"
    );
    // And nothing is recorded that the catalog does not know: every metrics macro
    // (`counter!`, `gauge!`, `histogram!`, …) or cached handle (`handles::counter`,
    // `handles::histogram`) whose name is an `idem_` literal. Other
    // `idem_` strings (a Postgres channel, an index) are not metrics.
    let mut recorded = Vec::new();
    let parts: Vec<&str> = code.split("\"idem_").collect();
    for (before, part) in parts.iter().zip(parts.iter().skip(1)) {
        let before = before.trim_end();
        let call = ["!(", "handles::counter(", "handles::histogram("];
        if !call.iter().any(|c| before.ends_with(c)) {
            continue;
        }
        let name: String = part
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if part[name.len()..].starts_with('"') {
            recorded.push(format!("idem_{name}"));
        }
    }
    assert!(
        recorded.iter().any(|n| n == "idem_build_info"),
        "the scan finds the metrics macros: {recorded:?}"
    );
    let unknown: Vec<&String> = recorded
        .iter()
        .filter(|n| !idem::metrics::CATALOG.iter().any(|m| m.name == n.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "recorded but not catalogued: {unknown:?}"
    );
}
