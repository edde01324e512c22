//! A TCP proxy that can cut a store off mid-test.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A TCP proxy to a real backend that the test can take down and bring back, to make
/// a store unreachable without stopping it for every other test.
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    down: Arc<AtomicBool>,
    generation: Arc<AtomicU32>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Proxies a fresh loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let down = Arc::new(AtomicBool::new(false));
        let generation = Arc::new(AtomicU32::new(0));
        let (d, g) = (down.clone(), generation.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if d.load(Ordering::SeqCst) {
                    drop(inbound); // refuse: close at once
                    continue;
                }
                let (d, g) = (d.clone(), g.clone());
                let born = g.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let copy = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
                    tokio::pin!(copy);
                    // Cut the connection when the proxy goes down.
                    loop {
                        tokio::select! {
                            _ = &mut copy => return,
                            _ = tokio::time::sleep(Duration::from_millis(20)) => {
                                if d.load(Ordering::SeqCst) || g.load(Ordering::SeqCst) != born { return; }
                            }
                        }
                    }
                });
            }
        });
        Proxy {
            addr,
            down,
            generation,
            task,
        }
    }

    /// Drops every connection and refuses new ones.
    pub fn take_down(&self) {
        self.down.store(true, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Accepts connections again.
    pub fn bring_up(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
