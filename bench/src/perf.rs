//! `perf record` of the origin during a measured phase: where its µs per request go.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `perf record`; [`Recording::finish`] waits for it.
pub struct Recording {
    child: Child,
    name: String,
}

/// Samples `pid`'s call stacks (DWARF unwinding: release builds keep no frame
/// pointers) for `duration` into `<dir>/<name>.data`.
pub fn record(dir: &Path, pid: u32, name: &str, duration: Duration) -> Result<Recording> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let out = dir.join(format!("{name}.data"));
    let child = Command::new("perf")
        .args([
            "record",
            "-q",
            "-F",
            "499",
            "--call-graph",
            "dwarf,32768",
            "-p",
        ])
        .arg(pid.to_string())
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg("sleep")
        .arg(format!("{:.3}", duration.as_secs_f64()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .context("starting perf record (Debian: apt-get install linux-perf)")?;
    Ok(Recording {
        child,
        name: name.to_owned(),
    })
}

impl Recording {
    pub fn finish(mut self) -> Result<()> {
        let status = self.child.wait()?;
        if !status.success() {
            bail!("perf record for {} failed: {status}", self.name);
        }
        Ok(())
    }
}
