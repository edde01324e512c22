//! The listeners (the API's and the admin API's): hyper's HTTP/1 server with the
//! limits a server on the public internet needs.
//!
//! `axum::serve` builds hyper without a timer, so hyper's header-read timeout is off:
//! a client that sends half its headers and stops holds its connection for ever, and
//! a few thousand such clients take every file descriptor. Here every connection has
//! a deadline for its request head (which also ends a keep-alive connection idle that
//! long), every request body a deadline ([`idem::DeadlineBody`]), and the
//! connections and the requests in progress are capped: past the first cap new
//! connections wait in the kernel's backlog, past the second a request gets `503`.

use axum::body::Body;
use axum::extract::connect_info::ConnectInfo;
use axum::Router;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use idem::DeadlineBody;
use idem_core::contract::{Problem, Rejection};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::Service;

/// What one client may hold of a listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// From the moment a request's head is awaited (a new connection, or a keep-alive
    /// one after its last answer) to its last header line.
    pub header_read: Duration,
    /// The longest gap between two parts of a request body.
    pub body_idle: Duration,
    /// The whole request body, from the end of its head.
    pub body_read: Duration,
    /// Connections open at once; more wait to be accepted.
    pub max_connections: usize,
    /// Requests in progress at once; more get `503` (`…:server-busy`). The health
    /// and metrics endpoints have a small cap of their own: a server at its limit
    /// still says so.
    pub max_requests: usize,
    /// How long a write may wait for the client to read (its receive window full)
    /// before the connection is closed: a client that never reads its answer holds no
    /// connection for ever.
    pub write_idle: Duration,
    /// After the shutdown signal, how long connections may take to finish their
    /// requests before they are closed.
    pub drain: Duration,
    /// What the server's own problems' types start with (`--problem-base`).
    pub problem_base: &'static str,
    /// Whether this listener serves idem's `/healthz`, `/readyz` and `/metrics`, whose
    /// requests have a small cap of their own: not the API's listener with
    /// `--ops-listen`, where those paths are the API's and count as any request.
    pub serves_probes: bool,
}

/// Serves `router` on `listener` within `limits` until `shutdown` resolves, then lets
/// the connections finish their requests in progress (idle ones are closed at once).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    serve_with(listener, router, limits, None, shutdown).await;
}

