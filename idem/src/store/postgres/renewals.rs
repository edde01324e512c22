//! The connections lease renewals run on, kept open in the background.
//!
//! A renewal may take a twelfth of the lease. A database slower to start a session
//! than that (far away, TLS, loaded) fails every renewal that has to open its own
//! connection — and a renewal given up closes the connection it held, so the next one
//! would have to open one too. These connections are therefore opened with the store
//! and, when one is closed (given up with its renewal, or by the server), opened again
//! here, in the background, each attempt with the store's whole timeout.
//!
//! The refill holds nothing a renewal needs: its attempts count no connection and take
//! no permit. A fresh attempt starts while older ones hang (on a network that drops
//! packets) and attempts refused back off to at most [`RETRY_MAX`], so a partition that
//! heals is followed by a connection within [`FRESH`] (dropped) or [`RETRY_MAX`]
//! (refused) plus one connect.

use super::{Connector, StoreError};
use deadpool_postgres::ClientWrapper;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

/// How long the refill waits after a failed attempt: doubled after each failure in a
/// row, up to [`RETRY_MAX`].
const RETRY: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// How long an attempt may hang before another one starts beside it, and how many
/// such attempts may run beyond the connections missing (each that lands after the
/// first is a session started for nothing on a server that may be struggling).
const FRESH: Duration = Duration::from_millis(500);
const FRESH_EXTRA: usize = 2;
/// How often the refill looks without being woken: wake-ups cover every way a counted
/// connection goes; this bounds the cost of a way missed.
const LOOK: Duration = Duration::from_secs(1);

/// Up to `size` connections, idle or lent to a running renewal.
#[derive(Clone)]
pub(super) struct RenewalConnections {
    inner: Arc<Inner>,
}

struct Inner {
    connector: Connector,
    size: usize,
    timeout: Duration,
    counted: Mutex<Counted>,
    /// Bounds the renewals running at once (as a pool's size would).
    running: Semaphore,
    /// Tells the refill a counted connection went (or the store did).
    wake_refill: Arc<Notify>,
    /// Tells renewals waiting for a connection that one is idle.
    added: Notify,
    /// Prepared on every new connection, so its first renewal is one round trip.
    statement: OnceLock<String>,
    /// No renewal will come (the tiered store's `async` mode renews in Redis): no
    /// connection is kept, none opened in the background.
    retired: AtomicBool,
}

/// The connections counted against `size`.
#[derive(Default)]
struct Counted {
    idle: Vec<ClientWrapper>,
    lent: usize,
}

/// What became of a connection handed back.
#[derive(Debug, PartialEq)]
enum Returned {
    Kept,
    /// Every connection was there already: closed.
    NoRoom,
    /// Closed already (by the server, or the network).
    Closed,
}

impl RenewalConnections {
    /// `size` connections of `connector`'s, each opened within `timeout`.
    pub(super) fn new(connector: Connector, size: usize, timeout: Duration) -> Self {
        let size = size.max(1);
        RenewalConnections {
            inner: Arc::new(Inner {
                connector,
                size,
                timeout,
                counted: Mutex::new(Counted::default()),
                running: Semaphore::new(size),
                wake_refill: Arc::new(Notify::new()),
                added: Notify::new(),
                statement: OnceLock::new(),
                retired: AtomicBool::new(false),
            }),
        }
    }

    /// Opens every connection (each within the timeout; one that fails is left to the
    /// refill), preparing `statement` on each, then keeps them open in the background
    /// for as long as a clone of `self` lives.
    pub(super) async fn open(&self, statement: &str) {
        let _ = self.inner.statement.set(statement.to_owned());
        let opening = (0..self.inner.missing())
            .map(|_| tokio::time::timeout(self.inner.timeout, attempt(&self.inner)));
        let mut failed = None;
        for opened in futures_util::future::join_all(opening).await {
            match opened {
                Ok(Ok(client)) => {
                    self.inner.give_back(client, false);
                }
                Ok(Err(e)) => failed = Some(e.to_string()),
                Err(_) => failed = Some(format!("not open within {:?}", self.inner.timeout)),
            }
        }
        if let Some(error) = failed {
            // Not fatal (the refill goes on trying), but while they are missing a
            // renewal may have to open its own, and a slow database then fails it.
            tracing::warn!(missing = self.inner.missing(), %error, "the lease renewals' connections did not all open at start-up; opening them in the background");
        }
        tokio::spawn(refill(
            Arc::downgrade(&self.inner),
            self.inner.wake_refill.clone(),
        ));
    }

