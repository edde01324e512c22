//! The origin under test: the real `idem-origin` binary in its own process.

use anyhow::{bail, Context, Result};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `idem-origin`; stopped (SIGTERM, then SIGKILL) on drop.
pub struct OriginProcess {
    child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
}

impl OriginProcess {
    pub async fn start(bin: &Path, args: &[String], log: PathBuf) -> Result<Self> {
        let addr = free_port()?;
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(bin)
            .arg("--listen")
            .arg(addr.to_string())
            .args(args)
            // Warnings only: per-request logging would be measured too.
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut origin = OriginProcess { child, addr, log };
        if let Err(e) = crate::load::wait_healthy(addr, Duration::from_secs(30)).await {
            let log = std::fs::read_to_string(&origin.log).unwrap_or_default();
            origin.stop();
            bail!("{e}; its log:\n{log}");
        }
        Ok(origin)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .arg(self.child.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for OriginProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?)
}

/// `idem-origin` beside this binary (cargo puts both in the same target directory).
pub fn default_binary() -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let bin = me.with_file_name(format!("idem-origin{}", std::env::consts::EXE_SUFFIX));
    if !bin.exists() {
        bail!(
            "{} not found: build it with the same profile (cargo build --release -p idem-origin), \
             or pass --origin-bin",
            bin.display()
        );
    }
    Ok(bin)
}
