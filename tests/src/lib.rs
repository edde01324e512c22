//! Test harness, by service: the shared Postgres ([`postgres`]: one fresh schema per
//! test), the shared Redis and Redis Cluster ([`redis`]), origins served over real
//! HTTP on loopback — in this process or as `idem-origin` processes ([`origin`]) — a
//! TCP proxy that can cut a store off mid-test ([`proxy`]), and dedicated service
//! processes that a test may kill ([`procs`]).
//!
//! A test that needs a service that is not running says so and how to start it
//! (`scripts/services-start`); `scripts/test` starts them all first.

pub mod edge;
pub mod origin;
pub mod otlp;
pub mod postgres;
pub mod procs;
pub mod proof;
pub mod proxy;
pub mod redis;
pub mod scope_vectors;
pub mod upstream;

pub use origin::{
    assert_clock_ahead, charge_body, client, clock_ahead_secs, edge_secret_file, faketime_lib,
    post_charge, post_charge_as_edge, post_json, raw_request, OriginProcess, TestOrigin,
    EDGE_SECRET,
};
pub use postgres::{connect, database_url, pg_addr, via, with_search_path, TestDb};
pub use proxy::Proxy;
pub use redis::{redis_cluster_urls, redis_store, redis_url, unique_namespace};
pub use upstream::Payments;

/// Logs of the code under test on stderr, filtered by `IDEM_TEST_LOG` (an `EnvFilter`,
/// e.g. `idem=debug,redis=debug`); nothing when it is unset. For a test that fails
/// in a way its counts don't explain.
pub fn logs_from_env() {
    if let Ok(filter) = std::env::var("IDEM_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// Appends a line to `target/idem-reports/<name>.txt`; `scripts/test` prints these at
/// the end, so the figures behind each claim are visible without `--nocapture`.
pub fn report(name: &str, line: &str) {
    use std::io::Write;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/idem-reports");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.txt")))
    {
        let _ = writeln!(f, "{line}");
    }
    eprintln!("[{name}] {line}");
}
