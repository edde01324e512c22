//! Settling an execution: what its outcome stores (or releases), and what the client —
//! and an edge in front — is answered, with the final write landed or still going on.

use super::execution::{Answered, Outcome, CLIENT_WAIT};
use super::guard::{ClaimGuard, Final};
use super::response::answer as stored_answer;
use super::{signals, Config};
use crate::metrics;
use axum::body::Body;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{response::Parts, HeaderValue, Response};
use http_body_util::BodyExt;
use idem_core::contract::{self, Disposition, OriginDisposition, Rejection};
use idem_core::{Fingerprint, RecordKey, StoredResponse, Transition};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What settling needs to know of the execution besides its outcome.
pub(super) struct Execution {
    pub(super) key: RecordKey,
    /// The request's fingerprint, which an edge in front is told its answer is stored
    /// under.
    pub(super) fingerprint: Fingerprint,
    /// Whether the request came through an edge in front (only it is told what was
    /// stored).
    pub(super) for_edge: bool,
    /// Set when the handler opened a transaction (read at the final write, as late as
    /// can be).
    pub(super) opened: Arc<AtomicBool>,
}

/// The answer as the client gets it, and the problem stored in its place when it can't
/// be stored itself.
struct Answer {
    parts: Parts,
    body: ClientBody,
    stored_instead: Option<StoredResponse>,
}

/// Settles an execution's outcome: decides what is stored (or released), writes it
/// through the guard — the client waits up to [`CLIENT_WAIT`] — and answers the client
/// (and an edge in front) with what the store holds.
pub(super) async fn settle(
    config: &Arc<Config>,
    mut guard: ClaimGuard,
    outcome: Outcome,
    execution: Execution,
) -> Answered {
    let Answer {
        mut parts,
        body,
        stored_instead,
    } = answer_of(config, outcome).await;
    // The answer goes to this client, a problem in its place to the store: an edge in
    // front must not keep the answer either (its replays would differ from the origin's).
    let substituted = stored_instead.is_some();
    // idem's private signals never reach the client.
    let signals = signals::take(&mut parts.extensions);
    let change = transition(config, &parts, &body, stored_instead, &signals);
    // What an edge in front is told was stored with the answer, should it be.
    let stored_headers = match &change {
        Transition::Complete(stored) => stored.headers.clone(),
        _ => Vec::new(),
    };
    if change == Transition::Release || signals.committed.is_some() {
        // No renewal after "nothing happened" (a heartbeat landing after the release
        // would lock the freed key again), nor after the transaction completed it.
        guard.stop_renewing();
    }
    let opened = execution.opened.load(Ordering::Acquire);
    let mut write = Box::pin(guard.finish(change, signals.committed, opened));
    let landed = tokio::select! {
        landed = &mut write => Some(landed),
        _ = tokio::time::sleep(CLIENT_WAIT) => None,
    };
    let disposition = match &landed {
        // A fenced execution's release only helps the store forget its claim sooner.
        _ if signals.fenced => None,
        Some(Final::Written(d)) => Some(*d),
        // Fenced: another attempt owns the key; this answer is not the stored one.
        Some(Final::Fenced) => None,
        Some(Final::Committed(..)) => None,
        None => Some(OriginDisposition::Pending),
    };
    // The edge stores nothing on `pending` and forwards retries, which the origin answers
    // with what it stored.
    let to_edge = match disposition {
        Some(OriginDisposition::Stored { .. }) if substituted => Some(OriginDisposition::Pending),
        d => d,
    };
    let to_edge = to_edge.filter(|_| execution.for_edge);
    tell_edge(config, &mut parts, &execution, to_edge, &stored_headers);
    // Only an answer whose record is stored binds the key; never the handler's own claim.
    parts.headers.remove(contract::KEY_TTL);
    if let Some(OriginDisposition::Stored { expires_at, .. }) = disposition {
        let ttl = contract::key_ttl(expires_at, config.store.now());
        if let Some(v) = ttl.and_then(|v| HeaderValue::from_str(&v).ok()) {
            parts.headers.insert(contract::KEY_TTL, v);
        }
    }
    let pending = landed.is_none();
    let response = match landed {
        // The handler's transaction committed an answer that it then failed to
        // return (it panicked, lost the commit's acknowledgement): that answer is
        // the request's result, so it is this attempt's too.
        Some(Final::Committed(stored, expires_at)) => {
            let names = stored.headers.clone();
            let mut res = stored_answer(stored);
            super::response::tell_edge_stored(
                res.headers_mut(),
                config.key_headers.record_tag(&execution.key),
                &execution.fingerprint,
                expires_at,
                &names,
            );
            super::response::advertise_ttl(&mut res, expires_at, config.store.now());
            res
        }
        // The client may be gone; the write goes on regardless.
        _ => Response::from_parts(parts, body.into_body()),
    };
    let unwritten: Option<Pin<Box<dyn Future<Output = ()> + Send>>> = match pending {
        true => Some(Box::pin(tracing::Instrument::in_current_span(async move {
            write.await;
        }))),
        false => None,
    };
    (response, unwritten)
}

