//! The layer's own answers, written out from the contract's plain values: refusals
//! and replays.

use axum::body::Body;
use http::{HeaderName, HeaderValue, Response, StatusCode};
use idem_core::contract::{self, Rejection};
use idem_core::StoredResponse;

/// One of idem's refusals ([`Rejection::headers`]: never cacheable).
pub(crate) fn refusal(rejection: &Rejection) -> Response<Body> {
    let headers = rejection.headers();
    let mut res = build(
        rejection.status(),
        headers.iter().map(|(n, v)| (*n, v.as_bytes())),
        rejection.body(),
    );
    res.extensions_mut().insert(Refused(rejection.clone()));
    res
}

/// The refusal an answer was made from, so that the layer can write its type under
/// another base ([`rebase_problem`]).
#[derive(Clone, Debug)]
pub(crate) struct Refused(pub(crate) Rejection);

/// Writes a refusal's body again with its type under `base` (the default base's
/// answers are already so).
pub(crate) fn rebase_problem(res: &mut Response<Body>, base: &str) {
    if base == contract::DEFAULT_PROBLEM_BASE {
        return;
    }
    if let Some(Refused(rejection)) = res.extensions_mut().remove::<Refused>() {
        let body = rejection.body_under(base);
        res.headers_mut().remove(http::header::CONTENT_LENGTH);
        *res.body_mut() = Body::from(body);
    }
}

/// The stored answer, marked `Idempotent-Replayed: true`, and stored until
/// `expires_at`: the key's TTL the client is told, at `now`, and — to idem's edge
/// (`for_edge`: the record's tag and the fingerprint it was stored under) — the
/// disposition it keeps its copy by.
pub(crate) fn replay(
    stored: StoredResponse,
    for_edge: Option<(idem_core::RecordTag, &idem_core::Fingerprint)>,
    expires_at: idem_core::Millis,
    now: idem_core::Millis,
) -> Response<Body> {
    let StoredResponse {
        status,
        headers,
        body,
    } = stored;
    let mut res = build(status, contract::replay_headers(&headers), body);
    if let Some((record, fingerprint)) = for_edge {
        tell_edge_stored(res.headers_mut(), record, fingerprint, expires_at, &headers);
    }
    advertise_ttl(&mut res, expires_at, now);
    res
}

/// Tells an edge in front that this answer is stored in the record tagged `record`
/// ([`contract::KeyHeaders::record_tag`]) until `expires_at`, with these headers: the
/// edge keeps a copy as long, with the same ones — if it claimed the request under the
/// same record, its key read from the same headers.
pub(crate) fn tell_edge_stored(
    headers: &mut http::HeaderMap,
    record: idem_core::RecordTag,
    fingerprint: &idem_core::Fingerprint,
    expires_at: idem_core::Millis,
    stored: &[(String, Vec<u8>)],
) {
    let disposition = contract::OriginDisposition::Stored {
        expires_at,
        record,
        fingerprint: Some(*fingerprint),
    };
    if let Ok(v) = HeaderValue::from_str(&disposition.header_value()) {
        headers.insert(contract::ORIGIN_DISPOSITION, v);
    }
    if let Ok(v) = HeaderValue::from_str(&contract::stored_header_names(stored)) {
        headers.insert(contract::STORED_HEADERS, v);
    }
}

/// Tells the client how long its key stays bound ([`contract::KEY_TTL`]).
pub(crate) fn advertise_ttl<B>(
    res: &mut Response<B>,
    expires_at: idem_core::Millis,
    now: idem_core::Millis,
) {
    let ttl = contract::key_ttl(expires_at, now).and_then(|v| HeaderValue::from_str(&v).ok());
    match ttl {
        Some(v) => res.headers_mut().insert(contract::KEY_TTL, v),
        None => res.headers_mut().remove(contract::KEY_TTL),
    };
}

/// The stored answer as it was stored (but idem's private headers).
pub(crate) fn answer(stored: StoredResponse) -> Response<Body> {
    let StoredResponse {
        status,
        headers,
        body,
    } = stored;
    build(status, contract::visible_headers(&headers), body)
}

/// Marks an answer idem made itself (a refusal, a replay), not the handler's: only
/// such answers get the layer's CORS headers ([`super::IdempotencyLayer::cors`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OwnAnswer;

fn build<'a>(
    status: u16,
    headers: impl Iterator<Item = (&'a str, &'a [u8])>,
    body: Vec<u8>,
) -> Response<Body> {
    let mut res = Response::new(Body::from(body));
    *res.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = res.headers_mut();
    for (name, value) in headers {
        // Names and values were valid when stored; skip anything that no longer parses
        // rather than fail the answer.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            h.append(name, value);
        }
    }
    res.extensions_mut().insert(OwnAnswer);
    res
}
