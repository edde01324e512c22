//! TLS to the stores: a Postgres with `ssl = on` and a Redis with a TLS port, both
//! with certificates from a CA the test makes; the right CA is trusted, a wrong CA is
//! refused with a readable error.

use idem::PgOptions;
use idem::StoreExt;
use idem::{PostgresStore, RedisOptions, RedisStore, Store};
use idem_core::{Decision, Fingerprint, IdempotencyKey, Policy, RecordKey, Scope};
use idem_tests::procs::{PgProc, RedisProc, TestCa};

fn key() -> RecordKey {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("tls-{}-{}-{n}", std::process::id(), idem::now());
    RecordKey::new(
        &Scope::anonymous(),
        &IdempotencyKey::parse(name.as_bytes()).unwrap(),
    )
}

async fn claims(store: &dyn Store) {
    let d = store
        .claim(
            &key(),
            &Fingerprint([1; 32]),
            idem::now(),
            &Policy::default(),
        )
        .await
        .unwrap();
    assert!(matches!(d, Decision::Execute(_)));
}

async fn uses_ssl(store: &PostgresStore) -> bool {
    let client = store.pool().get().await.unwrap();
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_verifies_the_server() {
    let ca = TestCa::new("pgtls");
    let pg = tokio::task::block_in_place(|| PgProc::start_tls("pgtls", &ca));
    let base = format!("postgres://postgres@localhost:{}/postgres", pg.port);

    let full = format!("{base}?sslmode=verify-full&sslrootcert={}", ca.ca.display());
    let store = PostgresStore::connect(&full, PgOptions::default())
        .await
        .expect("verify-full with the right CA");
    assert!(uses_ssl(&store).await, "the connection is encrypted");
    claims(&store).await;

    // The CA from the flag instead of the URL; the IP is in the certificate too.
    let by_ip = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full",
        pg.port
    );
    let options = PgOptions::default().ca_file(Some(ca.ca.clone()));
    assert!(
        uses_ssl(
            &PostgresStore::connect(&by_ip, options)
                .await
                .expect("verify-full by IP")
        )
        .await
    );

    // require: encrypted without verification, as libpq does without a CA.
    let require = PostgresStore::connect(&format!("{base}?sslmode=require"), PgOptions::default())
        .await
        .unwrap();
    assert!(uses_ssl(&require).await);

    let wrong = format!(
        "{base}?sslmode=verify-full&sslrootcert={}",
        ca.wrong_ca.display()
    );
    let err = PostgresStore::connect(&wrong, PgOptions::default())
        .await
        .err()
        .expect("a wrong CA is refused")
        .to_string();
    assert!(
        err.contains("certificate") || err.contains("UnknownIssuer"),
        "readable error: {err}"
    );
    idem_tests::report(
        "tls",
        &format!("postgres verify-full with a wrong CA refused: {err}"),
    );

    // A CA given by the flag is used with `require` and `prefer` too: a wrong one is
    // refused (it used to be ignored), the right one verifies.
    for mode in ["require", "prefer"] {
        let url = format!("{base}?sslmode={mode}");
        let with =
            |ca_file: &std::path::Path| PgOptions::default().ca_file(Some(ca_file.to_path_buf()));
        let err = PostgresStore::connect(&url, with(&ca.wrong_ca))
            .await
            .err()
            .unwrap_or_else(|| panic!("{mode} with a wrong --database-ca-file is refused"))
            .to_string();
        assert!(
            err.contains("certificate") || err.contains("UnknownIssuer"),
            "{mode}: {err}"
        );
        let store = PostgresStore::connect(&url, with(&ca.ca))
            .await
            .unwrap_or_else(|e| panic!("{mode} with the right CA: {e}"));
        assert!(uses_ssl(&store).await);
    }

    // The certificate names `localhost` and 127.0.0.1. The same server under another
    // name (`hostaddr` connects to the address, the name is what is verified):
    // verify-full checks the name and refuses it; verify-ca checks the chain only.
    let other_name = format!(
        "postgres://postgres@not-the-server.test:{}/postgres?hostaddr=127.0.0.1&sslrootcert={}",
        pg.port,
        ca.ca.display()
    );
    let err = PostgresStore::connect(
        &format!("{other_name}&sslmode=verify-full"),
        PgOptions::default(),
    )
    .await
    .err()
    .expect("verify-full refuses a certificate for another name")
    .to_string();
    assert!(
        err.contains("NotValidForName") || err.contains("name"),
        "readable error: {err}"
    );
    idem_tests::report(
        "tls",
        &format!("postgres verify-full with a host-name mismatch refused: {err}"),
    );
    let by_chain = PostgresStore::connect(
        &format!("{other_name}&sslmode=verify-ca"),
        PgOptions::default(),
    )
    .await
    .expect("verify-ca checks the chain, not the name");
    assert!(uses_ssl(&by_chain).await);
    claims(&by_chain).await;
    let wrong_chain = format!(
        "postgres://postgres@not-the-server.test:{}/postgres?hostaddr=127.0.0.1&sslmode=verify-ca&sslrootcert={}",
        pg.port,
        ca.wrong_ca.display()
    );
    let err = PostgresStore::connect(&wrong_chain, PgOptions::default())
        .await
        .err()
        .expect("verify-ca refuses a wrong CA")
        .to_string();
    assert!(
        err.contains("certificate") || err.contains("UnknownIssuer"),
        "readable error: {err}"
    );

    let missing = format!("{base}?sslmode=verify-full");
    let err = PostgresStore::connect(&missing, PgOptions::default())
        .await
        .err()
        .expect("no CA, no verify-full")
        .to_string();
    assert!(err.contains("CA file"), "{err}");
}

