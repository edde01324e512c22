//! What one caller (one scope) may hold of a layer: guarded requests in progress at
//! once, and new keys in a window. The layer's own limits are global; without these,
//! one tenant can take every slot of `max_in_progress` or fill a bounded store, and
//! every other tenant gets `503`. Counted in this process (each replica counts its
//! own). A caller that can mint scopes at will (any bearer token under
//! `scope-from authorization`) is bounded by the global limits only.

use idem_core::contract::{Problem, Rejection};
use idem_core::Scope;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The quota of one scope. `None` is no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScopeQuota {
    /// Guarded requests in progress at once — from their scope read to their answer
    /// stored, even when their client has left.
    pub in_progress: Option<usize>,
    /// New records (keys not seen, or expired) per window: a caller past it gets `429`
    /// for new keys, and its stored answers still replay.
    pub new_keys: Option<NewKeys>,
}

/// At most `count` new keys per `per`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewKeys {
    /// How many.
    pub count: u32,
    /// In what window, counted from the window's first new key.
    pub per: Duration,
}

impl Default for ScopeQuota {
    /// No quota: callers share the layer's own limits. A quota is a choice about one's
    /// callers — a service that sends all its traffic under one key, or every
    /// anonymous caller in one scope, would be throttled by a default one.
    fn default() -> Self {
        ScopeQuota {
            in_progress: None,
            new_keys: None,
        }
    }
}

/// Scopes tracked at once. Past it, idle ones are forgotten (oldest window first);
/// scopes with requests in progress are bounded by the layer's own limit.
const TRACKED: usize = 100_000;

#[derive(Clone, Copy, Debug)]
struct Usage {
    in_progress: usize,
    window_start: Instant,
    new_keys: u32,
}

/// The layer's quotas and each scope's use of them.
#[derive(Clone, Debug)]
pub(crate) struct ScopeQuotas {
    quota: ScopeQuota,
    usage: Arc<Mutex<HashMap<Scope, Usage>>>,
}

