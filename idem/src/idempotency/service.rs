//! The per-request logic of [`super::IdempotencyLayer`].

use super::execution::{execute, Claimed, FinishOnDrop, InProgress};
use super::response::{refusal, replay};
use super::trace;
#[cfg(feature = "postgres")]
use super::transaction::Completion;
use super::{Config, IdempotencyContext};
use crate::limits::{BodyBudget, BodyTimeout, Reservation};
use crate::metrics::{self, Outcome};
use crate::store::{StoreError, StoreErrorKind, StoreExt};
use axum::body::Body;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{header, request::Parts, HeaderMap, Request, Response};
use http_body_util::BodyExt;
use idem_core::contract::{self, Problem, Rejection, Route, Waiting};
use idem_core::{Decision, RecordKey};
use std::convert::Infallible;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};
use tracing::Instrument;

/// idem's private answer headers, made once (a name given as text is parsed on each use).
const ORIGIN_DISPOSITION: http::HeaderName =
    http::HeaderName::from_static(contract::ORIGIN_DISPOSITION);
const STORED_HEADERS: http::HeaderName = http::HeaderName::from_static(contract::STORED_HEADERS);

/// The service made by [`super::IdempotencyLayer`] around an inner service (typically
/// an axum `Router` or route). The inner service must be infallible, as axum's are.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
    /// Path patterns, first match wins, and their settings.
    patterns: Arc<[contract::PathPattern]>,
    routes: Arc<[Arc<Config>]>,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(
        inner: S,
        config: Arc<Config>,
        routes: Vec<(contract::PathPattern, Arc<Config>)>,
    ) -> Self {
        let (patterns, routes): (Vec<_>, Vec<_>) = routes.into_iter().unzip();
        IdempotencyService {
            inner,
            config,
            patterns: patterns.into(),
            routes: routes.into(),
        }
    }

    /// Whether the request came from the edge ([`contract::from_edge`]); the proof is
    /// taken off the request either way, so that no handler or upstream sees it.
    fn take_edge_proof(&self, headers: &mut HeaderMap) -> bool {
        if !headers.contains_key(contract::EDGE_SECRET) {
            return false;
        }
        let sent = || {
            headers
                .get_all(contract::EDGE_SECRET)
                .iter()
                .map(|v| v.as_bytes())
        };
        // Every secret is compared: which one matched does not show in the time taken.
        let from_edge = self
            .config
            .edge_secrets
            .iter()
            .fold(false, |matched, secret| {
                matched | contract::from_edge(secret, sent())
            });
        if !from_edge {
            warn_unknown_edge_secret();
        }
        headers.remove(contract::EDGE_SECRET);
        from_edge
    }

    /// The settings for a request, or `None` when its path is spelled so that servers
    /// may read it differently and one reading of it is guarded.
    fn config_for(
        &self,
        method: &http::Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Option<Arc<Config>> {
        let settings = |route: Option<usize>| route.map_or(&self.config, |i| &self.routes[i]);
        let guarded = |route| is_guarded(&settings(route).methods, method, headers);
        match contract::choose_route(&self.patterns, path, guarded) {
            contract::PathChoice::Route(route) => Some(settings(route).clone()),
            contract::PathChoice::Ambiguous => None,
        }
    }
}

/// Any request body in; any response body the inner service answers with (as
/// tower-http's layers take them), read and stored as bytes, answered as axum's
/// [`Body`].
impl<S, B, ResBody> Service<Request<B>> for IdempotencyService<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        // Take the service that was driven to readiness; leave a fresh clone behind.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let from_edge = self.take_edge_proof(req.headers_mut());
        if from_edge {
            req.extensions_mut().insert(super::FromEdge);
        }
        let Some(config) = self.config_for(req.method(), req.uri().path(), req.headers()) else {
            let mut res = invalid(&Rejection::new(Problem::PathAmbiguous));
            super::response::rebase_problem(&mut res, &self.config.problem_base);
            return Box::pin(async { Ok(res) });
        };
        let base = self.config.problem_base.clone();
        let inner = inner.map_response(into_axum_body::<ResBody> as fn(_) -> _);
        Box::pin(async move {
            let mut res = handle(config, inner, req).await;
            if !from_edge {
                // What idem stored is the edge's to know, never a client's.
                res.headers_mut().remove(&ORIGIN_DISPOSITION);
                res.headers_mut().remove(&STORED_HEADERS);
            }
            super::response::rebase_problem(&mut res, &base);
            if res.extensions_mut().remove::<WaitApplied>().is_some() {
                res.headers_mut().append(
                    contract::PREFERENCE_APPLIED,
                    http::HeaderValue::from_static("wait"),
                );
            }
            Ok(res)
        })
    }
}

