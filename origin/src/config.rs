//! The command line of `idem-origin`: every flag has an environment fallback.

use clap::{Parser, ValueEnum};
use idem::{Durability, PgStrategy, RedisLayout};
use idem_core::contract::{self, Anonymous, JwtKeys, JwtVerifier, ScopeRule, ScopeSource};
use std::net::SocketAddr;
use std::time::Duration;

/// Which record store to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// In-process map: zero set-up, not durable, not shared between processes.
    Memory,
    /// Postgres: durable and shared; needs --database-url.
    Postgres,
    /// Redis or Redis Cluster: fast and shared; needs --redis-url.
    Redis,
    /// Redis hot path over the Postgres authority; needs --redis-url and --database-url.
    Tiered,
}

/// Where the demo charges API keeps its charges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DemoLedger {
    /// Postgres when --database-url is set, else memory.
    Auto,
    /// In process: the handler costs no backend round trip (what the bench uses, so
    /// that it measures idem and not the demo).
    Memory,
    /// The `charges` table in Postgres; needs --database-url.
    Postgres,
}

/// How the demo commits a charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DemoCompletion {
    /// `transactional` when the charges and the records share a Postgres (--store postgres
    /// or tiered, the ledger in Postgres); `separate` otherwise.
    Auto,
    /// The charge and its idempotency record commit in one transaction: a crash or a
    /// paused holder can never charge twice. Needs --store postgres or tiered and the
    /// ledger in Postgres.
    Transactional,
    /// The charge commits on its own, then idem stores the answer: a crash in between,
    /// or a holder paused past its lease, charges twice (kept to show the difference).
    Separate,
}

/// What proxy mode does when the upstream's answer is lost after the request was sent
/// (a timeout, a dropped connection): the upstream may have acted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum UnknownOutcome {
    /// Store a 502 `upstream-outcome-unknown` problem: every retry gets it, nothing is
    /// sent again (a payment API's choice).
    Store,
    /// Answer that problem but release the key: a retry sends the request again (for an
    /// upstream that dedups by the downstream key it is sent).
    Release,
}

/// What a guarded request that says nowhere who it is gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AnonymousCallers {
    /// All such callers share the `anonymous` scope: one caller's key, with the same
    /// request, replays another's answer.
    Scoped,
    /// A 401 problem; nothing is claimed.
    Refused,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// idem-origin: the idempotency layer in front of the demo charges API.
