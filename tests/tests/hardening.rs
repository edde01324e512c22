//! What a hostile or careless client can hold of `idem-origin` on its default settings:
//! a connection that never finishes its headers, a body that never arrives, a
//! keep-alive connection left idle — each cut off within its limit, and none of them
//! leaving a claim behind.

use idem_tests::{report, OriginProcess, TestDb};
use std::collections::BTreeMap;
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
    // Cut at the limit, and not before it: the limit did it, nothing else (the old
    // server held all four open past the 20 s the test waits).
    let within = |cut: Option<Duration>, limit: f64| {
        cut.is_some_and(|d| d.as_secs_f64() >= limit - 0.5 && d.as_secs_f64() < limit + 6.0)
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
        body_answer
            .contains("https://github.com/idem-rs/idem/blob/main/docs/problems.md#body-timeout"),
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
            let headers = res.headers().clone();
            let body = res.text().await.unwrap();
            (status, headers, body)
        }
    };
    let mut counts = std::collections::BTreeMap::new();
    for n in 0..150 {
        let (status, headers, body) = send(format!("\"cap-{n}\"")).await;
        *counts.entry(status).or_insert(0) += 1;
        if status == 503 {
            assert!(
                body.contains(
                    "https://github.com/idem-rs/idem/blob/main/docs/problems.md#store-full"
                ),
                "{body}"
            );
            assert!(
                headers.contains_key("retry-after"),
                "a 503 without Retry-After"
            );
        }
    }
    // What it holds is still answered: a retry of a stored key replays.
    let (replayed, headers, _) = send("\"cap-7\"".into()).await;
    assert_eq!(
        headers.get("idempotent-replayed").map(|v| v.as_bytes()),
        Some(&b"true"[..]),
        "a stored key's retry is a replay"
    );
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

/// Sends a whole guarded charge that runs `latency_ms`, then hangs up without reading
/// the answer.
async fn send_and_hang_up(addr: &str, key: &str, latency_ms: u64) {
    let body = idem_tests::charge_body("cus_gone", 100, latency_ms);
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/charges HTTP/1.1\r\nhost: {addr}\r\nidempotency-key: \"{key}\"\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body.as_bytes()).await.unwrap();
    // Long enough for the request to be read and claimed, then gone.
    tokio::time::sleep(Duration::from_millis(150)).await;
    drop(conn);
}

#[tokio::test]
async fn requests_in_progress_are_capped_even_when_their_clients_hang_up() {
    let (mut origin, base) = OriginProcess::spawn(&["--max-requests", "4"]).await;
    let addr = base.trim_start_matches("http://").to_owned();
    let http = idem_tests::client();
    let charge = |key: String, customer: &'static str, latency_ms: u64| {
        let (http, url) = (http.clone(), format!("{base}/v1/charges"));
        async move {
            let res = http
                .post(url)
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(idem_tests::charge_body(customer, 100, latency_ms))
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            (status, res.text().await.unwrap())
        }
    };
    // Four clients send a charge that runs 3 s and hang up: their handlers go on.
    for n in 0..4 {
        send_and_hang_up(&addr, &format!("gone-{n}"), 3_000).await;
    }
    // While they run, a fifth is turned away, though no client is connected any more;
    // the probes still answer.
    let (status, body) = charge("\"fifth\"".into(), "cus_busy", 0).await;
    let healthz = http
        .get(format!("{base}/healthz"))
        .send()
        .await
        .unwrap()
        .status();
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap();
    let metrics_status = metrics.status();
    let busy = metrics
        .text()
        .await
        .unwrap()
        .lines()
        .find(|l| l.starts_with("idem_server_busy_total"))
        .map(str::to_owned);
    report(
        "hardening",
        &format!(
            "--max-requests 4, 4 charges whose clients hung up, still running: a fifth got {status} \
             ({}); /healthz {healthz}, /metrics {metrics_status}",
            body.split("\"type\":\"").nth(1).and_then(|t| t.split('"').next()).unwrap_or("")
        ),
    );
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("https://github.com/idem-rs/idem/blob/main/docs/problems.md#server-busy"),
        "{body}"
    );
    // Turned away by the layer (the clients had left the listener), not the listener.
    assert!(
        busy.as_deref().is_none_or(|l| l.ends_with(" 0")),
        "{busy:?}"
    );
    assert_eq!((healthz.as_u16(), metrics_status.as_u16()), (200, 200));
    // Once they are done, the next one runs, and each hung-up charge was kept.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert_eq!(charge("\"fifth\"".into(), "cus_busy", 0).await.0, 201);
    for n in 0..4 {
        let (status, body) = charge(format!("\"gone-{n}\""), "cus_gone", 3_000).await;
        assert_eq!(status, 201, "gone-{n}: {body}");
    }
    let _ = origin.kill();
    let _ = origin.wait();
}

