//! The admin API: what idem holds for a key, the attempts a crash orphaned, and
//! purging a record — for the on-call engineer, on a listener of its own.
//!
//! * `GET /admin/v1/records?key=…&scope=…` with the caller's identity in the
//!   [`IDENTITY_HEADER`] header — a record by the request's `Idempotency-Key` and its
//!   caller, given as the request gives it (`scope` is `authorization`,
//!   `header:<name>`, `jwt:<claim>` or `anonymous`; the identity is the
//!   `Authorization` value, the header's value or the claim's value). Never in the
//!   query: a customer's credential would be in every access log on the way.
//! * `GET /admin/v1/records/{record_key}` — a record by its record key (64 hex digits,
//!   as logs and listings show it). Both take `body=true` to include the stored body.
//! * `GET /admin/v1/in-progress?older_than=30s&limit=100&cursor=…` — in-progress
//!   records whose holders claimed them longer ago than `older_than`, a page at a time.
//! * `DELETE /admin/v1/records/{record_key}[?force=true]` — purges a record, and
//!   every replica's replay cache forgets it (within 1.7 s whatever happens to the channel: docs/operations.md).
//!   Refused (409) while an attempt holds the key under a live lease, unless forced;
//!   where requests are never sent twice ([`Resends::Never`], proxy mode), an
//!   in-progress record also needs `resend=true`, lease live or not (its attempt may
//!   have reached the upstream).
//!
//! Every request needs `Authorization: Bearer <token>` of a token in the token file
//! ([`Tokens`]): none is a 401 problem, a wrong one a 403, and neither changes
//! anything. Every action is logged (target `idem::admin`) with its operator, peer
//! address, record key and outcome.

#![allow(clippy::result_large_err)] // Its errors are the answers themselves.

mod auth;
mod status;
mod view;

pub use auth::Tokens;
pub use status::StatusInputs;

use crate::store::{Purged, Store, StoreError, StoreErrorKind};
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use http::{header, HeaderValue, StatusCode};
use idem_core::contract::{Anonymous, JwtKeys, JwtVerifier, ScopeRule, ScopeSource};
use idem_core::{IdempotencyKey, PurgeTarget, RecordKey, Scope};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// Most records one listing page returns.
pub const MAX_PAGE: usize = 1000;
const DEFAULT_PAGE: usize = 100;

#[derive(Clone)]
struct Admin {
    store: Arc<dyn Store>,
    resends: Resends,
    tokens: Arc<Tokens>,
    failed_logins: Arc<auth::FailedLogins>,
    status: Option<(StatusInputs, Arc<status::History>)>,
}

/// Who made an admin request.
#[derive(Clone, Debug)]
struct Actor {
    operator: String,
    peer: String,
}

/// Whether a retry may run a request again after an operator purged the record of an
/// attempt that may have run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resends {
    /// It may: a takeover runs the handler again anyway (a library or the demo, whose
    /// handlers fence their effects with the claim's token).
    Allowed,
    /// Never unless the operator says so (`resend=true`): proxy mode, which never sends
    /// an upstream a request that may have reached it. Without a purge, the attempt's
    /// next retry stores its outcome as unknown.
    Never,
}

/// The admin API over `store`, for the operators of `tokens`; with `status`, the
/// status page too (`/admin/status`, and its numbers at `/admin/v1/status`). Serve it
/// with `into_make_service_with_connect_info::<SocketAddr>()` so that logs name the
/// peer. Call it within a Tokio runtime when `status` is given (it samples a history).
pub fn router(
    store: Arc<dyn Store>,
    tokens: Tokens,
    status: Option<StatusInputs>,
    resends: Resends,
) -> Router {
    let status = status.map(|inputs| {
        let history = Arc::new(status::History::default());
        status::start_sampling(inputs.clone(), Arc::downgrade(&history));
        (inputs, history)
    });
    let has_status = status.is_some();
    let admin = Admin {
        store,
        resends,
        tokens: Arc::new(tokens),
        failed_logins: Arc::default(),
        status,
    };
    let api = Router::new()
        .route("/admin/v1/records", get(lookup))
        .route(
            "/admin/v1/records/{record_key}",
            get(get_record).delete(purge),
        )
        .route("/admin/v1/in-progress", get(in_progress));
    let api = match has_status {
        true => api.route("/admin/v1/status", get(status_json)),
        false => api,
    };
    let api = api
        .route_layer(middleware::from_fn_with_state(admin.clone(), authenticate))
        .with_state(admin);
    match has_status {
        // The page holds no data: it asks for a token and fetches the numbers with it.
        true => api.route("/admin/status", get(status_page)),
        false => api,
    }
}