#[derive(Parser, Debug, Clone)]
#[command(name = "idem-origin", version, about, long_about = None)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "IDEM_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Record store [default: memory; in proxy mode it must be named: `--store memory`
    /// keeps an upstream's records in this process only].
    #[arg(long, env = "IDEM_STORE", value_enum)]
    pub store: Option<StoreKind>,

    /// --store memory: the most records it holds; a new key past it gets 503
    /// (store-full) and nothing runs.
    #[arg(long, env = "IDEM_MEMORY_MAX_RECORDS", default_value_t = idem::MemoryStore::DEFAULT_MAX_RECORDS)]
    pub memory_max_records: usize,

    /// --store memory: about the most bytes its records take (keys and stored answers);
    /// a new key past it gets 503 (store-full) and nothing runs.
    #[arg(long, env = "IDEM_MEMORY_MAX_BYTES", default_value_t = idem::MemoryStore::DEFAULT_MAX_BYTES)]
    pub memory_max_bytes: usize,

    /// Postgres URL, e.g. postgres://user@127.0.0.1:5432/idem (required with --store postgres;
    /// also holds the demo's charges).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// CA certificates (PEM) that verify the Postgres server's chain whenever TLS is
    /// used (sslmode prefer, require, verify-ca; verify-full checks the host name too).
    /// With a CA, TLS is required: a server that declines it is refused. Overrides
    /// sslrootcert.
    #[arg(long, env = "IDEM_DATABASE_CA_FILE")]
    pub database_ca_file: Option<std::path::PathBuf>,

    /// Redis URL, or a comma-separated list of Redis Cluster nodes
    /// (redis://127.0.0.1:7000,redis://127.0.0.1:7001,…). Required with --store redis|tiered.
    #[arg(long, env = "IDEM_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,

    /// CA certificates (PEM) that verify rediss:// servers (else the system's roots).
    #[arg(long, env = "IDEM_REDIS_CA_FILE")]
    pub redis_ca_file: Option<std::path::PathBuf>,

    /// Treat --redis-url as a Redis Cluster. Without it, a list of URLs is a cluster
    /// and a single URL is asked (INFO cluster).
    #[arg(long, env = "IDEM_REDIS_CLUSTER")]
    pub redis_cluster: bool,

    /// Prefix of every Redis key, so several deployments can share one Redis.
    #[arg(long, env = "IDEM_REDIS_NAMESPACE", default_value = "idem")]
    pub redis_namespace: String,

    /// Start even if a Redis master evicts keys when full (maxmemory set and
    /// maxmemory-policy not noeviction): an evicted claim or answer lets a retry run the
    /// handler again.
    #[arg(long, env = "IDEM_REDIS_ALLOW_EVICTION")]
    pub redis_allow_eviction: bool,

    /// Redis Cluster: where else than the nodes --redis-url names the URLs' credentials
    /// may go, comma-separated: host names or IP addresses (any port), host:port, or
    /// networks (10.0.0.0/8). The cluster announces its own nodes; when the URLs carry
    /// a user or a password, one announced elsewhere is refused at start-up and never
    /// sent them later.
    #[arg(long, env = "IDEM_REDIS_ALLOW_HOST", value_delimiter = ',')]
    pub redis_allow_host: Vec<String>,

    /// Replicas that must acknowledge every claim and completion (Redis WAIT) before
    /// it counts; 0 = don't wait. Narrows the window in which a master that dies
    /// loses an acknowledged claim.
    #[arg(long, env = "IDEM_REDIS_WAIT_REPLICAS", default_value_t = 0)]
    pub redis_wait_replicas: u32,

    /// How records are written to Redis: `string` (the record itself), or `hash` (as
    /// idem 0.1 wrote them), for the first step of a rolling upgrade from 0.1 while its
    /// replicas still run. Both are read.
    #[arg(long, env = "IDEM_REDIS_LAYOUT", value_enum, default_value_t = RedisLayoutArg::String)]
    pub redis_layout: RedisLayoutArg,

    /// Tiered store: when claims and completions reach Postgres.
    #[arg(long, env = "IDEM_DURABILITY", value_enum, default_value_t = TieredDurability::Sync)]
    pub durability: TieredDurability,

    /// Tiered async: records the outbox queues before writers wait.
    #[arg(long, env = "IDEM_OUTBOX_CAPACITY", default_value_t = 10_000)]
    pub outbox_capacity: usize,

    /// Tiered async: most records per write-behind batch.
    #[arg(long, env = "IDEM_OUTBOX_BATCH", default_value_t = 500)]
    pub outbox_batch: usize,

    /// Tiered async: how long a request waits for room in a full outbox before it
    /// is refused with 503.
    #[arg(long, env = "IDEM_OUTBOX_WAIT", default_value = "1s", value_parser = parse_duration)]
    pub outbox_wait: Duration,

    /// How the Postgres store claims a key (`naive` is unsafe, for race tests only).
    #[arg(long, env = "IDEM_PG_STRATEGY", value_enum, default_value_t = ClaimStrategy::OnConflict)]
    pub pg_strategy: ClaimStrategy,

    /// Postgres connection pool size.
    #[arg(long, env = "IDEM_PG_POOL_SIZE", default_value_t = 16)]
    pub pg_pool_size: usize,

    /// How long a completed response is replayed (e.g. 24h, 90m, 30s).
    #[arg(long, env = "IDEM_TTL", default_value = "24h", value_parser = parse_duration)]
    pub ttl: Duration,

    /// How long a claim survives without a heartbeat before a retry may take over.
    #[arg(long, env = "IDEM_LEASE", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,

    /// Longest a handler may run; after it its outcome is stored as a 502 problem and
    /// the lease is no longer renewed. 0 = unbounded (in proxy mode: twice
    /// --upstream-timeout, at least 60 s, so an upstream that stalls mid-answer can't
    /// hold a key for ever).
    #[arg(long, env = "IDEM_MAX_EXECUTION", default_value = "0", value_parser = parse_duration)]
    pub max_execution: Duration,

    /// On SIGTERM: how long to wait for running handlers and their record writes
    /// before exiting (keys still unwritten then are logged and counted).
    #[arg(long, env = "IDEM_DRAIN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// Upper bound on `Prefer: wait=N`.
    #[arg(long, env = "IDEM_MAX_WAIT", default_value = "10s", value_parser = parse_duration)]
    pub max_wait: Duration,

    /// Largest accepted request body on guarded requests, in bytes.
    #[arg(long, env = "IDEM_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Bytes of guarded request bodies being read at once; a body that does not fit (its
    /// Content-Length, or undeclared --max-body-bytes) gets 503 (server-busy) and
    /// nothing runs.
    #[arg(long, env = "IDEM_MAX_BUFFERED_BODY_BYTES", default_value_t = idem::DEFAULT_BUFFERED_BODY_BYTES)]
    pub max_buffered_body_bytes: usize,

    /// How long a client may take to send a request's head (request line and headers),
    /// from when the listener awaits it: on a new connection, or on a keep-alive one
    /// after its last answer (so also how long an idle connection is kept). Both
    /// listeners.
    #[arg(long, env = "IDEM_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// The longest gap between two parts of a request body; past it a guarded request
    /// gets 408 (body-timeout) and nothing runs. Both listeners.
    #[arg(long, env = "IDEM_BODY_IDLE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub body_idle_timeout: Duration,

    /// How long a whole request body may take to arrive after its head; past it a
    /// guarded request gets 408 (body-timeout) and nothing runs. Both listeners.
    #[arg(long, env = "IDEM_BODY_READ_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub body_read_timeout: Duration,

    /// How long a write to a client may wait for it to read (its receive window full)
    /// before the connection is closed. Both listeners.
    #[arg(long, env = "IDEM_WRITE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub write_timeout: Duration,

    /// Connections open at once, per listener; more wait to be accepted.
    #[arg(long, env = "IDEM_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,

    /// Requests in progress at once, per listener; more get 503 (server-busy) and
    /// nothing runs (/healthz, /readyz and /metrics have a cap of 64 of their own).
    /// Guarded requests count until their answer is stored, even when their client has
    /// left.
    #[arg(long, env = "IDEM_MAX_REQUESTS", default_value_t = 10_000)]
    pub max_requests: usize,

    /// Guarded requests one caller (one scope) may have in progress at once, in this
    /// process; more get 429 (scope-quota) and nothing runs, while other callers go on.
    /// 0 (the default): no limit, and one caller may take every place of
    /// --max-requests. Anonymous callers (--anonymous scoped) are one scope.
    #[arg(long, env = "IDEM_SCOPE_MAX_IN_PROGRESS", default_value_t = 0)]
    pub scope_max_in_progress: usize,

    /// New keys one caller may make per --scope-new-keys-window, in this process; past
    /// it, its new keys get 429 (scope-quota) with Retry-After, and its stored answers
    /// still replay. Bounds the records one caller can put in a bounded store. 0: no
    /// limit.
    #[arg(long, env = "IDEM_SCOPE_MAX_NEW_KEYS", default_value_t = 0)]
    pub scope_max_new_keys: u32,

    /// The window of --scope-max-new-keys.
    #[arg(long, env = "IDEM_SCOPE_NEW_KEYS_WINDOW", default_value = "1m", value_parser = parse_duration)]
    pub scope_new_keys_window: Duration,

    /// Largest answer body stored for replay, in bytes; a larger answer is delivered to
    /// the attempt that ran and replays get a problem.
    #[arg(long, env = "IDEM_MAX_STORED_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_stored_body_bytes: usize,

    /// Bound on connecting to and on each operation of the store.
    #[arg(long, env = "IDEM_STORE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub store_timeout: Duration,

    /// How often expired records are deleted (in batches).
    #[arg(long, env = "IDEM_SWEEP_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub sweep_interval: Duration,

    /// `naive` strategy only: pause between its SELECT and its INSERT.
    #[arg(long, env = "IDEM_NAIVE_WINDOW", default_value = "20ms", value_parser = parse_duration)]
    pub naive_window: Duration,

    /// Bytes of completed records (keys and responses) kept in process so that replays
    /// skip the store; 0 turns the cache off. Not used with the memory store.
    #[arg(long, env = "IDEM_REPLAY_CACHE_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub replay_cache_bytes: u64,

    /// Proxy mode: forward every request idem does not serve itself (/healthz, /readyz,
    /// /metrics) to this http:// or https:// URL, through the idempotency layer,
    /// instead of serving the demo API.
    #[arg(long, env = "IDEM_UPSTREAM", hide_env_values = true)]
    pub upstream: Option<String>,

    /// Proxy mode, https:// upstream: the CA certificates (PEM) its certificate must
    /// lead to. Without it, the system's roots (a FROM scratch container has none).
    #[arg(long, env = "IDEM_UPSTREAM_CA_FILE")]
    pub upstream_ca_file: Option<std::path::PathBuf>,

    /// Proxy mode, https:// upstream: a client certificate chain (PEM) to present to
    /// an upstream that asks for one (mTLS). Needs --upstream-client-key.
    #[arg(long, env = "IDEM_UPSTREAM_CLIENT_CERT")]
    pub upstream_client_cert: Option<std::path::PathBuf>,

    /// The private key (PEM) of --upstream-client-cert.
    #[arg(long, env = "IDEM_UPSTREAM_CLIENT_KEY")]
    pub upstream_client_key: Option<std::path::PathBuf>,

    /// Proxy mode, https:// upstream: the name its certificate must carry (and SNI
    /// sends), when the URL names an address or another name than the certificate's.
    /// Without it, the URL's host.
    #[arg(long, env = "IDEM_UPSTREAM_TLS_NAME")]
    pub upstream_tls_name: Option<String>,

    /// Proxy mode: the longest wait for the upstream's answer to begin; past it the
    /// outcome is unknown.
    #[arg(long, env = "IDEM_UPSTREAM_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub upstream_timeout: Duration,

    /// Proxy mode: how long an idle pooled connection to the upstream is kept; keep it
    /// below the upstream's own keep-alive timeout (Node's is 5 s).
    #[arg(long, env = "IDEM_UPSTREAM_IDLE_TIMEOUT", default_value = "4s", value_parser = parse_duration)]
    pub upstream_idle_timeout: Duration,

    /// Proxy mode: the hosts clients reach the API by (`api.example.com`, with its
    /// port when not the scheme's), comma-separated. A request whose `Host` is one of
    /// them is sent on with `X-Forwarded-Host`; any other, and every request without
    /// this flag, goes without it: the client writes `Host`, and an upstream that builds
    /// links from `X-Forwarded-Host` would build them for whatever host a client names.
    #[arg(long, env = "IDEM_PUBLIC_HOST", value_delimiter = ',')]
    pub public_host: Option<Vec<String>>,

    /// Proxy mode: forward requests idem does not guard even when servers may read
    /// their path differently (an encoded `/`, a `;`, a `.` or `..` segment…), as an
    /// API with `%2F` in its resource names needs. Off by default: every such request
    /// is refused (400 path-ambiguous) whatever its method, since idem cannot tell
    /// which resource the upstream will take it for. Guarded requests, and every
    /// request under a base path (`--upstream http://…/base`, which a `..` could climb
    /// out of), are refused either way.
    #[arg(long, env = "IDEM_PASS_AMBIGUOUS_PATHS")]
    pub pass_ambiguous_paths: bool,

    /// Proxy mode: what an upstream answer lost after the request was sent means.
    #[arg(long, env = "IDEM_UPSTREAM_UNKNOWN_OUTCOME", value_enum, default_value_t = UnknownOutcome::Store)]
    pub upstream_unknown_outcome: UnknownOutcome,

    /// Proxy mode: the upstream's private response header meaning "nothing happened":
    /// the key is released and the header never reaches the client. Its name starts
    /// with `idem-` (or `x-idem-`): a release is never inferred from a header something
    /// else may put on any answer.
    #[arg(long, env = "IDEM_RELEASE_HEADER", default_value = "idem-release", value_parser = parse_release_header)]
    pub release_header: http::HeaderName,

    /// The answer statuses after which nothing is stored and the key is freed, so a
    /// client can correct what the API refused before acting and retry with the same
    /// key: 4xx statuses, comma-separated; `default` (with more statuses, if you like:
    /// `default,404`), or `none`. Default: `default` in proxy mode — 400, 401, 403, 405,
    /// 406, 408, 411, 413, 415, 422 and 429, statuses an API answers before it acts (the
    /// proxy mode's guide, docs/guide/proxy.md, says why each is in or out) — and `none` for the built-in app, which says
    /// "nothing happened" itself. A 2xx, 3xx or 5xx is always stored: a 5xx can follow
    /// an effect. Name only statuses your API answers before acting: a released
    /// request is run again.
    #[arg(long, env = "IDEM_RELEASE_ON", value_parser = parse_release_on)]
    pub release_on: Option<contract::ReleaseOn>,

    /// The request headers the key is read from, comma-separated, instead of
    /// Idempotency-Key (e.g. `x-idempotency-key`, or `idempotency-key,x-idempotency-key`
    /// while clients move). A request with keys in two of them is refused, and so is
    /// one with an Idempotency-Key where it is not read: its client would believe it
    /// guarded.
    #[arg(long, env = "IDEM_KEY_HEADER", value_delimiter = ',', value_parser = parse_key_header)]
    pub key_header: Option<Vec<String>>,

    /// Fields of a JSON body left out of its fingerprint, as JSON Pointers (RFC 6901),
    /// comma-separated: `/sent_at,/meta/trace_id`. A retry that differs only there (a
    /// timestamp, a nonce, a trace id it sets anew) gets the first answer instead of
    /// 422; a change anywhere else is still 422. Not with --fingerprint-only.
    #[arg(long, env = "IDEM_FINGERPRINT_EXCEPT", value_delimiter = ',')]
    pub fingerprint_except: Option<Vec<String>>,

    /// The only fields of a JSON body its fingerprint covers, as JSON Pointers,
    /// comma-separated: `/amount,/currency,/customer`. Everything else in the body may
    /// differ between retries. Not with --fingerprint-except.
    #[arg(long, env = "IDEM_FINGERPRINT_ONLY", value_delimiter = ',')]
    pub fingerprint_only: Option<Vec<String>>,

    /// Request headers whose values are part of the fingerprint too, comma-separated
    /// (e.g. a tenant or API-version header that changes what the request means).
    #[arg(long, env = "IDEM_FINGERPRINT_HEADERS", value_delimiter = ',')]
    pub fingerprint_headers: Option<Vec<String>>,

    /// Paths on which POST and PATCH need an Idempotency-Key, comma-separated; a
    /// trailing * matches a prefix (/v1/*). Without it: /v1/charges for the demo, none
    /// in proxy mode.
    #[arg(long, env = "IDEM_REQUIRE_KEY_ON", value_delimiter = ',')]
    pub require_key_on: Option<Vec<String>>,

    /// Replay an answer's Set-Cookie headers too (a cookie is usually meant for one
    /// client, so they are not replayed unless asked).
    #[arg(long, env = "IDEM_REPLAY_SET_COOKIE")]
    pub replay_set_cookie: bool,

    /// More answer headers to store and replay, comma-separated, besides the defaults
    /// (Content-Type, Location, Cache-Control…): e.g. `etag,link,retry-after,
    /// x-ratelimit-remaining`. Not those of the moment or the connection (Date, Age,
    /// Content-Length, hop-by-hop), idem's own, Set-Cookie (--replay-set-cookie), nor
    /// Access-Control-* (--cors-origin).
    #[arg(long, env = "IDEM_REPLAY_HEADERS", value_delimiter = ',', value_parser = parse_replay_header)]
    pub replay_headers: Option<Vec<String>>,

    /// The origins whose pages may read idem's own answers (replays, 409, 422 and
    /// other refusals), comma-separated: `https://app.example`, or `*` for any. Browsers
    /// hide an answer without Access-Control-Allow-Origin from the page, so a retry
    /// from a browser could not read its payment's result. The API's own answers are
    /// left as it wrote them, and preflights (OPTIONS) reach it: it must allow the
    /// Idempotency-Key header in them. Off without it.
    #[arg(long, env = "IDEM_CORS_ORIGIN", value_delimiter = ',')]
    pub cors_origin: Option<Vec<String>>,

    /// With --cors-origin: pages may read idem's answers to requests sent with
    /// credentials (cookies, Authorization). Not with `*`.
    #[arg(long, env = "IDEM_CORS_CREDENTIALS")]
    pub cors_credentials: bool,

    /// Who a key belongs to: `authorization` (the bearer token, Basic credentials or a
    /// lone token, hashed: a refreshed token is a new caller; another scheme, such as a
    /// signature new on every attempt, is refused), `header:<name>` (a header's value: an API key, or a
    /// principal a trusted gateway sets), or `jwt:<claim>` (a claim of the bearer JWT,
    /// verified with HS256 and --jwt-secret-file, or RS256/ES256 and --jwks-file: a
    /// refreshed token keeps its scope).
    #[arg(long, env = "IDEM_SCOPE_FROM", default_value = "authorization")]
    pub scope_from: String,

    /// The secret idem's edge in front proves itself with (its EDGE_SECRET), read from
    /// this file: one per line, each at least 16 visible ASCII bytes (`openssl rand
    /// -hex 32`); two lines while rotating. Only requests that carry one are told what
    /// idem stored (idem-disposition, idem-stored-headers), which the edge keeps its
    /// copies by; without it no answer carries them, and an edge in front keeps nothing.
    #[arg(long, env = "IDEM_EDGE_SECRET_FILE")]
    pub edge_secret_file: Option<std::path::PathBuf>,

    /// The HS256 key for --scope-from jwt:<claim>, read from this file (a trailing
    /// newline is not part of it).
    #[arg(long, env = "IDEM_JWT_SECRET_FILE")]
    pub jwt_secret_file: Option<std::path::PathBuf>,

    /// The identity provider's public keys (a JWKS, JSON) for --scope-from
    /// jwt:<claim> with RS256 or ES256 tokens; not with --jwt-secret-file.
    #[arg(long, env = "IDEM_JWKS_FILE")]
    pub jwks_file: Option<std::path::PathBuf>,

    /// The issuer (`iss`) a token must name; required with --jwks-file.
    #[arg(long, env = "IDEM_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// The audience (`aud`, or one of its list) a token must name; required with
    /// --jwks-file.
    #[arg(long, env = "IDEM_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// Whether a JWT must carry `exp`: a token that never expires names its principal
    /// for ever, to whoever holds it. `--jwt-require-exp false` accepts such tokens.
    #[arg(long, env = "IDEM_JWT_REQUIRE_EXP", default_value_t = true, action = clap::ArgAction::Set)]
    pub jwt_require_exp: bool,

    /// A guarded request that says nowhere who it is. Without it: refused in proxy mode
    /// (idem can't tell an upstream's callers apart by itself, and callers sharing a
    /// scope replay each other's answers); scoped only for the demo's own API.
    #[arg(long, env = "IDEM_ANONYMOUS", value_enum)]
    pub anonymous: Option<AnonymousCallers>,

    /// A proxy or load balancer in front of idem sets the forwarding headers
    /// (X-Forwarded-*, X-Real-IP, Forwarded, True-Client-IP…) itself and drops the
    /// client's: only then may --scope-from, or a route's scope_from, name one of them.
    /// Without it such a scope is refused at start-up: any client could name another's.
    #[arg(long, env = "IDEM_TRUSTED_PROXY")]
    pub trusted_proxy: bool,

    /// A TOML file of per-path settings (TTL, lease, waits, guarded methods, key
    /// required, scope), tried in order before these flags' (docs/guide/proxy.md, "The
    /// route file").
    #[arg(long, env = "IDEM_ROUTES")]
    pub routes: Option<std::path::PathBuf>,

    /// Where the demo charges API keeps its charges.
    #[arg(long, env = "IDEM_DEMO_LEDGER", value_enum, default_value_t = DemoLedger::Auto)]
    pub demo_ledger: DemoLedger,

    /// How the demo commits a charge with its idempotency record.
    #[arg(long, env = "IDEM_DEMO_COMPLETION", value_enum, default_value_t = DemoCompletion::Auto)]
    pub demo_completion: DemoCompletion,

    /// Lets a request ask the demo for a fault with a `Demo-Fault` header: abort the
    /// process right after the charge commits (`abort-after-charge`), or stall right
    /// before it commits (`stall-before-commit=<ms>`). Refused with 400 when off. For fault
    /// tests only.
    #[arg(long, env = "IDEM_DEMO_FAULTS")]
    pub demo_faults: bool,

    /// Log format.
    #[arg(long, env = "IDEM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// What the `type` URIs of idem's problems start with: a page of yours with a
    /// section per problem name (`…#request-in-flight`). Default: this project's
    /// docs/problems.md on GitHub, which explains each.
    #[arg(long, env = "IDEM_PROBLEM_BASE", default_value = contract::DEFAULT_PROBLEM_BASE, value_parser = parse_problem_base)]
    pub problem_base: String,

    /// Serve idem's own endpoints — /healthz, /readyz and /metrics — on this address
    /// instead of --listen, so that every path of --listen is the API's (in proxy mode
    /// an upstream's own /healthz or /metrics is then reached, not hidden by idem's).
    /// /metrics stays on the admin listener with --metrics-on-admin.
    #[arg(long, env = "IDEM_OPS_LISTEN")]
    pub ops_listen: Option<SocketAddr>,

    /// Serve the admin API (look up, list and purge records) on this address, apart
    /// from the API's listener; off without it. Needs --admin-token-file.
    #[arg(long, env = "IDEM_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,

    /// The admin API's bearer tokens: one per line, `<operator>:<token>` (the
    /// operator's name goes into every admin log line) or a bare token; at least 16
    /// characters each.
    #[arg(long, env = "IDEM_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<std::path::PathBuf>,

    /// The admin listener's certificate chain (PEM, its own first): the admin API is
    /// then served over TLS only. Needs --admin-tls-key. Without it the admin API is
    /// plain HTTP, and its tokens cross the network in clear: keep --admin-listen on
    /// loopback then (another address is warned about at start-up).
    #[arg(long, env = "IDEM_ADMIN_TLS_CERT", requires = "admin_tls_key")]
    pub admin_tls_cert: Option<std::path::PathBuf>,

    /// The private key (PEM) of --admin-tls-cert.
    #[arg(long, env = "IDEM_ADMIN_TLS_KEY", requires = "admin_tls_cert")]
    pub admin_tls_key: Option<std::path::PathBuf>,

    /// Serve /metrics on the admin listener only, not on --listen.
    #[arg(long, env = "IDEM_METRICS_ON_ADMIN")]
    pub metrics_on_admin: bool,

    /// Send traces (a span per guarded request, its store round trips as child spans)
    /// over OTLP/HTTP to this receiver, e.g. http://127.0.0.1:4318 (a collector).
    /// Without it, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT
    /// say where, as OpenTelemetry's SDKs read them (OTEL_TRACES_EXPORTER=none turns
    /// it off); none set, no traces. The service name is OTEL_SERVICE_NAME, else
    /// idem-origin; OTEL_EXPORTER_OTLP_HEADERS and OTEL_RESOURCE_ATTRIBUTES apply.
    #[arg(long, env = "IDEM_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

