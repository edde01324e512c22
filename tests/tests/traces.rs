//! Traces through real processes: `idem-origin` in proxy mode on Postgres sends its
//! spans over OTLP/HTTP to a receiver this test runs (`idem_tests::otlp`). A request's
//! `traceparent` becomes the parent of its `idem.request` span, the upstream is sent
//! that span's own `traceparent`, the store round trips are child spans, and a replay's
//! span links to the execution's.

use idem_tests::otlp::{Receiver, Span};
use idem_tests::{client, proof, report, OriginProcess, TestDb};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TRACE_A: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN_A: &str = "00f067aa0ba902b7";
const TRACE_B: &str = "5cf92f3577b34da6a3ce929d0e0e4737";
const SPAN_B: &str = "11f067aa0ba902b8";

/// An upstream that answers 201 and keeps every `traceparent` it was sent.
async fn upstream() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let app = axum::Router::new().fallback(move |headers: http::HeaderMap| {
        let kept = kept.clone();
        async move {
            let parent = headers
                .get("traceparent")
                .map(|v| v.to_str().unwrap_or("").to_owned())
                .unwrap_or_default();
            kept.lock().unwrap().push(parent);
            (
                http::StatusCode::CREATED,
                [("content-type", "application/json")],
                r#"{"id":"pay_1"}"#,
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

async fn pay(base: &str, traceparent: &str) -> reqwest::Response {
    client()
        .post(format!("{base}/v1/payments"))
        .header("authorization", "Bearer merchant-1")
        .header("idempotency-key", "trace-1")
        .header("content-type", "application/json")
        .header("traceparent", traceparent)
        .body(r#"{"amount":100}"#)
        .send()
        .await
        .unwrap()
}

fn request_span<'a>(spans: &'a [Span], trace: &str) -> Option<&'a Span> {
    spans
        .iter()
        .find(|s| s.trace_id == trace && s.attributes.contains_key("idem.outcome"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_follow_the_request_and_a_replay_links_to_its_execution() {
    let receiver = Receiver::start().await;
    let (upstream, seen) = upstream().await;
    let db = TestDb::new("traces").await;
    let upstream_url = format!("http://{upstream}");
    let endpoint = receiver.endpoint();
    // A route for the path: the server span is named after it (`http.route`).
    let routes = std::env::temp_dir().join(format!("idem-traces-{}.toml", std::process::id()));
    std::fs::write(&routes, "[[route]]\npath = \"/v1/payments\"\n").unwrap();
    let (mut origin, base) = OriginProcess::spawn_env(
        &[
            "--routes",
            routes.to_str().unwrap(),
            "--store",
            "postgres",
            "--database-url",
            &db.url,
            "--upstream",
            &upstream_url,
            "--otlp-endpoint",
            &endpoint,
        ],
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_SERVICE_NAME", "idem-trace-test"),
        ],
    )
    .await;

    let first = pay(&base, &format!("00-{TRACE_A}-{SPAN_A}-01")).await;
    assert_eq!(first.status().as_u16(), 201);
    assert!(!first.headers().contains_key("idempotent-replayed"));
    let retry = pay(&base, &format!("00-{TRACE_B}-{SPAN_B}-01")).await;
    assert_eq!(retry.status().as_u16(), 201);
    assert!(retry.headers().contains_key("idempotent-replayed"));
    assert!(
        !retry.headers().contains_key("idem-execution-trace"),
        "the execution's trace is stored, never sent"
    );
    assert_eq!(retry.text().await.unwrap(), r#"{"id":"pay_1"}"#);

    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| {
            request_span(spans, TRACE_A).is_some() && request_span(spans, TRACE_B).is_some()
        })
        .await;
    let executed = request_span(&spans, TRACE_A)
        .unwrap_or_else(|| panic!("no request span of the first trace in {spans:#?}"));
    let replayed = request_span(&spans, TRACE_B)
        .unwrap_or_else(|| panic!("no request span of the retry's trace in {spans:#?}"));

    // The first attempt: its span continues the client's trace.
    assert_eq!(executed.service, "idem-trace-test");
    assert_eq!(
        executed.version,
        env!("CARGO_PKG_VERSION"),
        "service.version"
    );
    // OpenTelemetry's HTTP conventions: `{method} {http.route}`, a server span, with the
    // answer's status and the host asked for.
    assert_eq!(executed.name, "POST /v1/payments");
    assert_eq!(executed.attributes["http.route"], "/v1/payments");
    assert_eq!(executed.kind, 2, "a server span");
    assert_eq!(executed.attributes["http.request.method"], "POST");
    assert_eq!(executed.attributes["http.response.status_code"], "201");
    assert_eq!(executed.attributes["server.address"], "127.0.0.1");
    assert_eq!(executed.parent_span_id, SPAN_A);
    assert_eq!(executed.attributes["idem.outcome"], "executed");
    assert_eq!(executed.attributes["idem.takeover"], "false");
    assert_eq!(executed.attributes["idem.record_key"].len(), 16);
    assert_eq!(executed.attributes["idem.scope"].len(), 16);
    assert!(executed.attributes["idem.token"].parse::<u64>().unwrap() > 0);
    // The upstream was sent the idem span's own context, once.
    let sent = seen.lock().unwrap().clone();
    assert_eq!(
        sent,
        vec![format!("00-{TRACE_A}-{}-01", executed.span_id)],
        "the upstream continues the trace under idem's span"
    );
    // The store round trips are its children.
    let children: Vec<&str> = spans
        .iter()
        .filter(|s| s.parent_span_id == executed.span_id)
        .map(|s| s.name.as_str())
        .collect();
    assert!(
        children.contains(&"idem.store claim") && children.contains(&"idem.store complete"),
        "store round trips as child spans: {children:?}"
    );
    let claim = spans
        .iter()
        .find(|s| s.parent_span_id == executed.span_id && s.name == "idem.store claim")
        .unwrap();
    assert_eq!(claim.kind, 3, "a client span");
    assert_eq!(claim.attributes["db.system.name"], "postgresql");
    assert_eq!(claim.attributes["db.operation.name"], "claim");

    // The retry: its own trace, replayed, linked to the execution.
    assert_eq!(replayed.parent_span_id, SPAN_B);
    assert_eq!(replayed.attributes["idem.outcome"], "replayed");
    assert_eq!(replayed.attributes["idem.replayed"], "true");
    assert_eq!(
        replayed.links,
        vec![(TRACE_A.to_owned(), executed.span_id.clone())],
        "a replay's span links to the execution's"
    );
    assert_eq!(
        replayed.attributes["idem.record_key"],
        executed.attributes["idem.record_key"]
    );
    assert_eq!(receiver.rejected(), 0);

    // A request with a malformed traceparent starts a trace of its own.
    let res = client()
        .post(format!("{base}/v1/payments"))
        .header("authorization", "Bearer merchant-1")
        .header("idempotency-key", "trace-2")
        .header("traceparent", "00-not-a-trace-01")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 201);
    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| {
            spans
                .iter()
                .filter(|s| s.attributes.contains_key("idem.outcome"))
                .count()
                >= 3
        })
        .await;
    let third = spans
        .iter()
        .find(|s| {
            s.attributes.contains_key("idem.outcome")
                && s.trace_id != TRACE_A
                && s.trace_id != TRACE_B
        })
        .expect("a third request span");
    assert_eq!(third.parent_span_id, "", "a root span");
    let sent = seen.lock().unwrap().clone();
    assert_eq!(sent.len(), 2);
    assert!(sent[1].contains(&third.trace_id) && sent[1].contains(&third.span_id));

    let _ = origin.kill();
    let _ = origin.wait();
    proof::record(
        "admin",
        "traces",
        &[&format!(
            "the execution's `idem.request` under the client's span, the store's under it, the upstream sent idem's `traceparent`; the replay in its own trace, linked to the execution ({} spans received, counted, not asserted)",
            spans.len()
        )],
    );
    report(
        "traces",
        &format!(
            "{} spans received; the execution's span under the client's, the upstream under idem's, the store round trips under it; the replay linked to the execution",
            spans.len()
        ),
    );
}