impl ScopeQuotas {
    pub(crate) fn new(quota: ScopeQuota) -> Self {
        ScopeQuotas {
            quota,
            usage: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Scope, Usage>> {
        self.usage.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place among `scope`'s requests in progress until the permit is dropped, or
    /// the refusal when it has none left.
    pub(crate) fn enter(&self, scope: Scope, now: Instant) -> Result<ScopePermit, Rejection> {
        let Some(limit) = self.quota.in_progress else {
            return Ok(ScopePermit(None));
        };
        let mut usage = self.lock();
        let entry = self.usage_of(&mut usage, scope, now);
        if entry.in_progress >= limit {
            return Err(Rejection::with_detail(
                Problem::ScopeQuota,
                format!(
                    "this caller has {limit} requests in progress, as many as it may; nothing was run, retry later"
                ),
            ));
        }
        entry.in_progress += 1;
        Ok(ScopePermit(Some((self.clone(), scope))))
    }

    /// One of `scope`'s new keys, taken from its quota until the reservation is
    /// dropped uncommitted (the claim made no record: a replay, a 409, an error); or,
    /// past the quota, how long until a new key may be made. Taken and checked under one
    /// lock, so concurrent new keys cannot all pass a check meant for one.
    pub(crate) fn reserve_new_key(
        &self,
        scope: Scope,
        now: Instant,
    ) -> Result<NewKeyReservation, Duration> {
        let Some(NewKeys { count, per }) = self.quota.new_keys else {
            return Ok(NewKeyReservation(None));
        };
        let mut usage = self.lock();
        let entry = self.usage_of(&mut usage, scope, now);
        let elapsed = now.saturating_duration_since(entry.window_start);
        if elapsed >= per {
            entry.window_start = now;
            entry.new_keys = 0;
        }
        if entry.new_keys >= count {
            let elapsed = now.saturating_duration_since(entry.window_start);
            return Err(per.saturating_sub(elapsed).max(Duration::from_millis(1)));
        }
        entry.new_keys += 1;
        Ok(NewKeyReservation(Some((
            self.clone(),
            scope,
            entry.window_start,
        ))))
    }

    /// Counts a new record `scope` made without a reservation (its key was past the
    /// quota, but the store held a live record for it, which expired meanwhile).
    pub(crate) fn created(&self, scope: &Scope, now: Instant) {
        match self.reserve_new_key(*scope, now) {
            Ok(reservation) => reservation.commit(),
            Err(_) => {
                if let Some(entry) = self.lock().get_mut(scope) {
                    entry.new_keys = entry.new_keys.saturating_add(1);
                }
            }
        }
    }

    fn give_back(&self, scope: &Scope, window_start: Instant) {
        if let Some(entry) = self.lock().get_mut(scope) {
            // Only within the window it was taken from: a new window started afresh.
            if entry.window_start == window_start {
                entry.new_keys = entry.new_keys.saturating_sub(1);
            }
        }
    }

    /// `scope`'s use, tracked from `now` if it was not (room made first when full).
    fn usage_of<'a>(
        &self,
        usage: &'a mut HashMap<Scope, Usage>,
        scope: Scope,
        now: Instant,
    ) -> &'a mut Usage {
        if !usage.contains_key(&scope) && usage.len() >= TRACKED {
            self.forget_idle(usage, now);
        }
        usage.entry(scope).or_insert(Usage {
            in_progress: 0,
            window_start: now,
            new_keys: 0,
        })
    }

    /// Drops scopes with nothing in progress: those whose window is over, then, if
    /// still too many, the oldest windows.
    fn forget_idle(&self, usage: &mut HashMap<Scope, Usage>, now: Instant) {
        let per = self.quota.new_keys.map_or(Duration::ZERO, |n| n.per);
        usage.retain(|_, u| {
            u.in_progress > 0 || now.saturating_duration_since(u.window_start) < per
        });
        if usage.len() >= TRACKED {
            let mut idle: Vec<(Instant, Scope)> = usage
                .iter()
                .filter(|(_, u)| u.in_progress == 0)
                .map(|(s, u)| (u.window_start, *s))
                .collect();
            // A tenth at once, the oldest windows (found in linear time): a crowd of new
            // scopes pays for this once per ten thousand, not on every request.
            let evict = (TRACKED / 10).min(idle.len());
            if evict > 0 && evict < idle.len() {
                idle.select_nth_unstable_by_key(evict, |(start, _)| *start);
            }
            for (_, scope) in idle.iter().take(evict) {
                usage.remove(scope);
            }
        }
    }

    fn leave(&self, scope: &Scope) {
        let mut usage = self.lock();
        let per = self.quota.new_keys.map(|n| n.per);
        if let Some(entry) = usage.get_mut(scope) {
            entry.in_progress = entry.in_progress.saturating_sub(1);
            let window_over = per.is_none_or(|per| entry.window_start.elapsed() >= per);
            if entry.in_progress == 0 && window_over {
                usage.remove(scope);
            }
        }
    }

    /// Scopes tracked now.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.lock().len()
    }
}

/// A new key taken from a scope's quota: given back when dropped, unless committed
/// (the claim made a record).
#[derive(Debug)]
#[must_use]
pub(crate) struct NewKeyReservation(Option<(ScopeQuotas, Scope, Instant)>);

impl NewKeyReservation {
    /// The claim made a record: the key stays counted.
    pub(crate) fn commit(mut self) {
        self.0 = None;
    }
}

impl Drop for NewKeyReservation {
    fn drop(&mut self) {
        if let Some((quotas, scope, window_start)) = &self.0 {
            quotas.give_back(scope, *window_start);
        }
    }
}

/// A place among a scope's requests in progress, given back when dropped.
#[derive(Debug)]
pub(crate) struct ScopePermit(Option<(ScopeQuotas, Scope)>);