impl Config {
    /// The record store: --store, memory when not given.
    pub fn store_kind(&self) -> StoreKind {
        self.store.unwrap_or(StoreKind::Memory)
    }

    /// What one client may hold of each listener.
    pub fn limits(&self) -> crate::serve::Limits {
        crate::serve::Limits {
            header_read: self.header_read_timeout,
            body_idle: self.body_idle_timeout,
            body_read: self.body_read_timeout,
            max_connections: self.max_connections,
            max_requests: self.max_requests,
            write_idle: self.write_timeout,
            drain: self.drain_timeout,
            problem_base: problem_base(&self.problem_base),
            serves_probes: true,
        }
    }

    /// Refuses a limit that would turn off what it bounds, or refuse every request.
    fn check_limits(&self) -> Result<(), String> {
        for (flag, value) in [
            ("--header-read-timeout", self.header_read_timeout),
            ("--body-idle-timeout", self.body_idle_timeout),
            ("--body-read-timeout", self.body_read_timeout),
            ("--write-timeout", self.write_timeout),
        ] {
            if value.is_zero() {
                return Err(format!(
                    "{flag} must be more than 0: a client could hold a connection for ever"
                ));
            }
        }
        if self.max_connections == 0 || self.max_requests == 0 {
            return Err("--max-connections and --max-requests must be at least 1".into());
        }
        if self.max_buffered_body_bytes < self.max_body_bytes {
            return Err(format!(
                "--max-buffered-body-bytes ({}) must be at least --max-body-bytes ({}): a body \
                 of the largest size accepted could never be read",
                self.max_buffered_body_bytes, self.max_body_bytes
            ));
        }
        if self.memory_max_records == 0 || self.memory_max_bytes == 0 {
            return Err("--memory-max-records and --memory-max-bytes must be at least 1".into());
        }
        if self.scope_max_new_keys > 0 && self.scope_new_keys_window.is_zero() {
            return Err(
                "--scope-new-keys-window must be more than 0 with --scope-max-new-keys".into(),
            );
        }
        Ok(())
    }

