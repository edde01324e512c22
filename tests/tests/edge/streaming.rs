//! Bodies: streamed when not guarded, bounded when guarded, fingerprinted as the origin does whatever their size.

use super::*;

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
