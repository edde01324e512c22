//! The idempotency middleware: [`IdempotencyLayer`] (its documentation is the
//! contract) and [`IdempotencyService`].

mod execution;
mod guard;
mod response;
mod service;
mod settle;
mod signals;
mod trace;
#[cfg(feature = "postgres")]
mod transaction;

pub use execution::Executions;

/// One of idem's `application/problem+json` answers, with the headers the layer puts
/// on its own ([`contract::Rejection::headers`]: `Retry-After` where it applies, never
/// cacheable): for a server in front of the layer that refuses a request itself (at
/// its limit of requests, say) in the same words.
pub fn problem_response(rejection: &contract::Rejection) -> http::Response<axum::body::Body> {
    response::refusal(rejection)
}

/// [`problem_response`] with its type under `base` ([`IdempotencyLayer::problem_base`]).
pub fn problem_response_under(
    rejection: &contract::Rejection,
    base: &str,
) -> http::Response<axum::body::Body> {
    let mut res = response::refusal(rejection);
    response::rebase_problem(&mut res, base);
    res
}
pub use service::IdempotencyService;
#[cfg(feature = "postgres")]
pub use transaction::{Transaction, TransactionError, TransactionsUnsupported};

use crate::store::Store;
use http::{request::Parts, HeaderName, Method};
use idem_core::InvalidSetting;
use idem_core::{contract, IdempotencyKey, Policy, RecordKey, Scope};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What the handler of an executing request can learn about its claim (a request
/// extension). Made by the layer only; it may gain fields.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct IdempotencyContext {
    /// The request's key.
    pub key: IdempotencyKey,
    /// Where its record lives.
    pub record_key: RecordKey,
    /// The fencing token of this execution. Higher than that of any earlier holder.
    pub token: u64,
    /// Whether this execution took over from a holder whose lease expired.
    pub took_over: bool,
    /// Cancelled when this execution lost its claim: another attempt fenced it out,
    /// or its lease could not be renewed for a whole lease (the store was unreachable)
    /// so another attempt may take over. A handler should check it before an effect
    /// it cannot fence otherwise, and stop.
    pub lease_lost: CancellationToken,
    /// Set when the layer is [`IdempotencyLayer::transactional`].
    #[cfg(feature = "postgres")]
    pub(crate) completion: Option<transaction::Completion>,
}

/// idem's private release signal: a response extension that says "this request did
/// nothing; free its key". Set it with [`release`]. The layer removes it; the client
/// never sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReleaseSignal;

/// Marks `response` as an answer after which nothing happened (for example a body
/// that failed validation before any effect): idem stores nothing and frees the key,
/// so a corrected retry may reuse it. Every other answer is stored and replayed.
///
/// ```
/// use axum::{http::StatusCode, response::IntoResponse};
/// let rejected = idem::release(
///     (StatusCode::BAD_REQUEST, "amount must be positive").into_response(),
/// );
/// ```
pub fn release<B>(mut response: http::Response<B>) -> http::Response<B> {
    response.extensions_mut().insert(ReleaseSignal);
    response
}

/// Marks a request that proved to come from idem's edge ([`contract::EDGE_SECRET`]):
/// only its answer is told what idem stored.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FromEdge;

type ScopeFn = dyn Fn(&Parts) -> Result<Scope, contract::Rejection> + Send + Sync;
type RequireFn = dyn Fn(&Parts) -> bool + Send + Sync;
type ConfigureFn = dyn Fn(IdempotencyLayer) -> IdempotencyLayer + Send + Sync;

