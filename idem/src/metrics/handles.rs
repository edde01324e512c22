//! Counters and histograms of the hot path, resolved once per thread and recorder.
//!
//! `counter!` and `histogram!` build their key and ask the recorder for its handle on
//! every call — hashing the name and labels, allocating the labels — which a new key
//! paid five times. The handles are kept here by name and label values, for the
//! recorder in force (the global one, or a thread's local one) when they were made.

use metrics::{Counter, Histogram, Key, Label, Level, Metadata, Recorder};
use std::cell::RefCell;

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
    metrics::with_recorder(|recorder| {
        let id = std::ptr::from_ref(recorder).cast::<()>() as usize;
        HANDLES.with(|handles| {
            let mut handles = handles.borrow_mut();
            // Names and label values are literals: their addresses tell them apart
            // (a literal stored twice only makes a second entry).
            let found = handles.iter().find(|e| {
                e.recorder == id
                    && same(e.name, name)
                    && e.labels
                        .iter()
                        .zip(&labels)
                        .all(|(a, b)| same(a.0, b.0) && same(a.1, b.1))
            });
            if let Some(entry) = found {
                return entry.handle.clone();
            }
            let handle = make(recorder, &key(name, &labels));
            handles.push(Entry {
                recorder: id,
                name,
                labels,
                handle: handle.clone(),
            });
            handle
        })
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

    /// Every counter it hands out adds to one number.
    #[derive(Default)]
    struct Counting(Arc<AtomicU64>);

    impl Recorder for Counting {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
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
}
