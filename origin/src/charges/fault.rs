//! Faults a request can ask the demo for, with `--demo-faults`: what fault tests need
//! to stop a handler at an exact point, through real processes.

use http::HeaderMap;
use std::time::Duration;

/// The request header that asks for a fault. Not part of the request's fingerprint, so
/// a retry without it is the same request.
pub const FAULT_HEADER: &str = "demo-fault";

/// The longest stall accepted.
pub const MAX_STALL_MS: u64 = 60_000;

/// A fault asked for by a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// None.
    None,
    /// `abort-after-charge`: the process aborts (no destructor, no flush, no graceful
    /// shutdown — as `kill -9`) right after the charge commits, before idem stores
    /// the answer (or, in a transaction, right after both commit).
    AbortAfterCharge,
    /// `stall-before-commit=<ms>`: the handler sleeps this long right before its charge
    /// commits — in a transaction, after the charge's `INSERT` and before the `COMMIT`
    /// (a window to pause or kill the process in).
    StallBeforeCommit(Duration),
    /// `stall-after-commit=<ms>`: the handler sleeps this long right after its charge
    /// committed, before it returns its answer (with `--max-execution` shorter than
    /// that, it is cut off after its effect).
    StallAfterCommit(Duration),
}

impl Fault {
    /// The fault the request asks for; a message for the client when it may not
    /// ask (faults off) or asks for something unknown.
    pub fn from_headers(headers: &HeaderMap, allowed: bool) -> Result<Fault, String> {
        let mut values = headers.get_all(FAULT_HEADER).iter();
        let Some(value) = values.next() else {
            return Ok(Fault::None);
        };
        if !allowed {
            return Err(
                "faults are off: start the origin with --demo-faults to use Demo-Fault".into(),
            );
        }
        if values.next().is_some() {
            return Err("send at most one Demo-Fault header".into());
        }
        let value = value.to_str().unwrap_or("").trim();
        if value == "abort-after-charge" {
            return Ok(Fault::AbortAfterCharge);
        }
        let stall = |prefix: &str| {
            value.strip_prefix(prefix).map(|ms| {
                ms.parse::<u64>()
                    .ok()
                    .filter(|&ms| ms <= MAX_STALL_MS)
                    .map(Duration::from_millis)
                    .ok_or_else(|| format!("{prefix} takes milliseconds from 0 to {MAX_STALL_MS}"))
            })
        };
        if let Some(d) = stall("stall-before-commit=") {
            return d.map(Fault::StallBeforeCommit);
        }
        if let Some(d) = stall("stall-after-commit=") {
            return d.map(Fault::StallAfterCommit);
        }
        Err(format!(
            "unknown Demo-Fault {value:?}: use abort-after-charge, stall-before-commit=<ms> or stall-after-commit=<ms>"
        ))
    }

    /// Right before the charge commits: sleeps if asked to.
    pub async fn before_commit(self) {
        if let Fault::StallBeforeCommit(d) = self {
            tracing::warn!(?d, "demo fault: stalling before the charge commits");
            tokio::time::sleep(d).await;
        }
    }

    /// Right after the charge committed: aborts the process, or sleeps, if asked to.
    pub async fn after_commit(self) {
        match self {
            Fault::AbortAfterCharge => {
                tracing::error!(
                    "demo fault: aborting the process right after the charge committed"
                );
                std::process::abort();
            }
            Fault::StallAfterCommit(d) => {
                tracing::warn!(?d, "demo fault: stalling after the charge committed");
                tokio::time::sleep(d).await;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(FAULT_HEADER, value.parse().unwrap());
        h
    }

    #[test]
    fn parses_faults_only_when_allowed() {
        assert_eq!(
            Fault::from_headers(&HeaderMap::new(), false),
            Ok(Fault::None)
        );
        assert!(Fault::from_headers(&with("abort-after-charge"), false)
            .unwrap_err()
            .contains("--demo-faults"));
        assert_eq!(
            Fault::from_headers(&with("abort-after-charge"), true),
            Ok(Fault::AbortAfterCharge)
        );
        assert_eq!(
            Fault::from_headers(&with("stall-before-commit=250"), true),
            Ok(Fault::StallBeforeCommit(Duration::from_millis(250)))
        );
        assert_eq!(
            Fault::from_headers(&with("stall-after-commit=0"), true),
            Ok(Fault::StallAfterCommit(Duration::ZERO))
        );
        for bad in [
            "stall-before-commit=-1",
            "stall-before-commit=60001",
            "explode",
            "",
        ] {
            assert!(Fault::from_headers(&with(bad), true).is_err(), "{bad:?}");
        }
        let mut two = with("abort-after-charge");
        two.append(FAULT_HEADER, "abort-after-charge".parse().unwrap());
        assert!(Fault::from_headers(&two, true).is_err());
    }
}
