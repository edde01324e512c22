//! One execution, from the handler's first poll to its record landing in the store.
//!
//! The handler runs in a task of its own, tracked by [`Executions`]: a client that goes
//! away doesn't cancel it, and graceful shutdown waits for it. While it runs — and
//! until its final write lands — a [`Heartbeat`] renews the lease, so a store outage
//! that ends before the lease does (counted from the last renewal, less the clock
//! tolerance) can't let a retry take over. The final write (completion or
//! release) is retried with backoff until it lands or the holder is fenced out; the
//! client waits for it only [`CLIENT_WAIT`], then gets its answer marked `pending`
//! while the write goes on.

use super::response::answer as stored_answer;
use super::{signals, Config};
use crate::metrics;
use crate::store::{HolderWrite, StoreExt};
use axum::body::Body;
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use http::{response::Parts, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use idem_core::contract::{self, Disposition, OriginDisposition, Problem, Rejection};
use idem_core::{Holder, Millis, Record, RecordKey, Refusal, StoredResponse, Transition};
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;
use tower::{Service, ServiceExt};

/// How long the client waits for the final write before it gets its answer anyway
/// (marked `pending`: the write goes on in the background).
pub(crate) const CLIENT_WAIT: Duration = Duration::from_secs(1);

/// The executions a layer started and whose records are not written yet.
#[derive(Clone, Default)]
pub struct Executions {
    tracker: TaskTracker,
    /// Requests between their claim and their execution, which finish even if their
    /// client leaves ([`FinishOnDrop`]): a drain waits for them too.
    claims: TaskTracker,
    /// (Idempotency key, record key) of executions whose final write has not landed.
    unwritten: Arc<Mutex<HashMap<u64, (String, String)>>>,
    next_id: Arc<AtomicU64>,
}

impl Executions {
    /// How many executions are still running or writing their record.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }

    /// Waits for every execution to finish and write its record, at most `deadline`.
    /// Returns the keys whose record was still not written then (each is logged and
    /// counted in `idem_lost_writes_total`): a retry of those runs the handler again
    /// once their lease ends.
    pub async fn drain(&self, deadline: Duration) -> Vec<(String, String)> {
        self.claims.close();
        self.tracker.close();
        // Claims first: one may still start an execution.
        let all = async {
            self.claims.wait().await;
            self.tracker.wait().await;
        };
        if tokio::time::timeout(deadline, all).await.is_ok() {
            return Vec::new();
        }
        let keys: Vec<(String, String)> = self
            .unwritten
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for (idempotency_key, record) in &keys {
            metrics::write_lost("shutdown");
            tracing::error!(idempotency_key = %idempotency_key, record = %record, "shutdown deadline passed before this key's record was written; after its lease a retry runs the handler again");
        }
        keys
    }

    fn pending(&self, key: &RecordKey, idempotency_key: &str) -> Unwritten {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.unwritten
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (idempotency_key.to_owned(), key.as_str().to_owned()));
        Unwritten {
            id,
            map: self.unwritten.clone(),
        }
    }
}

/// Removes its key from the unwritten set when dropped (written, fenced, or the task ended).
struct Unwritten {
    id: u64,
    map: Arc<Mutex<HashMap<u64, (String, String)>>>,
}

