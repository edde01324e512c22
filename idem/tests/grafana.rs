//! The Grafana dashboard (`docs/grafana/idem.json`) queries only metrics idem records,
//! with labels and label values they have, and shows every metric of the catalog.
//! Needs no service.

use idem::metrics::{Kind, CATALOG};
use serde_json::Value;
use std::collections::BTreeSet;

fn dashboard() -> Value {
    let text = include_str!("../../docs/grafana/idem.json");
    serde_json::from_str(text).expect("the dashboard is JSON")
}

/// Every query of every panel.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().expect("a title").to_owned();
        assert!(
            panel["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{title}: says what it shows"
        );
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: queries something");
        for t in targets {
            out.push((
                title.clone(),
                t["expr"].as_str().expect("a PromQL expr").to_owned(),
            ));
        }
    }
    out
}

/// The metric names an expression reads, each with the label matchers right after it.
fn reads(expr: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("idem_") {
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..len];
        let mut matchers = Vec::new();
        if let Some(body) = tail[len..].strip_prefix('{') {
            let body = &body[..body.find('}').expect("a closed selector")];
            for m in body.split(',') {
                let (label, value) = m
                    .split_once("=~")
                    .or_else(|| m.split_once('='))
                    .expect("label=value");
                matchers.push((
                    label.trim().to_owned(),
                    value.trim().trim_matches('"').to_owned(),
                ));
            }
        }
        out.push((name.to_owned(), matchers));
        rest = &tail[len..];
    }
    out
}

/// The labels an expression aggregates by.
fn by_labels(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("by (") {
        let tail = &rest[at + 4..];
        let end = tail.find(')').expect("a closed by");
        out.extend(tail[..end].split(',').map(|l| l.trim().to_owned()));
        rest = &tail[end..];
    }
    out
}

#[test]
fn the_dashboard_reads_what_idem_records_and_shows_all_of_it() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "idem-overview");
    let mut shown = BTreeSet::new();
    for (title, expr) in queries(&dashboard) {
        let read = reads(&expr);
        assert!(!read.is_empty(), "{title}: reads an idem metric: {expr}");
        let mut labels: BTreeSet<&str> = ["le", "job", "instance"].into();
        for (name, matchers) in &read {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            let metric = CATALOG
                .iter()
                .find(|m| m.name == name || (m.kind == Kind::Histogram && m.name == base))
                .unwrap_or_else(|| panic!("{title}: {name} is not a metric idem records"));
            shown.insert(metric.name);
            labels.extend(metric.labels.iter().copied());
            for (label, value) in matchers {
                if label == "job" {
                    continue;
                }
                assert!(
                    metric.labels.contains(&label.as_str()),
                    "{title}: {} has no label {label}",
                    metric.name
                );
                // The catalog lists the values of a metric's last label.
                if metric.labels.last() == Some(&label.as_str()) && !metric.values.is_empty() {
                    assert!(
                        metric.values.contains(&format!("`{value}`")),
                        "{title}: {label}=\"{value}\" is not a value of {}",
                        metric.name
                    );
                }
            }
        }
        for label in by_labels(&expr) {
            assert!(
                labels.contains(label.as_str()),
                "{title}: aggregates by {label}, which {expr} has not"
            );
        }
    }
    let missing: Vec<&str> = CATALOG
        .iter()
        .map(|m| m.name)
        .filter(|n| !shown.contains(n))
        .collect();
    assert!(missing.is_empty(), "metrics on no panel: {missing:?}");
}
