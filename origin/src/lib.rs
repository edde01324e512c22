//! `idem-origin`: the [`idem`] library served as a program — an axum service that
//! runs a side-effecting API (the demo charges API) behind the idempotency layer, on
//! the store its flags choose, with health checks and a Prometheus exporter.
//!
//! * [`charges`] — the demo business API whose double charges are countable.
//! * [`app`] and [`config`] — wiring, health and the command line.
//! * [`metrics`] — the Prometheus exporter for what the library records.
//! * [`proxy`] — proxy mode (`--upstream`): any HTTP service behind the layer.
//! * [`routes`] — the route file (`--routes`): settings per path.
//! * [`admin_cli`] — `idem-origin admin …`: the admin API from a shell.
//! * [`convert_cli`] — `idem-origin convert-keys`: a Postgres table of idem 0.1 to
//!   binary keys.
//! * [`telemetry`] — traces over OTLP (`--otlp-endpoint`).
#![forbid(unsafe_code)]

pub mod admin_cli;
pub mod app;
pub mod charges;
pub mod config;
pub mod convert_cli;
pub mod metrics;
pub mod proxy;
pub mod routes;
pub mod serve;
pub mod telemetry;
pub mod upstream_pool;
pub mod upstream_tls;
