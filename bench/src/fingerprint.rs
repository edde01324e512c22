//! The core's fingerprint in WASM under Node against the same code built natively
//! (with the CPU's SHA extensions, and with SHA-256 in software as WASM must do it).
//! `scripts/bench` builds the three into one directory:
//!
//! ```text
//! <dir>/wasm/idem_bench_wasm.js   wasm-bindgen --target nodejs output
//! <dir>/run.cjs                   the Node timing loop
//! <dir>/native                    fingerprint-native
//! <dir>/native-soft-sha           fingerprint-native built with --features soft-sha
//! ```

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;
use tokio::process::Command;

/// One case as the timing programs print it.
#[derive(Clone, Debug, Deserialize)]
struct Case {
    kind: String,
    size: String,
    bytes: usize,
    bytes_per_s: f64,
    /// Node only: the message made in WASM, hashed by WebCrypto.
    #[serde(default)]
    webcrypto_bytes_per_s: Option<f64>,
    fingerprint: String,
}

/// One row of the comparison.
#[derive(Clone, Debug, Serialize)]
pub struct FingerprintRow {
    pub kind: String,
    pub size: String,
    pub bytes: usize,
    pub native_mb_s: f64,
    pub native_soft_sha_mb_s: f64,
    pub wasm_mb_s: f64,
    /// The message made in WASM, SHA-256 by Node's WebCrypto.
    pub wasm_webcrypto_mb_s: f64,
    /// WASM ÷ native.
    pub ratio: f64,
    /// WASM ÷ native with software SHA-256.
    pub ratio_soft_sha: f64,
    /// WASM + WebCrypto ÷ native.
    pub ratio_webcrypto: f64,
}

pub async fn compare(dir: &Path, budget_ms: u64) -> Result<Vec<FingerprintRow>> {
    let ms = budget_ms.to_string();
    let js = dir.join("wasm/idem_bench_wasm.js");
    let wasm = run(Command::new("node")
        .arg(dir.join("run.cjs"))
        .arg(&js)
        .arg(&ms))
    .await?;
    let native = run(Command::new(dir.join("native")).arg(&ms)).await?;
    let soft = run(Command::new(dir.join("native-soft-sha")).arg(&ms)).await?;
    rows(&native, &soft, &wasm)
}

fn rows(native: &[Case], soft: &[Case], wasm: &[Case]) -> Result<Vec<FingerprintRow>> {
    if native.len() != wasm.len() || soft.len() != wasm.len() {
        bail!("the timing programs ran different cases");
    }
    let mut rows = Vec::new();
    for ((n, s), w) in native.iter().zip(soft).zip(wasm) {
        if (n.kind.as_str(), n.size.as_str()) != (w.kind.as_str(), w.size.as_str())
            || n.bytes != w.bytes
        {
            bail!("case mismatch: {n:?} vs {w:?}");
        }
        // Same code, same input: the same fingerprint, or the comparison is void.
        if n.fingerprint != w.fingerprint || s.fingerprint != w.fingerprint {
            bail!(
                "{} {}: native, software-SHA and WASM fingerprints differ ({}, {}, {})",
                n.kind,
                n.size,
                n.fingerprint,
                s.fingerprint,
                w.fingerprint
            );
        }
        rows.push(FingerprintRow {
            kind: n.kind.clone(),
            size: n.size.clone(),
            bytes: n.bytes,
            native_mb_s: n.bytes_per_s / 1e6,
            native_soft_sha_mb_s: s.bytes_per_s / 1e6,
            wasm_mb_s: w.bytes_per_s / 1e6,
            wasm_webcrypto_mb_s: w.webcrypto_bytes_per_s.unwrap_or(f64::NAN) / 1e6,
            ratio: w.bytes_per_s / n.bytes_per_s,
            ratio_soft_sha: w.bytes_per_s / s.bytes_per_s,
            ratio_webcrypto: w.webcrypto_bytes_per_s.unwrap_or(f64::NAN) / n.bytes_per_s,
        });
    }
    Ok(rows)
}

async fn run(cmd: &mut Command) -> Result<Vec<Case>> {
    let shown = format!("{:?}", cmd.as_std());
    let out = cmd
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {shown} (scripts/bench builds it)"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("reading what {shown} printed"))
}

pub fn table(rows: &[FingerprintRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<12} {:>6} {:>12} {:>16} {:>17} {:>12} {:>10} {:>20} {:>11}",
        "fingerprint",
        "size",
        "native MB/s",
        "native soft-SHA",
        "WASM (Node) MB/s",
        "WASM/native",
        "WASM/soft",
        "WASM+WebCrypto MB/s",
        "(÷ native)"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<12} {:>6} {:>12.0} {:>16.0} {:>17.0} {:>12.2} {:>10.2} {:>20.0} {:>11.2}",
            r.kind,
            r.size,
            r.native_mb_s,
            r.native_soft_sha_mb_s,
            r.wasm_mb_s,
            r.ratio,
            r.ratio_soft_sha,
            r.wasm_webcrypto_mb_s,
            r.ratio_webcrypto
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(kind: &str, bps: f64, fp: &str) -> Case {
        Case {
            kind: kind.into(),
            size: "1KiB".into(),
            bytes: 1024,
            bytes_per_s: bps,
            webcrypto_bytes_per_s: Some(bps * 2.0),
            fingerprint: fp.into(),
        }
    }

    #[test]
    fn compares_like_with_like() {
        let rows = rows(
            &[case("raw", 2e9, "ab")],
            &[case("raw", 5e8, "ab")],
            &[case("raw", 5e8, "ab")],
        )
        .unwrap();
        assert_eq!(rows[0].ratio, 0.25);
        assert_eq!(rows[0].ratio_soft_sha, 1.0);
        assert_eq!(rows[0].ratio_webcrypto, 0.5);
        assert!(table(&rows).contains("0.25"));
        let differ = rows_err(
            &[case("raw", 1.0, "ab")],
            &[case("raw", 1.0, "ab")],
            &[case("raw", 1.0, "cd")],
        );
        assert!(differ.contains("differ"), "{differ}");
        let other = rows_err(
            &[case("raw", 1.0, "ab")],
            &[case("raw", 1.0, "ab")],
            &[case("json", 1.0, "ab")],
        );
        assert!(other.contains("mismatch"), "{other}");
    }

    fn rows_err(n: &[Case], s: &[Case], w: &[Case]) -> String {
        rows(n, s, w).unwrap_err().to_string()
    }
}
