//! The leases' keeper: one task per layer that starts a claim's heartbeat only once its
//! handler has run for an eighth of its lease — when the first renewal is due. Most
//! handlers finish long before, and then their claim cost an entry in a map: no task
//! spawned, no timer set, no other worker woken.
//!
//! A claim's heartbeat, once started, is the same task as before (its own, so that a
//! handler blocking its thread cannot stop the renewals). The keeper is a task of its
//! own too; a registration that wakes it moves the registering request off its worker
//! before its handler runs ([`Registered::woke_keeper`]), for the same reason.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
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
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Heartbeats not started yet, by when they are due.
    due: BTreeMap<(Instant, u64), Start>,
    /// Heartbeats started, by registration.
    running: HashMap<u64, JoinHandle<()>>,
    started: bool,
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

/// What [`Keeper::register`] did.
pub(crate) struct Registered {
    pub(crate) registration: Registration,
    /// Whether the keeper was woken (this claim is due before any other): the keeper
    /// then sits in this worker's LIFO slot, which no other worker may take, and the
    /// request should yield once before its handler, which could block the thread.
    pub(crate) woke_keeper: bool,
}

impl Keeper {
    /// Starts the heartbeat `start` makes at `due`, unless the registration is dropped
    /// first. Call within a Tokio runtime.
    pub(crate) fn register(&self, due: Instant, start: Start) -> Registered {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        let earliest = state
            .due
            .keys()
            .next()
            .is_none_or(|(first, _)| due < *first);
        state.due.insert((due, id), start);
        let spawn_keeper = !std::mem::replace(&mut state.started, true);
        drop(state);
        if spawn_keeper {
            tokio::spawn(keep(Arc::downgrade(&self.inner)));
        }
        if earliest {
            self.inner.wake.notify_one();
        }
        Registered {
            registration: Registration {
                inner: self.inner.clone(),
                key: (due, id),
            },
            woke_keeper: earliest || spawn_keeper,
        }
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
        let mut state = lock(&self.inner);
        if state.due.remove(&self.key).is_none() {
            if let Some(heartbeat) = state.running.remove(&self.key.1) {
                heartbeat.abort();
            }
        }
    }
}

/// When nothing is due: how often the keeper looks whether its layer is gone.
const IDLE: Duration = Duration::from_secs(1);

/// The keeper's task: starts each heartbeat when due; ends with its layer.
async fn keep(inner: Weak<Inner>) {
    loop {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let now = Instant::now();
        let next = {
            let mut state = lock(&inner);
            while let Some(entry) = state.due.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                let ((_, id), start) = entry.remove_entry();
                let heartbeat = start();
                state.running.insert(id, heartbeat);
            }
            state.due.keys().next().map(|(at, _)| *at)
        };
        let wait = next.map_or(IDLE, |at| at.saturating_duration_since(now).min(IDLE));
        let woken = inner.wake.notified();
        tokio::pin!(woken);
        // Registered before sleeping: a registration meanwhile is not missed. (The
        // layer is held at most `IDLE` longer: the next turn finds it gone.)
        woken.as_mut().enable();
        tokio::select! {
            () = woken => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counting(started: &Arc<AtomicUsize>) -> Start {
        let started = started.clone();
        Box::new(move || {
            started.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(std::future::pending())
        })
    }

    #[tokio::test]
    async fn a_heartbeat_starts_only_for_a_claim_still_held_when_it_is_due() {
        let keeper = Keeper::default();
        let started = Arc::new(AtomicUsize::new(0));
        let soon = Instant::now() + Duration::from_millis(50);
        // Done before its first renewal: nothing ever started.
        let quick = keeper.register(soon, counting(&started));
        assert!(quick.woke_keeper, "the first claim wakes the keeper");
        drop(quick.registration);
        // Still held when due: started, and stopped when the claim ends.
        let slow = keeper.register(soon, counting(&started));
        let later = keeper.register(soon + Duration::from_secs(60), counting(&started));
        assert!(
            !later.woke_keeper,
            "due after another: the keeper is not woken"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(started.load(Ordering::SeqCst), 1);
        assert_eq!(keeper.counts(), (1, 1));
        drop(slow.registration);
        drop(later.registration);
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
        assert!(near.woke_keeper);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(started.load(Ordering::SeqCst), 1, "the near one started");
        drop((far, near));
    }
}
