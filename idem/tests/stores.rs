//! The conformance suite on the stores that need no service: the memory store, and
//! the replay cache in front of it.

use idem::{MemoryStore, ReplayCache};
use idem_testkit::conformance::{conformance, purges_and_listing};
use std::sync::Arc;

#[tokio::test]
async fn memory() {
    let store = MemoryStore::new();
    conformance(&store).await;
    purges_and_listing(&store).await;
}

#[tokio::test]
async fn replay_cache_over_memory() {
    let cache = ReplayCache::new(Arc::new(MemoryStore::new()), 1 << 20);
    conformance(&cache).await;
    purges_and_listing(&cache).await;
}
