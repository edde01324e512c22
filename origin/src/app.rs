//! Wiring: the stores, the layer, the demo routes, health and metrics.

use crate::charges::{self, Ledger, MemoryLedger, PgLedger};
use crate::config::{Config, DemoCompletion, DemoLedger, StoreKind};
use crate::proxy::{Upstream, UpstreamOptions};
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::{header, StatusCode};
use idem::IdempotencyLayer;
use idem::OutboxOptions;
use idem::{
    MemoryStore, PgOptions, PostgresStore, RedisOptions, RedisStore, ReplayCache, Store,
    TieredStore,
};
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::Arc;
use std::time::Duration;

/// A built origin: its router and what it runs on.
pub struct Origin {
    /// The whole HTTP surface.
    pub router: Router,
    /// The record store.
    pub store: Arc<dyn Store>,
    /// The demo ledger.
    pub ledger: Arc<dyn Ledger>,
    /// The executions the layer started: shutdown drains them before flushing.
    pub executions: idem::Executions,
    /// The admin API, for its own listener (`--admin-listen`); `None` when off.
    pub admin: Option<Router>,
    /// idem's own endpoints, for their own listener (`--ops-listen`); `None`: they are
    /// on `router`.
    pub ops: Option<Router>,
}

/// Connects the configured stores and builds the router.
pub async fn build(config: &Config) -> Result<Origin, String> {
    config.validate()?;
    let pg = match (&config.database_url, config.store_kind()) {
        (Some(url), _) if !url.is_empty() => Some(Arc::new(connect_postgres(config, url).await?)),
        _ => None,
    };
    let redis = match (&config.redis_url, config.store_kind()) {
        (Some(urls), StoreKind::Redis | StoreKind::Tiered) => {
            Some(connect_redis(config, urls).await?)
        }
        _ => None,
    };
    // The demo's charges live in Postgres whenever there is one, unless told otherwise —
    // and never in proxy mode: the database is the user's, the demo's table no business
    // of theirs.
    let proxy_mode = config.upstream.is_some();
    let ledger_in_authority = pg.is_some()
        && !proxy_mode
        && matches!(config.demo_ledger, DemoLedger::Auto | DemoLedger::Postgres)
        && matches!(config.store_kind(), StoreKind::Postgres | StoreKind::Tiered);
    let ledger: Arc<dyn Ledger> = match (&pg, config.demo_ledger) {
        _ if proxy_mode => Arc::new(MemoryLedger::default()),
        (Some(pg), DemoLedger::Auto | DemoLedger::Postgres) => Arc::new(
            PgLedger::new(pg.pool().clone())
                .await
                .map_err(|e| format!("cannot create the charges table: {e}"))?,
        ),
        _ => Arc::new(MemoryLedger::default()),
    };
    let store = store_of(config, pg, redis);
    let layer = layer(config, store.clone())?;
    // The charges commit with their records when both are in one Postgres: the store's
    // authority, whose database also holds the Postgres ledger's table (the ledger has a
    // pool of its own; a transactional charge is written on the handler's transaction).
    let shared = ledger_in_authority
        && store
            .authority()
            .is_some_and(|a| a.unfenced_because().is_none());
    let (layer, transactional) = match config.demo_completion {
        // The upstream commits on its own: nothing to share a transaction with.
        _ if config.upstream.is_some() => (layer, false),
        DemoCompletion::Separate => (layer, false),
        DemoCompletion::Auto if !shared => (layer, false),
        DemoCompletion::Auto | DemoCompletion::Transactional => {
            (layer.transactional().map_err(|e| e.to_string())?, true)
        }
    };
    if config.demo_completion == DemoCompletion::Transactional
        && !shared
        && config.upstream.is_none()
    {
        return Err("--demo-completion transactional needs the charges in the records' Postgres (--demo-ledger auto or postgres)".into());
    }
    let executions = layer.executions();
    let demo = charges::Demo {
        ledger: ledger.clone(),
        transactional,
        faults: config.demo_faults,
    };
    let admin = config
        .admin_tokens()?
        .map(|tokens| admin_router(config, &store, tokens, &executions));
    let metrics_here = !config.metrics_on_admin;
    // With --ops-listen, idem's endpoints move there and every path here is the API's.
    let (ops_here, ops_apart) = match config.ops_listen {
        Some(_) => {
            // Proxy mode's readiness is its store's alone.
            let ledger = config.upstream.is_none().then(|| ledger.clone());
            (None, Some(ops(store.clone(), ledger, metrics_here)))
        }
        None => (Some(()), None),
    };
    let router = match &config.upstream {
        Some(url) => {
            let upstream = Upstream::new(UpstreamOptions {
                url: url.clone(),
                timeout: config.upstream_timeout,
                idle_timeout: config.upstream_idle_timeout,
                release_header: config.release_header.clone(),
                unknown_outcome: config.upstream_unknown_outcome,
                public_hosts: config.public_host.clone().unwrap_or_default(),
                pass_ambiguous_paths: config.pass_ambiguous_paths,
                tls: config.upstream_tls()?,
                problem_base: config.problem_base.clone(),
            })?;
            let api = proxied(layer, upstream);
            match ops_here {
                Some(()) => api.merge(ops(store.clone(), None, metrics_here)),
                None => api,
            }
        }
        None => serve_demo(layer, store.clone(), demo, metrics_here, ops_here.is_some()),
    };
    metrics::gauge!(
        "idem_build_info",
        "version" => env!("CARGO_PKG_VERSION"),
        "store" => store.name(),
        "mode" => if config.upstream.is_some() { "proxy" } else { "demo" },
    )
    .set(1.0);
    Ok(Origin {
        router,
        store,
        ledger,
        executions,
        admin,
        ops: ops_apart,
    })
}

