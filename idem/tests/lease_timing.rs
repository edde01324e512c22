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
use idem::idempotency::IdempotencyLayer;
use idem::store::{HolderWrite, MemoryStore, Store, StoreError};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

/// The memory store, whose first claim's reply is held back `delay` after the claim
/// took effect (a slow network, a retransmit, a busy runtime).
struct SlowFirstReply {
    inner: MemoryStore,
    delay: Duration,
    delayed: AtomicBool,
}

#[async_trait]
impl Store for SlowFirstReply {
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
        if !self.delayed.swap(true, Ordering::SeqCst) {
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
        self.inner
            .write_as_holder(key, holder, change, now, policy)
            .await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
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
    let store = Arc::new(SlowFirstReply {
        inner: MemoryStore::new(),
        delay: Duration::from_millis(600),
        delayed: AtomicBool::new(false),
    });
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
