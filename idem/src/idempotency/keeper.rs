//! The leases' keeper: starts a claim's heartbeat only once its handler has run for an
//! eighth of its lease — when the first renewal is due. Most handlers finish long
//! before, and then their claim cost an entry in a map: no task spawned, no timer set,
//! no other worker woken.
//!
//! The keeper is a thread of its own per layer, not a task: no handler that blocks a
//! runtime's worker, no stalled or dropped runtime, can keep it from starting the
//! heartbeats of every other claim. It starts each heartbeat — the same task as before,
//! so that a handler blocking its thread cannot stop the renewals — on the runtime of
//! the request that claimed, from outside it: the task goes to the runtime's shared
//! queue, which any worker may take. (On a current-thread runtime there is no other
//! worker: a handler that blocks its thread holds back every task, its heartbeat too.)

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

type Start = Box<dyn FnOnce() -> JoinHandle<()> + Send>;

/// The keeper of one layer (shared by its routes).
#[derive(Clone, Default)]
pub(crate) struct Keeper {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Heartbeats not started yet, by when they are due.
    due: BTreeMap<(Instant, u64), Start>,
    /// Heartbeats started, by registration.
    running: HashMap<u64, JoinHandle<()>>,
    /// Whether the keeper's thread runs.
    started: bool,
    /// Whether it could not be started (heartbeats then start with their claims).
    failed: bool,
    /// When the keeper's thread wakes next by itself: a claim due earlier wakes it.
    sleeping_until: Option<Instant>,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keeper")
    }
}

/// A claim's place with the keeper: its heartbeat is stopped (or never started) when
/// this is dropped.
pub(crate) struct Registration {
    inner: Arc<Inner>,
    key: (Instant, u64),
}

impl Keeper {
    /// Starts the heartbeat `start` makes at `due`, unless the registration is dropped
    /// first. `start` runs on the keeper's thread, outside any runtime: it spawns with
    /// a runtime's `Handle`.
    pub(crate) fn register(&self, due: Instant, start: Start) -> Registration {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        let registration = Registration {
            inner: self.inner.clone(),
            key: (due, id),
        };
        if state.failed {
            // No keeper: the heartbeat starts with its claim, as it did before there
            // was one (`keep_alive` waits until its first renewal is due).
            let heartbeat = start();
            state.running.insert(id, heartbeat);
            return registration;
        }
        state.due.insert((due, id), start);
        if !state.started {
            state.started = true;
            let inner = Arc::downgrade(&self.inner);
            let spawned = std::thread::Builder::new()
                .name("idem-keeper".into())
                .spawn(move || keep(inner));
            if let Err(e) = spawned {
                state.failed = true;
                tracing::error!(error = %e, "the lease keeper's thread could not start; heartbeats start with their claims");
                if let Some(start) = state.due.remove(&(due, id)) {
                    let heartbeat = start();
                    state.running.insert(id, heartbeat);
                }
            }
            return registration;
        }
        // Woken only when this claim is due before the keeper wakes by itself: most
        // claims are due after it, and cost no system call.
        let wake = state.sleeping_until.is_some_and(|at| due < at);
        drop(state);
        if wake {
            self.inner.wake.notify_one();
        }
        registration
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.inner)
    }

    /// Claims waiting for their heartbeat, and heartbeats running.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let state = self.lock();
        (state.due.len(), state.running.len())
    }
}

fn lock(inner: &Inner) -> std::sync::MutexGuard<'_, State> {
    inner.state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Taken out under the lock, dropped and aborted after it: the start closure may
        // hold the last reference to the layer's settings.
        let (start, heartbeat) = {
            let mut state = lock(&self.inner);
            match state.due.remove(&self.key) {
                Some(start) => (Some(start), None),
                None => (None, state.running.remove(&self.key.1)),
            }
        };
        drop(start);
        if let Some(heartbeat) = heartbeat {
            heartbeat.abort();
        }
    }
}

/// When nothing is due: how often the keeper looks whether its layer is gone.
const IDLE: Duration = Duration::from_secs(1);

/// The keeper's thread: starts each heartbeat when due; ends with its layer.
fn keep(inner: Weak<Inner>) {
    loop {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let mut state = lock(&inner);
        let now = Instant::now();
        while let Some(entry) = state.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, id), start) = entry.remove_entry();
            // Defensive: `Handle::spawn` does not panic, even on a runtime shut down.
            if let Ok(heartbeat) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(start)) {
                state.running.insert(id, heartbeat);
            }
        }
        let wait = state
            .due
            .keys()
            .next()
            .map_or(IDLE, |(at, _)| at.saturating_duration_since(now).min(IDLE));
        state.sleeping_until = Some(now + wait);
        // Woken early by a registration due before everything else.
        let _ = inner
            .wake
            .wait_timeout(state, wait)
            .unwrap_or_else(|p| p.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counting(started: &Arc<AtomicUsize>) -> Start {
        let started = started.clone();
        let runtime = tokio::runtime::Handle::current();
        Box::new(move || {
            started.fetch_add(1, Ordering::SeqCst);
            runtime.spawn(std::future::pending())
        })
    }

    #[tokio::test]
    async fn a_heartbeat_starts_only_for_a_claim_still_held_when_it_is_due() {
        let keeper = Keeper::default();
        let started = Arc::new(AtomicUsize::new(0));
        let soon = Instant::now() + Duration::from_millis(50);
        // Done before its first renewal: nothing ever started.
        drop(keeper.register(soon, counting(&started)));
        // Still held when due: started, and stopped when the claim ends.
        let slow = keeper.register(soon, counting(&started));
        let later = keeper.register(soon + Duration::from_secs(60), counting(&started));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(started.load(Ordering::SeqCst), 1);
        assert_eq!(keeper.counts(), (1, 1));
        drop(slow);
        drop(later);
        assert_eq!(keeper.counts(), (0, 0));
    }

    #[tokio::test]
    async fn an_earlier_claim_wakes_the_keeper_from_a_longer_sleep() {
        let keeper = Keeper::default();
        let started = Arc::new(AtomicUsize::new(0));
        let far = keeper.register(
            Instant::now() + Duration::from_secs(3600),
            counting(&started),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        let near = keeper.register(
            Instant::now() + Duration::from_millis(30),
            counting(&started),
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(started.load(Ordering::SeqCst), 1, "the near one started");
        drop((far, near));
    }

    /// A runtime whose only worker is blocked does not hold back the heartbeats of
    /// claims made on another runtime (the keeper is a thread, and each heartbeat goes
    /// to its own claim's runtime).
    #[test]
    fn a_blocked_runtime_holds_back_no_other_claim_s_heartbeat() {
        let keeper = Keeper::default();
        let started = Arc::new(AtomicUsize::new(0));
        let blocked = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let other = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        // A claim on the first runtime, then that runtime's thread blocks (and is
        // dropped after: its heartbeat's spawn fails without harm).
        let first = blocked.block_on(async {
            keeper.register(
                Instant::now() + Duration::from_millis(10),
                counting(&started),
            )
        });
        let second = other.block_on(async {
            keeper.register(
                Instant::now() + Duration::from_millis(30),
                counting(&started),
            )
        });
        drop(blocked);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            started.load(Ordering::SeqCst),
            2,
            "both due heartbeats started"
        );
        assert_eq!(keeper.counts(), (0, 2));
        drop((first, second));
        assert_eq!(keeper.counts(), (0, 0));
    }
}
