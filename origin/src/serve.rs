//! The listeners (the API's and the admin API's): hyper's HTTP/1 server with the
//! limits a server on the public internet needs.
//!
//! `axum::serve` builds hyper without a timer, so hyper's header-read timeout is off:
//! a client that sends half its headers and stops holds its connection for ever, and
//! a few thousand such clients take every file descriptor. Here every connection has
//! a deadline for its request head (which also ends a keep-alive connection idle that
//! long), every request body a deadline ([`idem::limits::DeadlineBody`]), and the
//! connections and the requests in progress are capped: past the first cap new
//! connections wait in the kernel's backlog, past the second a request gets `503`.

use axum::body::Body;
use axum::extract::connect_info::ConnectInfo;
use axum::Router;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use idem::limits::DeadlineBody;
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
    /// Requests in progress at once; more get `503` (`…:server-busy`).
    pub max_requests: usize,
}

/// Serves `router` on `listener` within `limits` until `shutdown` resolves, then lets
/// the connections finish their requests in progress (idle ones are closed at once).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let requests = Arc::new(Semaphore::new(limits.max_requests));
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
                    // Out of file descriptors, or a connection reset before it was
                    // accepted: wait a moment rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
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
        };
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, %peer, "connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The router, for the requests of one connection.
#[derive(Clone)]
struct PeerService {
    router: Router,
    peer: SocketAddr,
    limits: Limits,
    requests: Arc<Semaphore>,
}

impl hyper::service::Service<Request<Incoming>> for PeerService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let Ok(permit) = self.requests.clone().try_acquire_owned() else {
            return Box::pin(async { Ok(busy()) });
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

fn busy() -> Response<Body> {
    idem::idempotency::problem_response(&Rejection::with_detail(
        Problem::Busy,
        "the server is at its limit of requests in progress; nothing was run, retry later",
    ))
}
