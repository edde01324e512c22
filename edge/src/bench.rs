//! `POST /__idem/bench/fingerprint?impl=wasm|webcrypto&iters=K`, for `idem-bench
//! --edge-hash` only, and served only when the var `IDEM_BENCH` is `fingerprint` (never
//! set it on a deployed worker: the route answers anyone, before any check): the
//! posted body fingerprinted K times, by SHA-256 in WASM or by WebCrypto over the same
//! message, and the fingerprint as the answer. The bench times requests with K and
//! with 0 from outside: workerd's clocks stand still while a request computes.

use crate::webcrypto;
use idem_core::{Fingerprint, RequestParts};
use worker::{Request, Response, Result};

pub const PATH: &str = "/__idem/bench/fingerprint";

/// Bounds on one request's work (iterations × body bytes, a body counted as at least
/// 1 KiB) and on its body: more would hold the isolate for seconds.
const MOST_ITERATIONS: u32 = 100_000;
const MOST_WORK_BYTES: usize = 64 << 20;
const MOST_BODY_BYTES: usize = 1 << 20;

pub async fn serve(mut req: Request) -> Result<Response> {
    let url = req.url()?;
    let (mut webcrypto, mut iterations) = (None, None);
    for (name, value) in url.query_pairs() {
        match (name.as_ref(), value.as_ref()) {
            ("impl", "wasm") => webcrypto = Some(false),
            ("impl", "webcrypto") => webcrypto = Some(true),
            ("iters", n) => iterations = n.parse::<u32>().ok().filter(|n| *n <= MOST_ITERATIONS),
            _ => {}
        }
    }
    let (Some(webcrypto), Some(iterations)) = (webcrypto, iterations) else {
        return Response::error(
            format!("needs impl=wasm|webcrypto and iters=0..={MOST_ITERATIONS}"),
            400,
        );
    };
    let content_type = req.headers().get("content-type")?;
    let body = req.bytes().await?;
    if body.len() > MOST_BODY_BYTES || iterations as usize * body.len().max(1024) > MOST_WORK_BYTES
    {
        return Response::error(
            format!("at most {MOST_BODY_BYTES} body bytes and {MOST_WORK_BYTES} bytes hashed per request"),
            413,
        );
    }
    let parts = RequestParts {
        method: "POST",
        path_and_query: "/v1/charges",
        content_type: content_type.as_deref(),
        body: &body,
    };
    let mut last = None;
    for _ in 0..iterations {
        last = Some(match webcrypto {
            true => Fingerprint(
                webcrypto::sha256(&Fingerprint::message(&parts))
                    .await
                    .ok_or("WebCrypto refused to digest")?,
            ),
            false => Fingerprint::of(&parts),
        });
    }
    Response::ok(last.map_or_else(String::new, |f| f.to_hex()))
}