    /// How a guarded request's scope is found (--scope-from, --jwt-secret-file,
    /// --anonymous); the error names the flag to fix.
    pub fn scope_rule(&self) -> Result<ScopeRule, String> {
        let source = ScopeSource::parse(&self.scope_from, self.jwt_verifier()?).map_err(|e| {
            format!("--scope-from: {e} (--jwt-secret-file or --jwks-file gives it)")
        })?;
        self.check_scope_header(&source)
            .map_err(|e| format!("--scope-from: {e}"))?;
        Ok(ScopeRule {
            source,
            anonymous: self.anonymous_default(),
        })
    }

    /// Refuses a scope by a header any client can set to anything — one proxies set
    /// (`X-Forwarded-For`, `X-Real-IP`, `Forwarded`…) — unless --trusted-proxy says a
    /// proxy in front sets it and drops the client's.
    pub fn check_scope_header(&self, source: &ScopeSource) -> Result<(), String> {
        match source {
            ScopeSource::Header(name)
                if idem_core::contract::forgeable(name) && !self.trusted_proxy =>
            {
                Err(format!(
                    "header:{name} is one proxies set, and a client can set it to anything: \
                     scoped by it, a caller names another's scope. Scope by the credential \
                     your clients authenticate with, or pass --trusted-proxy if a proxy in \
                     front of idem sets {name} and drops the client's"
                ))
            }
            _ => Ok(()),
        }
    }

