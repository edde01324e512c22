//! Counters and histograms of the hot path, resolved once per thread and recorder.
//!
//! `counter!` and `histogram!` build their key and ask the recorder for its handle on
//! every call — hashing the name and labels, allocating the labels — which a new key
//! paid five times. The handles are kept here by name and label values, for the
//! recorder in force (the global one, or a thread's local one) when they were made,
//! and made again after [`REFRESH`]: a recorder that prunes idle series (the
//! Prometheus exporter's `idle_timeout`) would otherwise never see a pruned series
//! again from a handle kept here. A recorder is known by its address: one dropped and
//! another made at the same address within [`REFRESH`] (local recorders in a loop)
//! gets the first one's handles until then.

use metrics::{Counter, Histogram, Key, Label, Level, Metadata, Recorder};
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// How long a handle is used before it is asked of the recorder again.
const REFRESH: Duration = Duration::from_secs(1);

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Up to two labels; unused ones are `("", "")`.
type Labels = [(&'static str, &'static str); 2];

#[derive(Clone)]
enum Handle {
    Counter(Counter),
    Histogram(Histogram),
}

struct Entry {
    /// The recorder the handle came from (its address).
    recorder: usize,
    name: &'static str,
    labels: Labels,
    handle: Handle,
    made_at: Instant,
}

thread_local! {
    static HANDLES: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
}

fn key(name: &'static str, labels: &Labels) -> Key {
    let labels: Vec<Label> = labels
        .iter()
        .filter(|(k, _)| !k.is_empty())
        .map(|&(k, v)| Label::from_static_parts(k, v))
        .collect();
    Key::from_parts(name, labels)
}

fn same(a: &str, b: &str) -> bool {
    std::ptr::eq(a, b)
}

fn handle(name: &'static str, labels: Labels, make: fn(&dyn Recorder, &Key) -> Handle) -> Handle {
    handle_at(Instant::now(), name, labels, make)
}

fn handle_at(
    now: Instant,
    name: &'static str,
    labels: Labels,
    make: fn(&dyn Recorder, &Key) -> Handle,
) -> Handle {
    metrics::with_recorder(|recorder| {
        let id = std::ptr::from_ref(recorder).cast::<()>() as usize;
        // Names and label values are literals: their addresses tell them apart (a
        // literal stored twice only makes a second entry).
        let matches = |e: &Entry| {
            e.recorder == id
                && same(e.name, name)
                && e.labels
                    .iter()
                    .zip(&labels)
                    .all(|(a, b)| same(a.0, b.0) && same(a.1, b.1))
        };
        let kept = HANDLES.with(|handles| {
            let handles = handles.borrow();
            let entry = handles.iter().find(|e| matches(e))?;
            (now.saturating_duration_since(entry.made_at) < REFRESH).then(|| entry.handle.clone())
        });
        if let Some(handle) = kept {
            return handle;
        }
        // Made with nothing borrowed: a recorder may record metrics of its own meanwhile.
        let handle = make(recorder, &key(name, &labels));
        HANDLES.with(|handles| {
            let mut handles = handles.borrow_mut();
            let made = Entry {
                recorder: id,
                name,
                labels,
                handle: handle.clone(),
                made_at: now,
            };
            match handles.iter_mut().find(|e| matches(e)) {
                Some(entry) => *entry = made,
                None => handles.push(made),
            }
        });
        handle
    })
}

/// The counter `name` with `labels`.
pub(super) fn counter(name: &'static str, labels: Labels) -> Counter {
    match handle(name, labels, |r, key| {
        Handle::Counter(r.register_counter(key, &METADATA))
    }) {
        Handle::Counter(c) => c,
        Handle::Histogram(_) => Counter::noop(),
    }
}

/// The histogram `name` with `labels`.
pub(super) fn histogram(name: &'static str, labels: Labels) -> Histogram {
    match handle(name, labels, |r, key| {
        Handle::Histogram(r.register_histogram(key, &METADATA))
    }) {
        Handle::Histogram(h) => h,
        Handle::Counter(_) => Histogram::noop(),
    }
}

#[cfg(test)]
mod tests {
    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// Every counter it hands out adds to one number; it counts the handles asked of it.
    #[derive(Default)]
    struct Counting(Arc<AtomicU64>, AtomicU64);

    impl Recorder for Counting {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            self.1.fetch_add(1, Ordering::Relaxed);
            Counter::from_arc(self.0.clone())
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn handles_follow_the_recorder_in_force() {
        let (first, second) = (Counting::default(), Counting::default());
        for recorder in [&first, &second, &first, &first] {
            metrics::with_local_recorder(recorder, || {
                super::counter("handles_test_total", [("op", "x"), ("", "")]).increment(1);
            });
        }
        let count = |r: &Counting| r.0.load(Ordering::Relaxed);
        assert_eq!((count(&first), count(&second)), (3, 1));
    }

    #[test]
    fn handles_are_asked_for_again_after_the_refresh() {
        let recorder = Counting::default();
        let labels = [("op", "y"), ("", "")];
        let start = std::time::Instant::now();
        let asked = |after_ms| {
            metrics::with_local_recorder(&recorder, || {
                let at = start + std::time::Duration::from_millis(after_ms);
                let make = |r: &dyn Recorder, k: &Key| {
                    super::Handle::Counter(r.register_counter(k, &super::METADATA))
                };
                let _ = super::handle_at(at, "handles_refresh_total", labels, make);
            });
            recorder.1.load(Ordering::Relaxed)
        };
        assert_eq!(
            [asked(0), asked(500), asked(1_500), asked(2_000)],
            [1, 1, 2, 2]
        );
    }
}