impl Drop for Unwritten {
    fn drop(&mut self) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

/// The claim an execution runs under.
pub(crate) struct Claimed {
    pub(crate) key: RecordKey,
    pub(crate) holder: Holder,
    /// Cancelled when the claim is lost (the handler's `IdempotencyContext` has it).
    pub(crate) lease_lost: CancellationToken,
    /// Set when the handler opened a transaction.
    pub(crate) opened: Arc<AtomicBool>,
    /// When the claim was sent: its lease runs from (at the latest) then.
    pub(crate) claimed_at: Instant,
    /// The request's fingerprint, which an edge in front is told its answer is stored
    /// under.
    pub(crate) fingerprint: idem_core::Fingerprint,
}

/// Runs the handler and answers the client with its answer.
///
/// The execution is polled in the request's own task — no task spawned, no channel
/// back, per request — and tracked by the layer's [`Executions`] all the same. If the
/// request is dropped first (the client went away), what is left of the execution is
/// spawned and finishes: the handler is never cancelled, and its record is written.
pub(crate) async fn execute<S>(
    config: Arc<Config>,
    inner: S,
    req: Request<Body>,
    claimed: Claimed,
    in_progress: InProgress,
) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    let tracker = config.executions.tracker.clone();
    let run = tracing::Instrument::in_current_span(run_to_completion(config, inner, req, claimed));
    let running = Running {
        _token: tracker.token(),
        _in_progress: in_progress,
    };
    let ((response, unwritten), running) = Detached::new(Box::pin(run), running).await;
    if let Some(write) = unwritten {
        // The answer goes out now (marked pending); its record's write goes on, still
        // counted as running (the token moves with it: a drain can't miss it, nor
        // the layer's cap on requests in progress).
        tokio::spawn(async move {
            write.await;
            drop(running);
        });
    }
    response
}

/// A future that, dropped before it finishes (its request went away), is spawned to
/// finish on its own; its output is then discarded. It counts among the layer's claims
/// from the start — a drain waits for it, as it may be about to run a handler — and
/// tells the future, through `left`, that nobody is waiting for its answer any more.
pub(crate) struct FinishOnDrop<F: Future + Send + 'static> {
    run: Option<Pin<Box<F>>>,
    token: Option<TaskTrackerToken>,
    left: Arc<AtomicBool>,
}

impl<F: Future + Send + 'static> FinishOnDrop<F> {
    /// `run`, counted among `executions`' claims; `left` is set if it is dropped.
    pub(crate) fn new(run: Pin<Box<F>>, executions: &Executions, left: Arc<AtomicBool>) -> Self {
        FinishOnDrop {
            run: Some(run),
            token: Some(executions.claims.token()),
            left,
        }
    }
}

impl<F: Future + Send + 'static> Future for FinishOnDrop<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let Some(run) = self.run.as_mut() else {
            return Poll::Pending; // polled after it finished: never, by `.await`
        };
        let output = std::task::ready!(run.as_mut().poll(cx));
        self.run = None;
        self.token = None;
        Poll::Ready(output)
    }
}

impl<F: Future + Send + 'static> Drop for FinishOnDrop<F> {
    fn drop(&mut self) {
        // Dropped by its own panic: polling it again would only panic again.
        if std::thread::panicking() {
            return;
        }
        let (Some(run), token) = (self.run.take(), self.token.take()) else {
            return;
        };
        self.left.store(true, Ordering::Relaxed);
        // Without a runtime (it is shutting down), nothing can run it any more.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                run.await;
                drop(token);
            });
        }
    }
}

/// What counts an execution as running, until its record is written: the layer's
/// tracker (a drain waits for it) and its place among the requests in progress.
struct Running {
    _token: TaskTrackerToken,
    _in_progress: InProgress,
}

/// A guarded request's places among the layer's requests in progress and among its
/// caller's ([`crate::quota`]), held until its record is written.
pub(crate) struct InProgress {
    pub(crate) _layer: tokio::sync::OwnedSemaphorePermit,
    pub(crate) _scope: crate::quota::ScopePermit,
}

/// A future that, dropped before it finishes, is spawned to finish on its own.
struct Detached<F: Future<Output = Answered> + Send + 'static> {
    run: Option<Pin<Box<F>>>,
    /// Counts the execution as running until it ends, wherever it is polled.
    token: Option<Running>,
}

impl<F: Future<Output = Answered> + Send + 'static> Detached<F> {
    fn new(run: Pin<Box<F>>, token: Running) -> Self {
        Detached {
            run: Some(run),
            token: Some(token),
        }
    }
}

impl<F: Future<Output = Answered> + Send + 'static> Future for Detached<F> {
    /// The answer, and the execution's token: it still counts until dropped.
    type Output = (Answered, Running);

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let Some(run) = self.run.as_mut() else {
            return Poll::Pending; // polled after it finished: never, by `execute`
        };
        let answered = std::task::ready!(run.as_mut().poll(cx));
        self.run = None;
        match self.token.take() {
            Some(token) => Poll::Ready((answered, token)),
            None => Poll::Pending, // the token is only ever taken with the run
        }
    }
}

