//! The HTTP contract's rows on the memory store: what `cargo test -p idem` checks on a
//! machine with no service. The same rows (`idem-testkit`) run on Postgres, Redis and
//! tiered in `idem-tests` (`tests/tests/contract.rs`).

use idem::{MemoryStore, Store};
use idem_testkit::contract_rows;
use std::sync::Arc;

async fn memory(_row: &str) -> (Arc<dyn Store>, ()) {
    (Arc::new(MemoryStore::new()), ())
}

contract_rows!(memory);
