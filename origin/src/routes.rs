//! The route file (`--routes <FILE>`): settings per path, in TOML. Each `[[route]]`
//! names a path (exact, or a prefix ending in `*`) and what differs there from the
//! flags; routes are tried in file order, the first match wins, and a path no route
//! matches gets the flags' settings.
//!
//! ```toml
//! [[route]]
//! path = "/v1/charges"
//! require_key = true
//! wait = "5s"
//!
//! [[route]]
//! path = "/v1/payouts/*"
//! ttl = "7d"
//! scope_from = "jwt:sub"
//! jwt_secret_file = "secrets/jwt"
//! ```
//!
//! Every error names the file, line and column to fix.

use crate::config::{parse_duration, Config};
use http::Method;
use idem::IdempotencyLayer;
#[cfg(test)]
use idem_core::contract::JwtVerifier;
use idem_core::contract::{self, Anonymous, JwtKeys, ScopeRule, ScopeSource};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The shortest lease a claim can run under (see `Policy::claim_in_time`).
pub const MIN_LEASE: Duration = Duration::from_millis(250);
use toml::Spanned;

/// The keys of a `[[route]]`: (key, example, meaning), as the book's reference
/// (docs/guide/proxy.md) shows them (a test keeps the two in step, and this list with the parser's).
pub const ROUTE_KEYS: &[(&str, &str, &str)] = &[
    ("path", r#""/v1/payouts/*""#, "Required. The path: exact, `<path>/*` (the path and everything under it), or a prefix ending in `*`, in visible ASCII and in normal form (no `//`, `.` or `..` segments, trailing `/` or needless `%` escapes). Requests are matched in normal form too and without regard to case (see `case_sensitive`), so `/v1/charges/`, `/v1/%63harges` and `/V1/Charges` get `/v1/charges`'s route; a spelling servers read differently (`;x`, `%2F`, `\\`, `..`) is refused with `400` when any reading of it is guarded. Routes are tried in file order and the first match wins; a route an earlier one always matches first is an error."),
    ("methods", r#"["POST", "PUT"]"#, "The methods guarded on this path, instead of the flags' (not in addition); others pass through. Not empty. Default: POST and PATCH. GET, HEAD and OPTIONS can't be guarded."),
    ("case_sensitive", "true", "Whether the path matches requests only in the same case. Default: false — `/V1/Payouts/7` gets `/v1/payouts/*`'s route, as Express, ASP.NET Core and IIS route it; turn it on only in front of an API whose router is case-sensitive too, or a request the API runs as a payout is not guarded as one."),
    ("require_key", "true", "Whether a guarded request without an `Idempotency-Key` is refused with `400`. Default: whether `--require-key-on` lists the path."),
    ("ttl", r#""7d""#, "How long an answer is replayed, and an abandoned claim is kept past its lease (so its retries learn that it may have run); at least 1s, longer than `lease`. Default: `--ttl`."),
    ("lease", r#""10s""#, "How long a claim lives without a heartbeat; at least 250ms, shorter than `ttl`. Default: `--lease`."),
    ("wait", r#""5s""#, "How long a retry that finds its key in flight waits for the first answer when it sends no `Prefer: wait` (a stated one wins). Default: 0, `409` at once; at most `max_wait`."),
    ("max_wait", r#""30s""#, "The most a request may wait, asked or by `wait`. Default: `--max-wait`."),
    ("scope_from", r#""jwt:sub""#, "Who a key belongs to, as `--scope-from`: `authorization`, `header:<name>` or `jwt:<claim>`. Default: `--scope-from`."),
    ("jwt_secret_file", r#""secrets/jwt""#, "The HS256 key for `jwt:<claim>`, relative to the route file. Default: `--jwt-secret-file`."),
    ("jwks_file", r#""keys/jwks.json""#, "The identity provider's public keys (a JWKS) for `jwt:<claim>` with RS256 or ES256 tokens, relative to the route file; not with `jwt_secret_file`. Default: `--jwks-file`."),
    ("jwt_issuer", r#""https://id.example""#, "The issuer (`iss`) a token must name; required with a JWKS. Default: `--jwt-issuer`."),
    ("jwt_audience", r#""payments""#, "The audience (`aud`, or one of its list) a token must name; required with a JWKS. Default: `--jwt-audience`."),
    ("key_header", r#"["x-idempotency-key"]"#, "The request headers the key is read from (a name or a list). A request with keys in two of them is refused, and so is one with an `Idempotency-Key` where it is not read. Default: `--key-header`."),
    ("fingerprint_except", r#"["/sent_at", "/meta/trace_id"]"#, "Fields of a JSON body left out of its fingerprint, as JSON Pointers (RFC 6901): a retry that differs only there gets the first answer. Not with `fingerprint_only`. Default: `--fingerprint-except`."),
    ("fingerprint_only", r#"["/amount", "/currency"]"#, "The only fields of a JSON body its fingerprint covers. Not with `fingerprint_except`. Default: `--fingerprint-only`."),
    ("fingerprint_headers", r#"["x-tenant"]"#, "Request headers whose values are part of the fingerprint. Default: `--fingerprint-headers`."),
    ("replay_headers", r#"["etag", "link"]"#, "More answer headers stored and replayed on this path, added to the flags' (`--replay-headers`)."),
    ("cors_origins", r#"["https://app.example"]"#, "The origins whose pages may read idem's own answers here (replays, 409, 422…), or `[\"*\"]`. Default: `--cors-origin`."),
    ("cors_credentials", "true", "Whether those pages may read answers to requests sent with credentials. Default: `--cors-credentials`."),
    ("release_on", "[400, 422, 429]", "The statuses (4xx only) after which nothing is stored and the key is freed, so a corrected retry with the same key runs; `[]` for none. Default: `--release-on`."),
    ("anonymous", r#""scoped""#, "A request that says nowhere who it is: `scoped` or `refused` (401). Default: `--anonymous`."),
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    route: Vec<Spanned<RouteEntry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteEntry {
    path: Spanned<String>,
    methods: Option<Spanned<Vec<Spanned<String>>>>,
    case_sensitive: Option<bool>,
    require_key: Option<bool>,
    ttl: Option<Spanned<String>>,
    lease: Option<Spanned<String>>,
    wait: Option<Spanned<String>>,
    max_wait: Option<Spanned<String>>,
    scope_from: Option<Spanned<String>>,
    jwt_secret_file: Option<Spanned<String>>,
    jwks_file: Option<Spanned<String>>,
    jwt_issuer: Option<Spanned<String>>,
    jwt_audience: Option<Spanned<String>>,
    key_header: Option<Spanned<OneOrMany>>,
    fingerprint_except: Option<Spanned<Vec<String>>>,
    fingerprint_only: Option<Spanned<Vec<String>>>,
    fingerprint_headers: Option<Spanned<Vec<String>>>,
    replay_headers: Option<Spanned<Vec<Spanned<String>>>>,
    cors_origins: Option<Spanned<Vec<String>>>,
    cors_credentials: Option<Spanned<bool>>,
    release_on: Option<Spanned<Vec<Spanned<u16>>>>,
    anonymous: Option<Spanned<String>>,
}

/// A header name, or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// One route's settings, checked; `None` keeps the flags'.
#[derive(Clone, Debug)]
pub struct Route {
    /// The path pattern.
    pub path: String,
    /// The line of its `path`, for messages.
    pub line: usize,
    methods: Option<Vec<Method>>,
    case_sensitive: bool,
    require_key: Option<bool>,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    wait: Option<Duration>,
    max_wait: Option<Duration>,
    release_on: Option<contract::ReleaseOn>,
    key_headers: Option<contract::KeyHeaders>,
    fingerprint: Option<idem_core::FingerprintRule>,
    /// The headers replayed here, when the route adds any.
    replayed: Option<Vec<String>>,
    /// Who may read idem's answers here, when the route changes it (the inner `None`:
    /// nobody).
    cors: Option<Option<contract::Cors>>,
    scope: Option<ScopeRule>,
}

impl Route {
    /// The statuses this route frees keys on, when it says.
    pub fn release_on(&self) -> Option<contract::ReleaseOn> {
        self.release_on
    }

    /// Whether the route fingerprints otherwise than the whole request.
    pub fn fingerprints_part(&self) -> bool {
        self.fingerprint.as_ref().is_some_and(|r| !r.is_whole())
    }

    /// The route's own scope rule, if it has one.
    pub fn scope(&self) -> Option<&ScopeRule> {
        self.scope.as_ref()
    }

    /// `layer` with this route's settings.
    pub fn apply(&self, mut layer: IdempotencyLayer) -> IdempotencyLayer {
        if let Some(methods) = &self.methods {
            layer = layer.methods(methods.clone());
        }
        layer = layer.case_sensitive_paths(self.case_sensitive);
        if let Some(required) = self.require_key {
            layer = layer.require_key_when(move |_| required);
        }
        if let Some(ttl) = self.ttl {
            layer = layer.ttl(ttl);
        }
        if let Some(lease) = self.lease {
            layer = layer.lease(lease);
        }
        if let Some(wait) = self.wait {
            layer = layer.default_wait(wait);
        }
        if let Some(max_wait) = self.max_wait {
            layer = layer.max_wait(max_wait);
        }
        if let Some(scope) = &self.scope {
            layer = layer.scope_rule(scope.clone());
        }
        if let Some(statuses) = self.release_on {
            layer = layer.release_on(statuses);
        }
        if let Some(headers) = &self.key_headers {
            layer = layer.key_headers(headers.clone());
        }
        if let Some(rule) = &self.fingerprint {
            layer = layer.fingerprint_rule(rule.clone());
        }
        if let Some(replayed) = &self.replayed {
            layer = layer.cached_headers(
                replayed
                    .iter()
                    .filter_map(|h| http::HeaderName::from_bytes(h.as_bytes()).ok()),
            );
        }
        if let Some(Some(cors)) = &self.cors {
            layer = layer.cors(cors.clone());
        }
        layer
    }
}

/// `layer` with every route of `routes` added.
pub fn add_routes(mut layer: IdempotencyLayer, routes: &[Route]) -> IdempotencyLayer {
    for route in routes {
        let route = Arc::new(route.clone());
        layer = layer.route(route.path.clone(), move |l| route.apply(l));
    }
    layer
}

/// Reads and checks the route file at `path`, whose unset keys take `flags`' values.
pub fn load(path: &Path, flags: &Config) -> Result<Vec<Route>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--routes {}: cannot read it: {e}", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    parse(&text, &path.display().to_string(), dir, flags)
}

/// Checks the route file `text` (named `name`, its relative paths from `dir`).
pub fn parse(text: &str, name: &str, dir: &Path, flags: &Config) -> Result<Vec<Route>, String> {
    let at = |span: Option<std::ops::Range<usize>>, message: &str| match span {
        Some(span) => {
            let (line, column) = line_column(text, span.start);
            format!("{name}:{line}:{column}: {message}")
        }
        None => format!("{name}: {message}"),
    };
    let file: File = toml::from_str(text).map_err(|e| at(e.span(), e.message().trim()))?;
    let mut routes: Vec<Route> = Vec::with_capacity(file.route.len());
    for entry in file.route {
        let entry = entry.into_inner();
        let mut route =
            check(&entry, dir, flags).map_err(|(span, message)| at(Some(span), &message))?;
        route.line = line_column(text, entry.path.span().start).0;
        let here = |message: String| at(Some(entry.path.span()), &message);
        if let Some(earlier) = routes.iter().find(|r| {
            contract::PathPattern::new(&r.path)
                .is_ok_and(|p| p.case_sensitive(r.case_sensitive).matches(&route.path))
        }) {
            let how = if earlier.path == route.path {
                "is listed twice"
            } else {
                "is never used"
            };
            return Err(here(format!(
                "route {:?} {how}: the route on line {} ({:?}) matches its paths first",
                route.path, earlier.line, earlier.path
            )));
        }
        routes.push(route);
    }
    Ok(routes)
}

type Problem = (std::ops::Range<usize>, String);

/// One entry's settings, or the span and message of what is wrong with it.
fn check(entry: &RouteEntry, dir: &Path, flags: &Config) -> Result<Route, Problem> {
    let path = entry.path.get_ref();
    contract::check_pattern(path).map_err(|e| (entry.path.span(), format!("path {e}")))?;
    let duration =
        |value: &Option<Spanned<String>>, key: &str| -> Result<Option<Duration>, Problem> {
            value
                .as_ref()
                .map(|v| parse_duration(v.get_ref()).map_err(|e| (v.span(), format!("{key}: {e}"))))
                .transpose()
        };
    let ttl = duration(&entry.ttl, "ttl")?;
    let lease = duration(&entry.lease, "lease")?;
    // Below it a claim can't come back in time to run (`Policy::claim_in_time`: its round
    // trip plus the clock tolerance, at least 50 ms, within two thirds of the lease).
    if lease.is_some_and(|l| l < MIN_LEASE) {
        return Err((span_of_lease(entry), "lease must be at least 250ms".into()));
    }
    if ttl.is_some_and(|t| t < Duration::from_secs(1)) {
        return Err((
            entry.ttl.as_ref().map_or(entry.path.span(), Spanned::span),
            "ttl must be at least 1s".into(),
        ));
    }
    let wait = duration(&entry.wait, "wait")?;
    let max_wait = duration(&entry.max_wait, "max_wait")?;
    let span_of = |v: &Option<Spanned<String>>| v.as_ref().map_or(entry.path.span(), Spanned::span);
    let (eff_ttl, eff_lease) = (ttl.unwrap_or(flags.ttl), lease.unwrap_or(flags.lease));
    if eff_ttl <= eff_lease {
        let span = if ttl.is_some() {
            span_of(&entry.ttl)
        } else {
            span_of(&entry.lease)
        };
        return Err((
            span,
            format!("ttl ({eff_ttl:?}) must be longer than lease ({eff_lease:?}): answers must outlive the claims that make them"),
        ));
    }
    let eff_max_wait = max_wait.unwrap_or(flags.max_wait);
    if let Some(wait) = wait.filter(|w| *w > eff_max_wait) {
        return Err((
            span_of(&entry.wait),
            format!("wait ({wait:?}) is more than max_wait ({eff_max_wait:?}): raise max_wait or --max-wait"),
        ));
    }
    let methods = match &entry.methods {
        None => None,
        Some(list) => {
            if list.get_ref().is_empty() {
                return Err((
                    list.span(),
                    "methods: an empty list would guard nothing on this path; leave the path out of the file instead, or name the methods".into(),
                ));
            }
            let mut methods = Vec::new();
            for m in list.get_ref() {
                let name = m.get_ref().trim().to_ascii_uppercase();
                match name.as_str() {
                    "POST" | "PUT" | "PATCH" | "DELETE" => methods.push(Method::from_bytes(name.as_bytes()).expect("a standard method")),
                    _ => {
                        return Err((
                            m.span(),
                            format!("methods: {:?} cannot be guarded: use POST, PUT, PATCH or DELETE (GET, HEAD and OPTIONS are safe to repeat and pass through)", m.get_ref()),
                        ))
                    }
                }
            }
            Some(methods)
        }
    };
    let release_on = match &entry.release_on {
        None => None,
        Some(list) => {
            let mut statuses = Vec::new();
            for status in list.get_ref() {
                contract::ReleaseOn::new([*status.get_ref()])
                    .map_err(|e| (status.span(), format!("release_on: {e}")))?;
                statuses.push(*status.get_ref());
            }
            Some(contract::ReleaseOn::new(statuses).map_err(|e| (list.span(), String::from(e)))?)
        }
    };
    let key_headers = match &entry.key_header {
        None => None,
        Some(names) => {
            let list = match names.get_ref() {
                OneOrMany::One(name) => vec![name.clone()],
                OneOrMany::Many(list) => list.clone(),
            };
            Some(
                contract::KeyHeaders::new(&list)
                    .map_err(|e| (names.span(), format!("key_header: {e}")))?,
            )
        }
    };
    let fingerprint = fingerprint(entry, flags)?;
    let (replayed, cors) = replayed_and_cors(entry, flags)?;
    let scope = scope(entry, dir, flags)?;
    Ok(Route {
        path: path.clone(),
        line: 0,
        methods,
        case_sensitive: entry.case_sensitive.unwrap_or(false),
        require_key: entry.require_key,
        ttl,
        lease,
        wait,
        max_wait,
        release_on,
        key_headers,
        fingerprint,
        replayed,
        cors,
        scope,
    })
}

/// The route's fingerprint rule, when it changes any part of the flags': its body
/// selection (`fingerprint_only` or `fingerprint_except`) replaces theirs, and its
/// `fingerprint_headers` theirs.
fn fingerprint(
    entry: &RouteEntry,
    flags: &Config,
) -> Result<Option<idem_core::FingerprintRule>, Problem> {
    let (only, except, headers) = (
        &entry.fingerprint_only,
        &entry.fingerprint_except,
        &entry.fingerprint_headers,
    );
    if only.is_none() && except.is_none() && headers.is_none() {
        return Ok(None);
    }
    let given = |v: &Option<Spanned<Vec<String>>>| v.as_ref().map(|v| v.get_ref().clone());
    let (flag_only, flag_except, flag_headers) = (
        flags.fingerprint_only.clone().unwrap_or_default(),
        flags.fingerprint_except.clone().unwrap_or_default(),
        flags.fingerprint_headers.clone().unwrap_or_default(),
    );
    let (only_list, except_list) = match (given(only), given(except)) {
        (None, None) => (flag_only, flag_except),
        (o, e) => (o.unwrap_or_default(), e.unwrap_or_default()),
    };
    let headers_list = given(headers).unwrap_or(flag_headers);
    let span = only
        .as_ref()
        .or(except.as_ref())
        .or(headers.as_ref())
        .map_or(entry.path.span(), Spanned::span);
    idem_core::FingerprintRule::new(&only_list, &except_list, &headers_list)
        .map(Some)
        .map_err(|e| {
            (
                span,
                format!("fingerprint_only, fingerprint_except, fingerprint_headers: {e}"),
            )
        })
}

/// The headers the route replays and who may read its answers across origins, when
/// it changes either.
#[allow(clippy::type_complexity)]
fn replayed_and_cors(
    entry: &RouteEntry,
    flags: &Config,
) -> Result<(Option<Vec<String>>, Option<Option<contract::Cors>>), Problem> {
    let mut replayed = None;
    if let Some(list) = &entry.replay_headers {
        let mut names = flags.replayed_headers();
        for name in list.get_ref() {
            let name = contract::check_replay_header(name.get_ref())
                .map_err(|e| (name.span(), format!("replay_headers: {e}")))?;
            if !names.contains(&name) {
                names.push(name);
            }
        }
        replayed = Some(names);
    }
    if entry.cors_origins.is_none() && entry.cors_credentials.is_none() {
        return Ok((replayed, None));
    }
    let origins = entry
        .cors_origins
        .as_ref()
        .map(|o| o.get_ref().clone())
        .or_else(|| flags.cors_origin.clone());
    let credentials = entry
        .cors_credentials
        .as_ref()
        .map_or(flags.cors_credentials, |c| *c.get_ref());
    let span = entry
        .cors_origins
        .as_ref()
        .map(Spanned::span)
        .or(entry.cors_credentials.as_ref().map(Spanned::span))
        .unwrap_or(entry.path.span());
    let cors = match origins {
        None if credentials => {
            return Err((
                span,
                "cors_credentials: needs cors_origins (or --cors-origin)".into(),
            ))
        }
        None => None,
        Some(origins) => Some(
            contract::Cors::new(&origins, credentials)
                .map_err(|e| (span, format!("cors_origins: {e}")))?,
        ),
    };
    Ok((replayed, Some(cors)))
}

fn span_of_lease(entry: &RouteEntry) -> std::ops::Range<usize> {
    entry
        .lease
        .as_ref()
        .map_or(entry.path.span(), Spanned::span)
}

/// The route's scope rule, when it changes any part of the flags'.
fn scope(entry: &RouteEntry, dir: &Path, flags: &Config) -> Result<Option<ScopeRule>, Problem> {
    if entry.scope_from.is_none()
        && entry.jwt_secret_file.is_none()
        && entry.jwks_file.is_none()
        && entry.jwt_issuer.is_none()
        && entry.jwt_audience.is_none()
        && entry.anonymous.is_none()
    {
        return Ok(None);
    }
    let read = |file: &Spanned<String>, key: &str, how: fn(&Path) -> Result<Vec<u8>, String>| {
        how(&dir.join(PathBuf::from(file.get_ref())))
            .map_err(|e| (file.span(), format!("{key}: {e}")))
    };
    let keys = match (&entry.jwt_secret_file, &entry.jwks_file) {
        (None, None) => flags.jwt_keys().map_err(|e| (entry.path.span(), e))?,
        (secret, jwks) => {
            let secret = secret
                .as_ref()
                .map(|f| read(f, "jwt_secret_file", crate::config::read_secret))
                .transpose()?;
            let jwks_bytes = jwks
                .as_ref()
                .map(|f| read(f, "jwks_file", crate::config::read_file))
                .transpose()?;
            let span = jwks
                .as_ref()
                .or(entry.jwt_secret_file.as_ref())
                .map_or(entry.path.span(), Spanned::span);
            JwtKeys::either(secret, jwks_bytes.as_deref())
                .map_err(|e| (span, format!("jwt_secret_file, jwks_file: {e}")))?
        }
    };
    let (spec, span) = match &entry.scope_from {
        Some(s) => (s.get_ref().as_str(), s.span()),
        None => (flags.scope_from.as_str(), entry.path.span()),
    };
    fn text(v: &Option<Spanned<String>>) -> Option<&str> {
        v.as_ref().map(|v| v.get_ref().as_str())
    }
    let issuer = text(&entry.jwt_issuer).or(flags.jwt_issuer.as_deref());
    let audience = text(&entry.jwt_audience).or(flags.jwt_audience.as_deref());
    let jwt = crate::config::jwt_verifier(keys, issuer, audience, flags.jwt_require_exp).map_err(
        |e| {
            let at = entry
                .jwks_file
                .as_ref()
                .or(entry.jwt_issuer.as_ref())
                .or(entry.jwt_audience.as_ref())
                .map_or(entry.path.span(), Spanned::span);
            (at, format!("jwt_issuer, jwt_audience: {e}"))
        },
    )?;
    let source = ScopeSource::parse(spec, jwt).map_err(|e| {
        let file = entry.jwt_secret_file.as_ref().or(entry.jwks_file.as_ref());
        let span = match (&entry.scope_from, file) {
            (None, Some(file)) => file.span(),
            _ => span.clone(),
        };
        (
            span,
            format!("scope_from: {e} (jwt_secret_file or jwks_file gives it)"),
        )
    })?;
    flags
        .check_scope_header(&source)
        .map_err(|e| (span, format!("scope_from: {e}")))?;
    let anonymous = match &entry.anonymous {
        None => flags.anonymous_default(),
        Some(a) => match a.get_ref().as_str() {
            "scoped" => Anonymous::Scoped,
            "refused" => Anonymous::Refused,
            other => {
                return Err((
                    a.span(),
                    format!("anonymous: {other:?} is not scoped or refused"),
                ))
            }
        },
    };
    Ok(Some(ScopeRule { source, anonymous }))
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn flags(extra: &[&str]) -> Config {
        let mut args = vec!["idem-origin"];
        args.extend_from_slice(extra);
        Config::try_parse_from(args).unwrap()
    }

    fn parsed(text: &str) -> Result<Vec<Route>, String> {
        parse(text, "routes.toml", Path::new("."), &flags(&[]))
    }

    #[test]
    fn reads_every_key() {
        let dir = std::env::temp_dir().join(format!("idem-routes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("jwt"), "s3cret-of-at-least-32-bytes-long\n").unwrap();
        let vectors: serde_json::Value =
            serde_json::from_str(include_str!("../../shared/testdata/scope-vectors.json")).unwrap();
        std::fs::write(dir.join("jwks.json"), vectors["jwks"].to_string()).unwrap();
        let text = r#"
# payouts
[[route]]
path = "/v1/payouts/*"
methods = ["post", "PUT"]
require_key = true
ttl = "7d"
lease = "10s"
wait = "5s"
max_wait = "30s"
scope_from = "jwt:sub"
jwt_secret_file = "jwt"
release_on = [400, 409]
key_header = ["X-Idempotency-Key", "paypal-request-id"]
fingerprint_except = ["/sent_at"]
fingerprint_headers = ["x-tenant"]
anonymous = "scoped"

[[route]]
path = "/v1/charges"

[[route]]
path = "/v1/refunds"
scope_from = "jwt:sub"
jwks_file = "jwks.json"
jwt_issuer = "https://id.example"
jwt_audience = "payments"
"#;
        let routes = parse(text, "routes.toml", &dir, &flags(&[])).unwrap();
        assert_eq!(routes.len(), 3);
        let refunds = routes[2].scope.as_ref().unwrap();
        assert!(
            matches!(&refunds.source, ScopeSource::JwtClaim { jwt, .. } if matches!(jwt.keys(), JwtKeys::Jwks(keys) if keys.len() == 2)),
            "{refunds:?}"
        );
        let payouts = &routes[0];
        assert_eq!((payouts.path.as_str(), payouts.line), ("/v1/payouts/*", 4));
        assert_eq!(payouts.methods, Some(vec![Method::POST, Method::PUT]));
        assert_eq!(payouts.require_key, Some(true));
        assert_eq!(payouts.ttl, Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(payouts.lease, Some(Duration::from_secs(10)));
        assert_eq!(payouts.wait, Some(Duration::from_secs(5)));
        assert_eq!(payouts.max_wait, Some(Duration::from_secs(30)));
        assert_eq!(
            payouts.release_on,
            contract::ReleaseOn::new([400, 409]).ok()
        );
        assert_eq!(
            payouts.fingerprint,
            idem_core::FingerprintRule::new(&[] as &[&str], &["/sent_at"], &["x-tenant"]).ok()
        );
        assert_eq!(
            payouts
                .key_headers
                .as_ref()
                .map(contract::KeyHeaders::names),
            Some(
                &[
                    "x-idempotency-key".to_owned(),
                    "paypal-request-id".to_owned()
                ][..]
            )
        );
        let scope = payouts.scope.as_ref().unwrap();
        assert_eq!(
            scope.source,
            ScopeSource::JwtClaim {
                claim: "sub".into(),
                jwt: JwtVerifier::new(
                    JwtKeys::Hs256(b"s3cret-of-at-least-32-bytes-long".to_vec()),
                    None,
                    None
                )
                .unwrap()
            }
        );
        assert_eq!(scope.anonymous, Anonymous::Scoped);
        let charges = &routes[1];
        assert_eq!(charges.line, 20);
        assert!(charges.ttl.is_none() && charges.scope.is_none() && charges.methods.is_none());
        assert!(
            parsed("").unwrap().is_empty(),
            "an empty file has no routes"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_error_names_the_line_and_what_to_fix() {
        let cases: &[(&str, &str)] = &[
            // syntax
            ("[[route]]\npath = \"/a\"\nttl = 5s\n", "routes.toml:3:"),
            // a key that does not exist, a type that does not fit
            ("[[route]]\npath = \"/a\"\nttll = \"5s\"\n", "routes.toml:3:1: unknown field `ttll`"),
            ("[[route]]\npath = \"/a\"\nrequire_key = \"yes\"\n", "routes.toml:3:"),
            ("[route]\npath = \"/a\"\n", "routes.toml:1:"),
            ("[[route]]\nttl = \"5s\"\n", "missing field `path`"),
            // values
            ("[[route]]\npath = \"/a\"\n\nttl = \"5 weeks\"\n", "routes.toml:4:7: ttl: unknown duration unit"),
            ("[[route]]\npath = \"v1/a\"\n", "routes.toml:2:8: path \"v1/a\" must start with /"),
            ("[[route]]\npath = \"/v1/*/a\"\n", "routes.toml:2:8: path"),
            ("[[route]]\npath = \"/a\"\nttl = \"1s\"\n", "routes.toml:3:7: ttl (1s) must be longer than lease (30s)"),
            ("[[route]]\npath = \"/a\"\nttl = \"2s\"\nlease = \"2s\"\n", "routes.toml:3:7: ttl (2s) must be longer than lease (2s)"),
            ("[[route]]\npath = \"/a\"\nlease = \"0s\"\n", "routes.toml:3:9: lease must be at least 250ms"),
            ("[[route]]\npath = \"/a\"\nlease = \"1ms\"\n", "routes.toml:3:9: lease must be at least 250ms"),
            ("[[route]]\npath = \"/a\"\nttl = \"500ms\"\nlease = \"250ms\"\n", "routes.toml:3:7: ttl must be at least 1s"),
            ("[[route]]\npath = \"/a\"\nmethods = []\n", "routes.toml:3:11: methods: an empty list would guard nothing"),
            ("[[route]]\npath = \"/a?b=1\"\n", "routes.toml:2:8: path \"/a?b=1\" must start with /"),
            ("[[route]]\npath = \"/caf\u{e9}\"\n", "routes.toml:2:8: path"),
            ("[[route]]\npath = \"/v1/charges/\"\n", "routes.toml:2:8: path \"/v1/charges/\" is matched as \"/v1/charges\": write it so"),
            ("[[route]]\npath = \"/v1//x/*\"\n", "routes.toml:2:8: path \"/v1//x/*\" is matched as \"/v1/x/*\": write it so"),
            ("[[route]]\npath = \"/a\"\nwait = \"1m\"\n", "routes.toml:3:8: wait (60s) is more than max_wait (10s)"),
            ("[[route]]\npath = \"/a\"\nmethods = [\"POST\", \"GET\"]\n", "routes.toml:3:20: methods: \"GET\" cannot be guarded"),
            ("[[route]]\npath = \"/a\"\nscope_from = \"cookie:x\"\n", "routes.toml:3:14: scope_from: \"cookie:x\""),
            ("[[route]]\npath = \"/a\"\nscope_from = \"jwt:sub\"\n", "routes.toml:3:14: scope_from: jwt:<claim> needs the HS256 secret"),
            ("[[route]]\npath = \"/a\"\njwt_secret_file = \"/nonexistent/jwt\"\n", "routes.toml:3:19: jwt_secret_file: /nonexistent/jwt: cannot read it"),
            ("[[route]]\npath = \"/a\"\nscope_from = \"header:X-Forwarded-For\"\n", "routes.toml:3:14: scope_from: header:x-forwarded-for is one proxies set"),
            ("[[route]]\npath = \"/a\"\nscope_from = \"header:x-real-ip\"\n", "routes.toml:3:14: scope_from: header:x-real-ip is one proxies set"),
            ("[[route]]\npath = \"/a\"\nrelease_on = [400, 503]\n", "routes.toml:3:20: release_on: 503 cannot free a key: only client errors"),
            ("[[route]]\npath = \"/a\"\nrelease_on = [\"400\"]\n", "routes.toml:3:"),
            ("[[route]]\npath = \"/a\"\nkey_header = \"authorization\"\n", "routes.toml:3:14: key_header: authorization cannot carry the idempotency key"),
            ("[[route]]\npath = \"/a\"\nkey_header = []\n", "routes.toml:3:14: key_header: no header names"),
            ("[[route]]\npath = \"/a\"\nfingerprint_except = [\"sent_at\"]\n", "routes.toml:3:22: fingerprint_only, fingerprint_except, fingerprint_headers: \"sent_at\" is not a JSON Pointer"),
            ("[[route]]\npath = \"/a\"\nfingerprint_only = [\"/a\"]\nfingerprint_except = [\"/b\"]\n", "not both"),
            ("[[route]]\npath = \"/a\"\nfingerprint_headers = [\"x-forwarded-for\"]\n", "routes.toml:3:23: fingerprint_only, fingerprint_except, fingerprint_headers: x-forwarded-for cannot be fingerprinted"),
            ("[[route]]\npath = \"/a\"\nanonymous = \"maybe\"\n", "routes.toml:3:13: anonymous: \"maybe\" is not scoped or refused"),
            ("[[route]]\npath = \"/a\"\nscope_from = \"jwt:sub\"\njwks_file = \"/etc/hostname\"\n", "routes.toml:4:13: jwt_secret_file, jwks_file: the JWKS: not JSON"),
            ("[[route]]\npath = \"/a\"\njwt_secret_file = \"/etc/hostname\"\njwks_file = \"/etc/hostname\"\n", "routes.toml:4:13: jwt_secret_file, jwks_file: give the HS256 secret or the JWKS, not both"),
            // order
            ("[[route]]\npath = \"/a\"\n[[route]]\npath = \"/a\"\n", "routes.toml:4:8: route \"/a\" is listed twice: the route on line 2"),
            ("[[route]]\npath = \"/v1/*\"\n[[route]]\npath = \"/v1/charges\"\n", "routes.toml:4:8: route \"/v1/charges\" is never used: the route on line 2 (\"/v1/*\")"),
        ];
        // A JWKS without an issuer and an audience.
        let vectors: serde_json::Value =
            serde_json::from_str(include_str!("../../shared/testdata/scope-vectors.json")).unwrap();
        let jwks =
            std::env::temp_dir().join(format!("idem-routes-jwks-{}.json", std::process::id()));
        std::fs::write(&jwks, vectors["jwks"].to_string()).unwrap();
        let text = format!(
            "[[route]]\npath = \"/a\"\nscope_from = \"jwt:sub\"\njwks_file = {:?}\njwt_issuer = \"https://id.example\"\n",
            jwks.display().to_string()
        );
        let error = parsed(&text).unwrap_err();
        std::fs::remove_file(&jwks).unwrap();
        assert!(
            error.contains("routes.toml:4:13: jwt_issuer, jwt_audience: a JWKS's keys sign tokens"),
            "{error}"
        );
        for (text, expected) in cases {
            let error = parsed(text).unwrap_err();
            assert!(
                error.contains(expected),
                "{text:?}\n  got: {error}\n  expected: {expected}"
            );
        }
    }

    #[test]
    fn the_keys_listed_are_the_keys_read() {
        let error = parsed("[[route]]\npath = \"/a\"\nnope = 1\n").unwrap_err();
        let expected = error.split("expected one of").nth(1).expect(&error);
        let read: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        let listed: Vec<&str> = ROUTE_KEYS.iter().map(|(key, _, _)| *key).collect();
        assert_eq!(read, listed);
    }
}