async fn connect_redis(config: &Config, urls: &str) -> Result<RedisStore, String> {
    let options = RedisOptions::default()
        .cluster(config.redis_cluster.then_some(true))
        .timeout(config.store_timeout)
        .namespace(config.redis_namespace.clone())
        .ca_file(config.redis_ca_file.clone())
        .allow_eviction(config.redis_allow_eviction)
        .wait_replicas(config.redis_wait_replicas)
        .layout(config.redis_layout.into())
        .allow_hosts(config.redis_allow_host.clone());
    RedisStore::connect(urls, options)
        .await
        .map_err(|e| format!("cannot use Redis at {}: {e}", redact(urls)))
}

/// The store `--store` names, over the connections made, with the replay cache in
/// front of a shared one.
fn store_of(
    config: &Config,
    pg: Option<Arc<PostgresStore>>,
    redis: Option<RedisStore>,
) -> Arc<dyn Store> {
    let store: Arc<dyn Store> = match (config.store_kind(), pg, redis) {
        (StoreKind::Memory, _, _) => Arc::new(MemoryStore::bounded(
            config.memory_max_records,
            config.memory_max_bytes,
        )),
        (StoreKind::Postgres, Some(pg), _) => pg,
        (StoreKind::Redis, _, Some(redis)) => Arc::new(redis),
        (StoreKind::Tiered, Some(pg), Some(redis)) => {
            let outbox = OutboxOptions::default()
                .capacity(config.outbox_capacity)
                .batch(config.outbox_batch)
                .enqueue_wait(config.outbox_wait);
            Arc::new(TieredStore::new(
                redis,
                pg,
                config.durability.into(),
                outbox,
            ))
        }
        _ => unreachable!("Config::validate checked the URLs each store needs"),
    };
    // The memory store is a map in this process already.
    match config.store_kind() {
        StoreKind::Memory => store,
        _ if config.replay_cache_bytes == 0 => store,
        _ => Arc::new(ReplayCache::new(store, config.replay_cache_bytes)),
    }
}

/// The admin API (and its status page) on `store`, for `tokens`.
fn admin_router(
    config: &Config,
    store: &Arc<dyn Store>,
    tokens: idem::admin::Tokens,
    executions: &idem::Executions,
) -> Router {
    let handle = crate::metrics::install();
    let status = idem::admin::StatusInputs {
        metrics: Arc::new(move || handle.render()),
        executions: executions.clone(),
    };
    // Proxy mode never sends a request twice: purging an attempt that may have
    // reached the upstream needs resend=true.
    let resends = match config.upstream {
        Some(_) => idem::admin::Resends::Never,
        None => idem::admin::Resends::Allowed,
    };
    let admin = idem::admin::router(store.clone(), tokens, Some(status), resends)
        .route("/healthz", get(|| async { "ok\n" }));
    match config.metrics_on_admin {
        true => admin.route(
            "/metrics",
            get(metrics).with_state(crate::metrics::install()),
        ),
        false => admin,
    }
}