async fn status_page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; form-action 'none'; frame-ancestors 'none'",
            ),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        include_str!("status.html"),
    )
        .into_response()
}

async fn status_json(State(admin): State<Admin>) -> Response {
    match &admin.status {
        Some((inputs, history)) => ok(status::status(inputs, history, admin.store.name())),
        None => problem(StatusCode::NOT_FOUND, "not-found", "no status here"),
    }
}

/// The kinds of the admin API's problems: each is `admin-<kind>` in `docs/problems.md`.
pub const ADMIN_PROBLEM_KINDS: [&str; 11] = [
    "bad-request",
    "forbidden",
    "lease-live",
    "may-resend",
    "no-record",
    "not-found",
    "record-changed",
    "record-changing",
    "store-unavailable",
    "too-many-failures",
    "unauthenticated",
];

/// An admin problem (RFC 9457), its type `admin-<kind>` under the default problem base.
fn problem(status: StatusCode, kind: &str, detail: impl Into<String>) -> Response {
    problem_with(status, kind, detail, Value::Null)
}

fn problem_with(
    status: StatusCode,
    kind: &str,
    detail: impl Into<String>,
    extra: Value,
) -> Response {
    debug_assert!(
        ADMIN_PROBLEM_KINDS.contains(&kind),
        "undocumented admin problem {kind}"
    );
    let mut body = json!({
        "type": format!("{}admin-{kind}", idem_core::contract::DEFAULT_PROBLEM_BASE),
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail.into(),
    });
    if let (Value::Object(extra), Some(fields)) = (extra, body.as_object_mut()) {
        fields.extend(extra);
    }
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

fn ok(body: Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn peer(request: &Request) -> Option<SocketAddr> {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
}

async fn authenticate(State(admin): State<Admin>, mut request: Request, next: Next) -> Response {
    let peer_addr = peer(&request);
    let peer = peer_addr.map_or_else(|| "unknown".to_owned(), |p| p.to_string());
    // Served without the peer's address, every client counts as one.
    let peer_ip = peer_addr.map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |p| p.ip());
    let action = format!("{} {}", request.method(), request.uri().path());
    let now = std::time::Instant::now();
    if peer_addr.is_none() {
        warn_no_peer_once();
    }
    if let Some(wait) = admin.failed_logins.blocked(peer_ip, now) {
        if admin.failed_logins.first_refusal(peer_ip) {
            tracing::warn!(target: "idem::admin", %peer, %action, "admin requests refused: too many failed logins from this peer; refused until the window ends (logged once a window)");
        }
        let mut refused = problem(
            StatusCode::TOO_MANY_REQUESTS,
            "too-many-failures",
            format!(
                "more than {} failed logins from this address within {} s; wait and retry",
                auth::FailedLogins::LIMIT - 1,
                auth::FailedLogins::WINDOW.as_secs()
            ),
        );
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            refused.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return refused;
    }
    let value = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    let operator = match auth::presented(value) {
        auth::Presented::Nothing => {
            tracing::warn!(target: "idem::admin", %peer, %action, "admin request refused: no bearer token");
            let mut refused = problem(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "send Authorization: Bearer <token>, with a token from the admin token file",
            );
            refused.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"idem-admin\""),
            );
            return refused;
        }
        auth::Presented::Bearer(token) => match admin.tokens.operator(token) {
            Some(operator) => {
                admin.failed_logins.succeeded(peer_ip);
                operator.to_owned()
            }
            None => {
                let failures = admin.failed_logins.failed(peer_ip, now);
                tracing::warn!(target: "idem::admin", %peer, %action, failures, "admin request refused: unknown token");
                return problem(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    "this token is not in the admin token file",
                );
            }
        },
    };
    request.extensions_mut().insert(Actor { operator, peer });
    next.run(request).await
}