impl<F: Future<Output = Answered> + Send + 'static> Drop for Detached<F> {
    fn drop(&mut self) {
        // Dropped by a panic of the execution itself: polling it again would only panic
        // again; the key is left to its lease.
        if std::thread::panicking() {
            return;
        }
        let (Some(run), token) = (self.run.take(), self.token.take()) else {
            return;
        };
        // Without a runtime (it is shutting down) nothing can run it any more: the key
        // is left to its lease, as a crash would leave it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let (_answer, unwritten) = run.await;
                if let Some(write) = unwritten {
                    write.await;
                }
                drop(token);
            });
        }
    }
}

/// The client's answer, and the record's write if it had not landed by then.
type Answered = (
    Response<Body>,
    Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
);

/// What the handler's run came to.
enum Outcome {
    /// It answered in full.
    Answered(Parts, Bytes),
    /// It answered with more than the stored-body limit: the first part read, and the
    /// rest still to stream to the client. Stored as a problem in its place.
    TooLarge(Parts, Bytes, Body),
    /// Execution began and its result is unknown: stored as this problem.
    Unknown(Rejection),
}

/// A response body read up to `limit` bytes.
enum Read {
    Whole(Bytes),
    /// Over the limit: what was read, and the rest of the body.
    Over(Bytes, Body),
}

/// Reads `body` whole, or until it exceeds `limit` (the rest is left unread, so an
/// answer of any size never sits in memory).
async fn read_bounded(mut body: Body, limit: usize) -> Result<Read, String> {
    let mut head = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Ok(data) = frame.into_data() {
            head.extend_from_slice(&data);
            if head.len() > limit {
                return Ok(Read::Over(head.freeze(), body));
            }
        }
    }
    Ok(Read::Whole(head.freeze()))
}

