//! Micro-benchmarks of the core: fingerprint throughput (1 KiB, 64 KiB, 1 MiB bodies,
//! raw and JSON), canonical JSON, and one decision.
//!
//!     cargo bench -p idem-core --bench core
//!
//! Throughputs are in bytes per second, so MB/s can be read off directly.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use idem_core::{decide, json, Decision, Fingerprint, Policy, RequestParts};
use std::hint::black_box;

/// A JSON document of about `size` bytes: an array of charge-like objects, keys
/// deliberately out of order so canonicalisation has sorting to do.
fn json_body(size: usize) -> Vec<u8> {
    let item = r#"{"currency":"usd","amount":1999,"metadata":{"order":"A-1042","note":"caf\u00e9"},"customer":"cus_9f8e7d"}"#;
    let mut out = String::from("[");
    while out.len() + item.len() + 2 < size {
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(item);
    }
    out.push(']');
    out.into_bytes()
}

fn fingerprints(c: &mut Criterion) {
    let mut group = c.benchmark_group("fingerprint");
    for (label, size) in [("1KiB", 1024), ("64KiB", 64 * 1024), ("1MiB", 1024 * 1024)] {
        let raw = vec![0xa5u8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(format!("raw/{label}"), |b| {
            b.iter(|| {
                Fingerprint::of(black_box(&RequestParts {
                    method: "POST",
                    path_and_query: "/v1/charges",
                    content_type: Some("application/octet-stream"),
                    body: &raw,
                }))
            })
        });
        let body = json_body(size);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(format!("json/{label}"), |b| {
            b.iter(|| {
                Fingerprint::of(black_box(&RequestParts {
                    method: "POST",
                    path_and_query: "/v1/charges",
                    content_type: Some("application/json"),
                    body: &body,
                }))
            })
        });
    }
    group.finish();
}

fn canonical_json(c: &mut Criterion) {
    let mut group = c.benchmark_group("canonical_json");
    for (label, size) in [("1KiB", 1024), ("64KiB", 64 * 1024)] {
        let body = json_body(size);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(label, |b| {
            b.iter(|| json::canonicalize(black_box(&body)).unwrap())
        });
    }
    group.finish();
}

fn decisions(c: &mut Criterion) {
    let policy = Policy::default();
    let fp = Fingerprint([7; 32]);
    let Decision::Execute(claim) = decide(None, &fp, 1_000, &policy) else {
        unreachable!()
    };
    let completed = claim.holder().completed(
        idem_core::StoredResponse {
            status: 201,
            headers: vec![],
            body: vec![0; 256],
        },
        1_500,
        &policy,
    );
    c.bench_function("decide/new key", |b| {
        b.iter(|| decide(black_box(None), black_box(&fp), 2_000, &policy))
    });
    c.bench_function("decide/replay", |b| {
        b.iter_batched(
            || completed.clone(),
            |r| decide(Some(&r), black_box(&fp), 2_000, &policy),
            BatchSize::SmallInput,
        )
    });
    c.bench_function("decide/in flight", |b| {
        b.iter(|| decide(Some(black_box(&claim.record)), &fp, 1_100, &policy))
    });
}

criterion_group!(benches, fingerprints, canonical_json, decisions);
criterion_main!(benches);
