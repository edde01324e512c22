//! Ceilings for the peer comparison (`--floors`): two servers that do less than any
//! real idempotency layer, measured by the same load in the same run as idem and the
//! `idempotent` crate, so that a target against the crate can be checked against what
//! this machine allows at all.
//!
//! - `http`: axum answering every request with a fixed `201` and a body the size of the
//!   demo charge's, nothing else. No server on this stack answers faster here: the
//!   ceiling of replays.
//! - `store`: the same, plus exactly idem's two store calls per new key on the
//!   standalone Redis — the claim and the completion scripts through
//!   [`idem::RedisStore`], leases judged on the store's clock — and a replay read from
//!   Redis. No caller scope, no fingerprint (a constant one), no heartbeat, no metrics,
//!   no replay cache, no tower layer: the ceiling of new keys for any server that keeps
//!   idem's store protocol.
//! - `proxy`: `store` with the upstream's answer instead of the fixed one — between the
//!   claim and the completion, the request forwarded to the proxy comparison's API on a
//!   kept-alive connection — the ceiling of proxy mode's new keys.

use crate::served::{self, Served};
use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use idem::{RedisOptions, RedisStore, Store, StoreExt};
use idem_core::StoredResponse;
use idem_core::{Decision, Fingerprint, Holder, IdempotencyKey, Policy, RecordKey, Scope};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Set to `<addr> <kind> <redis url> <namespace> [upstream]`, this binary serves a
/// floor instead.
pub const SERVE_ENV: &str = "IDEM_BENCH_SERVE_FLOOR";

/// A demo charge's answer: the origin's 201 body, for a customer named like the bench's
/// keys (the load sends `cus_<key>`).
const ANSWER: &[u8] = br#"{"id":"ch_d924b3d409cf91f91973e62a","amount":1999,"currency":"usd","customer":"cus_u1796505598529-3-32-0-0-12345","created":1796511969}"#;

/// The two ceilings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Floor {
    Http,
    Store,
    Proxy,
}

impl Floor {
    /// The system's name in the rows, and its program's (for its CPU: at most 15
    /// characters, as `/proc/<pid>/stat` keeps them; `cpu::FOLLOWED` lists them).
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            Floor::Http => ("ceiling: HTTP alone", "floor-http"),
            Floor::Store => ("ceiling: idem's store calls", "floor-store"),
            Floor::Proxy => ("ceiling: store calls+upstream", "floor-proxy"),
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Floor::Http => "http",
            Floor::Store => "store",
            Floor::Proxy => "proxy",
        }
    }

    /// The floor of a `kind` given in [`SERVE_ENV`].
    pub fn of_kind(kind: &str) -> Option<Floor> {
        [Floor::Http, Floor::Store, Floor::Proxy]
            .into_iter()
            .find(|f| f.kind() == kind)
    }
}

/// Serves a floor until killed (the floor's process).
pub async fn serve(spec: &str) -> Result<()> {
    let parts: Vec<&str> = spec.split(' ').collect();
    let (addr, kind, url, namespace, upstream) = match parts[..] {
        [addr, kind, url, namespace] => (addr, kind, url, namespace, None),
        [addr, kind, url, namespace, upstream] => (addr, kind, url, namespace, Some(upstream)),
        _ => anyhow::bail!(
            "{SERVE_ENV} must be \"<addr> <http|store|proxy> <redis url> <namespace> [upstream]\", not {spec:?}"
        ),
    };
    let connect = || async {
        let mut options = RedisOptions::default();
        options.namespace = namespace.to_owned();
        RedisStore::connect(url, options)
            .await
            .map_err(|e| anyhow::anyhow!("connecting the floor's store: {e}"))
    };
    let app = match (Floor::of_kind(kind), upstream) {
        (Some(Floor::Http), _) => Router::new().route("/v1/charges", post(fixed)),
        (Some(Floor::Store), _) => {
            Router::new()
                .route("/v1/charges", post(charge))
                .with_state(Arc::new(FloorState {
                    store: connect().await?,
                    upstream: None,
                }))
        }
        (Some(Floor::Proxy), Some(upstream)) => Router::new()
            .route("/v1/charges", post(charge))
            .with_state(Arc::new(FloorState {
                store: connect().await?,
                upstream: Some(Upstream {
                    addr: upstream.parse().context("the upstream's address")?,
                    idle: Mutex::new(Vec::new()),
                }),
            })),
        _ => anyhow::bail!("a floor is http, store, or proxy with an upstream, not {spec:?}"),
    };
    let app = app.route("/healthz", get(|| async { "ok\n" }));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    axum::serve(listener, app).await?;
    Ok(())
}