/// Warns once that the admin API is served without the peer's address: every client
/// then counts as one for the failed-login limit.
fn warn_no_peer_once() {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(target: "idem::admin", "the admin API is served without the peer's address (serve it with into_make_service_with_connect_info::<SocketAddr>()): every client counts as one for the failed-login limit, so one can lock the others out");
    }
}

/// The query as sent, pairs in order: a map would keep only the last of a repeated name,
/// so `token=1&token=7` would silently mean 7.
type Params = Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>;

/// The query's parameters, refusing any not in `known` and any given twice.
fn params(given: Params, known: &[&str]) -> Result<HashMap<String, String>, Response> {
    let Query(pairs) = given.map_err(|e| {
        problem(
            StatusCode::BAD_REQUEST,
            "bad-request",
            format!("the query string is not readable: {e}"),
        )
    })?;
    let mut params = HashMap::with_capacity(pairs.len());
    for (name, value) in pairs {
        if !known.contains(&name.as_str()) {
            return Err(problem(
                StatusCode::BAD_REQUEST,
                "bad-request",
                format!(
                    "unknown parameter {name:?}; this endpoint takes {}",
                    known.join(", ")
                ),
            ));
        }
        if params.contains_key(&name) {
            return Err(problem(
                StatusCode::BAD_REQUEST,
                "bad-request",
                format!("{name} is given more than once; give it once"),
            ));
        }
        params.insert(name, value);
    }
    Ok(params)
}

fn flag(params: &HashMap<String, String>, name: &str) -> Result<bool, Response> {
    match params.get(name).map(String::as_str) {
        // Only an explicit yes: `force=$F` with `$F` empty must not purge a live lease.
        None | Some("false" | "0") => Ok(false),
        Some("true" | "1") => Ok(true),
        Some(other) => Err(problem(
            StatusCode::BAD_REQUEST,
            "bad-request",
            format!("{name}={other:?}: use true or false"),
        )),
    }
}

/// `token` and `state` together: the attempt and state the operator saw (a listing's
/// record), which alone may be purged.
fn purge_target(params: &HashMap<String, String>) -> Result<Option<PurgeTarget>, Response> {
    let refuse = |detail: String| problem(StatusCode::BAD_REQUEST, "bad-request", detail);
    let token = match params.get("token") {
        None => None,
        // Digits only: `u64::from_str` would also take `+5`, which no listing shows.
        Some(t) => Some(
            t.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| t.parse::<u64>().ok())
                .flatten()
                .ok_or_else(|| {
                    refuse(format!(
                        "token={t:?}: a record's token, as a listing shows it (digits)"
                    ))
                })?,
        ),
    };
    let completed = match params.get("state").map(String::as_str) {
        None => None,
        Some("in_progress") => Some(false),
        Some("completed") => Some(true),
        Some(other) => {
            return Err(refuse(format!(
                "state={other:?}: use in_progress or completed"
            )))
        }
    };
    match (token, completed) {
        (Some(token), Some(completed)) => Ok(Some(PurgeTarget { token, completed })),
        (None, None) => Ok(None),
        _ => Err(refuse(
            "token and state go together: the record as a listing showed it".into(),
        )),
    }
}

fn record_key(text: &str) -> Result<RecordKey, Response> {
    RecordKey::from_stored(text).ok_or_else(|| {
        problem(
            StatusCode::BAD_REQUEST,
            "bad-request",
            "a record key is 64 lower-case hex digits (use /admin/v1/records?key=…&scope=… to find one from a request's key)",
        )
    })
}

