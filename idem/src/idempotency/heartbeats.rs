//! When each execution's heartbeat starts: at its first renewal, not at its claim.
//!
//! Most handlers answer long before their lease needs renewing (the first renewal is
//! due an eighth of the lease after the claim). Spawning a task per execution up front,
//! and yielding so that it left the worker, was most of what a lease cost every
//! request. Instead an execution enters its first renewal's time here, and one task
//! per layer starts its heartbeat — a task of its own, as before — when that time
//! comes; an execution that finishes first only leaves the schedule.
//!
//! A task woken from a worker sits in that worker's LIFO slot, which no other worker
//! may take: if the execution then blocked its thread, the scheduler would never run
//! and no lease would be renewed. So an execution that spawns or wakes the scheduler
//! yields once before its handler runs ([`Scheduled::must_yield`]); under load the
//! scheduler is already asleep until an earlier time, and nobody yields.

use super::guard::keep_alive;
use super::Config;
use idem_core::{Holder, RecordKey};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

/// A layer's heartbeats not yet due, and those running.
#[derive(Clone, Default)]
pub(crate) struct Heartbeats(Arc<Shared>);

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the scheduler: an earlier first renewal, or the layer gone.
    changed: Arc<Notify>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The scheduler holds only a weak reference: woken, it finds the layer gone.
        self.changed.notify_one();
    }
}

#[derive(Default)]
struct State {
    due: BTreeMap<(Instant, u64), DueIn>,
    running: HashMap<u64, AbortHandle>,
    next_id: u64,
    /// When the scheduler looks next; `None` while it waits for a change.
    wakes_at: Option<Instant>,
    scheduler: Option<tokio::task::JoinHandle<()>>,
}

/// What an execution's heartbeat needs, kept until it starts.
pub(crate) struct Due {
    pub(crate) config: Arc<Config>,
    pub(crate) key: RecordKey,
    pub(crate) holder: Holder,
    pub(crate) lease_lost: CancellationToken,
    pub(crate) claimed_at: Instant,
}

impl Due {
    fn start(self, span: tracing::Span) -> AbortHandle {
        let beat = keep_alive(
            self.config,
            self.key,
            self.holder,
            self.lease_lost,
            self.claimed_at,
        );
        tokio::spawn(tracing::Instrument::instrument(beat, span)).abort_handle()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Heartbeats {
    /// Enters a heartbeat that starts at `at` (in the current span), unless the
    /// returned value is dropped first; dropped after, it stops the heartbeat.
    pub(crate) fn schedule(&self, at: Instant, due: Due) -> Scheduled {
        let mut state = self.0.lock();
        let id = state.next_id;
        state.next_id += 1;
        let span = tracing::Span::current();
        state.due.insert((at, id), DueIn { due, span });
        let wake = state.wakes_at.is_none_or(|next| at < next);
        if wake {
            state.wakes_at = Some(at);
        }
        let spawn = state.scheduler.as_ref().is_none_or(|s| s.is_finished());
        if spawn {
            let (shared, changed) = (Arc::downgrade(&self.0), self.0.changed.clone());
            state.scheduler = Some(tokio::spawn(run(shared, changed)));
        }
        drop(state);
        if wake && !spawn {
            self.0.changed.notify_one();
        }
        Scheduled {
            heartbeats: self.clone(),
            at,
            id,
            must_yield: wake || spawn,
        }
    }
}

/// An execution's place in the schedule; dropped, its heartbeat stops (or never starts).
pub(crate) struct Scheduled {
    heartbeats: Heartbeats,
    at: Instant,
    id: u64,
    must_yield: bool,
}

impl Scheduled {
    /// Whether the execution must yield before its handler runs: it spawned or woke
    /// the scheduler, which is in its worker's LIFO slot until then.
    pub(crate) fn must_yield(&self) -> bool {
        self.must_yield
    }
}

impl Drop for Scheduled {
    fn drop(&mut self) {
        let mut state = self.heartbeats.0.lock();
        let waiting = state.due.remove(&(self.at, self.id));
        let running = match waiting {
            Some(_) => None,
            None => state.running.remove(&self.id),
        };
        drop(state);
        // (What it held is dropped outside the lock.)
        drop(waiting);
        if let Some(heartbeat) = running {
            heartbeat.abort();
        }
    }
}

/// An entry: the heartbeat's needs and the span it runs in.
struct DueIn {
    due: Due,
    span: tracing::Span,
}

/// The scheduler: starts each heartbeat at its time, until the layer is gone.
async fn run(shared: Weak<Shared>, changed: Arc<Notify>) {
    loop {
        let next = {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let mut state = shared.lock();
            let now = Instant::now();
            while let Some(entry) = state.due.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                let ((_, id), DueIn { due, span }) = entry.remove_entry();
                let heartbeat = due.start(span);
                state.running.insert(id, heartbeat);
            }
            let next = state.due.first_key_value().map(|((at, _), _)| *at);
            state.wakes_at = next;
            next
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => {}
                    () = changed.notified() => {}
                }
            }
            None => changed.notified().await,
        }
    }
}