/// The inner service's answer with its body as axum's.
fn into_axum_body<ResBody>(res: Response<ResBody>) -> Response<Body>
where
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    res.map(Body::new)
}

async fn handle<S, B>(config: Arc<Config>, inner: S, req: Request<B>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if !is_guarded(&config.methods, req.method(), req.headers()) {
        return pass_through(inner, req).await;
    }
    let took = std::time::Instant::now();
    // Read only when asked for: the hot path takes no copy.
    let origin: Option<Vec<http::HeaderValue>> = config.cors.as_ref().map(|_| {
        req.headers()
            .get_all(header::ORIGIN)
            .iter()
            .cloned()
            .collect()
    });
    let (parts, body) = req.into_parts();
    let span = trace::request_span(&parts, config.route_pattern.as_deref());
    let cors = config.cors.clone();
    let mut res = guarded(config, inner, parts, body)
        .instrument(span.clone())
        .await;
    trace::record_status(&span, res.status().as_u16());
    metrics::request_duration(res.status().as_u16(), took.elapsed());
    if let (Some(cors), Some(origin)) = (cors, origin) {
        add_cors(&cors, &origin, &mut res);
    }
    res
}

/// The layer's CORS headers on an answer idem made itself, for a request from an
/// allowed origin; never on the API's own answers (what they let pages read is the
/// API's to say).
fn add_cors(cors: &contract::Cors, origin: &[http::HeaderValue], res: &mut Response<Body>) {
    let own = res
        .extensions_mut()
        .remove::<super::response::OwnAnswer>()
        .is_some();
    if !own
        || res
            .headers()
            .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN)
    {
        return;
    }
    let carries: Vec<String> = res
        .headers()
        .keys()
        .map(|n| n.as_str().to_owned())
        .collect();
    let headers = cors.answer_headers(
        origin.iter().map(|v| v.as_bytes()),
        carries.iter().map(String::as_str),
    );
    for (name, value) in headers {
        if let Ok(value) = http::HeaderValue::from_str(&value) {
            res.headers_mut().append(name, value);
        }
    }
}

/// Whether `methods` guard a request of `method`, or one its headers ask the API to take
/// for another method ([`contract::guards_request`]).
fn is_guarded(methods: &[http::Method], method: &http::Method, headers: &HeaderMap) -> bool {
    let overrides = contract::METHOD_OVERRIDE_HEADERS
        .iter()
        .flat_map(|name| headers.get_all(*name).iter().map(|v| v.as_bytes()));
    contract::guards_request(methods, method.as_str(), overrides)
}

/// A request of a guarded method, within its span.
async fn guarded<S, B>(config: Arc<Config>, inner: S, parts: Parts, body: B) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let values_of = |name: &str| parts.headers.get_all(name).iter().map(|v| v.as_bytes());
    let key = match contract::route_by_key_headers(
        true,
        parts.uri.path(),
        &config.key_headers,
        values_of,
        || (config.key_required)(&parts),
    ) {
        Route::Guard(key) => key,
        Route::PassThrough => return pass_through(inner, Request::from_parts(parts, body)).await,
        Route::Reject(rejection) => return invalid(&rejection),
    };
    // Who is asking, before a byte of the body is read.
    let scope = match (config.scope)(&parts) {
        Ok(scope) => scope,
        Err(rejection) => return invalid(&rejection),
    };
    // Its place among its own requests in progress, before its body takes memory.
    let scope_permit = match config.quotas.enter(scope, std::time::Instant::now()) {
        Ok(permit) => permit,
        Err(rejection) => return invalid(&rejection),
    };
    let body = match read_body(&parts, body, config.max_body_bytes, &config.body_budget).await {
        Ok(body) => body,
        Err(rejection) => return invalid(&rejection),
    };
    let fingerprint = config.fingerprint_rule.fingerprint(
        parts.method.as_str(),
        parts.uri.path_and_query().map_or("", |pq| pq.as_str()),
        parts
            .headers
            .get_all(header::CONTENT_TYPE)
            .iter()
            .map(|v| v.as_bytes()),
        &body,
        |name| parts.headers.get_all(name).iter().map(|v| v.as_bytes()),
    );
    let record_key = RecordKey::new(&scope, &key);
    trace::record_key(&scope, &record_key);
    let prefer = parts.headers.get_all("prefer").iter();
    let wait_applied = contract::wait_applied(
        parts.headers.get_all("prefer").iter().map(|v| v.as_bytes()),
        super::millis(config.max_wait),
    );
    let wait_ms = contract::wait_ms_or(
        prefer.map(|v| v.as_bytes()),
        super::millis(config.default_wait),
        super::millis(config.max_wait),
    );
    // Sent, a claim may land whatever becomes of this request: if the client goes away
    // meanwhile (the request's future dropped), the claim and what follows it finish
    // on their own, as an execution does. Dropped with it, a claim that landed would
    // hold the key for its lease with nothing running, and make the next attempt a
    // takeover — which proxy mode answers with a stored "outcome unknown" for a request
    // it never sent.
    // Counted until the claim and what follows it are over, even once its client has
    // left (a server's own cap lets go of a request when its connection ends).
    let Ok(in_progress) = config.in_progress.clone().try_acquire_owned() else {
        return invalid(&Rejection::with_detail(
            Problem::Busy,
            "the server is at its limit of guarded requests in progress; nothing was run, retry later",
        ));
    };
    let in_progress = InProgress {
        _layer: in_progress,
        _scope: scope_permit,
    };
    let layer_config = Arc::clone(&config);
    let left = Arc::new(AtomicBool::new(false));
    let guarded = Guarded {
        parts,
        body,
        key,
        record_key,
        fingerprint,
    };
    let run = claim_and_execute(
        config,
        inner,
        guarded,
        Wait {
            ms: wait_ms,
            left: left.clone(),
            in_progress,
            scope,
        },
    );
    let mut res = FinishOnDrop::new(
        Box::pin(run.in_current_span()),
        &layer_config.executions,
        left,
    )
    .await;
    if wait_applied {
        // Said last, once the private headers are off (see `call`).
        res.extensions_mut().insert(WaitApplied);
    }
    res
}

