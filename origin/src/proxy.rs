//! Proxy mode (`--upstream`): the layer's inner service is any HTTP service, reached
//! over a pooled connection. The layer guards (claim, fingerprint, replay, 409/422);
//! this service forwards, and turns what the upstream did into the layer's terms:
//!
//! * never reached (refused, no such host) → [`release`]d 502 `upstream-unreachable`:
//!   nothing was sent, so a retry may run it;
//! * an answer, whatever its status → the answer (stored by the layer), unless it
//!   carries the private release header, which is stripped and releases the key;
//! * sent, then lost (a timeout, a dropped connection) → 502 `upstream-outcome-unknown`,
//!   stored: the upstream may have acted, so it is never sent again — or released, when
//!   `--upstream-unknown-outcome release` says the upstream is safe to retry.
//!
//! Headers go out as the edge sends them ([`contract::forwarded_headers`]), plus the
//! claim's fencing token and a downstream key ([`contract::FENCING_TOKEN`],
//! [`contract::DOWNSTREAM_KEY`]) so the upstream can fence its own writes.

use crate::config::UnknownOutcome;
use crate::upstream_pool::{Pool, SendError};
use axum::body::Body;
use axum::extract::ConnectInfo;
use futures_util::future::BoxFuture;
use http::uri::{PathAndQuery, Uri};
use http::{HeaderName, HeaderValue, Request, Response};
use hyper_rustls::{FixedServerNameResolver, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use idem::{release, IdempotencyContext};
use idem_core::contract::{self, Problem, Rejection};
use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// The purpose the downstream key is made for ([`idem_core::RecordKey::downstream_key`]).
pub const DOWNSTREAM_PURPOSE: &str = "upstream";

/// How proxy mode reaches its upstream.
#[derive(Clone, Debug)]
pub struct UpstreamOptions {
    /// The upstream's base URL: `http://host:port`, with an optional path prefix.
    pub url: String,
    /// The longest wait for the upstream's answer to begin.
    pub timeout: Duration,
    /// How long an idle pooled connection is kept: below the upstream's own keep-alive,
    /// or a request may be written onto a connection the upstream is closing (its
    /// outcome then unknown, and stored so).
    pub idle_timeout: Duration,
    /// The response header by which the upstream says "nothing happened".
    pub release_header: HeaderName,
    /// What a lost answer means.
    pub unknown_outcome: UnknownOutcome,
    /// The `Host` values clients may reach the upstream by, sent on as
    /// `X-Forwarded-Host`; a request for any other host goes without it.
    pub public_hosts: Vec<String>,
    /// Whether requests the layer let through unguarded are forwarded even when their
    /// path is ambiguous ([`contract::ambiguous_path`]); never under a base path.
    pub pass_ambiguous_paths: bool,
    /// TLS to an `https://` upstream.
    pub tls: crate::upstream_tls::UpstreamTls,
    /// What the types of its problems start with (`--problem-base`).
    pub problem_base: String,
}

/// The upstream as a tower service, for the layer to wrap. Cheap to clone: one
/// connection pool.
#[derive(Clone)]
pub struct Upstream {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    base_path: String,
    options: UpstreamOptions,
}

/// Checks an `--upstream` URL: `http[s]://host[:port][/prefix]`. The error names what
/// is wrong with it.
pub fn parse_upstream_url(url: &str) -> Result<Uri, String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("--upstream is not a URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err("--upstream must be an http:// or https:// URL".into());
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("--upstream has no host".into());
    }
    if uri.query().is_some() {
        return Err("--upstream must not have a query".into());
    }
    Ok(uri)
}