async fn run_to_completion<S>(
    config: Arc<Config>,
    inner: S,
    req: Request<Body>,
    claimed: Claimed,
) -> Answered
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    let Claimed {
        key,
        holder,
        lease_lost,
        opened,
        claimed_at,
        fingerprint,
    } = claimed;
    let idempotency_key = req
        .extensions()
        .get::<super::IdempotencyContext>()
        .map(|c| c.key.as_str().to_owned())
        .unwrap_or_default();
    // What was stored is told only to the edge (no header made for a client to strip).
    let for_edge = req.extensions().get::<super::FromEdge>().is_some();
    // Renews the lease until its final write consumes it, or it is dropped on any unwind.
    let mut guard = ClaimGuard::hold(
        &config,
        key.clone(),
        holder,
        lease_lost,
        claimed_at,
        &idempotency_key,
    );
    // Let the heartbeat's task run once before the handler: spawned from this worker,
    // it sits in the worker's LIFO slot, which no other worker may take, and a handler
    // that blocks this thread would keep it from ever renewing.
    tokio::task::yield_now().await;
    let limit = config.max_stored_body_bytes;
    let run = AssertUnwindSafe(async move {
        let res = match inner.oneshot(req).await {
            Ok(res) => res,
            Err(never) => match never {},
        };
        let (parts, body) = res.into_parts();
        read_bounded(body, limit).await.map(|read| (parts, read))
    })
    .catch_unwind();
    let ran = match config.max_execution {
        Some(limit) => tokio::time::timeout(limit, run).await.ok(),
        None => Some(run.await),
    };
    let outcome = match ran {
        Some(Ok(Ok((parts, Read::Whole(body))))) => Outcome::Answered(parts, body),
        Some(Ok(Ok((parts, Read::Over(head, rest))))) => {
            tracing::warn!(key = %key.as_str(), limit, "the answer is larger than --max-stored-body-bytes: delivered, not stored; replays get a problem");
            Outcome::TooLarge(parts, head, rest)
        }
        Some(Ok(Err(error))) => {
            tracing::error!(key = %key.as_str(), %error, "the handler's response body broke off; storing a 502 for this key");
            Outcome::Unknown(Rejection::new(Problem::HandlerFailed))
        }
        Some(Err(_panic)) => {
            tracing::error!(key = %key.as_str(), "handler panicked; storing a 500 for this key");
            Outcome::Unknown(Rejection::new(Problem::HandlerPanicked))
        }
        None => {
            metrics::execution_timed_out();
            tracing::error!(key = %key.as_str(), "handler ran past --max-execution; storing a 502 for this key");
            Outcome::Unknown(Rejection::execution_timed_out())
        }
    };
    let mut stored_instead = None;
    let (mut parts, body) = match outcome {
        Outcome::Answered(parts, body) => (parts, ClientBody::Whole(body)),
        Outcome::TooLarge(parts, head, rest) => {
            stored_instead =
                Some(Rejection::response_not_stored(limit).as_result_under(&config.problem_base));
            (parts, ClientBody::Streamed(head, rest))
        }
        Outcome::Unknown(rejection) => {
            // Unlike idem's refusals, this problem is the request's result: replayed.
            let (parts, body) =
                stored_answer(rejection.as_result_under(&config.problem_base)).into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            (parts, ClientBody::Whole(body))
        }
    };
    // The answer goes to this client, a problem in its place to the store: an edge in
    // front must not keep the answer either (its replays would differ from the origin's).
    let substituted = stored_instead.is_some();
    // idem's private signals never reach the client.
    let signals::Signals {
        released,
        committed,
        fenced,
    } = signals::take(&mut parts.extensions);
    let change =
        match contract::disposition(released || fenced, parts.status.as_u16(), config.release_on) {
            Disposition::Release => {
                if !fenced {
                    metrics::released();
                }
                Transition::Release
            }
            Disposition::Store => Transition::Complete(match (stored_instead, &body) {
                (Some(instead), _) => instead,
                (None, ClientBody::Whole(body)) => stored_response(&config, &parts, body),
                (None, ClientBody::Streamed(..)) => {
                    unreachable!("a streamed answer is stored instead")
                }
            }),
        };
    // What an edge in front is told was stored with the answer, should it be.
    let stored_headers = match &change {
        Transition::Complete(stored) => stored.headers.clone(),
        _ => Vec::new(),
    };
    if change == Transition::Release || committed.is_some() {
        // No renewal after "nothing happened" (a heartbeat landing after the release
        // would lock the freed key again), nor after the transaction completed it.
        guard.stop_renewing();
    }
    let mut write = Box::pin(guard.finish(change, committed, opened.load(Ordering::Acquire)));
    let landed = tokio::select! {
        landed = &mut write => Some(landed),
        _ = tokio::time::sleep(CLIENT_WAIT) => None,
    };
    let disposition = match &landed {
        // A fenced execution's release only helps the store forget its claim sooner.
        _ if fenced => None,
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
    // Only idem tells an edge what it stored; never a handler (or an upstream) itself.
    parts.headers.remove(contract::ORIGIN_DISPOSITION);
    parts.headers.remove(contract::STORED_HEADERS);
    match to_edge.filter(|_| for_edge) {
        Some(OriginDisposition::Stored { expires_at, .. }) => super::response::tell_edge_stored(
            &mut parts.headers,
            config.key_headers.record_tag(&key),
            &fingerprint,
            expires_at,
            &stored_headers,
        ),
        Some(d) => {
            if let Ok(v) = HeaderValue::from_str(&d.header_value()) {
                parts.headers.insert(contract::ORIGIN_DISPOSITION, v);
            }
        }
        None => {}
    }
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
                config.key_headers.record_tag(&key),
                &fingerprint,
                expires_at,
                &names,
            );
            super::response::advertise_ttl(&mut res, expires_at, config.store.now());
            res
        }
        // The client may be gone; the write goes on regardless.
        _ => {
            let body = match body {
                ClientBody::Whole(body) => Body::from(body),
                ClientBody::Streamed(head, rest) => {
                    let head =
                        futures_util::stream::once(async move { Ok::<_, axum::Error>(head) });
                    Body::from_stream(head.chain(rest.into_data_stream()))
                }
            };
            Response::from_parts(parts, body)
        }
    };
    let unwritten: Option<Pin<Box<dyn Future<Output = ()> + Send>>> = match pending {
        true => Some(Box::pin(tracing::Instrument::in_current_span(async move {
            write.await;
        }))),
        false => None,
    };
    (response, unwritten)
}