/// [`serve`], over TLS when `tls` is given: a handshake not done within the
/// header-read time closes the connection.
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let requests = Arc::new(Semaphore::new(limits.max_requests));
    let probes = Arc::new(Semaphore::new(PROBES_AT_ONCE));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // A connection reset before it was accepted is that client's
                    // business; anything else (out of file descriptors) is waited out
                    // rather than spun on, as axum::serve does.
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                    ) {
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = PeerService {
            router: router.clone(),
            peer,
            limits,
            requests: requests.clone(),
            probes: probes.clone(),
        };
        let (http, watcher, tls) = (http.clone(), graceful.watcher(), tls.clone());
        tokio::spawn(async move {
            let ended = match tls {
                None => serve_connection(&http, watcher, stream, service).await,
                Some(tls) => {
                    match tokio::time::timeout(limits.header_read, tls.accept(stream)).await {
                        Ok(Ok(stream)) => serve_connection(&http, watcher, stream, service).await,
                        Ok(Err(e)) => Err(format!("TLS handshake failed: {e}")),
                        Err(_) => Err("TLS handshake not done within the header-read time".into()),
                    }
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, %peer, "connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    // Idle connections close at once; busy ones finish their requests, within `drain`
    // (a client that never reads its answer cannot hold the exit).
    if tokio::time::timeout(limits.drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(drain = ?limits.drain, "connections still open after the drain time; no longer waiting for them");
    }
}

/// One connection's requests, until it closes or the server shuts down.
async fn serve_connection<IO>(
    http: &hyper::server::conn::http1::Builder,
    watcher: hyper_util::server::graceful::Watcher,
    stream: IO,
    service: PeerService,
) -> Result<(), String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(WriteDeadline::new(stream, service.limits.write_idle));
    // No upgrades (WebSocket): hyper-util cannot shut an upgradeable HTTP/1 connection
    // down gracefully, and nothing idem serves upgrades.
    let connection = http.serve_connection(io, service);
    watcher.watch(connection).await.map_err(|e| e.to_string())
}

/// A TLS acceptor for the certificate chain in `cert` (PEM, the server's first) and its
/// private key in `key` (PEM). The error names the file and what is wrong.
pub fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{}: cannot read certificates: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not PEM certificates: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: holds no certificate", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("{}: no usable private key (PEM): {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate and its key: {e}"))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The router, for the requests of one connection.
#[derive(Clone)]
struct PeerService {
    router: Router,
    peer: SocketAddr,
    limits: Limits,
    requests: Arc<Semaphore>,
    probes: Arc<Semaphore>,
}

impl hyper::service::Service<Request<Incoming>> for PeerService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        // Probes have a small cap of their own: a server at its limit of requests
        // still answers them, and a flood of them (each `/readyz` asks the store)
        // takes no more than that.
        let cap = match self.limits.serves_probes && is_probe(&request) {
            true => &self.probes,
            false => &self.requests,
        };
        let permit = match cap.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                metrics::counter!("idem_server_busy_total").increment(1);
                let base = self.limits.problem_base;
                return Box::pin(async move { Ok(busy(base)) });
            }
        };
        let limits = self.limits;
        let mut request = request
            .map(|body| Body::new(DeadlineBody::new(body, limits.body_idle, limits.body_read)));
        // What `into_make_service_with_connect_info` would insert: proxy mode sends the
        // peer on in X-Forwarded-For.
        request.extensions_mut().insert(ConnectInfo(self.peer));
        let mut router = self.router.clone();
        Box::pin(async move {
            let response = router.call(request).await;
            drop(permit);
            response
        })
    }
}

/// Probes answered at once, apart from `--max-requests`.
const PROBES_AT_ONCE: usize = 64;

/// A health or metrics probe: answered whatever the load, so that a server at its
/// limit of requests is not taken for a dead one.
fn is_probe<B>(request: &Request<B>) -> bool {
    matches!(*request.method(), http::Method::GET | http::Method::HEAD)
        && matches!(request.uri().path(), "/healthz" | "/readyz" | "/metrics")
}

fn busy(base: &str) -> Response<Body> {
    idem::problem_response_under(
        &Rejection::with_detail(
            Problem::Busy,
            "the server is at its limit of requests in progress; nothing was run, retry later",
        ),
        base,
    )
}

/// A connection whose writes fail once one has waited `idle` for the peer to read.
struct WriteDeadline<T> {
    io: T,
    idle: Duration,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    armed: bool,
}

impl<T> WriteDeadline<T> {
    fn new(io: T, idle: Duration) -> Self {
        WriteDeadline {
            io,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            armed: false,
        }
    }
}

impl<T: Unpin> WriteDeadline<T> {
    /// `poll` of a write: ready clears the deadline; pending arms it, and past it the
    /// write fails.
    fn deadline<R>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        poll: impl FnOnce(
            std::pin::Pin<&mut T>,
            &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<R>>,
    ) -> std::task::Poll<std::io::Result<R>> {
        use std::task::Poll;
        match poll(std::pin::Pin::new(&mut self.io), cx) {
            Poll::Ready(result) => {
                self.armed = false;
                Poll::Ready(result)
            }
            Poll::Pending => {
                if !self.armed {
                    self.armed = true;
                    let at = tokio::time::Instant::now() + self.idle;
                    self.timer.as_mut().reset(at);
                }
                match self.timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client read nothing of its answer for the write timeout",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteDeadline<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteDeadline<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.get_mut().deadline(cx, |io, cx| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.get_mut()
            .deadline(cx, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.get_mut().deadline(cx, |io, cx| io.poll_flush(cx))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.get_mut().deadline(cx, |io, cx| io.poll_shutdown(cx))
    }
}
