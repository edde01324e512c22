//! The suites every store and every deployment of idem must pass, shared by the crates
//! that run them: `idem`'s own tests run them on the memory store, with no service;
//! `idem-tests` on every real backend and through proxy mode.
//!
//! - [`conformance`]: the store protocol, whatever executes it.
//! - [`rows`]: the HTTP contract's rows, one test each with [`contract_rows!`].

pub mod conformance;
pub mod rows;