    /// The keys of --jwt-secret-file or --jwks-file, if one is given.
    pub fn jwt_keys(&self) -> Result<Option<JwtKeys>, String> {
        let secret = self
            .jwt_secret_file
            .as_deref()
            .map(read_secret)
            .transpose()
            .map_err(|e| format!("--jwt-secret-file {e}"))?;
        let jwks = self
            .jwks_file
            .as_deref()
            .map(read_file)
            .transpose()
            .map_err(|e| format!("--jwks-file {e}"))?;
        JwtKeys::either(secret, jwks.as_deref())
            .map_err(|e| format!("--jwt-secret-file, --jwks-file: {e}"))
    }

    /// How a JWT is accepted: the keys of --jwt-secret-file or --jwks-file, and
    /// --jwt-issuer and --jwt-audience; none without keys.
    pub fn jwt_verifier(&self) -> Result<Option<JwtVerifier>, String> {
        jwt_verifier(
            self.jwt_keys()?,
            self.jwt_issuer.as_deref(),
            self.jwt_audience.as_deref(),
            self.jwt_require_exp,
        )
        .map_err(|e| format!("--jwt-issuer, --jwt-audience: {e}"))
    }

    /// The headers keys are read from, unless a route says otherwise.
    pub fn key_headers(&self) -> Result<contract::KeyHeaders, String> {
        match &self.key_header {
            None => Ok(contract::KeyHeaders::default()),
            Some(names) => {
                contract::KeyHeaders::new(names).map_err(|e| format!("--key-header: {e}"))
            }
        }
    }

    /// Which parts of a request its fingerprint covers, unless a route says otherwise.
    pub fn fingerprint_rule(&self) -> Result<idem_core::FingerprintRule, String> {
        let list = |v: &Option<Vec<String>>| -> Vec<String> {
            v.iter()
                .flatten()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        };
        idem_core::FingerprintRule::new(
            &list(&self.fingerprint_only),
            &list(&self.fingerprint_except),
            &list(&self.fingerprint_headers),
        )
        .map_err(|e| {
            format!("--fingerprint-only, --fingerprint-except, --fingerprint-headers: {e}")
        })
    }

    /// The answer headers stored and replayed, unless a route adds more: the defaults,
    /// `Set-Cookie` with --replay-set-cookie, and --replay-headers.
    pub fn replayed_headers(&self) -> Vec<String> {
        let mut names: Vec<String> = contract::DEFAULT_CACHED_HEADERS
            .iter()
            .map(|h| (*h).to_owned())
            .collect();
        if self.replay_set_cookie {
            names.push("set-cookie".into());
        }
        for name in self.replay_headers.iter().flatten() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        names
    }

    /// Who may read idem's answers across origins, unless a route says otherwise.
    pub fn cors(&self) -> Result<Option<contract::Cors>, String> {
        match &self.cors_origin {
            None if self.cors_credentials => Err("--cors-credentials needs --cors-origin".into()),
            None => Ok(None),
            Some(origins) => contract::Cors::new(origins, self.cors_credentials)
                .map(Some)
                .map_err(|e| format!("--cors-origin: {e}")),
        }
    }

    /// The statuses that free a key, unless a route says otherwise.
    pub fn release_on_default(&self) -> contract::ReleaseOn {
        match self.release_on {
            Some(statuses) => statuses,
            None if self.upstream.is_some() => contract::ReleaseOn::proxy_default(),
            None => contract::ReleaseOn::NONE,
        }
    }

    /// What a request without an identity gets, unless a route says otherwise.
    pub fn anonymous_default(&self) -> Anonymous {
        match self.anonymous {
            Some(AnonymousCallers::Scoped) => Anonymous::Scoped,
            Some(AnonymousCallers::Refused) => Anonymous::Refused,
            None if self.upstream.is_some() => Anonymous::Refused,
            None => Anonymous::Scoped,
        }
    }

    /// The route file's routes, checked; none without `--routes`.
    pub fn routes(&self) -> Result<Vec<crate::routes::Route>, String> {
        match &self.routes {
            Some(path) => crate::routes::load(path, self),
            None => Ok(Vec::new()),
        }
    }

    /// Checks the combinations clap can't; the message names the flag to fix.
    /// The admin API's tokens when it is on; the error says what is missing or wrong.
    pub fn admin_tokens(&self) -> Result<Option<idem::admin::Tokens>, String> {
        match (&self.admin_listen, &self.admin_token_file) {
            (None, None) if self.metrics_on_admin => {
                Err("--metrics-on-admin needs --admin-listen".into())
            }
            (None, None) => Ok(None),
            (None, Some(_)) => Err("--admin-token-file is for --admin-listen, which is not set".into()),
            (Some(_), None) => Err(
                "--admin-listen needs --admin-token-file: the admin API is never served without tokens"
                    .into(),
            ),
            (Some(listen), Some(_)) if *listen == self.listen => {
                Err("--admin-listen must differ from --listen".into())
            }
            (Some(_), Some(file)) => idem::admin::Tokens::from_file(file)
                .map(Some)
                .map_err(String::from),
        }
    }