/// The claim an execution holds, from its claim to its final write: while it lives
/// the lease is renewed, and the key is counted as unwritten for a graceful shutdown.
/// The final write ([`ClaimGuard::finish`]) consumes it; dropped on any unwind, it
/// stops renewing and leaves the key to its lease.
struct ClaimGuard {
    config: Arc<Config>,
    key: RecordKey,
    holder: Holder,
    heartbeat: Option<Heartbeat>,
    _unwritten: Unwritten,
}

impl ClaimGuard {
    fn hold(
        config: &Arc<Config>,
        key: RecordKey,
        holder: Holder,
        lease_lost: CancellationToken,
        claimed_at: Instant,
        idempotency_key: &str,
    ) -> ClaimGuard {
        ClaimGuard {
            _unwritten: config.executions.pending(&key, idempotency_key),
            heartbeat: Some(Heartbeat::start(
                config.clone(),
                key.clone(),
                holder,
                lease_lost,
                claimed_at,
            )),
            config: config.clone(),
            key,
            holder,
        }
    }

    /// Stops renewing the lease before the final write.
    fn stop_renewing(&mut self) {
        self.heartbeat.take();
    }

    /// Writes the execution's final record — or takes note of the one its handler's
    /// transaction committed — and gives up the claim.
    async fn finish(self, change: Transition, committed: Option<Record>, opened: bool) -> Final {
        let ClaimGuard {
            config,
            key,
            holder,
            ..
        } = &self;
        match &committed {
            // The handler's transaction wrote the completion: the tiers in front of the
            // authority learn it, and nothing is written again.
            Some(record) => {
                if let Err(e) = config.store.committed(key, holder, record).await {
                    tracing::warn!(key = %key.as_str(), error = %e, "the store did not take note of a committed completion");
                }
                Final::Written(OriginDisposition::Stored {
                    expires_at: record.expires_at(),
                    record: key.tag(),
                    fingerprint: None,
                })
            }
            None => {
                // The handler opened a transaction and its answer never came back
                // committed (it was cut off, panicked, or lost the commit's
                // acknowledgement): the authority says whether the commit landed.
                if opened {
                    if let Some(committed) = committed_meanwhile(config, key, holder).await {
                        return committed;
                    }
                }
                let op = if change == Transition::Release {
                    "release"
                } else {
                    "complete"
                };
                write_final(config, key, holder, &change, op).await
            }
        }
    }
}

/// The answer's body as the client gets it.
enum ClientBody {
    Whole(Bytes),
    /// What was read, then the rest of the handler's body, streamed.
    Streamed(Bytes, Body),
}

