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
    /// Requests still reach the backend, their replies never come back: the connection
    /// is cut just after a request went through ([`Proxy::lose_replies`]).
    losing: Arc<AtomicBool>,
    generation: Arc<AtomicU32>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Proxies a fresh loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let down = Arc::new(AtomicBool::new(false));
        let losing = Arc::new(AtomicBool::new(false));
        let generation = Arc::new(AtomicU32::new(0));
        let (d, g, l) = (down.clone(), generation.clone(), losing.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if d.load(Ordering::SeqCst) {
                    drop(inbound); // refuse: close at once
                    continue;
                }
                let (d, g, l) = (d.clone(), g.clone(), l.clone());
                let born = g.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    relay(inbound, outbound, born, &d, &g, &l).await;
                });
            }
        });
        Proxy {
            addr,
            down,
            losing,
            generation,
            task,
        }
    }

    /// From now on every request reaches the backend and its reply is lost: the
    /// connection is cut once the request has had time to land (a lost reply whose
    /// write landed).
    pub fn lose_replies(&self) {
        self.losing.store(true, Ordering::SeqCst);
    }

    /// Replies come back again.
    pub fn deliver_replies(&self) {
        self.losing.store(false, Ordering::SeqCst);
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

/// Copies both ways until either side closes, the proxy goes down (or cuts its
/// connections), or — replies being lost — a request has gone through.
async fn relay(
    mut inbound: TcpStream,
    mut outbound: TcpStream,
    born: u32,
    down: &AtomicBool,
    generation: &AtomicU32,
    losing: &AtomicBool,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut from_client, mut to_client) = inbound.split();
    let (mut from_backend, mut to_backend) = outbound.split();
    let (mut up, mut back) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        tokio::select! {
            read = from_client.read(&mut up) => {
                let Ok(n @ 1..) = read else { return };
                if to_backend.write_all(&up[..n]).await.is_err() { return; }
                if losing.load(Ordering::SeqCst) {
                    // Let the backend act on it, then cut: its reply is lost.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    return;
                }
            }
            read = from_backend.read(&mut back) => {
                let Ok(n @ 1..) = read else { return };
                if to_client.write_all(&back[..n]).await.is_err() { return; }
            }
            _ = tokio::time::sleep(Duration::from_millis(20)) => {
                if down.load(Ordering::SeqCst) || generation.load(Ordering::SeqCst) != born { return; }
            }
        }
    }
}