/// The request's `Prefer: wait` was honoured: its answer says so last
/// (`Preference-Applied: wait`), after every other header, as the edge's answers do.
#[derive(Clone, Copy, Debug)]
struct WaitApplied;

/// How long a request may wait while another attempt holds its key, unless its
/// client has left meanwhile; and its place among the requests in progress, held until
/// its execution's record is written.
struct Wait {
    ms: u64,
    left: Arc<AtomicBool>,
    in_progress: InProgress,
    /// Who is asking: its quota of new keys is checked before a claim, and counted
    /// after one that made a record.
    scope: idem_core::Scope,
}

/// A guarded request, read whole and placed: what its claim and its execution need.
struct Guarded {
    parts: Parts,
    body: Bytes,
    key: idem_core::IdempotencyKey,
    /// Where its record lives: its caller's scope and its key.
    record_key: RecordKey,
    fingerprint: idem_core::Fingerprint,
}

/// Claims the key — waiting while another attempt holds it, if asked to — then replays,
/// refuses, or runs the request under the claim.
async fn claim_and_execute<S>(
    config: Arc<Config>,
    inner: S,
    guarded: Guarded,
    wait: Wait,
) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    let record_key = &guarded.record_key;
    // The wait is measured on the runtime's monotonic clock, from here.
    let started = Instant::now();
    let mut waiting = Waiting::new(0, wait.ms);
    // A new key of this caller's quota, taken before the claim (concurrent new keys
    // take one each) and given back unless the claim makes a record.
    let mut new_key = match config
        .quotas
        .reserve_new_key(wait.scope, std::time::Instant::now())
    {
        Ok(reservation) => Some(reservation),
        Err(wait_for) => match past_quota(&config, record_key, wait_for).await {
            Some(refused) => return refused,
            None => None,
        },
    };

    loop {
        let store = &config.store;
        // The claim's lease starts when it is computed: count it from before sending.
        let sent = Instant::now();
        let decision = metrics::timed(
            store.name(),
            "claim",
            store.claim(
                record_key,
                &guarded.fingerprint,
                store.now(),
                &config.policy,
            ),
        )
        .await;
        let (claim, took_over) = match decision {
            Err(e) => return unavailable(&e),
            Ok(Decision::Execute(claim)) => {
                match new_key.take() {
                    Some(reservation) => reservation.commit(),
                    None => config
                        .quotas
                        .created(&wait.scope, std::time::Instant::now()),
                }
                (claim, false)
            }
            Ok(Decision::TakeOver(claim)) => (claim, true),
            Ok(Decision::Replay {
                response,
                expires_at,
            }) => {
                metrics::outcome(Outcome::Replayed);
                trace::record_replay(&response.headers);
                let for_edge = guarded.parts.extensions.get::<super::FromEdge>().is_some();
                return replay(
                    response,
                    for_edge.then(|| {
                        (
                            config.key_headers.record_tag(record_key),
                            &guarded.fingerprint,
                        )
                    }),
                    expires_at,
                    store.now(),
                );
            }
            Ok(Decision::Mismatch) => {
                metrics::outcome(Outcome::Mismatch);
                return refusal(&Rejection::new(Problem::Mismatch));
            }
            Ok(Decision::InFlight { .. }) => {
                let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                // Nobody is waiting for this one any more: no more asking.
                let gone = wait.left.load(std::sync::atomic::Ordering::Relaxed);
                match waiting.poll_after(elapsed).filter(|_| !gone) {
                    Some(ms) => {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        continue;
                    }
                    None => {
                        metrics::outcome(Outcome::InFlight);
                        return refusal(&Rejection::new(Problem::InFlight));
                    }
                }
            }
        };
        if let Some(refused) = claimed_too_late(&config, record_key, &claim, took_over, sent).await
        {
            return refused;
        }
        let claim = Claim {
            claim,
            took_over,
            sent,
        };
        return execute_claimed(config, inner, guarded, claim, wait.in_progress).await;
    }
}

