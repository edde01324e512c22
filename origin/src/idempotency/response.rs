//! Building the layer's own answers: problems and replays.

use axum::body::Body;
use http::{header, HeaderName, HeaderValue, Response, StatusCode};
use idem_core::contract::{Problem, IDEMPOTENT_REPLAYED, PROBLEM_CONTENT_TYPE};
use idem_core::StoredResponse;

/// An RFC 9457 problem answer. Never cacheable: `Cache-Control: no-store`.
pub(crate) fn problem(p: Problem, detail: Option<&str>) -> Response<Body> {
    let mut res = Response::new(Body::from(p.body(detail)));
    *res.status_mut() =
        StatusCode::from_u16(p.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(PROBLEM_CONTENT_TYPE),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(secs) = p.retry_after_secs() {
        h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    res
}

/// The stored answer, marked `Idempotent-Replayed: true`.
pub(crate) fn replay(stored: StoredResponse) -> Response<Body> {
    let mut res = answer(stored);
    res.headers_mut().insert(
        HeaderName::from_static(IDEMPOTENT_REPLAYED),
        HeaderValue::from_static("true"),
    );
    res
}

/// The stored answer as it was stored.
pub(crate) fn answer(stored: StoredResponse) -> Response<Body> {
    let mut res = Response::new(Body::from(stored.body));
    *res.status_mut() =
        StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = res.headers_mut();
    for (name, value) in stored.headers {
        // Names and values were valid when stored; skip anything that no longer parses
        // rather than fail the replay.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) {
            h.append(name, value);
        }
    }
    res
}