async fn connect_postgres(config: &Config, url: &str) -> Result<PostgresStore, String> {
    let options = PgOptions::default()
        .strategy(config.pg_strategy.strategy()?)
        .pool_size(config.pg_pool_size)
        .timeout(config.store_timeout)
        .ca_file(config.database_ca_file.clone());
    #[cfg(feature = "testing")]
    let options = options.naive_window(config.naive_window);
    PostgresStore::connect(url, options)
        .await
        .map_err(|e| format!("cannot use the Postgres store at {}: {e}", redact(url)))
}

/// The idempotency layer as configured.
pub fn layer(config: &Config, store: Arc<dyn Store>) -> Result<IdempotencyLayer, String> {
    let required: Vec<String> = match &config.require_key_on {
        Some(paths) => paths
            .iter()
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty())
            .collect(),
        None if config.upstream.is_some() => Vec::new(),
        None => vec!["/v1/charges".into()],
    };
    let replayed = config.replayed_headers();
    let cached: Vec<http::HeaderName> = replayed
        .iter()
        .filter_map(|h| http::HeaderName::from_bytes(h.as_bytes()).ok())
        .collect();
    let layer = IdempotencyLayer::new(store)
        .scope_rule(config.scope_rule()?)
        .require_key_on(required)
        .cached_headers(cached)
        .ttl(config.ttl)
        .lease(config.lease)
        .max_wait(config.max_wait)
        .max_body_bytes(config.max_body_bytes)
        .max_buffered_body_bytes(config.max_buffered_body_bytes)
        .max_in_progress(config.max_requests)
        .scope_quota(idem::ScopeQuota {
            in_progress: (config.scope_max_in_progress > 0).then_some(config.scope_max_in_progress),
            new_keys: (config.scope_max_new_keys > 0).then_some(idem::NewKeys {
                count: config.scope_max_new_keys,
                per: config.scope_new_keys_window,
            }),
        })
        .max_stored_body_bytes(config.max_stored_body_bytes)
        .release_on(config.release_on_default())
        .key_headers(config.key_headers()?)
        .fingerprint_rule(config.fingerprint_rule()?)
        .problem_base(&config.problem_base)?;
    let layer = match config.cors()? {
        Some(cors) => layer.cors(cors),
        None => layer,
    };
    let routes = config.routes()?;
    let flags_scope = config.scope_rule()?;
    let edge_in_front = config.edge_secret_file.is_some();
    for route in &routes {
        // The flag's list is warned about in main; a route's own, here.
        if let Some(statuses) = route.release_on() {
            let risky: Vec<String> = statuses.risky().map(|s| s.to_string()).collect();
            if !risky.is_empty() {
                tracing::warn!(
                    route = %route.path,
                    line = route.line,
                    statuses = %risky.join(","),
                    "this route frees the key on statuses an API often answers after it acted (409 \"already paid\", a lookup's 404 after a write): a retry runs the request again"
                );
            }
        }
        if edge_in_front && route.fingerprints_part() {
            tracing::info!(
                route = %route.path,
                line = route.line,
                "this route fingerprints part of the request: the edge in front keeps its answers only if its FINGERPRINT_EXCEPT, FINGERPRINT_ONLY and FINGERPRINT_HEADERS are this rule; otherwise it sends its retries on to this origin"
            );
        }
        if let Some(scope) = route.scope().filter(|s| **s != flags_scope) {
            tracing::warn!(
                route = %route.path,
                line = route.line,
                scope = %scope.source,
                flags = %flags_scope.source,
                "this route scopes keys its own way: an edge in front applies one rule (SCOPE_FROM) to every path, so give the edge this rule or put no edge in front of this route"
            );
        }
    }
    let layer = crate::routes::add_routes(layer, &routes);
    let mut layer = layer;
    for secret in config.edge_secrets()? {
        layer = layer.edge_secret(secret)?;
    }
    Ok(match (config.max_execution.is_zero(), &config.upstream) {
        (false, _) => layer.max_execution(config.max_execution),
        // An upstream that stalls mid-answer must not hold its key for ever.
        (true, Some(_)) => {
            layer.max_execution((config.upstream_timeout * 2).max(Duration::from_secs(60)))
        }
        (true, None) => layer,
    })
}

#[derive(Clone)]
struct Health {
    store: Arc<dyn Store>,
    /// The demo's ledger; none in proxy mode.
    ledger: Option<Arc<dyn Ledger>>,
}

/// idem's own routes: `/healthz`, `/readyz` (the store, and the demo's ledger when
/// there is a demo) and, unless it moved to the admin listener, `/metrics`.
fn ops(store: Arc<dyn Store>, ledger: Option<Arc<dyn Ledger>>, with_metrics: bool) -> Router {
    let health = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(Health { store, ledger });
    match with_metrics {
        true => health.route(
            "/metrics",
            get(metrics).with_state(crate::metrics::install()),
        ),
        false => health,
    }
}