fn unavailable(e: &StoreError) -> Response {
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "store-unavailable",
        format!("the store did not answer: {e}"),
    )
}

/// The request header that carries the identity of the caller whose record is looked
/// up (`GET /admin/v1/records?key=…&scope=…`): a customer's credential, never put in a
/// query string, which access logs keep.
pub const IDENTITY_HEADER: &str = "idem-admin-identity";

/// The scope a request would get, from the identity it would carry. Errors never show
/// the identity (a customer's credential).
fn scope_of(scope: &str, identity: Option<&str>, issuer: Option<&str>) -> Result<Scope, String> {
    let needs = |what: &str| format!("scope={scope} needs the {IDENTITY_HEADER} header: {what}");
    if scope.trim() == "anonymous" {
        return match identity {
            None => Ok(Scope::anonymous()),
            Some(_) => Err(format!("scope=anonymous takes no {IDENTITY_HEADER}")),
        };
    }
    // Any JWT verifier parses the spec: the claim's value is given, not a token.
    let any_jwt = JwtVerifier::new(JwtKeys::Hs256([0; 32].to_vec()), None, None).ok();
    match ScopeSource::parse(scope, any_jwt)? {
        ScopeSource::Authorization => {
            let value = identity.ok_or_else(|| needs("the Authorization header's value"))?;
            // The request's own rule: a value it refuses, or takes for no identity,
            // names no record of this scope.
            let rule = ScopeRule {
                source: ScopeSource::Authorization,
                anonymous: Anonymous::Refused,
            };
            rule.scope(|_| Some(value.as_bytes()), 0)
                .map_err(|rejection| {
                    format!(
                        "the {IDENTITY_HEADER} given is not a caller under scope=authorization ({})",
                        rejection.detail
                    )
                })
        }
        ScopeSource::Header(name) => Ok(Scope::from_header(
            &name,
            identity
                .ok_or_else(|| needs("the header's value"))?
                .as_bytes(),
        )),
        ScopeSource::JwtClaim { claim, .. } => {
            let value = identity.ok_or_else(|| needs("the claim's value"))?;
            // The claim's JSON value as the token carries it: a number or a string (a
            // bare word is taken for a string).
            let json = match idem_core::json::canonicalize(value.as_bytes()) {
                Ok(canonical) => canonical,
                Err(_) => idem_core::json::canonicalize(json!(value).to_string().as_bytes())
                    .map_err(|_| format!("the {IDENTITY_HEADER} given is not a claim's value"))?,
            };
            // A token's `iss` is part of its scope where the origin pins no issuer: the
            // operator gives it as the token carries it.
            let issuer = issuer
                .map(|iss| {
                    idem_core::json::canonicalize(json!(iss).to_string().as_bytes())
                        .map_err(|_| format!("issuer={iss:?} is not an issuer"))
                })
                .transpose()?;
            Ok(Scope::from_issued_claim(issuer.as_deref(), &claim, &json))
        }
    }
}

