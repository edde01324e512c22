//! The HTTP contract's rows on the memory store: what `cargo test -p idem-origin`
//! checks on a machine with no service. The same rows run on Postgres, Redis and
//! tiered in `idem-tests` (`tests/tests/contract.rs`).

#[macro_use]
mod rows;

use idem::{MemoryStore, Store};
use std::sync::Arc;

async fn memory(_row: &str) -> (Arc<dyn Store>, ()) {
    (Arc::new(MemoryStore::new()), ())
}

contract_rows!(memory);