    /// The secrets of --edge-secret-file, one per line, each checked; none without it.
    pub fn edge_secrets(&self) -> Result<Vec<Vec<u8>>, String> {
        let Some(path) = &self.edge_secret_file else {
            return Ok(Vec::new());
        };
        let text = read_file(path).map_err(|e| format!("--edge-secret-file {e}"))?;
        let secrets: Vec<Vec<u8>> = text
            .split(|b| *b == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line).to_vec())
            .filter(|line| !line.is_empty())
            .collect();
        if secrets.is_empty() {
            return Err(format!(
                "--edge-secret-file {}: holds no secret",
                path.display()
            ));
        }
        for (n, secret) in secrets.iter().enumerate() {
            idem_core::contract::check_edge_secret(secret).map_err(|e| {
                format!("--edge-secret-file {}: line {}: {e}", path.display(), n + 1)
            })?;
        }
        Ok(secrets)
    }

    /// Where traces go (--otlp-endpoint, or OpenTelemetry's variables); `None`: off.
    pub fn traces_endpoint(&self) -> Result<Option<String>, String> {
        let url = crate::telemetry::endpoint(self.otlp_endpoint.as_deref(), |name| {
            std::env::var(name).ok()
        })?;
        if url.is_none() && self.otlp_endpoint.is_some() {
            // Said before logging is set up: the kill switch wins, but not silently.
            eprintln!(
                "idem-origin: warning: --otlp-endpoint is set, but OTEL_TRACES_EXPORTER=none \
                 or OTEL_SDK_DISABLED=true turns traces off"
            );
        }
        Ok(url)
    }

    /// TLS to the upstream, as the flags give it.
    pub fn upstream_tls(&self) -> Result<crate::upstream_tls::UpstreamTls, String> {
        let client_cert = match (&self.upstream_client_cert, &self.upstream_client_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => return Err("--upstream-client-cert and --upstream-client-key go together".into()),
        };
        Ok(crate::upstream_tls::UpstreamTls {
            ca_file: self.upstream_ca_file.clone(),
            client_cert,
            server_name: self.upstream_tls_name.clone(),
        })
    }

    /// The admin listener's TLS acceptor, when --admin-tls-cert is given.
    pub fn admin_tls(&self) -> Result<Option<tokio_rustls::TlsAcceptor>, String> {
        match (&self.admin_tls_cert, &self.admin_tls_key) {
            (Some(cert), Some(key)) => {
                if self.admin_listen.is_none() {
                    return Err("--admin-tls-cert is for --admin-listen, which is not set".into());
                }
                crate::serve::tls_acceptor(cert, key)
                    .map(Some)
                    .map_err(|e| format!("--admin-tls-cert, --admin-tls-key: {e}"))
            }
            _ => Ok(None),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if let Some(ops) = self.ops_listen {
            if ops == self.listen {
                return Err("--ops-listen must differ from --listen".into());
            }
            if Some(ops) == self.admin_listen {
                return Err("--ops-listen must differ from --admin-listen".into());
            }
        }
        self.scope_rule()?;
        self.check_limits()?;
        self.admin_tokens()?;
        self.admin_tls()?;
        self.edge_secrets()?;
        self.traces_endpoint()?;
        let tls = self.upstream_tls()?;
        if self.upstream.is_none() && tls.is_set() {
            return Err("--upstream-ca-file, --upstream-client-cert and --upstream-tls-name are for proxy mode (--upstream https://…)".into());
        }
        if let Some(url) = &self.upstream {
            let uri = crate::proxy::parse_upstream_url(url)?;
            match uri.scheme_str() {
                Some("https") => {
                    tls.client_config()?;
                    tls.server_name()?;
                }
                _ if tls.is_set() => {
                    return Err("--upstream-ca-file, --upstream-client-cert and --upstream-tls-name are for an https:// upstream".into());
                }
                _ => {}
            }
            if self.store.is_none() {
                return Err(
                    "proxy mode needs its store named: --store postgres, redis or tiered \
                            keep the upstream's records across restarts and replicas; --store \
                            memory keeps them in this process only (a restart forgets every key)"
                        .into(),
                );
            }
            if self.upstream_timeout.is_zero() {
                return Err("--upstream-timeout must be more than 0".into());
            }
            // Within the connect timeout nothing may have been sent: a request cut off
            // there would be stored as an unknown outcome for a payment never made.
            let connect = self
                .upstream_timeout
                .min(std::time::Duration::from_secs(10));
            if !self.max_execution.is_zero() && self.max_execution <= connect {
                return Err(format!(
                    "--max-execution ({:?}) must be longer than the upstream connect timeout ({connect:?}, --upstream-timeout up to 10 s): a request still connecting would be stored as an unknown outcome though nothing was sent",
                    self.max_execution
                ));
            }
        }
        if self.store_kind() == StoreKind::Postgres
            && self.database_url.as_deref().is_none_or(str::is_empty)
        {
            return Err("--store postgres needs --database-url (or DATABASE_URL), e.g. postgres://postgres@127.0.0.1:5432/idem".into());
        }
        let missing = |v: &Option<String>| v.as_deref().is_none_or(str::is_empty);
        if matches!(self.store_kind(), StoreKind::Redis | StoreKind::Tiered)
            && missing(&self.redis_url)
        {
            return Err(format!(
                "--store {} needs --redis-url (or IDEM_REDIS_URL), e.g. redis://127.0.0.1:6379",
                if self.store_kind() == StoreKind::Redis {
                    "redis"
                } else {
                    "tiered"
                }
            ));
        }
        if self.demo_ledger == DemoLedger::Postgres && missing(&self.database_url) {
            return Err("--demo-ledger postgres needs --database-url (or DATABASE_URL)".into());
        }
        if self.demo_completion == DemoCompletion::Transactional
            && (!matches!(self.store_kind(), StoreKind::Postgres | StoreKind::Tiered)
                || self.demo_ledger == DemoLedger::Memory)
        {
            return Err("--demo-completion transactional needs the records and the charges in one Postgres: --store postgres or tiered, and --demo-ledger auto or postgres".into());
        }
        if self.store_kind() == StoreKind::Tiered && missing(&self.database_url) {
            return Err(
                "--store tiered needs --database-url (or DATABASE_URL) for the Postgres authority"
                    .into(),
            );
        }
        if self.redis_namespace.is_empty() || self.redis_namespace.contains(['{', '}']) {
            return Err("--redis-namespace must be non-empty and free of braces".into());
        }
        if self.outbox_capacity == 0 || self.outbox_batch == 0 {
            return Err("--outbox-capacity and --outbox-batch must be at least 1".into());
        }
        if self.lease < crate::routes::MIN_LEASE {
            return Err(
                "--lease must be at least 250ms: a claim must come back within two thirds of it, less the clock tolerance (50 ms at least)".into(),
            );
        }
        if self.lease.as_millis() > u128::from(idem_core::Policy::MAX_LEASE_MS) {
            return Err("--lease must be at most a year (365d)".into());
        }
        if self.ttl <= self.lease {
            return Err(format!(
                "--ttl ({:?}) must be longer than --lease ({:?}): answers must outlive the claims that make them",
                self.ttl, self.lease
            ));
        }
        if self.pg_pool_size == 0 {
            return Err("--pg-pool-size must be at least 1".into());
        }
        if self.max_body_bytes == 0 {
            return Err("--max-body-bytes must be at least 1".into());
        }
        if self.store_timeout.is_zero() || self.sweep_interval.is_zero() {
            return Err("--store-timeout and --sweep-interval must be greater than zero".into());
        }
        for pattern in self.require_key_on.iter().flatten().map(|p| p.trim()) {
            if !pattern.is_empty() {
                idem_core::contract::check_pattern(pattern)
                    .map_err(|e| format!("--require-key-on: {e}"))?;
            }
        }
        // Last: a route's error must not stand for a flag's.
        self.routes()?;
        Ok(())
    }
}