async fn lookup(
    State(admin): State<Admin>,
    Extension(actor): Extension<Actor>,
    headers: http::HeaderMap,
    query: Params,
) -> Response {
    let params = match params(query, &["key", "scope", "identity", "issuer", "body"]) {
        Ok(p) => p,
        Err(refused) => return refused,
    };
    if params.contains_key("identity") {
        // Refused whatever it holds, and not echoed: it is in the query now, and in
        // whatever logged it on the way; the operator should know.
        return problem(
            StatusCode::BAD_REQUEST,
            "bad-request",
            format!(
                "identity= in the query is refused (access logs keep query strings): send \
                 the caller's identity in the {IDENTITY_HEADER} header"
            ),
        );
    }
    let mut identities = headers.get_all(IDENTITY_HEADER).iter();
    let identity = match (identities.next(), identities.next()) {
        (None, _) => None,
        // UTF-8, not only ASCII: a claim's value may be any text.
        (Some(v), None) => match std::str::from_utf8(v.as_bytes()) {
            Ok(v) => Some(v),
            Err(_) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "bad-request",
                    format!("the {IDENTITY_HEADER} header is not UTF-8"),
                )
            }
        },
        (Some(_), Some(_)) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "bad-request",
                format!("the {IDENTITY_HEADER} header is given more than once"),
            )
        }
    };
    let Some(key) = params.get("key") else {
        return problem(
            StatusCode::BAD_REQUEST,
            "bad-request",
            "key=<the Idempotency-Key as sent> is required",
        );
    };
    let key = match IdempotencyKey::parse(key.as_bytes()) {
        Ok(k) => k,
        Err(e) => return problem(StatusCode::BAD_REQUEST, "bad-request", e.to_string()),
    };
    let Some(scope) = params.get("scope") else {
        return problem(
            StatusCode::BAD_REQUEST,
            "bad-request",
            "scope=authorization|header:<name>|jwt:<claim>|anonymous is required",
        );
    };
    let scope = match scope_of(scope, identity, params.get("issuer").map(String::as_str)) {
        Ok(s) => s,
        Err(e) => return problem(StatusCode::BAD_REQUEST, "bad-request", e),
    };
    let with_body = match flag(&params, "body") {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    show(&admin, &actor, RecordKey::new(&scope, &key), with_body).await
}

async fn get_record(
    State(admin): State<Admin>,
    Extension(actor): Extension<Actor>,
    Path(key): Path<String>,
    query: Params,
) -> Response {
    let params = match params(query, &["body"]) {
        Ok(p) => p,
        Err(refused) => return refused,
    };
    let with_body = match flag(&params, "body") {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    match record_key(&key) {
        Ok(key) => show(&admin, &actor, key, with_body).await,
        Err(refused) => refused,
    }
}

async fn show(admin: &Admin, actor: &Actor, key: RecordKey, with_body: bool) -> Response {
    let found = admin.store.get(&key).await;
    let outcome = match &found {
        Ok(Some(_)) => "found",
        Ok(None) => "absent",
        Err(_) => "store-error",
    };
    tracing::info!(target: "idem::admin", operator = %actor.operator, peer = %actor.peer, action = "get", record_key = key.as_str(), with_body, outcome);
    let now = admin.store.now();
    match found {
        Ok(Some(record)) => ok(json!({
            "now_ms": now,
            "record": view::record(&key, &record, now, with_body),
        })),
        Ok(None) => problem_with(
            StatusCode::NOT_FOUND,
            "no-record",
            "idem holds no record for this key (never used, expired and swept, or purged)",
            json!({ "record_key": key.as_str() }),
        ),
        Err(e) => unavailable(&e),
    }
}

async fn in_progress(
    State(admin): State<Admin>,
    Extension(actor): Extension<Actor>,
    query: Params,
) -> Response {
    let params = match params(query, &["older_than", "limit", "cursor"]) {
        Ok(p) => p,
        Err(refused) => return refused,
    };
    let older_than = match params.get("older_than").map(|a| view::age_ms(a)) {
        None => 0,
        Some(Ok(ms)) => ms,
        Some(Err(e)) => return problem(StatusCode::BAD_REQUEST, "bad-request", e),
    };
    let limit = match params.get("limit").map(|l| l.parse::<usize>()) {
        None => DEFAULT_PAGE,
        Some(Ok(l)) if (1..=MAX_PAGE).contains(&l) => l,
        Some(_) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "bad-request",
                format!("limit is a number from 1 to {MAX_PAGE}"),
            )
        }
    };
    let cursor = params.get("cursor").map(String::as_str);
    if cursor
        .is_some_and(|c| c.is_empty() || c.len() > 256 || !c.bytes().all(|b| b.is_ascii_graphic()))
    {
        return problem(
            StatusCode::BAD_REQUEST,
            "bad-request",
            "cursor is the next_cursor of the previous page, as it was given",
        );
    }
    let now = admin.store.now();
    let claimed_before = now.saturating_sub(older_than);
    let page = admin.store.in_progress(claimed_before, cursor, limit).await;
    tracing::info!(target: "idem::admin", operator = %actor.operator, peer = %actor.peer, action = "list-in-progress", older_than_ms = older_than, found = page.as_ref().map_or(0, |p| p.records.len()), ok = page.is_ok());
    match page {
        Ok(page) => ok(json!({
            "now_ms": now,
            "claimed_before_ms": claimed_before,
            "records": page
                .records
                .iter()
                .map(|(k, r)| view::record(k, r, now, false))
                .collect::<Vec<_>>(),
            "next_cursor": page.next,
        })),
        // A cursor the store cannot read is the caller's mistake, not the store's.
        Err(e)
            if e.kind() == StoreErrorKind::Corrupt
                && cursor.is_some()
                && e.detail().contains("cursor") =>
        {
            problem(
                StatusCode::BAD_REQUEST,
                "bad-request",
                format!(
                    "{}: pass next_cursor as the previous page gave it",
                    e.detail()
                ),
            )
        }
        Err(e) => unavailable(&e),
    }
}