impl Upstream {
    /// A pooled client for `options.url`; an error names what is wrong with the URL.
    pub fn new(options: UpstreamOptions) -> Result<Self, String> {
        let uri = parse_upstream_url(&options.url)?;
        let scheme = uri.scheme().cloned().unwrap_or(http::uri::Scheme::HTTP);
        let authority = uri.authority().cloned().ok_or("--upstream has no host")?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        // A connection not made within this is "never reached", released; past it,
        // the request may have been sent.
        connector.set_connect_timeout(Some(options.timeout.min(Duration::from_secs(10))));
        // The TLS handshake is part of connecting: a certificate refused (another CA,
        // another name) is "never reached" too — no byte of the request was written.
        connector.enforce_http(false);
        let https = uri.scheme_str() == Some("https");
        if !https && options.tls.is_set() {
            return Err("--upstream-ca-file, --upstream-client-cert and --upstream-tls-name are for an https:// upstream".into());
        }
        let tls = match https {
            true => options.tls.client_config()?,
            // Never used: the URL's scheme is http, and only its requests are sent.
            false => rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
        };
        let builder = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let builder = match options.tls.server_name()? {
            Some(name) => builder.with_server_name_resolver(FixedServerNameResolver::new(name)),
            None => builder,
        };
        let connector = builder.enable_http1().wrap_connector(connector);
        // `Host` as a client library sends it: the port only when it is not the scheme's.
        let default_port = if https { 443 } else { 80 };
        let host = match authority.port_u16() {
            Some(port) if port != default_port => format!("{}:{port}", authority.host()),
            _ => authority.host().to_owned(),
        };
        let host =
            HeaderValue::from_str(&host).map_err(|_| "--upstream's host cannot be sent as Host")?;
        let target = Uri::builder()
            .scheme(scheme)
            .authority(authority)
            .path_and_query("/")
            .build()
            .map_err(|e| format!("--upstream: {e}"))?;
        Ok(Upstream {
            inner: Arc::new(Inner {
                pool: Pool::new(connector, target, host, options.idle_timeout),
                base_path: uri.path().trim_end_matches('/').to_owned(),
                options,
            }),
        })
    }
}

impl tower::Service<Request<Body>> for Upstream {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move { Ok(inner.forward(req).await) })
    }
}

impl Inner {
    async fn forward(&self, req: Request<Body>) -> Response<Body> {
        let method = req.method().clone();
        if method == http::Method::CONNECT {
            // A reverse proxy has no tunnel to open.
            let mut res = Response::new(Body::from("CONNECT is not forwarded\n"));
            *res.status_mut() = http::StatusCode::METHOD_NOT_ALLOWED;
            res.headers_mut().insert(
                http::header::ALLOW,
                HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
            );
            return res;
        }
        if contract::ambiguous_path(req.uri().path()) {
            // Under a base path, a `..` the upstream resolves climbs out of it (to a path
            // no route of idem's guards, or outside the API). Without one, the upstream
            // may still take the path for another resource than idem read (one a route
            // guards, reached by a method idem let through). Nothing of the kind is
            // sent, whatever the method, unless the operator said so.
            if !self.base_path.is_empty() {
                return release(problem(
                    &self.options.problem_base,
                    Problem::PathAmbiguous,
                    "the upstream is reached under a base path, and this path could climb out of it",
                ));
            }
            if !self.options.pass_ambiguous_paths {
                return release(problem(
                    &self.options.problem_base,
                    Problem::PathAmbiguous,
                    "servers may read this path as different resources; nothing was sent (--pass-ambiguous-paths forwards such requests when idem does not guard them)",
                ));
            }
        }
        if let Some(ctx) = req.extensions().get::<IdempotencyContext>() {
            if ctx.took_over && self.options.unknown_outcome == UnknownOutcome::Store {
                // The previous holder of this claim is gone (crashed, or paused past its
                // lease) and may have sent the request: sending it again could act
                // twice.
                return result(
                    &self.options.problem_base,
                    Problem::UpstreamOutcomeUnknown,
                    "an earlier attempt may have sent this request to the upstream and was lost before its answer was stored; it will not be sent again for this key",
                );
            }
            if ctx.lease_lost.is_cancelled() {
                // Another attempt may own the key now: it sends, not this one.
                return release(problem(
                    &self.options.problem_base,
                    Problem::UpstreamUnreachable,
                    "this attempt lost its claim before sending; nothing was sent",
                ));
            }
        }
        let outbound = match self.outbound(req) {
            Ok(outbound) => outbound,
            Err(why) => {
                return release(problem(
                    &self.options.problem_base,
                    Problem::UpstreamUnreachable,
                    &why,
                ))
            }
        };
        let handed = AtomicBool::new(false);
        let started = std::time::Instant::now();
        let sent =
            tokio::time::timeout(self.options.timeout, self.pool.send(outbound, &handed)).await;
        let result = match &sent {
            Ok(Ok(answer)) => idem::metrics::status_class(answer.status().as_u16()),
            Ok(Err(SendError::NotSent(_))) => "unreachable",
            Err(_) if !handed.load(Ordering::Relaxed) => "unreachable",
            Ok(Err(SendError::Lost(_))) | Err(_) => "lost",
        };
        metrics::histogram!("idem_upstream_duration_seconds", "result" => result)
            .record(started.elapsed().as_secs_f64());
        let answer = match sent {
            Ok(Ok(answer)) => answer,
            // Timed out before the request was handed to a connection: nothing was sent.
            Err(_) if !handed.load(Ordering::Relaxed) => {
                return release(problem(
                    &self.options.problem_base,
                    Problem::UpstreamUnreachable,
                    &format!(
                        "no connection to the upstream within {:?}; nothing was sent, retry with the same key",
                        self.options.timeout
                    ),
                ))
            }
            Ok(Err(SendError::NotSent(why))) => {
                return release(problem(
                    &self.options.problem_base,
                    Problem::UpstreamUnreachable,
                    &format!("nothing was sent to the upstream ({why}); retry with the same key"),
                ))
            }
            Ok(Err(SendError::Lost(why))) => {
                return self.unknown(&format!("the upstream's answer was lost ({why})"))
            }
            Err(_) => {
                return self.unknown(&format!(
                    "the upstream did not answer within {:?}",
                    self.options.timeout
                ))
            }
        };
        let (mut parts, body) = answer.into_parts();
        let released = parts.headers.remove(&self.options.release_header).is_some();
        parts.headers = relayed(method.as_str(), &parts.headers);
        let answer = Response::from_parts(parts, Body::new(body));
        if released {
            release(answer)
        } else {
            answer
        }
    }

