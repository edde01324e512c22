//! idem at the edge: a Cloudflare Worker that answers retries before they reach the
//! origin.
//!
//! Every guarded request (POST/PATCH with an `Idempotency-Key`) is routed to one
//! Durable Object per (scope, key), which asks the same core as the origin what to do
//! and records the answer in one storage write — before the worker makes any outbound
//! fetch. The first attempt is forwarded to the origin (`ORIGIN_URL`) unchanged; its
//! answer is stored (up to `MAX_STORED_BODY_BYTES`) and replayed to retries with
//! `Idempotent-Replayed: true`. The origin stays the authority: when the edge has no
//! record (evicted, expired, a new deployment), or its Durable Object is unreachable,
//! the request goes to the origin, which replays or refuses — losing edge state never
//! runs the handler twice.
//!
//! * [`flow`] — one request, over plain values: every decision from the core's
//!   contract, every effect through an [`flow::EdgeRuntime`] (host-testable).
//! * [`config`] — the worker's vars.
//! * [`records`] — the durable-backend adapter trait, the Durable Object protocol, and
//!   the pure function the Durable Object executes; [`memory`] runs it on the host.
//! * `durable` / `handler` — the Durable Object and the Workers runtime (wasm32 only).
//!
//! A panic is logged by `worker`'s own start hook ("Rust panic: …" on the console),
//! which marks the instance for re-initialisation.

pub mod config;
pub mod flow;
pub mod memory;
pub mod records;

#[cfg(target_arch = "wasm32")]
mod bench;
#[cfg(target_arch = "wasm32")]
mod durable;
#[cfg(target_arch = "wasm32")]
mod handler;
#[cfg(target_arch = "wasm32")]
mod webcrypto;

#[cfg(target_arch = "wasm32")]
pub use durable::IdemRecord;

#[cfg(target_arch = "wasm32")]
#[worker::event(fetch)]
async fn fetch(
    req: worker::Request,
    env: worker::Env,
    ctx: worker::Context,
) -> worker::Result<worker::Response> {
    handler::handle(req, env, ctx).await
}