/// A path pattern and how its requests are guarded, relative to the layer's own
/// settings ([`IdempotencyLayer::route`]).
#[derive(Clone)]
pub(crate) struct RouteSettings {
    pattern: contract::PathPattern,
    configure: Arc<ConfigureFn>,
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) methods: Vec<Method>,
    pub(crate) key_required: Arc<RequireFn>,
    /// The request headers the key is read from.
    pub(crate) key_headers: contract::KeyHeaders,
    /// Which parts of a request its fingerprint covers.
    pub(crate) fingerprint_rule: idem_core::FingerprintRule,
    /// The origins whose pages may read idem's own answers.
    pub(crate) cors: Option<contract::Cors>,
    /// What problem `type` URIs start with.
    pub(crate) problem_base: Arc<str>,
    /// The route pattern these settings are for (`http.route` of its spans); `None`
    /// for the layer's own.
    pub(crate) route_pattern: Option<Arc<str>>,
    pub(crate) policy: Policy,
    pub(crate) max_wait: Duration,
    /// The wait of a request that states none (`Prefer: wait=N`).
    pub(crate) default_wait: Duration,
    pub(crate) scope: Arc<ScopeFn>,
    pub(crate) cached_headers: Vec<HeaderName>,
    pub(crate) max_body_bytes: usize,
    /// The bytes of guarded bodies held at once, shared by every route.
    pub(crate) body_budget: crate::limits::BodyBudget,
    /// Guarded requests between their body and their answer, shared by every route.
    pub(crate) in_progress: Arc<tokio::sync::Semaphore>,
    /// What one caller may hold, shared by every route.
    pub(crate) quotas: crate::quota::ScopeQuotas,
    pub(crate) max_execution: Option<Duration>,
    pub(crate) executions: Executions,
    pub(crate) max_stored_body_bytes: usize,
    /// Statuses after which nothing is stored and the key is freed.
    pub(crate) release_on: contract::ReleaseOn,
    /// Whether a route's pattern matches paths only in the same case.
    pub(crate) case_sensitive: bool,
    /// The secrets an edge in front proves itself with ([`contract::EDGE_SECRET`]).
    pub(crate) edge_secrets: Vec<Arc<[u8]>>,
    /// Per-path settings, first match wins; resolved when the layer wraps a service.
    pub(crate) routes: Vec<RouteSettings>,
    /// Where handlers commit their effects with their answer, when enabled.
    #[cfg(feature = "postgres")]
    pub(crate) authority: Option<crate::store::postgres::Authority>,
}

/// A tower layer that makes guarded requests idempotent.
///
/// Guarded requests (POST and PATCH by default) that carry an `Idempotency-Key` run
/// their handler at most once per (scope, key, TTL): concurrent retries get `409` (or
/// wait, with `Prefer: wait=N`), later retries get the stored response with
/// `Idempotent-Replayed: true`, and a reused key with a different request gets `422`.
/// Every other request passes through untouched.
///
/// ```
/// use axum::{routing::post, Router};
/// use idem::IdempotencyLayer;
/// use idem::MemoryStore;
/// use std::{sync::Arc, time::Duration};
///
/// let idempotency = IdempotencyLayer::new(Arc::new(MemoryStore::new()))
///     .require_key_on(["/v1/charges"])
///     .ttl(Duration::from_secs(24 * 60 * 60))
///     .lease(Duration::from_secs(30))
///     .max_wait(Duration::from_secs(10))
///     .max_body_bytes(256 * 1024);
///
/// let app: Router = Router::new()
///     .route("/v1/charges", post(|| async { "charged once" }))
///     .layer(idempotency);
/// ```
///
/// Once the handler started, its answer is the request's result, whatever its status
/// or headers, and is replayed to every retry — unless the handler says that nothing
/// happened by passing its answer through [`release`] (for example when it rejects an
/// invalid body before doing anything): then the key is freed for a corrected retry.
///
/// The handler runs in its own task: a client that disconnects mid-request doesn't
/// cancel it, its answer is still stored for the retry, and graceful shutdown waits
/// for it ([`IdempotencyLayer::executions`]). While it runs, and until its answer is
/// written, the claim's lease is renewed; if the process dies, the lease runs out and
/// the next retry takes over under a higher fencing token, and the dead holder's late
/// writes are refused. The handler can read that token from the [`IdempotencyContext`]
/// request extension to fence its own side effects, and learns there when its lease
/// was lost.
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

