//! What a client may hold of a server while it sends a request: time to send its
//! body, and the bytes of the bodies buffered at once.
//!
//! A request's body is read before its key is claimed, so a slow client never holds a
//! claim; but without a deadline it holds a connection, a task and its buffer for as
//! long as it likes (one byte a minute keeps it alive). [`DeadlineBody`] bounds that:
//! the body must arrive within `total`, and no gap between two of its frames may last
//! `idle`. The layer answers a guarded request whose body ran out of time with `408`
//! (`…:body-timeout`), and nothing is claimed or run.

use bytes::Buf;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body that did not arrive in time: the error a [`DeadlineBody`] yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTimeout {
    /// Whether the gap between two frames ran out (`true`) or the whole body's time.
    pub idle: bool,
    /// The limit that ran out.
    pub after: Duration,
}

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.idle {
            write!(
                f,
                "no byte of the request body arrived for {:?}",
                self.after
            )
        } else {
            write!(f, "the request body did not arrive within {:?}", self.after)
        }
    }
}

impl std::error::Error for BodyTimeout {}

impl BodyTimeout {
    /// Whether `error`, or any error in its chain of sources, is a [`BodyTimeout`]
    /// (bodies are often wrapped again: axum's `Body`, `Limited`).
    pub fn in_chain(error: &(dyn std::error::Error + 'static)) -> bool {
        std::iter::successors(Some(error), |e| e.source()).any(|e| e.is::<BodyTimeout>())
    }
}

pin_project_lite::pin_project! {
    /// A body that fails with [`BodyTimeout`] when it is not all read within `total`,
    /// or when no frame arrives for `idle`. Its clock starts when it is made (when the
    /// request's head has arrived). Its timers are set only when it has to wait for the
    /// client: a body that has arrived by the time it is read (most do) costs a clock
    /// reading per frame, and no timer.
    pub struct DeadlineBody<B> {
        #[pin]
        inner: B,
        idle: Duration,
        total: Duration,
        total_due: Instant,
        // When the last frame (or the head) arrived.
        last: Instant,
        #[pin]
        idle_timer: Sleep,
        #[pin]
        total_timer: Sleep,
        done: bool,
    }
}

impl<B> DeadlineBody<B> {
    /// `inner`, due within `total`, with no gap of `idle` between its frames.
    pub fn new(inner: B, idle: Duration, total: Duration) -> Self {
        let now = Instant::now();
        DeadlineBody {
            inner,
            idle,
            total,
            total_due: now + total,
            last: now,
            idle_timer: tokio::time::sleep_until(now + idle),
            total_timer: tokio::time::sleep_until(now + total),
            done: false,
        }
    }
}

impl<B> Body for DeadlineBody<B>
where
    B: Body,
    B::Data: Buf,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        let total_timeout =
            |after: Duration| Poll::Ready(Some(Err(BodyTimeout { idle: false, after }.into())));
        // The whole body's deadline first: a client trickling a byte at a time is
        // always "ready", and would otherwise never be timed.
        let now = Instant::now();
        if now >= *this.total_due {
            *this.done = true;
            return total_timeout(*this.total);
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                *this.last = now;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                *this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                // Waiting for the client: now the timers, to be woken at either deadline.
                let idle_due = *this.last + *this.idle;
                if this.idle_timer.deadline() != idle_due {
                    this.idle_timer.as_mut().reset(idle_due);
                }
                if this.total_timer.as_mut().poll(cx).is_ready() {
                    *this.done = true;
                    return total_timeout(*this.total);
                }
                if this.idle_timer.poll(cx).is_ready() {
                    *this.done = true;
                    let timeout = BodyTimeout {
                        idle: true,
                        after: *this.idle,
                    };
                    return Poll::Ready(Some(Err(timeout.into())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A tower layer that puts every request's body under a [`DeadlineBody`], for a
/// server that has no body deadline of its own (hyper has none).
#[derive(Clone, Copy, Debug)]
pub struct BodyDeadlineLayer {
    idle: Duration,
    total: Duration,
}

impl BodyDeadlineLayer {
    /// Bodies due within `total`, with no gap of `idle` between frames.
    pub fn new(idle: Duration, total: Duration) -> Self {
        BodyDeadlineLayer { idle, total }
    }

    /// `request` with its body under this layer's deadlines.
    pub fn apply<B>(&self, request: Request<B>) -> Request<DeadlineBody<B>> {
        request.map(|body| DeadlineBody::new(body, self.idle, self.total))
    }
}

impl<S> tower::Layer<S> for BodyDeadlineLayer {
    type Service = BodyDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BodyDeadline {
            inner,
            deadlines: *self,
        }
    }
}

/// The service made by [`BodyDeadlineLayer`].
#[derive(Clone, Debug)]
pub struct BodyDeadline<S> {
    inner: S,
    deadlines: BodyDeadlineLayer,
}

impl<S, B> tower::Service<Request<B>> for BodyDeadline<S>
where
    S: tower::Service<Request<DeadlineBody<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> S::Future {
        self.inner.call(self.deadlines.apply(request))
    }
}

/// The bytes of request bodies held at once, shared by a layer and its routes: a body
/// takes its bytes as they arrive and keeps them while it lives; one that does not fit
/// in what is left gets a `503`, and a crowd of large or slow bodies cannot run the
/// process out of memory.
#[derive(Clone, Debug)]
pub(crate) struct BodyBudget {
    in_use: Arc<AtomicUsize>,
    cap: usize,
}

impl BodyBudget {
    pub(crate) fn new(cap: usize) -> Self {
        BodyBudget {
            in_use: Arc::new(AtomicUsize::new(0)),
            cap,
        }
    }

    /// `bytes` of the budget until the returned reservation is dropped, or `None`
    /// when they do not fit.
    pub(crate) fn reserve(&self, bytes: usize) -> Option<Reservation> {
        let mut reservation = Reservation {
            in_use: self.in_use.clone(),
            bytes: 0,
            cap: self.cap,
        };
        reservation.grow(bytes).then_some(reservation)
    }

    /// The bytes reserved now.
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }
}

/// Bytes of a [`BodyBudget`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    in_use: Arc<AtomicUsize>,
    bytes: usize,
    cap: usize,
}

impl Reservation {
    /// `more` bytes added to this reservation, if they fit in what is left.
    pub(crate) fn grow(&mut self, more: usize) -> bool {
        let mut in_use = self.in_use.load(Ordering::Relaxed);
        loop {
            let Some(after) = in_use.checked_add(more).filter(|&after| after <= self.cap) else {
                return false;
            };
            match self.in_use.compare_exchange_weak(
                in_use,
                after,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.bytes += more;
                    return true;
                }
                Err(now) => in_use = now,
            }
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.in_use.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_gives_what_fits_and_takes_it_back_when_dropped() {
        let budget = BodyBudget::new(100);
        let a = budget.reserve(60).expect("60 of 100 fit");
        assert!(budget.reserve(41).is_none(), "101 of 100 were given");
        let b = budget.reserve(40).expect("100 of 100 fit");
        assert!(budget.reserve(1).is_none());
        assert_eq!(budget.in_use(), 100);
        drop(a);
        assert_eq!(budget.in_use(), 40);
        assert!(
            budget.reserve(usize::MAX).is_none(),
            "an overflowing reservation"
        );
        drop(b);
        assert_eq!(budget.in_use(), 0);
        assert!(
            BodyBudget::new(0).reserve(0).is_some(),
            "an empty body fits any budget"
        );
        // A reservation grows while it fits, and gives back all it grew to.
        let mut growing = budget.reserve(10).unwrap();
        assert!(growing.grow(80));
        assert!(!growing.grow(11), "past the cap");
        assert!(growing.grow(10));
        assert_eq!(budget.in_use(), 100);
        drop(growing);
        assert_eq!(budget.in_use(), 0);
    }
}
