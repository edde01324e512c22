//! This binary serving under another name — the peer, a floor, the proxy comparison's
//! upstream — so that each one's CPU is told apart from the load generator's.

use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A free loopback address for a server to listen on.
pub fn free_addr() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// This binary as `out/<program>` (a hard link, or a copy where links are refused).
pub fn as_program(out: &Path, program: &str) -> Result<Command> {
    let me = std::env::current_exe()?;
    let bin = out.join(program);
    let _ = std::fs::remove_file(&bin);
    if std::fs::hard_link(&me, &bin).is_err() {
        std::fs::copy(&me, &bin).with_context(|| format!("copying to {}", bin.display()))?;
    }
    Ok(Command::new(bin))
}

/// A server process listening on `addr`; killed on drop.
pub struct Served {
    child: Child,
    pub addr: SocketAddr,
}

impl Served {
    /// Starts `cmd`, which listens on `addr`, and waits until it answers `/healthz`.
    pub async fn start(mut cmd: Command, addr: SocketAddr, what: &str) -> Result<Served> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        let served = Served { child, addr };
        crate::load::wait_healthy(addr, Duration::from_secs(10)).await?;
        Ok(served)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
