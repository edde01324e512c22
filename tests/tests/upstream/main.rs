//! Proxy mode end to end: `idem-origin --upstream` in front of a payments API written
//! in Python (standard library and SQLite: tests/upstream/payments.py) that knows
//! nothing about idempotency. Every count is read from the upstream's own database.
//! One module per area; the proxy they start, and the helpers they share, are here.

mod charging;
mod edges;
mod outcomes;
mod paths;
mod routes;
mod scoping;

use idem_tests::{charge_body, client, proof, raw_request, report, Payments, TestOrigin};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;

/// idem in front of `payments`, a key required on `/v1/*`. Its callers send no
/// identity, so they share the anonymous scope unless `extra` says otherwise.
pub(crate) async fn proxy(payments: &Payments, extra: &[&str]) -> TestOrigin {
    proxy_to(&payments.url(), extra).await
}

/// idem in front of the upstream at `url`, as [`proxy`] sets it up.
pub(crate) async fn proxy_to(url: &str, extra: &[&str]) -> TestOrigin {
    let mut args = vec!["--upstream", url, "--require-key-on", "/v1/*"];
    if !extra.contains(&"--store") {
        args.extend_from_slice(&["--store", "memory"]);
    }
    if !extra
        .iter()
        .any(|a| *a == "--anonymous" || *a == "--scope-from")
    {
        args.extend_from_slice(&["--anonymous", "scoped"]);
    }
    args.extend_from_slice(extra);
    TestOrigin::start(&args).await
}

pub(crate) async fn post(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    body: String,
) -> reqwest::Response {
    idem_tests::post_json(http, url, key, body).await
}

pub(crate) fn problem_type(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body).unwrap_or_default()["type"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

pub(crate) const KEYS: usize = 200;

pub(crate) const RETRIES: usize = 16;

/// The last part of a problem's type (`path-ambiguous`), found in a raw body.
pub(crate) fn problem_kind(body: &str) -> String {
    body.split("https://github.com/idem-rs/idem/blob/main/docs/problems.md#")
        .nth(1)
        .map(|rest| rest.split('"').next().unwrap_or("").to_owned())
        .unwrap_or_default()
}

/// idem in proxy mode on Postgres (`args`), killed (SIGKILL) once the upstream has each
/// of `keys`' charges (2 s each) and before it could store an answer: the client lost
/// its answers, the claims are orphans. Returns when the process is gone.
pub(crate) async fn kill_mid_request(
    payments: &Payments,
    args: &[&str],
    keys: &[&'static str],
) -> Instant {
    let (mut first, base) = idem_tests::OriginProcess::spawn(args).await;
    let http = client();
    let mut sent = Vec::new();
    for &key in keys {
        let (http, url) = (http.clone(), format!("{base}/v1/charges"));
        sent.push(tokio::spawn(async move {
            http.post(&url)
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(charge_body("c-orphan", 100, 2_000))
                .send()
                .await
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while keys.iter().any(|k| payments.calls_for(k) == 0) {
        assert!(
            Instant::now() < deadline,
            "a request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = first.kill();
    let _ = first.wait();
    let killed = Instant::now();
    for answer in sent {
        assert!(answer.await.unwrap().is_err(), "the client lost its answer");
    }
    killed
}