/// A claim the store made for this request.
struct Claim {
    claim: idem_core::Claim,
    /// It took the key over from a holder whose lease ended.
    took_over: bool,
    /// When it was sent: its lease runs from (at the latest) then.
    sent: Instant,
}

/// The refusal of a claim that came back too close to the end of its lease (another
/// attempt may have taken the key over already: running now could run the handler
/// twice); `None` when it came in time.
async fn claimed_too_late(
    config: &Config,
    record_key: &RecordKey,
    claim: &idem_core::Claim,
    took_over: bool,
    sent: Instant,
) -> Option<Response<Body>> {
    let round_trip = u64::try_from(sent.elapsed().as_millis()).unwrap_or(u64::MAX);
    if config.policy.claim_in_time(round_trip) {
        return None;
    }
    // A fresh claim is freed if it is still ours (nothing ran); a takeover is left to
    // its lease, so that the next attempt takes over again and knows an earlier
    // attempt may have run (proxy mode never re-sends then).
    if !took_over {
        let store = &config.store;
        let holder = claim.holder();
        let _ = tokio::time::timeout(
            Duration::from_millis(config.policy.lease_ms),
            store.release(record_key, &holder, store.now(), &config.policy),
        )
        .await;
    }
    Some(unavailable(&StoreError::unavailable(format!(
        "the claim took {round_trip} ms, too close to its {} ms lease",
        config.policy.lease_ms
    ))))
}

/// Runs the request under `claim`: the handler gets the claim's context (its fencing
/// token, whether it took over, the lease's cancellation), and the execution holds the
/// request's place in progress until its record is written.
async fn execute_claimed<S>(
    config: Arc<Config>,
    inner: S,
    guarded: Guarded,
    claim: Claim,
    in_progress: InProgress,
) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    let Guarded {
        parts,
        body,
        key,
        record_key,
        fingerprint,
    } = guarded;
    let Claim {
        claim,
        took_over,
        sent,
    } = claim;
    metrics::outcome(Outcome::Executed);
    trace::record_claim(claim.token, took_over);
    if took_over {
        metrics::takeover();
        tracing::warn!(key = %key, token = claim.token, "took over a claim whose holder's lease expired");
    }
    let holder = claim.holder();
    let lease_lost = CancellationToken::new();
    let opened = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut req = Request::from_parts(parts, Body::from(body));
    trace::hand_on(req.headers_mut());
    req.extensions_mut().insert(IdempotencyContext {
        key,
        record_key: record_key.clone(),
        token: claim.token,
        took_over,
        lease_lost: lease_lost.clone(),
        #[cfg(feature = "postgres")]
        completion: config.authority.clone().map(|authority| Completion {
            authority,
            holder,
            config: config.clone(),
            opened: opened.clone(),
        }),
    });
    let claimed = Claimed {
        key: record_key,
        holder,
        lease_lost,
        opened,
        claimed_at: sent.into_std(),
        fingerprint,
    };
    execute(config, inner, req, claimed, in_progress).await
}

