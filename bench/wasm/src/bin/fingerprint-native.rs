//! The native side of the WASM comparison: times the same fingerprints as `run.cjs`
//! and prints the same JSON.
//!     fingerprint-native <milliseconds per case>

use idem_bench_wasm::{body, fingerprint_of, SIZES};
use std::time::Instant;

fn main() {
    let budget_ms: f64 = match std::env::args().nth(1).map(|a| a.parse()) {
        None => 1000.0,
        Some(Ok(ms)) if ms > 0.0 => ms,
        Some(_) => {
            eprintln!("usage: fingerprint-native [milliseconds per case]");
            std::process::exit(2);
        }
    };
    let mut results = Vec::new();
    for json in [false, true] {
        for (label, size) in SIZES {
            let body = body(json, size);
            let run = |ms: f64| {
                let t0 = Instant::now();
                let mut n = 0u64;
                while t0.elapsed().as_secs_f64() * 1000.0 < ms {
                    std::hint::black_box(fingerprint_of(json, std::hint::black_box(&body)));
                    n += 1;
                }
                (n, t0.elapsed().as_secs_f64())
            };
            run(budget_ms / 4.0);
            let (n, secs) = run(budget_ms);
            let hex: String = fingerprint_of(json, &body)
                .0
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            results.push(format!(
                r#"{{"kind":"{}","size":"{label}","bytes":{},"bytes_per_s":{},"fingerprint":"{hex}"}}"#,
                if json { "json" } else { "raw" },
                body.len(),
                body.len() as f64 * n as f64 / secs,
            ));
        }
    }
    println!("[{}]", results.join(","));
}