    /// The request as the upstream gets it.
    fn outbound(&self, req: Request<Body>) -> Result<Request<Body>, String> {
        let (parts, body) = req.into_parts();
        let uri = origin_form(&parts.uri, &self.base_path)?;
        let client_ip = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip().to_string());
        // The core decides which headers go (by name); the client's go with their bytes
        // as sent, idem's own after them.
        let decided =
            contract::forwarded_headers(&as_text(&parts.headers), client_ip.as_deref(), "http");
        let mut headers = keep_named(&parts.headers, &decided, |name| {
            !SET_BY_IDEM.contains(&name)
        });
        // `X-Forwarded-Host` only for a host the operator named: the client writes
        // `Host`, and an upstream that builds links from it (a password reset, a
        // redirect) would build them for whatever host a client names.
        let public = |host: &str| {
            self.options
                .public_hosts
                .iter()
                .any(|h| h.eq_ignore_ascii_case(host.trim()))
        };
        let mut set: Vec<(&str, String)> = decided
            .iter()
            .filter(|(n, _)| SET_BY_IDEM.contains(&n.as_str()))
            .filter(|(n, v)| n != "x-forwarded-host" || public(v))
            .map(|(n, v)| (n.as_str(), v.clone()))
            .collect();
        if let Some(ctx) = parts.extensions.get::<IdempotencyContext>() {
            set.push((contract::FENCING_TOKEN, ctx.token.to_string()));
            set.push((
                contract::DOWNSTREAM_KEY,
                ctx.record_key.downstream_key(DOWNSTREAM_PURPOSE),
            ));
        }
        for (name, value) in set {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                headers.append(name, value);
            }
        }
        let mut out = Request::new(body);
        *out.method_mut() = parts.method;
        *out.uri_mut() = uri;
        *out.headers_mut() = headers;
        Ok(out)
    }

    /// The answer for a request sent whose answer was lost.
    fn unknown(&self, why: &str) -> Response<Body> {
        let detail = format!("{why}; the upstream may have acted");
        match self.options.unknown_outcome {
            UnknownOutcome::Store => result(
                &self.options.problem_base,
                Problem::UpstreamOutcomeUnknown,
                &format!("{detail}: it will not be sent again for this key"),
            ),
            UnknownOutcome::Release => release(problem(
                &self.options.problem_base,
                Problem::UpstreamOutcomeUnknown,
                &format!("{detail}; retry with the same key"),
            )),
        }
    }
}