/// compose.yaml's Postgres serves the certificate `scripts/compose-certs` makes, and
/// its origin connects with `sslmode=verify-full` and the script's CA: the same
/// certificates here, by name, encrypted; another CA refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_certificates_serve_verify_full() {
    let ca = TestCa::from_compose_script("compose-certs");
    let pg = tokio::task::block_in_place(|| PgProc::start_tls("compose-certs", &ca));
    // By the name compose's origin uses (`postgres`), at this machine's address.
    let url = |ca_file: &std::path::Path| {
        format!(
            "postgres://postgres@postgres:{}/postgres?hostaddr=127.0.0.1&sslmode=verify-full&sslrootcert={}",
            pg.port,
            ca_file.display()
        )
    };
    let store = PostgresStore::connect(&url(&ca.ca), PgOptions::default())
        .await
        .expect("verify-full with the script's CA");
    assert!(uses_ssl(&store).await, "the connection is encrypted");
    claims(&store).await;
    let err = PostgresStore::connect(&url(&ca.wrong_ca), PgOptions::default())
        .await
        .err()
        .expect("another CA is refused")
        .to_string();
    assert!(
        err.contains("UnknownIssuer") || err.contains("certificate"),
        "{err}"
    );
    let compose =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../compose.yaml")).unwrap();
    assert!(
        compose.contains("sslmode=verify-full&sslrootcert=/certs/ca.pem"),
        "compose.yaml's origin verifies Postgres"
    );
}