impl Drop for ScopePermit {
    fn drop(&mut self) {
        if let Some((quotas, scope)) = &self.0 {
            quotas.leave(scope);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(n: u8) -> Scope {
        Scope::from_tenant(&format!("tenant-{n}"))
    }

    #[test]
    fn a_scope_holds_at_most_its_quota_in_progress_and_others_are_not_affected() {
        let quotas = ScopeQuotas::new(ScopeQuota {
            in_progress: Some(2),
            new_keys: None,
        });
        let now = Instant::now();
        let a1 = quotas.enter(scope(1), now).unwrap();
        let _a2 = quotas.enter(scope(1), now).unwrap();
        let refused = quotas.enter(scope(1), now).unwrap_err();
        assert_eq!(refused.problem, Problem::ScopeQuota);
        assert_eq!(refused.status(), 429);
        let _b = quotas.enter(scope(2), now).expect("another scope");
        drop(a1);
        let _a3 = quotas.enter(scope(1), now).expect("a place was given back");
        let unlimited = ScopeQuotas::new(ScopeQuota {
            in_progress: None,
            new_keys: None,
        });
        let held: Vec<_> = (0..5_000)
            .map(|_| unlimited.enter(scope(1), now).unwrap())
            .collect();
        assert_eq!(held.len(), 5_000);
        assert_eq!(unlimited.tracked(), 0, "nothing tracked without a quota");
    }

    #[test]
    fn new_keys_past_the_quota_wait_for_the_window() {
        let quotas = ScopeQuotas::new(ScopeQuota {
            in_progress: None,
            new_keys: Some(NewKeys {
                count: 3,
                per: Duration::from_secs(60),
            }),
        });
        let t0 = Instant::now();
        // Three taken at once (concurrent new keys): a fourth is refused before any of
        // them made its record.
        let held: Vec<_> = (0..3)
            .map(|_| quotas.reserve_new_key(scope(1), t0).unwrap())
            .collect();
        assert_eq!(
            quotas.reserve_new_key(scope(1), t0).err(),
            Some(Duration::from_secs(60))
        );
        // One made no record (a replay): given back. The others made theirs.
        let mut held = held.into_iter();
        drop(held.next());
        held.for_each(NewKeyReservation::commit);
        quotas.reserve_new_key(scope(1), t0).unwrap().commit();
        let later = t0 + Duration::from_secs(45);
        assert_eq!(
            quotas.reserve_new_key(scope(1), later).err(),
            Some(Duration::from_secs(15))
        );
        quotas
            .reserve_new_key(scope(2), later)
            .expect("another scope")
            .commit();
        let next = t0 + Duration::from_secs(60);
        let fresh = quotas
            .reserve_new_key(scope(1), next)
            .expect("a new window");
        drop(fresh);
        assert!(
            quotas.reserve_new_key(scope(1), next).is_ok(),
            "1 of 3, given back"
        );
    }

    #[test]
    fn tracking_is_bounded_and_forgets_idle_scopes_first() {
        let quotas = ScopeQuotas::new(ScopeQuota {
            in_progress: Some(10),
            new_keys: Some(NewKeys {
                count: 10,
                per: Duration::from_secs(3600),
            }),
        });
        let t0 = Instant::now();
        let busy = quotas.enter(scope(0), t0).unwrap();
        for n in 0..(TRACKED as u32 + 10) {
            let at = t0 + Duration::from_millis(n.into());
            quotas
                .reserve_new_key(Scope::from_tenant(&format!("idle-{n}")), at)
                .unwrap()
                .commit();
        }
        assert!(quotas.tracked() <= TRACKED, "{}", quotas.tracked());
        // The scope with a request in progress was kept, and gives its place back.
        assert_eq!(quotas.lock()[&scope(0)].in_progress, 1);
        drop(busy);
        assert_eq!(quotas.lock().get(&scope(0)).map(|u| u.in_progress), Some(0));
    }
}