/// The request's URI as HTTP/1 sends it to a server (not a proxy): its path and query,
/// under `base_path`. A request in absolute form may have no path at all (`POST
/// http://host HTTP/1.1`): it is written `/`, as the path's text reads.
fn origin_form(uri: &Uri, base_path: &str) -> Result<Uri, String> {
    let path = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    if base_path.is_empty() && !path.path().is_empty() {
        return Ok(Uri::from(path));
    }
    PathAndQuery::from_maybe_shared(format!("{base_path}{path}"))
        .map(Uri::from)
        .map_err(|e| format!("the request's path cannot be sent upstream: {e}"))
}

/// The headers idem sets for the upstream from what it knows of the client.
const SET_BY_IDEM: [&str; 3] = ["x-forwarded-for", "x-forwarded-host", "x-forwarded-proto"];

/// Headers as text, for the core's decisions by name, borrowed (a value that is not
/// text is shown with replacement characters, the one copy made; its bytes are kept
/// where it is passed on).
fn as_text(headers: &http::HeaderMap) -> Vec<(&str, Cow<'_, str>)> {
    headers
        .iter()
        .map(|(n, v)| (n.as_str(), String::from_utf8_lossy(v.as_bytes())))
        .collect()
}

/// The upstream's answer headers the client gets ([`contract::relayed_answer_headers`]).
fn relayed(method: &str, headers: &http::HeaderMap) -> http::HeaderMap {
    let keep = contract::relayed_answer_headers(method, &as_text(headers));
    keep_named(headers, &keep, |_| true)
}

/// The headers of `headers` whose names the core kept in `decided` (and `also`
/// accepts), with their bytes as they came: a value that is not text keeps them.
fn keep_named(
    headers: &http::HeaderMap,
    decided: &[(String, String)],
    also: impl Fn(&str) -> bool,
) -> http::HeaderMap {
    let mut out = http::HeaderMap::with_capacity(decided.len() + 2);
    for (name, value) in headers {
        let kept = decided
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name.as_str()));
        if kept && also(name.as_str()) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// A problem that is the request's result, stored and replayed like an answer: its
/// content type only, the same on the first answer and every replay.
fn result(base: &str, problem: Problem, detail: &str) -> Response<Body> {
    let stored = Rejection::with_detail(problem, detail).as_result_under(base);
    let mut res = Response::new(Body::from(stored.body));
    *res.status_mut() =
        http::StatusCode::from_u16(stored.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    for (name, value) in stored.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) {
            res.headers_mut().append(name, value);
        }
    }
    res
}

/// A problem after which nothing is stored (the key is released): never cacheable.
fn problem(base: &str, problem: Problem, detail: &str) -> Response<Body> {
    let rejection = Rejection::with_detail(problem, detail);
    let mut res = Response::new(Body::from(rejection.body_under(base)));
    *res.status_mut() =
        http::StatusCode::from_u16(rejection.status()).unwrap_or(http::StatusCode::BAD_GATEWAY);
    for (name, value) in rejection.headers() {
        if let Ok(value) = HeaderValue::from_str(&value) {
            res.headers_mut().append(name, value);
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_gets_the_path_and_query_under_its_base() {
        let sent = |uri: &str, base: &str| {
            origin_form(&uri.parse().unwrap(), base)
                .unwrap()
                .to_string()
        };
        assert_eq!(sent("/v1/charges?a=1", ""), "/v1/charges?a=1");
        assert_eq!(sent("/v1/charges?a=1", "/api"), "/api/v1/charges?a=1");
        // Absolute form: the client's scheme and host never reach the upstream.
        assert_eq!(sent("http://evil.example/v1/charges", ""), "/v1/charges");
        assert_eq!(sent("http://evil.example", ""), "/");
        assert_eq!(sent("http://evil.example?a=1", ""), "/?a=1");
        assert_eq!(sent("http://evil.example", "/api"), "/api/");
        assert_eq!(sent("*", ""), "*");
    }
}