impl IdempotencyLayer {
    /// A layer over `store` with the defaults: POST and PATCH guarded, key optional,
    /// 24 h TTL, 30 s lease, `Prefer: wait` capped at 10 s, scope from the bearer
    /// token — a guarded request without one refused (401), since callers idem can't
    /// tell apart must not share answers (choose otherwise with
    /// [`scope_rule`](Self::scope_rule) or [`scope`](Self::scope)) — 1 MiB body limit,
    /// and [`contract::DEFAULT_CACHED_HEADERS`] replayed. Route patterns match without
    /// regard to case ([`case_sensitive_paths`](Self::case_sensitive_paths)).
    pub fn new(store: Arc<dyn Store>) -> Self {
        IdempotencyLayer {
            config: Arc::new(Config {
                store,
                methods: vec![Method::POST, Method::PATCH],
                key_required: Arc::new(|_| false),
                key_headers: contract::KeyHeaders::default(),
                fingerprint_rule: idem_core::FingerprintRule::default(),
                cors: None,
                problem_base: Arc::from(contract::DEFAULT_PROBLEM_BASE),
                route_pattern: None,
                policy: Policy::default(),
                max_wait: Duration::from_secs(10),
                default_wait: Duration::ZERO,
                scope: rule_scope(contract::ScopeRule::default()),
                cached_headers: contract::DEFAULT_CACHED_HEADERS
                    .iter()
                    .map(|h| HeaderName::from_static(h))
                    .collect(),
                max_body_bytes: 1024 * 1024,
                body_budget: crate::limits::BodyBudget::new(DEFAULT_BUFFERED_BODY_BYTES),
                in_progress: Arc::new(tokio::sync::Semaphore::new(DEFAULT_MAX_IN_PROGRESS)),
                quotas: crate::quota::ScopeQuotas::new(crate::quota::ScopeQuota::default()),
                max_execution: None,
                executions: Executions::default(),
                max_stored_body_bytes: 1024 * 1024,
                release_on: contract::ReleaseOn::NONE,
                case_sensitive: false,
                edge_secrets: Vec::new(),
                routes: Vec::new(),
                #[cfg(feature = "postgres")]
                authority: None,
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// The methods that are guarded; every other method passes through.
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.with(|c| c.methods = methods)
    }

    /// Requires a key on these paths: exact, or a prefix ending in `*` (`/v1/*`) — a
    /// guarded request without one gets `400`.
    pub fn require_key_on<P: Into<String>>(self, paths: impl IntoIterator<Item = P>) -> Self {
        let paths: Vec<String> = paths.into_iter().map(Into::into).collect();
        self.require_key_when(move |parts| idem_core::contract::listed(&paths, parts.uri.path()))
    }

    /// The request headers the key is read from ([`contract::KeyHeaders`]), instead of
    /// `Idempotency-Key` — `X-Idempotency-Key`, `PayPal-Request-Id`, as an API's clients
    /// already send. A request with two keys (in one header or two) is refused, and so
    /// is one with an `Idempotency-Key` when it is not among them: its client would
    /// believe it guarded.
    pub fn key_headers(self, headers: contract::KeyHeaders) -> Self {
        self.with(|c| c.key_headers = headers)
    }

    /// Which parts of a request make two requests with one key "the same"
    /// ([`idem_core::FingerprintRule`]): the whole body by default; some JSON fields
    /// left out (a timestamp, a nonce, a trace id a retry changes) or only some kept;
    /// and headers, if they matter. A retry that differs only in what the rule leaves
    /// out gets the first answer; one that differs in anything else, `422`.
    pub fn fingerprint_rule(self, rule: idem_core::FingerprintRule) -> Self {
        self.with(|c| c.fingerprint_rule = rule)
    }

    /// Lets pages of these origins read idem's own answers — replays, `409` while the
    /// first attempt runs, `422` and every other refusal — which a browser hides from
    /// the page without `Access-Control-Allow-Origin` ([`contract::Cors`]). The API's
    /// own answers are left as the API wrote them; preflights pass through to it.
    pub fn cors(self, cors: contract::Cors) -> Self {
        self.with(|c| c.cors = Some(cors))
    }

    /// What the `type` URIs of idem's problems start with: by default the repository's
    /// `docs/problems.md#`, whose sections explain each; an operator's own page (with a
    /// section per problem name, [`contract::Problem::slug`]) instead. Layer-wide.
    ///
    /// # Errors
    ///
    /// A base that is not an absolute URL or URN ([`contract::check_problem_base`]).
    pub fn problem_base(self, base: &str) -> Result<Self, InvalidSetting> {
        contract::check_problem_base(base)?;
        Ok(self.with(|c| c.problem_base = Arc::from(base)))
    }

    /// Requires a key on every guarded request for which `required` returns true.
    pub fn require_key_when(
        self,
        required: impl Fn(&Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.with(|c| c.key_required = Arc::new(required))
    }

    /// How long a completed response is replayed.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|c| c.policy.ttl_ms = millis(ttl))
    }

    /// How long a claim lives without a heartbeat (heartbeats come every eighth of it).
    pub fn lease(self, lease: Duration) -> Self {
        // Within a year: longer, a claim's lease and expiry could both saturate.
        self.with(|c| c.policy.lease_ms = millis(lease).clamp(3, Policy::MAX_LEASE_MS))
    }

    /// The longest a request with `Prefer: wait=N` waits for an in-flight attempt.
    pub fn max_wait(self, max_wait: Duration) -> Self {
        self.with(|c| c.max_wait = max_wait)
    }

    /// How long a request whose key is in flight waits for that attempt when it states
    /// no `Prefer: wait=N` (capped by [`max_wait`](Self::max_wait)); none by default:
    /// such a request gets `409` at once.
    pub fn default_wait(self, wait: Duration) -> Self {
        self.with(|c| c.default_wait = wait)
    }

    /// Settings for the requests whose path matches `pattern` — exact, or a prefix
    /// ending in `*` (`/v1/payouts/*`): `configure` gets this layer with every setting
    /// made on it (before or after this call) and changes what differs on that path —
    /// TTL, lease, waits, guarded methods, whether a key is required, scope. Patterns
    /// are tried in the order they were added; the first match wins, and a path none
    /// matches gets the layer's own settings. Routes share the layer's store and
    /// executions.
    ///
    /// ```
    /// use idem::IdempotencyLayer;
    /// use idem::MemoryStore;
    /// use std::{sync::Arc, time::Duration};
    ///
    /// let idempotency = IdempotencyLayer::new(Arc::new(MemoryStore::new()))
    ///     .route("/v1/payouts/*", |payouts| {
    ///         payouts
    ///             .ttl(Duration::from_secs(7 * 24 * 60 * 60))
    ///             .require_key_when(|_| true)
    ///     });
    /// ```
    ///
    /// # Panics
    ///
    /// When `pattern` is not one [`contract::check_pattern`] accepts (as axum's router
    /// panics on a malformed route): a pattern not in normal form could never match,
    /// or not where it seems to.
    pub fn route(
        self,
        pattern: impl AsRef<str>,
        configure: impl Fn(IdempotencyLayer) -> IdempotencyLayer + Send + Sync + 'static,
    ) -> Self {
        let pattern = contract::PathPattern::new(pattern.as_ref())
            .unwrap_or_else(|e| panic!("IdempotencyLayer::route: the path {e}"));
        let route = RouteSettings {
            pattern,
            configure: Arc::new(configure),
        };
        self.with(|c| c.routes.push(route))
    }

    /// Whether route patterns match paths only in the same case (`/V1/Payouts` is then
    /// not `/v1/payouts/*`'s). Off by default: most frameworks route without regard to
    /// case, and a request the API routes to a guarded handler must be guarded here
    /// too. Set on a route's layer, it applies to that route's pattern.
    pub fn case_sensitive_paths(self, yes: bool) -> Self {
        self.with(|c| c.case_sensitive = yes)
    }

    /// A secret idem's edge in front sends with the requests it claimed
    /// ([`contract::EDGE_SECRET`]; the edge's `EDGE_SECRET`). Only requests that carry
    /// one are told what idem stored — the private headers the edge keeps its copies
    /// by ([`contract::ORIGIN_DISPOSITION`], [`contract::STORED_HEADERS`]); every other
    /// answer goes without them, so a client never sees them. Unset (the default), no
    /// answer carries them and an edge in front keeps nothing. Called again, it accepts
    /// one more (to rotate: accept the new one, move the edge to it, drop the old).
    /// Layer-wide: set on a route's layer it is ignored. The header is removed from
    /// every request before the service this layer wraps gets it — so wrap every route
    /// the edge forwards to, or a route outside the layer gets the secret.
    ///
    /// # Errors
    ///
    /// A secret shorter than [`contract::MIN_EDGE_SECRET_BYTES`], or not sendable as a
    /// header value ([`contract::check_edge_secret`]).
    pub fn edge_secret(self, secret: impl Into<Vec<u8>>) -> Result<Self, InvalidSetting> {
        let secret: Vec<u8> = secret.into();
        contract::check_edge_secret(&secret)?;
        Ok(self.with(|c| c.edge_secrets.push(secret.into())))
    }

    /// The settings of each route, made from this layer's.
    fn resolved_routes(&self) -> Vec<(contract::PathPattern, Arc<Config>)> {
        let mut base = (*self.config).clone();
        base.routes.clear();
        let base = IdempotencyLayer {
            config: Arc::new(base),
        };
        self.config
            .routes
            .iter()
            .map(|r| {
                let mut config = (r.configure)(base.clone()).config;
                let settings = Arc::make_mut(&mut config);
                settings.routes.clear();
                settings.route_pattern = Some(Arc::from(r.pattern.as_str()));
                (
                    r.pattern.clone().case_sensitive(config.case_sensitive),
                    config,
                )
            })
            .collect()
    }

    /// Who a key belongs to. The default hashes the `Authorization` header's bearer
    /// token, `Basic` credentials or lone token, and refuses other schemes (401): see
    /// [`contract::ScopeRule::default`].
    pub fn scope(self, scope: impl Fn(&Parts) -> Scope + Send + Sync + 'static) -> Self {
        self.with(|c| c.scope = Arc::new(move |parts| Ok(scope(parts))))
    }

    /// Who a key belongs to, by a rule of the contract — the same the edge applies:
    /// the `Authorization` value, a header (`x-api-key`, a gateway's principal), or a
    /// claim of a verified HS256 JWT (a refreshed token keeps its scope). A request
    /// the rule can't place is refused with `401` before anything is claimed.
    pub fn scope_rule(self, rule: contract::ScopeRule) -> Self {
        self.with(|c| c.scope = rule_scope(rule))
    }

    /// The response headers stored and replayed besides status and body.
    pub fn cached_headers(self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        let headers = headers.into_iter().collect();
        self.with(|c| c.cached_headers = headers)
    }

    /// The largest answer body stored for replay (1 MiB by default). A larger answer is
    /// still delivered in full to the attempt that ran — streamed, never held whole in
    /// memory — and replays get a `500` problem (`…:response-not-stored`) instead.
    pub fn max_stored_body_bytes(self, limit: usize) -> Self {
        self.with(|c| c.max_stored_body_bytes = limit)
    }

    /// The statuses after which nothing is stored and the key is freed, as if the
    /// handler had said [`release`]: a corrected retry with the same key runs. Client
    /// errors only ([`contract::ReleaseOn`]); none by default — the handler's own signal
    /// is the precise one — and [`contract::ReleaseOn::proxy_default`] in proxy mode,
    /// whose upstream has no signal but its status. Name only statuses the API answers
    /// before acting: a released answer is run again.
    pub fn release_on(self, statuses: contract::ReleaseOn) -> Self {
        self.with(|c| c.release_on = statuses)
    }

    /// The longest a handler may run. After it, the handler is dropped, its outcome
    /// is stored as a `502` problem (it may have had effects: it never runs again for
    /// that key), and the lease is no longer renewed. Unbounded by default.
    pub fn max_execution(self, limit: Duration) -> Self {
        self.with(|c| c.max_execution = Some(limit))
    }

    /// Lets handlers commit their effects and their answer in one transaction
    /// ([`IdempotencyContext::transaction`]), on the Postgres database that holds the
    /// store's authoritative records. Fails — at start-up — when the store has none
    /// (memory, Redis alone).
    #[cfg(feature = "postgres")]
    pub fn transactional(self) -> Result<Self, TransactionsUnsupported> {
        let store = self.config.store.clone();
        let unsupported = |reason| TransactionsUnsupported {
            store: store.name(),
            reason,
        };
        let authority = store.authority().ok_or_else(|| {
            unsupported("it keeps its records outside Postgres (use --store postgres or tiered)")
        })?;
        if let Some(reason) = authority.unfenced_because() {
            return Err(unsupported(reason));
        }
        Ok(self.with(|c| c.authority = Some(authority)))
    }

    /// Whether handlers can commit their effects with their answer.
    pub fn is_transactional(&self) -> bool {
        #[cfg(feature = "postgres")]
        return self.config.authority.is_some();
        #[cfg(not(feature = "postgres"))]
        false
    }

    /// The executions this layer starts, for graceful shutdown: after the server
    /// stopped accepting, [`Executions::drain`] waits for every handler to finish
    /// and its record to be written.
    pub fn executions(&self) -> Executions {
        self.config.executions.clone()
    }

    /// The largest request body accepted on guarded requests (`413` above it).
    pub fn max_body_bytes(self, limit: usize) -> Self {
        self.with(|c| c.max_body_bytes = limit)
    }

    /// The bytes of guarded request bodies held at once, across every route of this
    /// layer ([`DEFAULT_BUFFERED_BODY_BYTES`] unless set): a body takes its bytes as
    /// they arrive and holds them until its request is answered and stored; one that
    /// does not fit in what is left gets `503` (`…:server-busy`, `Retry-After: 1`),
    /// and nothing is claimed or run. Bounds the memory a crowd of slow or large
    /// bodies can take. Keep it at least [`max_body_bytes`](Self::max_body_bytes), or
    /// the largest bodies accepted can never be read.
    pub fn max_buffered_body_bytes(self, limit: usize) -> Self {
        self.with(|c| c.body_budget = crate::limits::BodyBudget::new(limit))
    }

    /// Guarded requests in progress at once — from their body read to their answer
    /// stored, including those whose client has left and that finish on their own —
    /// across every route ([`DEFAULT_MAX_IN_PROGRESS`] unless set). Past it a guarded
    /// request gets `503` (`…:server-busy`) and nothing is claimed or run. A server's
    /// own cap on requests lets go of a request when its client disconnects; this one
    /// does not, so clients that send and hang up cannot start handlers without bound.
    pub fn max_in_progress(self, limit: usize) -> Self {
        self.with(|c| c.in_progress = Arc::new(tokio::sync::Semaphore::new(limit)))
    }
}

impl IdempotencyLayer {
    /// What one caller (one scope) may hold, across every route (no quota unless set:
    /// [`crate::quota::ScopeQuota::default`]): guarded requests in progress at once,
    /// and new keys in a window. Past either, its guarded requests get `429`
    /// (`…:scope-quota`) and nothing is claimed or run — its stored answers still replay
    /// — while other callers go on. Without it, one tenant could take every place of
    /// [`max_in_progress`](Self::max_in_progress), or fill a bounded store.
    pub fn scope_quota(self, quota: crate::quota::ScopeQuota) -> Self {
        self.with(|c| c.quotas = crate::quota::ScopeQuotas::new(quota))
    }
}

/// The default of [`IdempotencyLayer::max_in_progress`].
pub const DEFAULT_MAX_IN_PROGRESS: usize = 10_000;

/// The default of [`IdempotencyLayer::max_buffered_body_bytes`]: 64 MiB, 64 bodies of
/// the default 1 MiB limit read at once (a body of declared length reserves only that).
pub const DEFAULT_BUFFERED_BODY_BYTES: usize = 64 * 1024 * 1024;

impl<S> tower::Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.config.clone(), self.resolved_routes())
    }
}

/// A request's scope by `rule`, refusing what it can't place.
fn rule_scope(rule: contract::ScopeRule) -> Arc<ScopeFn> {
    Arc::new(move |parts| {
        let now_secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let values = |name: &str| parts.headers.get_all(name).iter().map(|v| v.as_bytes());
        rule.scope(values, now_secs)
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
