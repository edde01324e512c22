//! The shared Redis and Redis Cluster (`scripts/services-start` starts both); each
//! test keeps its keys in a namespace of its own.

use idem::{RedisOptions, RedisStore};
use std::sync::atomic::{AtomicU32, Ordering};

/// The standalone Redis the tests use (`IDEM_TEST_REDIS_URL`).
pub fn redis_url() -> String {
    std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The Redis Cluster nodes the tests use (`IDEM_TEST_REDIS_CLUSTER_URLS`, comma-separated).
pub fn redis_cluster_urls() -> String {
    std::env::var("IDEM_TEST_REDIS_CLUSTER_URLS").unwrap_or_else(|_| {
        (7000..7006)
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// A Redis key namespace no other test (or earlier run) uses.
pub fn unique_namespace(label: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "test-{label}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A Redis store on `urls` (a node, or the cluster's nodes) in a fresh namespace;
/// panics with what to do when Redis is not there.
pub async fn redis_store(urls: &str, label: &str) -> RedisStore {
    let options = RedisOptions::default().namespace(unique_namespace(label));
    RedisStore::connect(urls, options)
        .await
        .unwrap_or_else(|e| {
            panic!("cannot connect to Redis at {urls}: {e} — run scripts/services-start")
        })
}