/// Proxy mode: every request but idem's own routes goes to `upstream`, through `layer`.
pub fn proxy_router(layer: IdempotencyLayer, store: Arc<dyn Store>, upstream: Upstream) -> Router {
    proxied(layer, upstream).merge(ops(store, None, true))
}

/// Every request to `upstream`, through `layer`: proxy mode without idem's own routes.
pub fn proxied(layer: IdempotencyLayer, upstream: Upstream) -> Router {
    Router::new().fallback_service(upstream).layer(layer)
}

/// The demo API behind `layer`, plus `/healthz`, `/readyz` and `/metrics`.
pub fn router(layer: IdempotencyLayer, store: Arc<dyn Store>, demo: charges::Demo) -> Router {
    serve_demo(layer, store, demo, true, true)
}

fn serve_demo(
    layer: IdempotencyLayer,
    store: Arc<dyn Store>,
    demo: charges::Demo,
    with_metrics: bool,
    with_ops: bool,
) -> Router {
    let ops = match with_ops {
        true => ops(store, Some(demo.ledger.clone()), with_metrics),
        false => Router::new(),
    };
    charges::routes(demo)
        .layer(layer)
        .merge(ops)
        .fallback(|| async {
            charges::demo_problem(
                StatusCode::NOT_FOUND,
                "not-found",
                "Not found",
                "no such route",
            )
        })
        .method_not_allowed_fallback(|| async {
            charges::demo_problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                "this route does not accept that method",
            )
        })
}

/// Readiness. The body names what is down in a few words; the store's own error (host
/// names, users, server messages) goes to the log, never to whoever can reach `/readyz`.
async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    let store = h.store.ping().await.map_err(|e| {
        tracing::warn!(error = %e, "readiness: the store is not ready");
        match e.kind() {
            idem::StoreErrorKind::Corrupt => "corrupt record",
            idem::StoreErrorKind::Contention => "contention",
            idem::StoreErrorKind::Unsafe => "unsafe configuration",
            idem::StoreErrorKind::Full => "full",
            // And any kind a later idem adds: not ready, whatever it is.
            _ => "unreachable",
        }
    });
    let ledger = match &h.ledger {
        Some(ledger) => Some(ledger.ping().await.map_err(|e| {
            tracing::warn!(error = %e, "readiness: the ledger is not ready");
            "unreachable"
        })),
        None => None,
    };
    let ledger_ok = ledger.as_ref().is_none_or(Result::is_ok);
    let ready = store.is_ok() && ledger_ok;
    let mut body = serde_json::json!({
        "ready": ready,
        "store": { "name": h.store.name(), "ok": store.is_ok(), "error": store.err() },
    });
    if let Some(ledger) = ledger {
        body["ledger"] = serde_json::json!({ "ok": ledger.is_ok(), "error": ledger.err() });
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}

async fn metrics(State(handle): State<PrometheusHandle>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
}

/// The URL — or comma-separated list of URLs — without passwords, for messages: the
/// userinfo's password and `password=` / `sslpassword=` query parameters.
pub fn redact(urls: &str) -> String {
    if urls.contains(',') && urls.split(',').all(|u| u.contains("://")) {
        return urls
            .split(',')
            .map(redact_one)
            .collect::<Vec<_>>()
            .join(",");
    }
    redact_one(urls)
}

fn redact_one(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let base = match (base.find("://"), base.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &base[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &base[..scheme_end + 3], &base[at..]),
                None => base.to_owned(),
            }
        }
        _ => base.to_owned(),
    };
    let Some(query) = query else { return base };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _))
                if k.eq_ignore_ascii_case("password") || k.eq_ignore_ascii_case("sslpassword") =>
            {
                format!("{k}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{base}?{}", query.join("&"))
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redacts_passwords_wherever_they_are() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(
            redact("postgres://u@h/db?sslmode=require&password=secret&PassWord=x"),
            "postgres://u@h/db?sslmode=require&password=***&PassWord=***"
        );
        assert_eq!(
            redact("redis://:s1@a:7000,redis://:s2@b:7001"),
            "redis://:***@a:7000,redis://:***@b:7001"
        );
        assert_eq!(redact("postgres://h/db"), "postgres://h/db");
        assert!(!redact("postgres://u:p%40ss@h/db?password=z").contains('z'));
    }
}
