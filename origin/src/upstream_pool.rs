//! Proxy mode's connections to its upstream: HTTP/1, kept alive and reused, bounded —
//! and for each request, whether any of it was written, which decides whether its key
//! may be released.
//!
//! Every live connection is kept in one list, busy or idle; a request takes the most
//! recently used one that is ready (its last answer read whole), else opens one. A
//! connection goes back to the list as soon as its request is handed over, and is
//! ready again only once hyper has read its answer to the end, so nothing is spawned
//! per request to wait for that. (hyper may report a connection ready an instant
//! before it has taken a request handed to it; a second request then queues behind
//! the first on that connection. It is written only after the first's answer, never
//! alongside it; if it times out while queued it is taken for sent — its key is kept,
//! not released, the safe side.)

use axum::body::Body;
use http::header::HOST;
use http::{HeaderValue, Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tower::ServiceExt;

/// The most connections kept: past it a request still gets a connection of its own,
/// closed after its answer (a burst never leaves more than this many open).
const MAX_KEPT: usize = 1024;

/// How many times a request the upstream closed a reused connection under — before any
/// of it was written — is tried again, on another connection.
const RETRIES: usize = 3;

/// What became of a request sent upstream, when no answer came.
#[derive(Debug)]
pub enum SendError {
    /// None of it was written: no connection was made, the TLS handshake was refused,
    /// or the connection closed before the request was started.
    NotSent(String),
    /// It was written, or may have been, and its answer was lost.
    Lost(String),
}

/// The upstream's connections.
pub struct Pool {
    connector: HttpsConnector<HttpConnector>,
    /// `scheme://authority`: what the connector connects to.
    target: Uri,
    /// The `Host` a request goes with when the client's is not forwarded.
    host: HeaderValue,
    /// A connection idle longer is closed, not reused (the upstream may be closing it).
    idle_timeout: Duration,
    conns: Mutex<Vec<Kept>>,
}

struct Kept {
    sender: SendRequest<Body>,
    /// When its last request was handed over: its idle time is counted from then, so
    /// a connection is never reused past `idle_timeout` of true idleness (and sometimes
    /// closed a little before it).
    used_at: Instant,
}

impl Pool {
    pub fn new(
        connector: HttpsConnector<HttpConnector>,
        target: Uri,
        host: HeaderValue,
        idle_timeout: Duration,
    ) -> Pool {
        Pool {
            connector,
            target,
            host,
            idle_timeout,
            conns: Mutex::new(Vec::new()),
        }
    }

    /// Sends `req` (its URI in origin form) and returns the answer's head; its body
    /// streams on. `handed` is set once the request is handed to a connection: a
    /// caller that gives up before then knows nothing of it was sent.
    pub async fn send(
        &self,
        mut req: Request<Body>,
        handed: &AtomicBool,
    ) -> Result<Response<Incoming>, SendError> {
        if !req.headers().contains_key(HOST) {
            req.headers_mut().insert(HOST, self.host.clone());
        }
        let mut attempts = 0;
        loop {
            let (mut sender, reused) = match self.checkout() {
                Some(sender) => (sender, true),
                None => (self.connect().await?, false),
            };
            handed.store(true, Ordering::Relaxed);
            let answer = sender.try_send_request(req);
            self.keep(sender);
            match answer.await {
                Ok(answer) => return Ok(answer),
                Err(mut e) => match e.take_message() {
                    // The connection closed before the request was started: hyper gave
                    // it back unwritten.
                    Some(unsent) if reused && attempts < RETRIES => {
                        attempts += 1;
                        req = unsent;
                        handed.store(false, Ordering::Relaxed);
                    }
                    Some(_) => return Err(SendError::NotSent(root_cause(e.error()))),
                    None => {
                        let e = e.into_error();
                        let why = root_cause(&e);
                        return Err(match never_sent(&e) {
                            true => SendError::NotSent(why),
                            false => SendError::Lost(why),
                        });
                    }
                },
            }
        }
    }

    /// The most recently used ready connection, if any. Closed ones, and ready ones
    /// idle too long, are dropped (and so closed) on the way.
    fn checkout(&self) -> Option<SendRequest<Body>> {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        let idle_timeout = self.idle_timeout;
        let stale = |c: &Kept| c.sender.is_ready() && c.used_at.elapsed() >= idle_timeout;
        conns.retain(|c| !(c.sender.is_closed() || stale(c)));
        let at = conns.iter().rposition(|c| c.sender.is_ready())?;
        Some(conns.remove(at).sender)
    }

    /// Puts a connection whose request was handed over back in the list, ready again
    /// once its answer has been read.
    fn keep(&self, sender: SendRequest<Body>) {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        if conns.len() < MAX_KEPT {
            conns.push(Kept {
                sender,
                used_at: Instant::now(),
            });
        }
    }

    /// A new connection (and its TLS handshake, for `https://`); its task is spawned.
    async fn connect(&self) -> Result<SendRequest<Body>, SendError> {
        let io = self
            .connector
            .clone()
            .oneshot(self.target.clone())
            .await
            .map_err(|e| SendError::NotSent(root_cause(&*e)))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| SendError::NotSent(root_cause(&e)))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "an upstream connection ended");
            }
        });
        Ok(sender)
    }
}

/// Whether a request whose answer failed was provably never read by the upstream:
/// hyper said it was canceled before it was written, or the upstream ended the TLS
/// handshake over this client's certificate (with TLS 1.3 a client may write its
/// request before the server has checked its certificate; a server that then refuses
/// the handshake never reads the request: RFC 8446 §4.4.2.4). A request written and
/// then cut off is neither.
fn never_sent(e: &hyper::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        let canceled = c
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled);
        // An io::Error's `source` skips the error it wraps: look inside.
        let tls = c
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .or_else(|| c.downcast_ref::<rustls::Error>());
        if canceled || tls.is_some_and(handshake_refused) {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Whether the upstream ended the TLS handshake with an alert about this client's
/// certificate or the handshake itself.
fn handshake_refused(e: &rustls::Error) -> bool {
    use rustls::AlertDescription as A;
    matches!(
        e,
        rustls::Error::AlertReceived(
            A::CertificateRequired
                | A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::HandshakeFailure
        )
    )
}

/// The innermost error's text: hyper's outer errors say only "client error".
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}
