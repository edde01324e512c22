//! One execution, from the handler's first poll to its record landing in the store.
//!
//! The handler runs in the request's own task, tracked by [`Executions`]: a client that
//! goes away doesn't cancel it, and graceful shutdown waits for it. While it runs — and
//! until its final write lands — the claim's guard ([`super::guard`]) renews the lease;
//! its outcome is then settled ([`super::settle`]): stored or released, and answered.

use super::guard::ClaimGuard;
use super::settle::{settle, Execution};
use super::Config;
use crate::metrics;
use axum::body::Body;
use bytes::Bytes;
use futures_util::FutureExt;
use http::{response::Parts, Request, Response};
use http_body_util::BodyExt;
use idem_core::contract::{Problem, Rejection};
use idem_core::{Holder, RecordKey};
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

    pub(super) fn pending(&self, key: &RecordKey, idempotency_key: &str) -> Unwritten {
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
pub(super) struct Unwritten {
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
/// back, per request — and tracked by the layer's [`Executions`] all the same. It runs
/// inside the request's [`FinishOnDrop`]: if the request is dropped first (the client
/// went away), what is left of it is spawned and finishes — the handler is never
/// cancelled, and its record is written.
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
    let running = Running {
        _token: config.executions.tracker.token(),
        _in_progress: in_progress,
    };
    let (response, unwritten) = run_to_completion(config, inner, req, claimed).await;
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

/// The client's answer, and the record's write if it had not landed by then.
pub(super) type Answered = (
    Response<Body>,
    Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
);

/// What the handler's run came to.
pub(super) enum Outcome {
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

/// Runs the handler under the claim, then settles its outcome: the claim's whole life
/// from the first renewal to the final write (or the client's answer while it goes on).
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
    let guard = ClaimGuard::hold(
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
    let outcome = run_handler(&config, inner, req, &key).await;
    let execution = Execution {
        key,
        fingerprint,
        for_edge,
        opened,
    };
    settle(&config, guard, outcome, execution).await
}

/// Runs the handler to its answer, read up to the stored-body limit, within
/// `max_execution`; a panic, a body that breaks off or a run past the limit is an
/// outcome of its own (execution began: its result is unknown).
async fn run_handler<S>(config: &Config, inner: S, req: Request<Body>, key: &RecordKey) -> Outcome
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
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
    match ran {
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
    }
}