pub(crate) fn stored_response(config: &Config, parts: &Parts, body: &Bytes) -> StoredResponse {
    let headers = contract::stored_headers(&config.cached_headers, |name, push| {
        for value in parts.headers.get_all(name) {
            push(value.as_bytes())
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

/// Backoff of the final write: from 25 ms, doubling, at most 2 s between attempts.
const FIRST_BACKOFF: Duration = Duration::from_millis(25);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The holder's own completion, if its handler's transaction committed one; the tiers
/// in front of the authority learn it. `None` when it did not, or the authority can't
/// tell now (the final write then decides: where the completion is written in the
/// authority itself it meets the committed one and is refused; see [`Final::Committed`]).
#[cfg(feature = "postgres")]
async fn committed_meanwhile(config: &Config, key: &RecordKey, holder: &Holder) -> Option<Final> {
    let authority = config.authority.as_ref()?;
    let mut attempts = 0;
    let record = loop {
        match authority.read_settled(key).await {
            Ok(record) => break record,
            Err(e) if attempts < 3 => {
                attempts += 1;
                tracing::warn!(key = %key.as_str(), error = %e, "cannot tell yet whether the handler's transaction committed; asking again");
                tokio::time::sleep(FIRST_BACKOFF * 4 * attempts).await;
            }
            Err(e) => {
                tracing::warn!(key = %key.as_str(), error = %e, "cannot tell whether the handler's transaction committed");
                return None;
            }
        }
    };
    let stored = holder.own_completion(record.as_ref())?.clone();
    let record = record?;
    tracing::info!(key = %key.as_str(), "the handler's transaction had committed its answer; it is the answer");
    if let Err(e) = config.store.committed(key, holder, &record).await {
        tracing::warn!(key = %key.as_str(), error = %e, "the store did not take note of a committed completion");
    }
    Some(Final::Committed(stored, record.expires_at()))
}

/// Without Postgres there is no handler transaction whose commit could have landed.
#[cfg(not(feature = "postgres"))]
async fn committed_meanwhile(_: &Config, _: &RecordKey, _: &Holder) -> Option<Final> {
    None
}

/// How a final write ended.
enum Final {
    /// Written; what the origin tells the edge about it.
    Written(OriginDisposition),
    /// Refused: another attempt owns the key.
    Fenced,
    /// Refused because the record already holds this holder's own completion with
    /// another answer — committed by the handler's transaction — and its expiry.
    Committed(StoredResponse, Millis),
}

/// Writes the holder's final record until it lands or is refused. Until then the key
/// stays claimed and the heartbeat keeps its lease: nobody else runs the handler.
async fn write_final(
    config: &Config,
    key: &RecordKey,
    holder: &Holder,
    change: &Transition,
    op: &'static str,
) -> Final {
    let store = &config.store;
    let mut backoff = FIRST_BACKOFF;
    let mut failures = 0u64;
    loop {
        let now = store.now();
        let write = store.write_as_holder(key, holder, change, now, &config.policy);
        match metrics::timed(store.name(), op, write).await {
            Ok(HolderWrite::Written) => {
                if failures > 0 {
                    tracing::info!(key = %key.as_str(), failures, "{op} written after retries");
                }
                return Final::Written(match change {
                    Transition::Release => OriginDisposition::Released,
                    // The stored record expires at its write's time plus the TTL, and
                    // that write may be an earlier one whose reply was lost: the claim's
                    // time bounds it from below, so the edge never outlives it.
                    _ => OriginDisposition::Stored {
                        expires_at: holder.claimed_at().saturating_add(config.policy.ttl_ms),
                        record: key.tag(),
                        fingerprint: None,
                    },
                });
            }
            Ok(HolderWrite::Refused(Refusal::AlreadyCompleted)) => {
                // This holder's own completion (another's token is refused as fenced),
                // committed by its handler's transaction: its answer is the one to give.
                // Read a few times: a single failed read gave the client the handler's
                // own answer, which its retries never get.
                let mut record = store.get(key).await;
                for _ in 0..3 {
                    let Err(e) = &record else { break };
                    tracing::warn!(key = %key.as_str(), error = %e, "{op} refused as completed; reading the completion again");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    record = store.get(key).await;
                }
                let record = record.ok().flatten();
                if let Some(stored) = holder.own_completion(record.as_ref()) {
                    let expires_at = record.as_ref().map_or(0, |r| r.expires_at());
                    tracing::info!(key = %key.as_str(), "{op} refused: the handler's transaction had committed the answer; it is the answer");
                    return Final::Committed(stored.clone(), expires_at);
                }
                metrics::fenced(op);
                tracing::warn!(key = %key.as_str(), "{op} refused: the record is completed");
                return Final::Fenced;
            }
            Ok(HolderWrite::Refused(refusal)) => {
                metrics::fenced(op);
                tracing::warn!(key = %key.as_str(), %refusal, "{op} refused: another attempt owns this key");
                return Final::Fenced;
            }
            Err(e) => {
                failures += 1;
                metrics::final_write_retried(op);
                // Every failure of a long outage would flood the log: the first, then every 10th.
                if failures == 1 || failures % 10 == 0 {
                    tracing::warn!(key = %key.as_str(), error = %e, failures, "{op} failed; retrying while the lease is kept alive");
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The lease's keeper: renews it every eighth of the lease (sooner after a failure)
/// until dropped, and tells the handler — through `lease_lost` — when the lease is
/// lost: fenced out, or not renewed by the time it may end on the store's clock.
///
/// A task of its own, not a future polled beside the handler: a handler that blocks
/// its thread (synchronous work in an async handler) must not stop the renewals, or
/// its lease could end under it and a retry run it a second time. (The execution
/// yields once after starting it, so that it leaves the worker it was spawned on.)
struct Heartbeat(tokio::task::JoinHandle<()>);

impl Heartbeat {
    fn start(
        config: Arc<Config>,
        key: RecordKey,
        holder: Holder,
        lease_lost: CancellationToken,
        claimed_at: Instant,
    ) -> Heartbeat {
        Heartbeat(tokio::spawn(tracing::Instrument::in_current_span(
            keep_alive(config, key, holder, lease_lost, claimed_at),
        )))
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn keep_alive(
    config: Arc<Config>,
    key: RecordKey,
    holder: Holder,
    lease_lost: CancellationToken,
    claimed_at: Instant,
) {
    let lease = Duration::from_millis(config.policy.lease_ms);
    // The cadence bounds the store outage a holder survives. An outage may begin just
    // before a renewal was due (an eighth of the lease since the last one); once the
    // store is back, the attempt hanging at that moment is given up after a twelfth
    // and the next follows a twenty-fourth later; and the lease may end a tenth early
    // on the store's clock (the tolerance). 1 − 1/8 − 1/12 − 1/24 − 1/10 = 0.65 of the
    // lease, as the book promises (docs/guarantee.md). (Every third, a sixth and a twelfth left 0.32:
    // a 0.63-lease outage starting just before a renewal let retries take over.)
    let every = (lease / 8).max(Duration::from_millis(1));
    let after_failure = (lease / 24).max(Duration::from_millis(5));
    // A heartbeat that doesn't answer within this is given up and sent again.
    let attempt_timeout = (lease / 12).max(Duration::from_millis(20));
    // The lease may end this much early on the store's clock (the clock tolerance):
    // the handler is told before then, whatever the attempts are doing.
    let margin = crate::store::Stamp::new(0, &config.policy).tolerance;
    let told_after = lease.saturating_sub(Duration::from_millis(margin));
    // The lease runs from when the claim was sent, not from when its reply came.
    let mut renewed_at = claimed_at;
    let mut wait = every.saturating_sub(claimed_at.elapsed());
    loop {
        let store = &config.store;
        let beat = async {
            tokio::time::sleep(wait).await;
            let sent = Instant::now();
            let beat = store.heartbeat(&key, &holder, store.now(), &config.policy);
            let outcome = tokio::time::timeout(
                attempt_timeout,
                metrics::timed(store.name(), "heartbeat", beat),
            )
            .await;
            (sent, outcome)
        };
        let deadline = tokio::time::Instant::from_std(renewed_at + told_after);
        let (sent, outcome) = tokio::select! {
            done = beat => done,
            _ = tokio::time::sleep_until(deadline), if !lease_lost.is_cancelled() => {
                metrics::lease_lost();
                lease_lost.cancel();
                tracing::error!(key = %key.as_str(), "the lease was not renewed in time: another attempt may take over");
                wait = after_failure;
                continue;
            }
        };
        match outcome {
            Ok(Ok(HolderWrite::Written)) => {
                renewed_at = sent;
                wait = every;
            }
            // This holder's own completion landed (the handler's transaction): done.
            Ok(Ok(HolderWrite::Refused(Refusal::AlreadyCompleted))) => return,
            Ok(Ok(HolderWrite::Refused(refusal))) => {
                metrics::fenced("heartbeat");
                if !lease_lost.is_cancelled() {
                    metrics::lease_lost();
                    lease_lost.cancel();
                }
                tracing::warn!(key = %key.as_str(), token = holder.token, %refusal, "lost the claim while the handler runs");
                return;
            }
            failed => {
                if let Ok(Err(e)) = failed {
                    tracing::warn!(key = %key.as_str(), error = %e, "heartbeat failed; retrying");
                } else {
                    tracing::warn!(key = %key.as_str(), "heartbeat timed out; retrying");
                }
                wait = after_failure;
            }
        }
    }
}
