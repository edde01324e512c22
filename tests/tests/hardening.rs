//! What a hostile or careless client can hold of `idem-origin` on its default settings:
//! a connection that never finishes its headers, a body that never arrives, a
//! keep-alive connection left idle — each cut off within its limit, and none of them
//! leaving a claim behind.

use idem_tests::{report, OriginProcess, TestDb};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Writes `head` (and `body`), then reads until the server closes the connection or
/// `give_up` passes: what the server answered, and when it closed (`None`: still
/// open when the test gave up).
async fn hold(
    addr: &str,
    head: &str,
    body: &[u8],
    trickle: Option<(Duration, usize)>,
    give_up: Duration,
) -> (String, Option<Duration>) {
    let start = Instant::now();
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let mut next_byte = trickle.map(|(every, _)| Instant::now() + every);
    let mut trickled = 0;
    loop {
        let left = give_up.saturating_sub(start.elapsed());
        if left.is_zero() {
            return (String::from_utf8_lossy(&answer).into_owned(), None);
        }
        let wait = next_byte.map_or(left, |at| {
            at.saturating_duration_since(Instant::now()).min(left)
        });
        match tokio::time::timeout(wait, conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                return (
                    String::from_utf8_lossy(&answer).into_owned(),
                    Some(start.elapsed()),
                )
            }
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {
                // A trickling client sends its next byte.
                if let (Some((every, most)), Some(_)) = (trickle, next_byte) {
                    if trickled < most && conn.write_all(b" ").await.is_ok() {
                        trickled += 1;
                    }
                    next_byte = Some(Instant::now() + every);
                }
            }
        }
    }
}

fn status(answer: &str) -> Option<u16> {
    answer.split(' ').nth(1).and_then(|s| s.parse().ok())
}