/// A man in the middle in front of Postgres on `upstream`: it answers every client's
/// SSLRequest with `N` ("no TLS here"), as one that strips TLS does, then relays the
/// session in plain text. Its port.
async fn tls_stripper(upstream: u16) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut first = [0u8; 8];
                if client.read_exact(&mut first).await.is_err() {
                    return;
                }
                let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    return;
                };
                // Length 8, code 80877103: SSLRequest.
                if first == [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f] {
                    if client.write_all(b"N").await.is_err() {
                        return;
                    }
                } else if server.write_all(&first).await.is_err() {
                    return;
                }
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_ssl_request_is_refused_when_a_ca_is_given() {
    let ca = TestCa::new("pgstrip");
    let pg = tokio::task::block_in_place(|| PgProc::start_tls("pgstrip", &ca));
    let stripped = tls_stripper(pg.port).await;
    let through =
        |query: &str| format!("postgres://postgres@localhost:{stripped}/postgres?{query}");
    // Without a CA, `prefer` takes the plain session it is offered: that is what
    // `prefer` means (libpq's too), and why a CA changes it. The stripper is in the
    // path for real: the session is not encrypted.
    let plain = PostgresStore::connect(&through("sslmode=prefer"), PgOptions::default())
        .await
        .expect("prefer without a CA accepts a server without TLS");
    assert!(!uses_ssl(&plain).await, "the stripper did not strip TLS");
    let with_ca =
        |ca_file: &std::path::Path| PgOptions::default().ca_file(Some(ca_file.to_path_buf()));
    let (mut refused, mut connected) = (Vec::new(), Vec::new());
    for (query, options) in [
        ("sslmode=prefer".to_owned(), with_ca(&ca.ca)),
        ("sslmode=require".to_owned(), with_ca(&ca.ca)),
        (
            format!("sslmode=prefer&sslrootcert={}", ca.ca.display()),
            PgOptions::default(),
        ),
        (
            format!("sslrootcert={}", ca.ca.display()),
            PgOptions::default(),
        ),
        (
            format!("sslmode=verify-ca&sslrootcert={}", ca.ca.display()),
            PgOptions::default(),
        ),
        (
            format!("sslmode=verify-full&sslrootcert={}", ca.ca.display()),
            PgOptions::default(),
        ),
    ] {
        match PostgresStore::connect(&through(&query), options).await {
            Ok(store) => connected.push(format!("{query} (encrypted: {})", uses_ssl(&store).await)),
            Err(e) => {
                // Refused for the right reason: no TLS offered, not a typo in the test.
                assert!(
                    e.to_string().contains("does not support TLS"),
                    "{query}: {e}"
                );
                refused.push(format!("{query}: {e}"));
            }
        }
    }
    idem_tests::report(
        "tls",
        &format!(
            "postgres through a TLS stripper: prefer without a CA connects in plain text (as \
             libpq does); with a CA, {} of 6 refused ({}), connected: {connected:?}",
            refused.len(),
            refused.first().map_or("", String::as_str)
        ),
    );
    assert!(
        connected.is_empty(),
        "a CA given, and through a stripper: {connected:?}"
    );
    // And straight to the server, the same settings connect, encrypted.
    let direct = format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=prefer",
        pg.port
    );
    let store = PostgresStore::connect(&direct, with_ca(&ca.ca))
        .await
        .unwrap();
    assert!(uses_ssl(&store).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_verifies_the_server() {
    let ca = TestCa::new("redistls");
    let redis = tokio::task::block_in_place(|| RedisProc::start_tls("redistls", &ca));
    let url = redis.url();
    assert!(url.starts_with("rediss://"));

    let options = RedisOptions::default().ca_file(Some(ca.ca.clone()));
    let store = RedisStore::connect(&url, options)
        .await
        .expect("rediss with the right CA");
    claims(&store).await;

    let options = RedisOptions::default().ca_file(Some(ca.wrong_ca.clone()));
    let err = RedisStore::connect(&url, options)
        .await
        .err()
        .expect("a wrong CA is refused")
        .to_string();
    assert!(
        err.contains("certificate") || err.contains("UnknownIssuer") || err.contains("TLS"),
        "readable error: {err}"
    );
    idem_tests::report("tls", &format!("rediss with a wrong CA refused: {err}"));

    // Plain redis:// to a TLS-only port does not silently work.
    let plain = url.replacen("rediss://", "redis://", 1);
    let options = RedisOptions::default().timeout(std::time::Duration::from_millis(500));
    assert!(RedisStore::connect(&plain, options).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_over_tls_verifies_every_node() {
    use idem_tests::procs::RedisClusterProc;
    let ca = TestCa::new("clustertls");
    let cluster = tokio::task::block_in_place(|| RedisClusterProc::start_tls("clustertls", &ca));
    let urls = cluster.urls();
    assert!(urls.starts_with("rediss://"));
    let options = RedisOptions::default().ca_file(Some(ca.ca.clone()));
    let store = RedisStore::connect(&urls, options)
        .await
        .expect("rediss cluster with the right CA");
    assert!(store.is_cluster());
    // Keys land on every master: several claims cover the slots of all three.
    for _ in 0..12 {
        claims(&store).await;
    }
    let options = RedisOptions::default().ca_file(Some(ca.wrong_ca.clone()));
    assert!(
        RedisStore::connect(&urls, options).await.is_err(),
        "a wrong CA is refused"
    );
}
