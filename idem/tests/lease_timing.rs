//! A claim's lease starts when the claim is computed, before it is sent. A claim whose
//! reply comes back after the lease may be taken over already: its handler must not
//! run. (Found by the model checker's review: the layer counted the lease from the
//! reply, and ran the handler whatever the claim's round trip had cost.)

use async_trait::async_trait;
use axum::body::Body;
use axum::routing::post;
use axum::Router;
use http::Request;
use http_body_util::BodyExt;
use idem::core::{Decision, Fingerprint, Holder, Millis, Policy, Record, RecordKey, Transition};
use idem::{HolderWrite, MemoryStore, Store, StoreError};
use idem::{IdempotencyContext, IdempotencyLayer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

/// The memory store, whose `slow`-th claim's reply (from 1) is held back `delay` after
/// the claim took effect (a slow network, a retransmit, a busy runtime); with
/// `no_renewals`, every heartbeat fails as if the store were out for it.
struct SlowReply {
    inner: MemoryStore,
    delay: Duration,
    slow: usize,
    claims: AtomicUsize,
    no_renewals: bool,
}

impl SlowReply {
    fn new(slow: usize, delay: Duration, no_renewals: bool) -> Self {
        SlowReply {
            inner: MemoryStore::new(),
            delay,
            slow,
            claims: AtomicUsize::new(0),
            no_renewals,
        }
    }
}

#[async_trait]
impl Store for SlowReply {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn claim_with_record(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        now: Millis,
        policy: &Policy,
    ) -> Result<(Decision, Option<Record>), StoreError> {
        let done = self
            .inner
            .claim_with_record(key, fingerprint, now, policy)
            .await;
        if self.claims.fetch_add(1, Ordering::SeqCst) + 1 == self.slow {
            tokio::time::sleep(self.delay).await;
        }
        done
    }

    async fn write_as_holder(
        &self,
        key: &RecordKey,
        holder: &Holder,
        change: &Transition,
        now: Millis,
        policy: &Policy,
    ) -> Result<HolderWrite, StoreError> {
        if self.no_renewals && *change == Transition::Renew {
            return Err(StoreError::unavailable("out for heartbeats"));
        }
        self.inner
            .write_as_holder(key, holder, change, now, policy)
            .await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }

    async fn delete_if_same(
        &self,
        key: &RecordKey,
        expected: &Record,
        not_before: Millis,
    ) -> Result<idem::Deletion, StoreError> {
        self.inner.delete_if_same(key, expected, not_before).await
    }

    async fn in_progress(
        &self,
        claimed_before: Millis,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<idem::InProgressPage, StoreError> {
        self.inner.in_progress(claimed_before, cursor, limit).await
    }

    async fn sweep(&self, now: Millis, batch: usize) -> Result<u64, StoreError> {
        self.inner.sweep(now, batch).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

async fn charge(app: &Router) -> u16 {
    let req = Request::post("/charge")
        .header("idempotency-key", "slow-reply")
        .body(Body::from("{}"))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    res.into_body().collect().await.unwrap();
    status
}

#[tokio::test]
async fn a_claim_whose_reply_comes_after_its_lease_never_runs() {
    let store = Arc::new(SlowReply::new(1, Duration::from_millis(600), false));
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route(
            "/charge",
            post({
                let calls = calls.clone();
                move || {
                    let calls = calls.clone();
                    async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        (http::StatusCode::CREATED, "charged")
                    }
                }
            }),
        )
        .layer(
            IdempotencyLayer::new(store)
                .scope_rule(idem_core::contract::ScopeRule::by_authorization(
                    idem_core::contract::Anonymous::Scoped,
                ))
                .require_key_when(|_| true)
                .lease(Duration::from_millis(400)),
        );
    // The first attempt's claim lands at once; its reply comes 600 ms later.
    let first = tokio::spawn({
        let app = app.clone();
        async move { charge(&app).await }
    });
    // Its lease (400 ms) ends on the store meanwhile: a retry takes over and runs.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let retry = charge(&app).await;
    let first = first.await.unwrap();
    let calls = calls.load(Ordering::SeqCst);
    eprintln!("the slow claim answered {first}, the retry {retry}; {calls} call(s)");
    assert_eq!(retry, 201, "the retry took over the expired claim");
    assert_eq!(first, 503, "the slow claim does not run");
    assert_eq!(calls, 1, "the handler ran once");
}

/// The answer's status and whether the handler was told it took over.
async fn charge_told(app: &Router) -> (u16, Option<String>) {
    let req = Request::post("/charge")
        .header("idempotency-key", "late-takeover")
        .body(Body::from("{}"))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let told = res
        .headers()
        .get("took-over")
        .map(|v| v.to_str().unwrap().to_owned());
    res.into_body().collect().await.unwrap();
    (status, told)
}

/// A late *takeover* is not released: releasing it would make the next attempt a fresh
/// claim, and its handler (proxy mode: its upstream) would not know that an earlier
/// attempt may have run.
#[tokio::test]
async fn a_late_takeover_leaves_the_next_attempt_a_takeover() {
    // The first attempt's heartbeats fail, so its lease runs out while it runs; the
    // second's claim (a takeover) comes back 300 ms late.
    let store = Arc::new(SlowReply::new(2, Duration::from_millis(300), true));
    let app = Router::new()
        .route(
            "/charge",
            post(|req: Request<Body>| async move {
                let took_over = req
                    .extensions()
                    .get::<IdempotencyContext>()
                    .map(|c| c.took_over)
                    .unwrap_or_default();
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                (
                    http::StatusCode::CREATED,
                    [("took-over", took_over.to_string())],
                    "charged",
                )
            }),
        )
        .layer(
            IdempotencyLayer::new(store)
                .scope_rule(idem_core::contract::ScopeRule::by_authorization(
                    idem_core::contract::Anonymous::Scoped,
                ))
                .require_key_when(|_| true)
                .lease(Duration::from_millis(400)),
        );
    let first = tokio::spawn({
        let app = app.clone();
        async move { charge_told(&app).await }
    });
    tokio::time::sleep(Duration::from_millis(450)).await;
    let (late, _) = charge_told(&app).await;
    // Past the late takeover's own lease.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let (third, told) = charge_told(&app).await;
    let _ = first.await.unwrap();
    eprintln!(
        "the late takeover answered {late}; the next attempt {third}, told it took over: {told:?}"
    );
    assert_eq!(late, 503, "the late takeover does not run");
    assert_eq!(third, 201);
    assert_eq!(
        told.as_deref(),
        Some("true"),
        "the next attempt knows it took over"
    );
}