/// The `store` and `proxy` floors' state.
struct FloorState {
    store: RedisStore,
    upstream: Option<Upstream>,
}

/// The proxy floor's API, and its idle kept-alive connections.
struct Upstream {
    addr: SocketAddr,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl Upstream {
    /// The API's answer to the client's `POST /v1/charges`.
    async fn forward(&self, key: &HeaderValue, body: Bytes) -> Result<(StatusCode, Bytes)> {
        let idle = self.idle.lock().unwrap().pop();
        let mut sender = match idle {
            Some(sender) => sender,
            None => {
                let stream = tokio::net::TcpStream::connect(self.addr).await?;
                stream.set_nodelay(true)?;
                let (sender, connection) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(connection);
                sender
            }
        };
        sender.ready().await?;
        let request = http::Request::post("/v1/charges")
            .header("host", self.addr.to_string())
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(Full::new(body))?;
        let answer = sender.send_request(request).await?;
        let status = answer.status();
        let body = answer.into_body().collect().await?.to_bytes();
        self.idle.lock().unwrap().push(sender);
        Ok((status, body))
    }
}

/// The fixed answer, marked a replay for the bench's replay keys (theirs start with
/// `r`, `Keys::Replay`; the header is a quoted string): the load checks the mark, and its work must be the same for
/// every server it compares.
async fn fixed(headers: HeaderMap, _body: Bytes) -> Response {
    let replay = headers
        .get("idempotency-key")
        .is_some_and(|k| k.as_bytes().starts_with(b"\"r"));
    if replay {
        (
            StatusCode::CREATED,
            [("idempotent-replayed", "true")],
            ANSWER,
        )
            .into_response()
    } else {
        (StatusCode::CREATED, ANSWER).into_response()
    }
}

const FINGERPRINT: Fingerprint = Fingerprint([7; 32]);

async fn charge(State(floor): State<Arc<FloorState>>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(header) = headers.get("idempotency-key") else {
        return (StatusCode::BAD_REQUEST, "Idempotency-Key").into_response();
    };
    let Ok(key) = IdempotencyKey::parse(header.as_bytes()) else {
        return (StatusCode::BAD_REQUEST, "Idempotency-Key").into_response();
    };
    let key = RecordKey::new(&Scope::anonymous(), &key);
    let policy = Policy::default();
    let store = &floor.store;
    let unavailable = |e: String| (StatusCode::SERVICE_UNAVAILABLE, e).into_response();
    match store.claim(&key, &FINGERPRINT, store.now(), &policy).await {
        Ok(Decision::Execute(claim) | Decision::TakeOver(claim)) => {
            let holder = Holder {
                fingerprint: FINGERPRINT,
                token: claim.token,
            };
            let (status, answer) = match &floor.upstream {
                None => (StatusCode::CREATED, Bytes::from_static(ANSWER)),
                Some(upstream) => match upstream.forward(header, body).await {
                    Ok(answer) => answer,
                    Err(e) => return unavailable(format!("{e:#}")),
                },
            };
            let response = StoredResponse {
                status: status.as_u16(),
                headers: Vec::new(),
                body: answer.to_vec(),
            };
            match store
                .complete(&key, &holder, response, store.now(), &policy)
                .await
            {
                Ok(_) => (status, answer).into_response(),
                Err(e) => unavailable(e.to_string()),
            }
        }
        Ok(Decision::Replay { response, .. }) => (
            StatusCode::from_u16(response.status).unwrap_or(StatusCode::OK),
            [("idempotent-replayed", "true")],
            response.body,
        )
            .into_response(),
        Ok(Decision::InFlight { .. }) => StatusCode::CONFLICT.into_response(),
        Ok(Decision::Mismatch) => StatusCode::UNPROCESSABLE_ENTITY.into_response(),
        Err(e) => unavailable(e.to_string()),
    }
}

/// Starts `floor` on `redis_url`, its keys under `namespace`; the proxy floor forwards
/// to `upstream`.
pub async fn start(
    out: &Path,
    floor: Floor,
    redis_url: &str,
    namespace: &str,
    upstream: Option<SocketAddr>,
) -> Result<Served> {
    let addr = served::free_addr()?;
    let mut spec = format!("{addr} {} {redis_url} {namespace}", floor.kind());
    if let Some(upstream) = upstream {
        spec.push_str(&format!(" {upstream}"));
    }
    let mut cmd = served::as_program(out, floor.names().1)?;
    cmd.env(SERVE_ENV, spec);
    Served::start(cmd, addr, "a floor").await
}