/// A caller past its quota of new keys may still get what the store holds, live, for
/// this key (a replay, a 409); for any other key it is refused (`429`), and told when a
/// new one may be made. `None`: go on to the claim.
async fn past_quota(
    config: &Config,
    record_key: &RecordKey,
    wait: Duration,
) -> Option<Response<Body>> {
    let store = &config.store;
    match store.get(record_key).await {
        Ok(Some(record)) if record.expires_at() > store.now() => None,
        Ok(_) => {
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            let mut refused = invalid(&Rejection::with_detail(
                Problem::ScopeQuota,
                format!(
                    "this caller made as many new keys lately as it may; nothing was run, retry in {secs} s"
                ),
            ));
            if let Ok(v) = http::HeaderValue::from_str(&secs.to_string()) {
                refused.headers_mut().insert(header::RETRY_AFTER, v);
            }
            Some(refused)
        }
        Err(e) => Some(unavailable(&e)),
    }
}

async fn pass_through<S, B>(inner: S, req: Request<B>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut res = match inner.oneshot(req.map(Body::new)).await {
        Ok(res) => res,
        Err(never) => match never {},
    };
    // Unguarded here, stored nowhere: only idem tells an edge in front what it stored,
    // never a handler (or an upstream) itself.
    res.headers_mut().remove(&ORIGIN_DISPOSITION);
    res.headers_mut().remove(&STORED_HEADERS);
    res
}

/// Warns, at most once a minute, that a request carried an edge secret this layer does
/// not accept: an edge whose `EDGE_SECRET` is not the origin's (its cache silently off),
/// or a client guessing.
fn warn_unknown_edge_secret() {
    static LAST_WARNED_SECS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST_WARNED_SECS.load(std::sync::atomic::Ordering::Relaxed);
    if now >= last.saturating_add(60)
        && LAST_WARNED_SECS
            .compare_exchange(
                last,
                now,
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok()
    {
        tracing::warn!(
            "a request carried an idem-edge-secret this origin does not accept (an edge whose EDGE_SECRET is not in --edge-secret-file, or a client guessing): it is told nothing of what idem stored, and an edge in front keeps nothing; warned at most once a minute"
        );
    }
}

fn invalid(rejection: &Rejection) -> Response<Body> {
    metrics::outcome(match rejection.problem {
        Problem::Busy => Outcome::Busy,
        Problem::ScopeQuota => Outcome::ScopeQuota,
        _ => Outcome::Invalid,
    });
    refusal(rejection)
}

fn unavailable(e: &StoreError) -> Response<Body> {
    if e.kind() == StoreErrorKind::Full {
        metrics::outcome(Outcome::StoreFull);
        tracing::warn!(error = %e, "idempotency store full; refusing to run the handler unguarded");
        return refusal(&Rejection::with_detail(Problem::StoreFull, e.detail()));
    }
    metrics::outcome(Outcome::Unavailable);
    tracing::error!(error = %e, "idempotency store unavailable; refusing to run the handler unguarded");
    refusal(&Rejection::new(Problem::StoreUnavailable))
}

/// The body of a guarded request, whole, within the route's limit and the layer's
/// budget of bytes buffered at once: it must be read before the key is claimed (its
/// fingerprint is part of the claim), so a slow body holds a buffer, never a claim.
/// Bytes are taken from the budget as they arrive — a client that declares a large
/// body and trickles it holds only what it sent — and given back when the last copy
/// of the body is dropped (after the handler and the record are done with it).
async fn read_body<B>(
    parts: &Parts,
    body: B,
    limit: usize,
    budget: &BodyBudget,
) -> Result<Bytes, Rejection>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let declared = parts.headers.get(header::CONTENT_LENGTH);
    contract::check_declared_length(declared.map(|v| v.as_bytes()), limit)?;
    let mut reserved = budget.reserve(0).ok_or_else(busy)?;
    // Nothing allocated ahead of what arrived: a declared length is only a promise.
    let mut read = bytes::BytesMut::new();
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            let e: Box<dyn std::error::Error + Send + Sync> = e.into();
            if BodyTimeout::in_chain(&*e) {
                Rejection::with_detail(Problem::BodyTimeout, e.to_string())
            } else {
                Rejection::new(Problem::BodyUnreadable)
            }
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if read.len() + data.len() > limit {
            return Err(Rejection::body_too_large(limit));
        }
        if !reserved.grow(data.len()) {
            return Err(busy());
        }
        read.extend_from_slice(&data);
    }
    Ok(Bytes::from_owner(Budgeted {
        bytes: read.freeze(),
        _reserved: reserved,
    }))
}

fn busy() -> Rejection {
    Rejection::with_detail(
        Problem::Busy,
        "the server is buffering as many request bodies as it allows; nothing was run, retry later",
    )
}

/// A body's bytes, holding their part of the budget for as long as they live.
struct Budgeted {
    bytes: Bytes,
    _reserved: Reservation,
}

impl AsRef<[u8]> for Budgeted {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}