/// One caller (one scope) cannot take every place of the server or fill its store:
/// with `--scope-max-in-progress 2`, tenant A's four concurrent charges run two and
/// get `429 …:scope-quota` for the others while tenant B's runs; with
/// `--scope-max-new-keys 5`, A's sixth and seventh new keys get `429` with
/// `Retry-After`, its stored answers still replay, and B still makes new keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_caller_cannot_take_every_place_or_fill_the_store() {
    let (mut origin, base) = OriginProcess::spawn(&[
        "--scope-max-in-progress",
        "2",
        "--scope-max-new-keys",
        "5",
        "--scope-new-keys-window",
        "1m",
    ])
    .await;
    let http = idem_tests::client();
    let send = |tenant: &'static str, key: String, latency_ms: u64| {
        let http = http.clone();
        let url = format!("{base}/v1/charges");
        async move {
            let res = http
                .post(url)
                .header("authorization", format!("Bearer {tenant}"))
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(idem_tests::charge_body(tenant, 100, latency_ms))
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            let replayed = res.headers().contains_key("idempotent-replayed");
            let retry_after = res
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            let body = res.text().await.unwrap();
            let quota = body
                .contains("https://github.com/idem-rs/idem/blob/main/docs/problems.md#scope-quota");
            (status, quota, replayed, retry_after)
        }
    };
    // Four of A's at once, and one of B's while they run.
    let a: Vec<_> = (0..4)
        .map(|n| tokio::spawn(send("tenant-a", format!("\"a-{n}\""), 1_500)))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = send("tenant-b", "\"b-0\"".into(), 0).await;
    let mut at_once = BTreeMap::new();
    for handle in a {
        let (status, quota, _, _) = handle.await.unwrap();
        *at_once.entry((status, quota)).or_insert(0) += 1;
    }
    // A's new keys, one after the other (2 of its 5 made above).
    let mut new_keys = Vec::new();
    for n in 10..15 {
        let (status, quota, _, retry_after) = send("tenant-a", format!("\"a-{n}\""), 0).await;
        new_keys.push((status, quota, retry_after));
    }
    let stored = send("tenant-a", "\"a-10\"".into(), 0).await;
    let b_new = send("tenant-b", "\"b-1\"".into(), 0).await;
    let charges = |customer: &'static str| {
        let http = http.clone();
        let url = format!("{base}/v1/charges?customer={customer}");
        async move {
            let list: serde_json::Value = http.get(url).send().await.unwrap().json().await.unwrap();
            list["data"].as_array().map_or(0, Vec::len)
        }
    };
    let (a_charges, b_charges) = (charges("tenant-a").await, charges("tenant-b").await);
    report(
        "hardening",
        &format!(
            "per-scope quotas (2 in progress, 5 new keys a minute): A's 4 at once {at_once:?}, B's meanwhile {}; \
             A's next 5 new keys {new_keys:?}; A's stored key again {} (replayed {}); B's new key {}; charges A {a_charges}, B {b_charges}",
            b.0, stored.0, stored.2, b_new.0
        ),
    );
    assert_eq!(
        at_once,
        BTreeMap::from([((201, false), 2), ((429, true), 2)]),
        "A's four at once"
    );
    assert_eq!(b.0, 201, "B is not held up by A");
    let statuses: Vec<u16> = new_keys.iter().map(|(s, ..)| *s).collect();
    assert_eq!(statuses, [201, 201, 201, 429, 429], "A's new keys");
    for (status, quota, retry_after) in &new_keys[3..] {
        assert!(*quota, "{status}: not a scope-quota problem");
        assert!(
            retry_after.is_some_and(|s| (1..=60).contains(&s)),
            "Retry-After {retry_after:?}"
        );
    }
    assert_eq!(
        (stored.0, stored.2),
        (201, true),
        "a stored key still replays"
    );
    assert_eq!(b_new.0, 201, "B still makes new keys");
    assert_eq!((a_charges, b_charges), (5, 2));
    let _ = origin.kill();
    let _ = origin.wait();

    // New keys sent all at once, with no quota on requests in progress: each takes its
    // place in the quota before its claim, so a burst cannot pass a check meant for
    // one. (Counted only after the claim, as first written, the burst still got 3 here:
    // the window between check and count is one claim's round trip, which this load
    // does not hit; the unit test `new_keys_past_the_quota_wait_for_the_window` holds
    // three places at once.)
    let (mut origin, base) = OriginProcess::spawn(&["--scope-max-new-keys", "3"]).await;
    let burst: Vec<_> = (0..8)
        .map(|n| {
            let http = http.clone();
            let url = format!("{base}/v1/charges");
            tokio::spawn(async move {
                http.post(url)
                    .header("authorization", "Bearer tenant-c")
                    .header("idempotency-key", format!("\"c-{n}\""))
                    .header("content-type", "application/json")
                    .body(idem_tests::charge_body("tenant-c", 100, 300))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let mut burst_statuses = BTreeMap::new();
    for handle in burst {
        *burst_statuses.entry(handle.await.unwrap()).or_insert(0) += 1;
    }
    let list: serde_json::Value = http
        .get(format!("{base}/v1/charges?customer=tenant-c"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let burst_charges = list["data"].as_array().map_or(0, Vec::len);
    report(
        "hardening",
        &format!("8 new keys at once with --scope-max-new-keys 3: {burst_statuses:?}, {burst_charges} charges"),
    );
    assert_eq!(burst_statuses, BTreeMap::from([(201, 3), (429, 5)]));
    assert_eq!(burst_charges, 3);
    let _ = origin.kill();
    let _ = origin.wait();
}
