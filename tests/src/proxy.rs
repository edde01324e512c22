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
    /// Connections cut after a request went through, replies being lost.
    lost: Arc<AtomicU32>,
    generation: Arc<AtomicU32>,
    /// Milliseconds a new connection waits before it is put through: a database far
    /// away, or one too loaded to start a session quickly ([`Proxy::slow_connects`]).
    connect_delay_ms: Arc<AtomicU32>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Proxies a fresh loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let down = Arc::new(AtomicBool::new(false));
        let losing = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicU32::new(0));
        let generation = Arc::new(AtomicU32::new(0));
        let connect_delay_ms = Arc::new(AtomicU32::new(0));
        let (d, g, l, n, w) = (
            down.clone(),
            generation.clone(),
            losing.clone(),
            lost.clone(),
            connect_delay_ms.clone(),
        );
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if d.load(Ordering::SeqCst) {
                    drop(inbound); // refuse: close at once
                    continue;
                }
                let (d, g, l, n) = (d.clone(), g.clone(), l.clone(), n.clone());
                let born = g.load(Ordering::SeqCst);
                let delay = Duration::from_millis(w.load(Ordering::SeqCst).into());
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let Ok(outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    if relay(inbound, outbound, born, &d, &g, &l).await {
                        n.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        Proxy {
            addr,
            down,
            losing,
            lost,
            generation,
            connect_delay_ms,
            task,
        }
    }

    /// From now on a new connection is put through only after `delay` (connections
    /// already made are not slowed).
    pub fn slow_connects(&self, delay: Duration) {
        let ms = u32::try_from(delay.as_millis()).unwrap_or(u32::MAX);
        self.connect_delay_ms.store(ms, Ordering::SeqCst);
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

    /// How many connections were cut after a request went through.
    pub fn replies_lost(&self) -> u32 {
        self.lost.load(Ordering::SeqCst)
    }

    /// Drops every connection and refuses new ones.
    pub fn take_down(&self) {
        self.down.store(true, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Cuts every connection made so far and goes on accepting new ones: a server
    /// that closed its sessions (restarted, or `pg_terminate_backend`), a middlebox that
    /// dropped them.
    pub fn cut_connections(&self) {
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

/// Copies both ways — each direction on its own, a side's end of stream passed on as a
/// half-close — until both ends are closed, the proxy goes down (or cuts its
/// connections), or, replies being lost, a request has gone through (then true).
async fn relay(
    inbound: TcpStream,
    outbound: TcpStream,
    born: u32,
    down: &AtomicBool,
    generation: &AtomicU32,
    losing: &AtomicBool,
) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut from_client, mut to_client) = inbound.into_split();
    let (mut from_backend, mut to_backend) = outbound.into_split();
    // Client to backend: true when cut after a request went through (its reply lost).
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from_client.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = to_backend.shutdown().await;
                    return false;
                }
                Ok(n) => n,
            };
            if to_backend.write_all(&buf[..n]).await.is_err() {
                return false;
            }
            if losing.load(Ordering::SeqCst) {
                // Let the backend act on it, then cut: its reply is lost.
                tokio::time::sleep(Duration::from_millis(20)).await;
                return true;
            }
        }
    };
    let back = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from_backend.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = to_client.shutdown().await;
                    return;
                }
                Ok(n) => n,
            };
            if to_client.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Checked every 20 ms whatever the traffic.
    let watch = async {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tick.tick().await;
            if down.load(Ordering::SeqCst) || generation.load(Ordering::SeqCst) != born {
                return;
            }
        }
    };
    tokio::pin!(up, back, watch);
    let (mut up_done, mut back_done) = (false, false);
    while !(up_done && back_done) {
        tokio::select! {
            cut = &mut up, if !up_done => {
                if cut {
                    return true;
                }
                up_done = true;
            }
            () = &mut back, if !back_done => back_done = true,
            () = &mut watch => return false,
        }
    }
    false
}