    /// Closes the connections and stops keeping them: renewals, should one come
    /// after all, open their own.
    #[cfg_attr(not(feature = "tiered"), allow(dead_code))]
    pub(super) fn retire(&self) {
        self.inner.retired.store(true, Ordering::Relaxed);
        self.inner.counted().idle.clear();
        self.inner.wake_refill.notify_one();
    }

    /// Runs `f` on a connection before `deadline` — an idle one, else whichever comes
    /// first of one opened now and one the refill adds — and closes the connection
    /// unless `f` finishes.
    pub(super) async fn with<T>(
        &self,
        deadline: Instant,
        no_answer: impl Fn() -> StoreError,
        f: impl AsyncFnOnce(&ClientWrapper) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let inner = &*self.inner;
        let Ok(Ok(_permit)) = tokio::time::timeout_at(deadline, inner.running.acquire()).await
        else {
            return Err(no_answer());
        };
        let mut held = Held {
            client: None,
            lent: false,
            inner,
        };
        if let Some(client) = inner.lend() {
            (held.client, held.lent) = (Some(client), true);
        } else {
            inner.wake_refill.notify_one();
            let own = attempt(inner);
            tokio::pin!(own);
            // Its own connect refused at once (too many clients?): a connection handed
            // back or added may still come before the deadline.
            let mut own_failed = None;
            loop {
                let added = inner.added.notified();
                tokio::pin!(added);
                added.as_mut().enable();
                if let Some(client) = inner.lend() {
                    (held.client, held.lent) = (Some(client), true);
                    break;
                }
                tokio::select! {
                    opened = &mut own, if own_failed.is_none() => match opened {
                        // Counted (and kept) only if there is room when it comes back.
                        Ok(client) => {
                            held.client = Some(client);
                            break;
                        }
                        Err(e) => own_failed = Some(e),
                    },
                    () = &mut added => {}
                    () = tokio::time::sleep_until(deadline) => {
                        return Err(own_failed.unwrap_or_else(no_answer));
                    }
                }
            }
        }
        let Some(client) = held.client.as_ref() else {
            unreachable!("set just above")
        };
        match tokio::time::timeout_at(deadline, f(client)).await {
            Ok(result) => {
                if let Some(client) = held.client.take() {
                    // Back while the permit is still held.
                    inner.give_back(client, held.lent);
                }
                result
            }
            Err(_) => Err(no_answer()),
        }
    }
}

/// A renewal's connection: dropped without being handed back, it is closed, and the
/// refill told if it was counted.
struct Held<'a> {
    client: Option<ClientWrapper>,
    lent: bool,
    inner: &'a Inner,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.client.take().is_some() && self.lent {
            self.inner.counted().lent -= 1;
            self.inner.wake_refill.notify_one();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The refill ends at once instead of at its next look.
        self.wake_refill.notify_one();
    }
}

impl Inner {
    fn counted(&self) -> MutexGuard<'_, Counted> {
        // Nothing panics while holding it; a poisoned count is still a count.
        self.counted.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connections neither idle nor lent.
    fn missing(&self) -> usize {
        if self.retired.load(Ordering::Relaxed) {
            return 0;
        }
        let counted = self.counted();
        self.size.saturating_sub(counted.idle.len() + counted.lent)
    }

    /// An idle connection still open, counted as lent (closed ones are dropped on
    /// the way).
    fn lend(&self) -> Option<ClientWrapper> {
        let mut counted = self.counted();
        while let Some(client) = counted.idle.pop() {
            if !client.is_closed() {
                counted.lent += 1;
                return Some(client);
            }
        }
        None
    }