/// Parses `500ms`, `30s`, `5m`, `24h`, `7d`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration: use e.g. 500ms, 30s, 5m, 24h, 7d"))?;
    let ms_per = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => {
            return Err(format!(
                "unknown duration unit {other:?}: use ms, s, m, h or d"
            ))
        }
    };
    n.checked_mul(ms_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// An HS256 key from `path`; a trailing newline is not part of it. The error starts
/// with the path.
pub fn read_secret(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let mut bytes = read_file(path)?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    Ok(bytes)
}

/// A verifier for `keys`, if any, requiring `issuer` and `audience` when given.
pub fn jwt_verifier(
    keys: Option<JwtKeys>,
    issuer: Option<&str>,
    audience: Option<&str>,
    require_exp: bool,
) -> Result<Option<JwtVerifier>, String> {
    keys.map(|keys| {
        JwtVerifier::new(keys, issuer, audience).map(|jwt| jwt.exp_optional(!require_exp))
    })
    .transpose()
    .map_err(String::from)
}

/// The bytes of `path`; the error starts with the path.
pub fn read_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: cannot read it: {e}", path.display()))
}

/// A header name, e.g. `idem-release`.
pub fn parse_header_name(s: &str) -> Result<http::HeaderName, String> {
    http::HeaderName::from_bytes(s.trim().as_bytes())
        .map_err(|_| format!("{s:?} is not a header name"))
}

/// One `--key-header` name, checked as [`contract::KeyHeaders::new`] checks it.
pub fn parse_key_header(s: &str) -> Result<String, String> {
    contract::KeyHeaders::new([s])?;
    Ok(s.trim().to_ascii_lowercase())
}

/// `--problem-base` ([`contract::check_problem_base`]).
pub fn parse_problem_base(s: &str) -> Result<String, String> {
    contract::check_problem_base(s.trim())?;
    Ok(s.trim().to_owned())
}

/// One `--replay-headers` name ([`contract::check_replay_header`]).
pub fn parse_replay_header(s: &str) -> Result<String, String> {
    contract::check_replay_header(s).map_err(String::from)
}

/// `--release-on`: [`contract::ReleaseOn::parse`].
pub fn parse_release_on(s: &str) -> Result<contract::ReleaseOn, String> {
    contract::ReleaseOn::parse(s).map_err(String::from)
}

/// `--release-header`: a header name private to the upstream and idem, `idem-…` (or
/// `x-idem-…`). A claim is released only by that private signal, never inferred from a
/// header something else may put on any answer — a standard one (`Cache-Control`), or
/// one that proxies, tracing or security middleware stamp (`X-Request-Id`, `CF-Ray`…),
/// which would free every key, and let every retry charge again — nor from idem's own.
pub fn parse_release_header(s: &str) -> Result<http::HeaderName, String> {
    use idem_core::contract;
    let name = parse_header_name(s)?;
    let own = [
        contract::IDEMPOTENCY_KEY,
        contract::IDEMPOTENT_REPLAYED,
        contract::KEY_TTL,
        contract::FENCING_TOKEN,
        contract::DOWNSTREAM_KEY,
        contract::ORIGIN_DISPOSITION,
        contract::STORED_HEADERS,
        contract::EXECUTION_TRACE,
        contract::EDGE_SECRET,
    ];
    if own.contains(&name.as_str()) {
        return Err(format!(
            "{name} is one of idem's own headers: a release needs a private one, e.g. idem-release"
        ));
    }
    let private = ["idem-", "x-idem-"]
        .iter()
        .any(|prefix| name.as_str().starts_with(prefix) && name.as_str().len() > prefix.len());
    if !private {
        return Err(format!(
            "{name} is not private to idem and the upstream: a release is signalled by a header named idem-… (or x-idem-…), e.g. idem-release, that nothing else puts on an answer"
        ));
    }
    Ok(name)
}

/// `--redis-layout`: [`RedisLayout`] on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RedisLayoutArg {
    /// The record's encoding as a string.
    String,
    /// A hash of t, s, r (idem 0.1's layout).
    Hash,
}

impl From<RedisLayoutArg> for RedisLayout {
    fn from(l: RedisLayoutArg) -> RedisLayout {
        match l {
            RedisLayoutArg::String => RedisLayout::String,
            RedisLayoutArg::Hash => RedisLayout::Hash,
        }
    }
}

/// `--durability`: [`Durability`] on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TieredDurability {
    /// Before the handler runs / before the answer is returned: a Redis crash loses nothing.
    Sync,
    /// Written behind by a batching outbox: faster, and a Redis crash can lose a claim.
    Async,
}

impl From<TieredDurability> for Durability {
    fn from(d: TieredDurability) -> Durability {
        match d {
            TieredDurability::Sync => Durability::Sync,
            TieredDurability::Async => Durability::Async,
        }
    }
}

/// `--pg-strategy`: [`PgStrategy`] on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ClaimStrategy {
    /// `INSERT … ON CONFLICT DO NOTHING` plus compare-and-swap: one round trip per new key.
    OnConflict,
    /// `pg_advisory_xact_lock(hashtext(key))`, then read and write in one transaction.
    AdvisoryLock,
    /// SELECT then INSERT without a lock. Unsafe on purpose: for race tests only, and
    /// only in builds with the `testing` feature.
    Naive,
}

impl ClaimStrategy {
    /// The store's strategy; `naive` is refused unless built in.
    pub fn strategy(self) -> Result<PgStrategy, String> {
        match self {
            ClaimStrategy::OnConflict => Ok(PgStrategy::OnConflict),
            ClaimStrategy::AdvisoryLock => Ok(PgStrategy::AdvisoryLock),
            #[cfg(feature = "testing")]
            ClaimStrategy::Naive => Ok(PgStrategy::Naive),
            #[cfg(not(feature = "testing"))]
            ClaimStrategy::Naive => Err(
                "--pg-strategy naive is unsafe on purpose and only built for tests (cargo feature `testing`)".into(),
            ),
        }
    }
}