fn charge_head(addr: &str, key: &str, length: usize) -> String {
    format!(
        "POST /v1/charges HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer slow-client\r\n\
         idempotency-key: \"{key}\"\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    )
}

#[tokio::test]
async fn slow_clients_are_cut_off_on_the_default_settings_and_hold_no_claim() {
    let db = TestDb::new("slowclients").await;
    // The defaults: only the store is given.
    let (mut origin, base) =
        OriginProcess::spawn(&["--store", "postgres", "--database-url", &db.url]).await;
    let addr = base.trim_start_matches("http://").to_owned();
    // A second origin with short body limits, for a client that trickles a byte every
    // 300 ms: never idle long, but never done.
    let (mut short, short_base) = OriginProcess::spawn(&[
        "--store",
        "postgres",
        "--database-url",
        &db.url,
        "--body-idle-timeout",
        "2s",
        "--body-read-timeout",
        "3s",
    ])
    .await;
    let short_addr = short_base.trim_start_matches("http://").to_owned();
    let give_up = Duration::from_secs(20);

    let half_head = format!(
        "POST /v1/charges HTTP/1.1\r\nhost: {addr}\r\nidempotency-key: \"slow-head\"\r\nauthori"
    );
    let slow_body_head = charge_head(&addr, "slow-body", 1000);
    let idle = format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\n\r\n");
    let trickle_head = charge_head(&short_addr, "trickle", 1000);
    let (
        (head_answer, head_cut),
        (body_answer, body_cut),
        (idle_answer, idle_cut),
        (trickle_answer, trickle_cut),
    ) = tokio::join!(
        hold(&addr, &half_head, b"", None, give_up),
        hold(&addr, &slow_body_head, b"{\"amount\":", None, give_up),
        hold(&addr, &idle, b"", None, give_up),
        hold(
            &short_addr,
            &trickle_head,
            b"{",
            Some((Duration::from_millis(300), 100)),
            give_up
        ),
    );
    let secs = |cut: Option<Duration>| {
        cut.map_or("still open".to_owned(), |d| {
            format!("{:.1} s", d.as_secs_f64())
        })
    };
    report(
        "hardening",
        &format!(
            "half a head: closed after {} ({:?}); 10 of 1000 body bytes: {:?} after {}; \
             idle keep-alive: closed after {} ({:?}); a byte every 300 ms: {:?} after {}",
            secs(head_cut),
            status(&head_answer),
            status(&body_answer),
            secs(body_cut),
            secs(idle_cut),
            status(&idle_answer),
            status(&trickle_answer),
            secs(trickle_cut),
        ),
    );
    // Cut within the limit (10 s), and not before it: the limit did it, nothing else.
    let within = |cut: Option<Duration>, limit: f64| {
        cut.is_some_and(|d| d.as_secs_f64() >= limit - 0.5 && d.as_secs_f64() < limit + 3.0)
    };
    assert!(within(head_cut, 10.0), "half a head: {}", secs(head_cut));
    assert!(
        within(idle_cut, 10.0),
        "an idle keep-alive connection: {}",
        secs(idle_cut)
    );
    assert_eq!(status(&idle_answer), Some(200), "{idle_answer}");
    assert!(within(body_cut, 10.0), "a stalled body: {}", secs(body_cut));
    assert_eq!(status(&body_answer), Some(408), "{body_answer}");
    assert!(
        body_answer.contains("urn:idem:problem:body-timeout"),
        "{body_answer}"
    );
    assert!(
        within(trickle_cut, 3.0),
        "a trickled body: {}",
        secs(trickle_cut)
    );
    assert_eq!(status(&trickle_answer), Some(408), "{trickle_answer}");

    // Nothing was claimed or charged, and the keys are free: the same keys, sent
    // whole, run now.
    assert_eq!(
        db.count("SELECT count(*) FROM idem_records").await,
        0,
        "a claim was left behind"
    );
    assert_eq!(db.charges().await, 0);
    let body = idem_tests::charge_body("cus_slow", 100, 0);
    for (at, key) in [
        (&addr, "slow-head"),
        (&addr, "slow-body"),
        (&short_addr, "trickle"),
    ] {
        let (status, text) = idem_tests::raw_request(
            at.parse().unwrap(),
            "POST",
            "/v1/charges",
            &[
                ("authorization", "Bearer slow-client"),
                ("idempotency-key", &format!("\"{key}\"")),
                ("content-type", "application/json"),
            ],
            body.as_bytes(),
        )
        .await;
        assert_eq!(status, 201, "{key}: {text}");
    }
    assert_eq!(db.charges().await, 3);
    for child in [&mut origin, &mut short] {
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[tokio::test]
async fn the_memory_store_refuses_new_keys_past_its_cap_and_replays_what_it_holds() {
    let (mut origin, base) = OriginProcess::spawn(&["--memory-max-records", "100"]).await;
    let http = idem_tests::client();
    let send = |key: String| {
        let http = http.clone();
        let url = format!("{base}/v1/charges");
        async move {
            let res = http
                .post(url)
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(idem_tests::charge_body("cus_cap", 100, 0))
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            let retry_after = res.headers().get("retry-after").cloned();
            let body = res.text().await.unwrap();
            (status, retry_after, body)
        }
    };
    let mut counts = std::collections::BTreeMap::new();
    for n in 0..150 {
        let (status, retry_after, body) = send(format!("\"cap-{n}\"")).await;
        *counts.entry(status).or_insert(0) += 1;
        if status == 503 {
            assert!(body.contains("urn:idem:problem:store-full"), "{body}");
            assert!(retry_after.is_some(), "a 503 without Retry-After");
        }
    }
    // What it holds is still answered: a retry of a stored key replays.
    let (replayed, _, _) = send("\"cap-7\"".into()).await;
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let full = metrics
        .lines()
        .find(|l| l.starts_with("idem_requests_total{outcome=\"store_full\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_owned);
    report(
        "hardening",
        &format!(
            "memory store capped at 100 records, 150 new keys: {counts:?}; a stored key's retry: {replayed}; store_full counted: {full:?}"
        ),
    );
    assert_eq!(counts, [(201, 100), (503, 50)].into());
    assert_eq!(replayed, 201);
    assert_eq!(full.as_deref(), Some("50"));
    let _ = origin.kill();
    let _ = origin.wait();
}

/// A GET to `addr` with this `Host`: the answer's body.
async fn get_with_host(addr: std::net::SocketAddr, host: &str) -> String {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET /echo HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer.split_once("\r\n\r\n").unwrap().1.to_owned()
}

#[tokio::test]
async fn proxy_mode_sends_x_forwarded_host_only_for_a_public_host() {
    // An upstream that says which X-Forwarded-Host it got.
    let echo = axum::Router::new().route(
        "/echo",
        axum::routing::get(|headers: http::HeaderMap| async move {
            headers
                .get("x-forwarded-host")
                .map_or("none".to_owned(), |v| {
                    format!("xfh={}", String::from_utf8_lossy(v.as_bytes()))
                })
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, echo).await });
    let listed = idem_tests::TestOrigin::start(&[
        "--upstream",
        &upstream,
        "--store",
        "memory",
        "--public-host",
        "api.example.com,api.example.com:8443",
    ])
    .await;
    let unlisted =
        idem_tests::TestOrigin::start(&["--upstream", &upstream, "--store", "memory"]).await;
    let mut seen = Vec::new();
    for (origin, host) in [
        (&listed, "api.example.com"),
        (&listed, "API.example.com:8443"),
        (&listed, "evil.example"),
        (&listed, "api.example.com.evil.example"),
        (&unlisted, "api.example.com"),
    ] {
        seen.push(get_with_host(origin.addr, host).await);
    }
    report(
        "hardening",
        &format!("proxy mode, X-Forwarded-Host the upstream got for 5 Hosts: {seen:?}"),
    );
    assert_eq!(
        seen,
        [
            "xfh=api.example.com",
            "xfh=API.example.com:8443",
            "none",
            "none",
            "none"
        ]
    );
}