/// The client's answer for `outcome`, and what is stored instead when the answer can't
/// be (too large to store).
async fn answer_of(config: &Config, outcome: Outcome) -> Answer {
    match outcome {
        Outcome::Answered(parts, body) => Answer {
            parts,
            body: ClientBody::Whole(body),
            stored_instead: None,
        },
        Outcome::TooLarge(parts, head, rest) => Answer {
            parts,
            body: ClientBody::Streamed(head, rest),
            stored_instead: Some(
                Rejection::response_not_stored(config.max_stored_body_bytes)
                    .as_result_under(&config.problem_base),
            ),
        },
        Outcome::Unknown(rejection) => {
            // Unlike idem's refusals, this problem is the request's result: replayed.
            let (parts, body) =
                stored_answer(rejection.as_result_under(&config.problem_base)).into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Answer {
                parts,
                body: ClientBody::Whole(body),
                stored_instead: None,
            }
        }
    }
}

/// The final write the answer calls for: the key released when the handler (or the
/// route's statuses) said nothing happened, or fenced out; else the completion.
fn transition(
    config: &Config,
    parts: &Parts,
    body: &ClientBody,
    stored_instead: Option<StoredResponse>,
    signals: &signals::Signals,
) -> Transition {
    let nothing_happened = signals.released || signals.fenced;
    match contract::disposition(nothing_happened, parts.status.as_u16(), config.release_on) {
        Disposition::Release => {
            if !signals.fenced {
                metrics::released();
            }
            Transition::Release
        }
        Disposition::Store => Transition::Complete(match (stored_instead, body) {
            (Some(instead), _) => instead,
            (None, ClientBody::Whole(body)) => stored_response(config, parts, body),
            (None, ClientBody::Streamed(..)) => {
                unreachable!("a streamed answer is stored instead")
            }
        }),
    }
}

/// Sets what an edge in front is told was stored (`to_edge`), after removing what the
/// handler (or an upstream) said itself: only idem tells an edge that.
fn tell_edge(
    config: &Config,
    parts: &mut Parts,
    execution: &Execution,
    to_edge: Option<OriginDisposition>,
    stored_headers: &[(String, Vec<u8>)],
) {
    parts.headers.remove(contract::ORIGIN_DISPOSITION);
    parts.headers.remove(contract::STORED_HEADERS);
    match to_edge {
        Some(OriginDisposition::Stored { expires_at, .. }) => super::response::tell_edge_stored(
            &mut parts.headers,
            config.key_headers.record_tag(&execution.key),
            &execution.fingerprint,
            expires_at,
            stored_headers,
        ),
        Some(d) => {
            if let Ok(v) = HeaderValue::from_str(&d.header_value()) {
                parts.headers.insert(contract::ORIGIN_DISPOSITION, v);
            }
        }
        None => {}
    }
}

/// The answer's body as the client gets it.
enum ClientBody {
    Whole(Bytes),
    /// What was read, then the rest of the handler's body, streamed.
    Streamed(Bytes, Body),
}

impl ClientBody {
    fn into_body(self) -> Body {
        match self {
            ClientBody::Whole(body) => Body::from(body),
            ClientBody::Streamed(head, rest) => {
                let head = futures_util::stream::once(async move { Ok::<_, axum::Error>(head) });
                Body::from_stream(head.chain(rest.into_data_stream()))
            }
        }
    }
}

/// The answer as it is stored: its status, the headers the layer keeps, its body.
pub(crate) fn stored_response(config: &Config, parts: &Parts, body: &Bytes) -> StoredResponse {
    // An answer has a few headers, and idem stores some: walking them is cheaper than
    // looking each stored name up (which parses and hashes it).
    let headers = contract::stored_headers(&config.cached_headers, |name, push| {
        for (n, value) in &parts.headers {
            if n.as_str().eq_ignore_ascii_case(name) {
                push(value.as_bytes())
            }
        }
    });
    let mut headers = headers;
    // Which execution this is, for the traces of its replays (never sent).
    headers.extend(super::trace::execution_header());
    StoredResponse {
        status: parts.status.as_u16(),
        headers,
        body: body.to_vec(),
    }
}