/// `base` for the process's lifetime: the server's own refusals carry it in [`crate::serve::Limits`],
/// which is `Copy`. The default is never copied; another base is leaked once per
/// distinct value (a process has one).
fn problem_base(base: &str) -> &'static str {
    use std::sync::Mutex;
    static KEPT: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    if base == contract::DEFAULT_PROBLEM_BASE {
        return contract::DEFAULT_PROBLEM_BASE;
    }
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = kept.iter().find(|b| **b == base) {
        return found;
    }
    let leaked: &'static str = Box::leak(base.to_owned().into_boxed_str());
    kept.push(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_any_client_can_forge_is_refused_unless_a_proxy_sets_it() {
        for header in [
            "x-forwarded-for",
            "X-Real-IP",
            "forwarded",
            "x-forwarded-host",
            "true-client-ip",
        ] {
            let spec = format!("header:{header}");
            let config = Config::try_parse_from(["idem-origin", "--scope-from", &spec]).unwrap();
            let error = config.scope_rule().unwrap_err();
            assert!(
                error.starts_with("--scope-from: header:") && error.contains("--trusted-proxy"),
                "{header}: {error}"
            );
            let trusted =
                Config::try_parse_from(["idem-origin", "--scope-from", &spec, "--trusted-proxy"])
                    .unwrap();
            assert!(
                trusted.scope_rule().is_ok(),
                "{header} behind a trusted proxy"
            );
        }
        let api_key =
            Config::try_parse_from(["idem-origin", "--scope-from", "header:x-api-key"]).unwrap();
        assert!(api_key.scope_rule().is_ok());
    }

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5 weeks").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("99999999999999999d").is_err());
    }

    #[test]
    fn proxy_mode_outlasts_its_connect_timeout() {
        let with = |max: &str| {
            Config::try_parse_from([
                "idem-origin",
                "--upstream",
                "http://127.0.0.1:9",
                "--store",
                "memory",
                "--upstream-timeout",
                "5s",
                "--max-execution",
                max,
            ])
            .unwrap()
            .validate()
        };
        assert!(with("3s").unwrap_err().contains("connect timeout"));
        assert!(with("5s").is_err());
        assert_eq!(with("6s"), Ok(()));
        assert_eq!(with("0"), Ok(()), "0 is the bounded default");
    }

    #[test]
    fn tls_to_the_upstream_is_checked_at_start_up() {
        let check = |args: &[&str]| {
            let mut argv = vec!["idem-origin", "--store", "memory"];
            argv.extend_from_slice(args);
            Config::try_parse_from(argv).unwrap().validate()
        };
        let cases: &[(&[&str], &str)] = &[
            (
                &["--upstream-ca-file", "/etc/hostname"],
                "are for proxy mode",
            ),
            (
                &[
                    "--upstream",
                    "http://127.0.0.1:9",
                    "--upstream-tls-name",
                    "x",
                ],
                "are for an https:// upstream",
            ),
            (
                &[
                    "--upstream",
                    "https://127.0.0.1:9",
                    "--upstream-client-cert",
                    "/x",
                ],
                "go together",
            ),
            (
                &[
                    "--upstream",
                    "https://127.0.0.1:9",
                    "--upstream-ca-file",
                    "/nonexistent/ca.pem",
                ],
                "--upstream-ca-file /nonexistent/ca.pem: cannot read it",
            ),
            (
                &[
                    "--upstream",
                    "https://127.0.0.1:9",
                    "--upstream-ca-file",
                    "/etc/hostname",
                ],
                "holds no certificate",
            ),
            (
                &["--upstream", "ftp://127.0.0.1:9"],
                "must be an http:// or https:// URL",
            ),
            (
                &["--ops-listen", "127.0.0.1:8080"],
                "--ops-listen must differ from --listen",
            ),
        ];
        for (args, says) in cases {
            let error = check(args).unwrap_err();
            assert!(error.contains(says), "{args:?}: {error}");
        }
        let base = Config::try_parse_from(["idem-origin", "--problem-base", "docs/problems#"])
            .unwrap_err()
            .to_string();
        assert!(base.contains("cannot prefix problem types"), "{base}");
    }

    #[test]
    fn a_release_header_is_private() {
        let with = |name: &str| Config::try_parse_from(["idem-origin", "--release-header", name]);
        assert_eq!(
            Config::try_parse_from(["idem-origin"])
                .unwrap()
                .release_header,
            "idem-release"
        );
        assert_eq!(
            with("Idem-Nothing-Happened").unwrap().release_header,
            "idem-nothing-happened"
        );
        assert_eq!(
            with("x-idem-release").unwrap().release_header,
            "x-idem-release"
        );
        for stamped in [
            "cache-control",
            "Retry-After",
            "traceparent",
            "x-request-id",
            "cf-ray",
            "idem-",
        ] {
            let refused = with(stamped).unwrap_err().to_string();
            assert!(refused.contains("not private"), "{refused}");
        }
        for own in [
            "idem-disposition",
            "idempotent-replayed",
            "idem-fencing-token",
        ] {
            let refused = with(own).unwrap_err().to_string();
            assert!(refused.contains("idem's own"), "{refused}");
        }
    }

    #[test]
    fn proxy_mode_names_its_store() {
        let proxy = |more: &[&str]| {
            let mut argv = vec!["idem-origin", "--upstream", "http://127.0.0.1:9"];
            argv.extend_from_slice(more);
            Config::try_parse_from(argv).unwrap().validate()
        };
        let refused = proxy(&[]).unwrap_err();
        assert!(refused.contains("--store memory keeps"), "{refused}");
        assert_eq!(
            proxy(&["--store", "memory"]),
            Ok(()),
            "memory, asked for by name"
        );
        // The demo keeps its zero-set-up default.
        let demo = Config::try_parse_from(["idem-origin"]).unwrap();
        assert_eq!(
            (demo.validate(), demo.store_kind()),
            (Ok(()), StoreKind::Memory)
        );
    }

    #[test]
    fn limits_that_turn_off_what_they_bound_are_refused() {
        let with = |more: &[&str]| {
            let mut argv = vec!["idem-origin"];
            argv.extend_from_slice(more);
            Config::try_parse_from(argv).unwrap().validate()
        };
        for flag in [
            "--header-read-timeout",
            "--body-idle-timeout",
            "--body-read-timeout",
            "--write-timeout",
        ] {
            let refused = with(&[flag, "0"]).unwrap_err();
            assert!(
                refused.contains(flag) && refused.contains("for ever"),
                "{refused}"
            );
            assert_eq!(with(&[flag, "1s"]), Ok(()));
        }
        for flag in [
            "--max-connections",
            "--max-requests",
            "--memory-max-records",
            "--memory-max-bytes",
        ] {
            assert!(with(&[flag, "0"]).unwrap_err().contains(flag), "{flag} 0");
            assert_eq!(with(&[flag, "1"]), Ok(()), "{flag} 1");
        }
        let refused = with(&[
            "--max-body-bytes",
            "2000",
            "--max-buffered-body-bytes",
            "1999",
        ])
        .unwrap_err();
        assert!(refused.contains("could never be read"), "{refused}");
        assert_eq!(
            with(&[
                "--max-body-bytes",
                "2000",
                "--max-buffered-body-bytes",
                "2000"
            ]),
            Ok(())
        );
        let defaults = Config::try_parse_from(["idem-origin"]).unwrap().limits();
        assert_eq!(
            (defaults.header_read, defaults.body_idle, defaults.body_read),
            (
                Duration::from_secs(10),
                Duration::from_secs(10),
                Duration::from_secs(60)
            )
        );
    }

    #[test]
    fn rejects_bad_combinations() {
        let base = Config::try_parse_from(["idem-origin"]).unwrap();
        assert_eq!(base.validate(), Ok(()));
        let pg = Config::try_parse_from(["idem-origin", "--store", "postgres"]).unwrap();
        assert!(pg.validate().unwrap_err().contains("--database-url"));
        let redis = Config::try_parse_from(["idem-origin", "--store", "redis"]).unwrap();
        assert!(redis.validate().unwrap_err().contains("--redis-url"));
        let tiered = Config::try_parse_from([
            "idem-origin",
            "--store",
            "tiered",
            "--redis-url",
            "redis://x",
        ])
        .unwrap();
        assert!(tiered.validate().unwrap_err().contains("--database-url"));
        let short =
            Config::try_parse_from(["idem-origin", "--ttl", "1s", "--lease", "30s"]).unwrap();
        assert!(short.validate().unwrap_err().contains("--ttl"));
        let equal =
            Config::try_parse_from(["idem-origin", "--ttl", "2s", "--lease", "2s"]).unwrap();
        assert!(
            equal
                .validate()
                .unwrap_err()
                .contains("must be longer than --lease"),
            "a TTL equal to the lease is refused"
        );
        assert!(Config::try_parse_from(["idem-origin", "--store", "cassandra"]).is_err());
        let trailing_comma =
            Config::try_parse_from(["idem-origin", "--require-key-on", "/v1/charges,"]).unwrap();
        assert_eq!(
            trailing_comma.validate(),
            Ok(()),
            "an empty entry is no pattern"
        );
        assert!(Config::try_parse_from(["idem-origin", "--listen", "nowhere"]).is_err());
    }
}
