//! The per-request logic of [`super::IdempotencyLayer`].

use super::execution::{execute, Claimed};
use super::response::{problem, replay};
use super::transaction::Completion;
use super::{Config, IdempotencyContext};
use crate::metrics::{self, Outcome};
use crate::store::StoreError;
use axum::body::Body;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{header, request::Parts, Request, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::contract::{self, Problem, IDEMPOTENCY_KEY};
use idem_core::{Decision, Fingerprint, IdempotencyKey, RecordKey, RequestParts};
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};

/// The service made by [`super::IdempotencyLayer`] around an inner service (typically
/// an axum `Router` or route). The inner service must be infallible, as axum's are.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        IdempotencyService { inner, config }
    }
}

impl<S, B> Service<Request<B>> for IdempotencyService<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // Take the service that was driven to readiness; leave a fresh clone behind.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        Box::pin(async move { Ok(handle(config, inner, req).await) })
    }
}

async fn handle<S, B>(config: Arc<Config>, inner: S, req: Request<B>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if !config.methods.contains(req.method()) {
        return pass_through(inner, req).await;
    }
    let (parts, body) = req.into_parts();
    let key = match parse_key(&parts) {
        Ok(Some(key)) => key,
        Ok(None) if (config.key_required)(&parts) => {
            return invalid(
                Problem::KeyMissing,
                "send an Idempotency-Key header, e.g. Idempotency-Key: \"<uuid>\"",
            );
        }
        Ok(None) => return pass_through(inner, Request::from_parts(parts, body)).await,
        Err(detail) => return invalid(Problem::KeyMalformed, &detail),
    };
    let body = match read_body(&parts, body, config.max_body_bytes).await {
        Ok(body) => body,
        Err(p) => {
            let detail = format!("the limit is {} bytes", config.max_body_bytes);
            return invalid(
                p,
                if p == Problem::BodyTooLarge {
                    &detail
                } else {
                    "the request body could not be read"
                },
            );
        }
    };
    let fingerprint = fingerprint(&parts, &body);
    let record_key = RecordKey::new(&(config.scope)(&parts), &key);
    let wait = parts
        .headers
        .get_all("prefer")
        .iter()
        .find_map(|v| contract::prefer_wait(v.as_bytes()))
        .map(|secs| Duration::from_secs(secs).min(config.max_wait));
    let deadline = wait.map(|w| Instant::now() + w);
    let mut poll_every = Duration::from_millis(10);

    loop {
        let store = &config.store;
        let decision = metrics::timed(
            store.name(),
            "claim",
            store.claim(&record_key, &fingerprint, store.now(), &config.policy),
        )
        .await;
        let (claim, took_over) = match decision {
            Err(e) => return unavailable(&e),
            Ok(Decision::Execute(claim)) => (claim, false),
            Ok(Decision::TakeOver(claim)) => (claim, true),
            Ok(Decision::Replay(stored)) => {
                metrics::outcome(Outcome::Replayed);
                return replay(stored);
            }
            Ok(Decision::Mismatch) => {
                metrics::outcome(Outcome::Mismatch);
                return problem(
                    Problem::Mismatch,
                    Some("this Idempotency-Key was already used with a different method, path, content type or body"),
                );
            }
            Ok(Decision::InFlight { .. }) => match deadline {
                Some(deadline) if Instant::now() < deadline => {
                    tokio::time::sleep(
                        poll_every.min(deadline.saturating_duration_since(Instant::now())),
                    )
                    .await;
                    poll_every = (poll_every * 2).min(Duration::from_millis(200));
                    continue;
                }
                _ => {
                    metrics::outcome(Outcome::InFlight);
                    return problem(
                        Problem::InFlight,
                        Some("retry later, or send Prefer: wait=<seconds> to wait for it"),
                    );
                }
            },
        };
        metrics::outcome(Outcome::Executed);
        if took_over {
            metrics::takeover();
            tracing::warn!(key = %key, token = claim.token, "took over a claim whose holder's lease expired");
        }
        let holder = claim.holder();
        let lease_lost = CancellationToken::new();
        let opened = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut req = Request::from_parts(parts, Body::from(body));
        req.extensions_mut().insert(IdempotencyContext {
            key,
            record_key: record_key.clone(),
            token: claim.token,
            took_over,
            lease_lost: lease_lost.clone(),
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
        };
        return execute(config, inner, req, claimed).await;
    }
}

async fn pass_through<S, B>(inner: S, req: Request<B>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match inner.oneshot(req.map(Body::new)).await {
        Ok(res) => res,
        Err(never) => match never {},
    }
}

fn invalid(p: Problem, detail: &str) -> Response<Body> {
    metrics::outcome(Outcome::Invalid);
    problem(p, Some(detail))
}

fn unavailable(e: &StoreError) -> Response<Body> {
    metrics::outcome(Outcome::Unavailable);
    tracing::error!(error = %e, "idempotency store unavailable; refusing to run the handler unguarded");
    problem(
        Problem::StoreUnavailable,
        Some("the idempotency store did not answer; the request was not processed"),
    )
}

/// `Ok(None)` when absent; a client-facing message when malformed.
fn parse_key(parts: &Parts) -> Result<Option<IdempotencyKey>, String> {
    let mut values = parts.headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("send exactly one Idempotency-Key header".into());
    }
    IdempotencyKey::parse(first.as_bytes())
        .map(Some)
        .map_err(|e| e.to_string())
}

async fn read_body<B>(parts: &Parts, body: B, limit: usize) -> Result<Bytes, Problem>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Problem::BodyTooLarge);
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(Problem::BodyTooLarge),
        Err(_) => Err(Problem::BodyUnreadable),
    }
}

fn fingerprint(parts: &Parts, body: &[u8]) -> Fingerprint {
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()));
    Fingerprint::of(&RequestParts {
        method: parts.method.as_str(),
        path_and_query: parts.uri.path_and_query().map_or("/", |pq| pq.as_str()),
        content_type: content_type.as_deref(),
        body,
    })
}
