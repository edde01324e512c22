//! Dedicated service processes for fault tests — a Redis, a Redis Cluster, a Postgres —
//! each on free loopback ports and in its own temporary directory, so a test can
//! kill -9, flush or stop them without disturbing the shared services. Everything is
//! killed when the handle drops.

mod partition;
mod postgres;
mod redis;
mod tls;

pub use self::partition::Partition;
pub use self::postgres::PgProc;
pub use self::redis::{redis_cli, RedisClusterProc, RedisProc};
pub use self::tls::TestCa;

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A loopback port that is free now (and whose cluster-bus port, +10000, is too).
pub fn free_port() -> u16 {
    for _ in 0..200 {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair found");
}

pub(crate) fn temp_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "idem-fault-{label}-{}-{}",
        std::process::id(),
        free_port()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub(crate) fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