async fn purge(
    State(admin): State<Admin>,
    Extension(actor): Extension<Actor>,
    Path(key): Path<String>,
    query: Params,
) -> Response {
    let params = match params(query, &["force", "resend", "token", "state"]) {
        Ok(p) => p,
        Err(refused) => return refused,
    };
    let (force, resend) = match (flag(&params, "force"), flag(&params, "resend")) {
        (Ok(f), Ok(r)) => (f, r),
        (Err(refused), _) | (_, Err(refused)) => return refused,
    };
    let mut expected = match purge_target(&params) {
        Ok(t) => t,
        Err(refused) => return refused,
    };
    let key = match record_key(&key) {
        Ok(k) => k,
        Err(refused) => return refused,
    };
    let now = admin.store.now();
    if admin.resends == Resends::Never && !resend {
        // Decided on this read, and the purge below deletes only what was read: an
        // attempt that lands meanwhile is another record, never purged unseen.
        let record = match admin.store.get(&key).await {
            Ok(record) => record,
            Err(e) => return unavailable(&e),
        };
        if let Some(record) = record
            .as_ref()
            .filter(|r| idem_core::purge_may_resend(r, now))
        {
            tracing::info!(target: "idem::admin", operator = %actor.operator, peer = %actor.peer, action = "purge", record_key = key.as_str(), force, resend, state = "in_progress", outcome = "refused-may-resend");
            return problem_with(
                StatusCode::CONFLICT,
                "may-resend",
                "this attempt may have reached the upstream (its holder may still be running, or died mid-request): after a purge, a retry would send the request again. Without a purge, the key's next retry stores its outcome as unknown (502 upstream-outcome-unknown) and never sends it. Purge with resend=true only if the upstream is known not to have acted on it, or dedups by the downstream key it was sent",
                json!({ "record": view::record(&key, record, now, false) }),
            );
        }
        // None read: no attempt is purged either (token 0 is no attempt's).
        let seen = record.as_ref().map_or(
            PurgeTarget {
                token: 0,
                completed: true,
            },
            PurgeTarget::of,
        );
        expected = expected.or(Some(seen));
    }
    let purged =
        crate::store::StoreExt::purge_expecting(&*admin.store, &key, now, force, expected).await;
    let outcome = match &purged {
        Ok(Purged::Deleted(_)) => "deleted",
        Ok(Purged::Absent) => "absent",
        Ok(Purged::LeaseLive(_)) => "refused-lease-live",
        Ok(Purged::Changed(_)) => "refused-changed",
        Err(e) if e.kind() == StoreErrorKind::Contention => "refused-changing",
        Err(_) => "store-error",
    };
    let state = match &purged {
        Ok(Purged::Deleted(r) | Purged::LeaseLive(r) | Purged::Changed(r)) if r.is_completed() => {
            "completed"
        }
        Ok(Purged::Deleted(_) | Purged::LeaseLive(_) | Purged::Changed(_)) => "in_progress",
        _ => "-",
    };
    let expected_token = expected.map(|t| t.token);
    let expected_state = expected.map(|t| {
        if t.completed {
            "completed"
        } else {
            "in_progress"
        }
    });
    tracing::info!(target: "idem::admin", operator = %actor.operator, peer = %actor.peer, action = "purge", record_key = key.as_str(), force, ?expected_token, ?expected_state, state, outcome);
    match purged {
        Ok(Purged::Deleted(record)) => ok(json!({
            "purged": true,
            "now_ms": now,
            "record": view::record(&key, &record, now, false),
        })),
        Ok(Purged::Absent) => problem_with(
            StatusCode::NOT_FOUND,
            "no-record",
            "idem holds no record for this key (every replica's replay cache is told to forget it all the same)",
            json!({ "record_key": key.as_str() }),
        ),
        Ok(Purged::LeaseLive(record)) => {
            let lease_until = match &record {
                idem_core::Record::InProgress { lease_until, .. } => *lease_until,
                idem_core::Record::Completed { .. } => now,
            };
            problem_with(
                StatusCode::CONFLICT,
                "lease-live",
                format!(
                    "an attempt holds this key for {} ms more: its handler is probably still running, and purging would let a retry run it again. Purge with force=true only if its holder is known to be gone",
                    lease_until.saturating_sub(now)
                ),
                json!({ "record": view::record(&key, &record, now, false) }),
            )
        }
        Ok(Purged::Changed(record)) => problem_with(
            StatusCode::CONFLICT,
            "record-changed",
            "the record changed while it was being purged: its attempt completed, or another attempt claimed the key. Nothing was deleted; read it and decide again (a completed answer may already be with the client, and purging it lets a retry run the handler again)",
            json!({ "record": view::record(&key, &record, now, false) }),
        ),
        Err(e) if e.kind() == StoreErrorKind::Contention => problem(
            StatusCode::CONFLICT,
            "record-changing",
            "the record kept changing while it was being purged (a completion, a takeover, a write-behind landing); read it and try again",
        ),
        Err(e) => unavailable(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::scope_of;
    use idem_core::Scope;

    #[test]
    fn scopes_as_the_request_would_get_them() {
        assert_eq!(
            scope_of("authorization", Some("Bearer tok"), None),
            Ok(Scope::from_credential(b"tok"))
        );
        assert_eq!(
            scope_of("header:X-Tenant", Some("acme"), None),
            Ok(Scope::from_header("x-tenant", b"acme"))
        );
        assert_eq!(
            scope_of("jwt:sub", Some("alice"), None),
            Ok(Scope::from_claim("sub", b"\"alice\""))
        );
        assert_eq!(
            scope_of("jwt:sub", Some("42"), None),
            Ok(Scope::from_claim("sub", b"42"))
        );
        assert_eq!(
            scope_of("jwt:sub", Some("alice"), Some("https://a.example")),
            Ok(Scope::from_issued_claim(
                Some(br#""https://a.example""#),
                "sub",
                b"\"alice\""
            ))
        );
        assert_eq!(scope_of("anonymous", None, None), Ok(Scope::anonymous()));
        assert!(scope_of("anonymous", Some("x"), None).is_err());
        assert!(scope_of("authorization", None, None).is_err());
        assert!(scope_of("cookie", Some("x"), None).is_err());
        // As a request gets them: Basic and a lone token whole; no credential, or a
        // signature scheme, names no caller (before: hashed whole, a scope no request has).
        assert_eq!(
            scope_of("authorization", Some("Basic dTpw"), None),
            Ok(Scope::from_credential(b"Basic dTpw"))
        );
        assert_eq!(
            scope_of("authorization", Some("sk_1"), None),
            Ok(Scope::from_credential(b"sk_1"))
        );
        for refused in [
            "Bearer",
            "Bearer ",
            " ",
            "AWS4-HMAC-SHA256 Credential=a, Signature=b",
        ] {
            let error = scope_of("authorization", Some(refused), None).unwrap_err();
            assert!(error.contains("is not a caller"), "{refused:?}: {error}");
        }
    }
}