    /// Takes `client` back (`lent`: as the connection lent for it) to idle, unless it
    /// is closed or every connection is there (then it is closed).
    fn give_back(&self, client: ClientWrapper, lent: bool) -> Returned {
        let returned = {
            let mut counted = self.counted();
            if lent {
                counted.lent -= 1;
            }
            if client.is_closed() {
                Returned::Closed
            } else if counted.idle.len() + counted.lent < self.size
                && !self.retired.load(Ordering::Relaxed)
            {
                counted.idle.push(client);
                Returned::Kept
            } else {
                Returned::NoRoom
            }
        };
        match returned {
            Returned::Kept => self.added.notify_waiters(),
            Returned::Closed if lent => self.wake_refill.notify_one(),
            _ => {}
        }
        returned
    }

    /// Drops idle connections the server (or the network) closed.
    fn prune(&self) {
        self.counted().idle.retain(|client| !client.is_closed());
    }
}

/// Opens a connection of `inner.connector`'s (whose end, whenever it comes, wakes the
/// refill) and prepares the renewal's statement on it. The future holds nothing of
/// `inner`'s.
fn attempt(inner: &Inner) -> impl Future<Output = Result<ClientWrapper, StoreError>> + use<> {
    let (connector, wake_refill) = (inner.connector.clone(), inner.wake_refill.clone());
    let statement = inner.statement.get().cloned();
    async move {
        let client = connector.open(Some(wake_refill)).await?;
        if let Some(statement) = statement {
            client
                .prepare_cached(&statement)
                .await
                .map_err(super::unavailable)?;
        }
        Ok(client)
    }
}

/// Keeps the connections of `inner` open until it is gone: when fewer than its size are
/// counted, opens the missing ones — a fresh attempt beside any that hung for
/// [`FRESH`], up to [`FRESH_EXTRA`] beyond those missing — and backs off while
/// attempts fail, or while connections close as soon as they are kept.
async fn refill(inner: Weak<Inner>, wake: Arc<Notify>) {
    let mut opening = FuturesUnordered::new();
    let mut last_start = Instant::now();
    let mut not_before = Instant::now();
    let mut retry = RETRY;
    // When a connection was last kept, and how many were missing then: one more
    // missing soon after was closed as it opened (a proxy or server that ends
    // sessions), and is retried with backoff.
    let mut kept: Option<(Instant, usize)> = None;
    loop {
        let Some(connections) = inner.upgrade() else {
            return;
        };
        if connections.retired.load(Ordering::Relaxed) {
            return;
        }
        connections.prune();
        let missing = connections.missing();
        let now = Instant::now();
        match kept {
            Some((at, missing_then)) if missing > missing_then && now < at + FRESH => {
                not_before = not_before.max(now + retry);
                retry = (retry * 2).min(RETRY_MAX);
                kept = None;
            }
            Some((at, _)) if now >= at + RETRY_MAX => {
                retry = RETRY;
                kept = None;
            }
            _ => {}
        }
        let start = missing > 0
            && now >= not_before
            && (opening.len() < missing
                || (now >= last_start + FRESH && opening.len() < missing + FRESH_EXTRA));
        if start {
            opening.push(tokio::time::timeout(
                connections.timeout,
                attempt(&connections),
            ));
            last_start = now;
            continue;
        }
        // Later than now: whatever kept `start` false holds until then.
        let next_look = if missing == 0 || opening.len() >= missing + FRESH_EXTRA {
            now + LOOK
        } else if opening.len() < missing {
            not_before
        } else {
            (last_start + FRESH).max(not_before)
        };
        // Nothing of the store's is held while waiting.
        drop(connections);
        tokio::select! {
            Some(opened) = opening.next() => {
                let returned = match (opened, inner.upgrade()) {
                    (Ok(Ok(client)), Some(connections)) => {
                        let returned = connections.give_back(client, false);
                        if returned == Returned::Kept {
                            kept = Some((Instant::now(), connections.missing()));
                        }
                        returned
                    }
                    (Ok(Err(e)), _) => {
                        tracing::debug!(error = %e, "opening a renewal connection failed");
                        Returned::Closed
                    }
                    _ => Returned::Closed,
                };
                if returned == Returned::Closed {
                    // The database is down, or closes sessions as they open.
                    not_before = Instant::now() + retry;
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
            () = wake.notified() => {}
            () = tokio::time::sleep_until(next_look) => {}
        }
    }
}
