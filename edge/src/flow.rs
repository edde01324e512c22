//! One request at the edge, over plain values: every decision is the core's
//! ([`idem_core::contract`]); every effect goes through an [`EdgeRuntime`] — the
//! Workers runtime in production, plain Rust in host-side tests.

use crate::config::EdgeConfig;
use crate::records::{EdgeRecords, Op, Reply, WireResponse, MAX_TTL_MS};
use idem_core::contract::{
    self, NotKept, OriginDisposition, Problem, Rejection, Route, Waiting, DEFAULT_METHODS,
    ORIGIN_DISPOSITION, STORED_HEADERS,
};
use idem_core::{Fingerprint, Millis, RecordKey, StoredResponse};

/// Diagnostic response header: what the edge did ([`Handled`]).
pub const EDGE_HEADER: &str = "idem-edge";

/// Bodies of at least this many bytes are hashed by the runtime's SHA-256 (WebCrypto)
/// rather than in WASM. Under workerd (`idem-bench --edge-hash`, docs/performance.md, "The
/// edge's hash"), WebCrypto loses below 2 KiB (its call costs ~6 µs) and wins from 4 KiB:
/// 1.1× on JSON there (canonicalising costs the same either way), 1.4× on raw bytes,
/// up to 1.3× and 4.7× at 1 MiB.
pub const RUNTIME_SHA256_FROM: usize = 4 * 1024;

/// A request's head as the edge sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// The method, as sent.
    pub method: String,
    /// The path and query, e.g. `/v1/charges?expand=customer`.
    pub path_and_query: String,
    /// The headers, in order.
    pub headers: Vec<(String, String)>,
    /// The scheme the client used (`https`, `http`).
    pub scheme: String,
}

impl Head {
    /// The path, without the query.
    pub fn path(&self) -> &str {
        let pq = self.path_and_query.as_str();
        pq.split_once('?').map_or(pq, |(path, _)| path)
    }

    /// Every value of the header `name` (case-insensitive), in order.
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + Clone + 'a {
        header_values(&self.headers, name)
    }

    /// Every value of the header `name`, for a lookup that outlives the name.
    pub fn all_values(&self, name: &str) -> Vec<&[u8]> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_bytes())
            .collect()
    }

    /// The first value of the header `name`.
    pub fn header<'a>(&'a self, name: &'a str) -> Option<&'a [u8]> {
        self.values(name).next()
    }
}

/// A request the edge sends to the origin, its body read (`Vec<u8>`) or streamed.
/// `Debug` shows the edge's secret as `<edge secret>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Outbound<B = Vec<u8>> {
    /// The method.
    pub method: String,
    /// The origin's URL for the request.
    pub url: String,
    /// The headers passed on ([`contract::forwarded_request_header`]).
    pub headers: Vec<(String, String)>,
    /// The body; `None` for GET and HEAD, which send none.
    pub body: Option<B>,
}

impl<B: std::fmt::Debug> std::fmt::Debug for Outbound<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(
                |(n, v)| match n.eq_ignore_ascii_case(contract::EDGE_SECRET) {
                    true => (n.as_str(), "<edge secret>"),
                    false => (n.as_str(), v.as_str()),
                },
            )
            .collect();
        f.debug_struct("Outbound")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("headers", &headers)
            .field("body", &self.body)
            .finish()
    }
}

/// An answer as plain values, its body read (`Vec<u8>`) or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer<B = Vec<u8>> {
    /// The status.
    pub status: u16,
    /// The headers, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: B,
}

impl<B> Answer<B> {
    fn header<'a>(&'a self, name: &'a str) -> Option<&'a [u8]> {
        header_values(&self.headers, name).next()
    }

    /// The same answer with its body turned by `f`.
    pub fn map_body<C>(self, f: impl FnOnce(B) -> C) -> Answer<C> {
        Answer {
            status: self.status,
            headers: self.headers,
            body: f(self.body),
        }
    }
}

/// The body of the client's answer: read (idem's answers, replays, guarded forwards,
/// which may be stored), or streamed from the origin as it arrives (pass-through).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload<S> {
    /// All of it.
    Bytes(Vec<u8>),
    /// The origin's body, not read by the edge.
    Stream(S),
}

/// Why a body was not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// More than the limit arrived; reading stopped there.
    TooLarge,
    /// The body broke off or could not be read.
    Unreadable(String),
}

/// What the edge did with a request (the value of [`EDGE_HEADER`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handled {
    /// Answered from its record.
    Replayed,
    /// Claimed the key and forwarded the request.
    Forwarded,
    /// Not guarded: forwarded as is.
    Passed,
    /// Its records could not answer: forwarded, for the origin to guard.
    Degraded,
    /// Refused with one of idem's problems.
    Refused,
    /// Claimed and forwarded; the origin stored its answer under another record than
    /// the edge's (their scope rules differ), so the edge kept nothing.
    OtherRecord,
    /// Claimed and forwarded; the origin stored its answer under another fingerprint
    /// than the edge's (its route's fingerprint rule), so the edge kept nothing.
    OtherFingerprint,
}

impl Handled {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Handled::Replayed => "replayed",
            Handled::Forwarded => "forwarded",
            Handled::Passed => "passed",
            Handled::Degraded => "degraded",
            Handled::Refused => "refused",
            Handled::OtherRecord => "forwarded; other-record",
            Handled::OtherFingerprint => "forwarded; other-fingerprint",
        }
    }
}

/// The effects the edge needs from its runtime.
#[allow(async_fn_in_trait)]
pub trait EdgeRuntime {
    /// A request body not read yet.
    type Body;
    /// An answer's body not read yet, streamed to the client as it arrives.
    type Stream;
    /// The records of one key.
    type Records: EdgeRecords;
    /// Reads the body, stopping with [`ReadError::TooLarge`] as soon as more than
    /// `limit` bytes have arrived.
    async fn read_body(&self, body: Self::Body, limit: usize) -> Result<Vec<u8>, ReadError>;
    /// Sends a request to the origin and reads its whole answer (one the edge may store).
    async fn fetch_whole(&self, request: Outbound) -> Result<Answer, String>;
    /// Sends a request to the origin with its body streamed, and returns the answer
    /// with its body unread: pass-through, where nothing is stored.
    async fn fetch_streamed(
        &self,
        request: Outbound<Self::Body>,
    ) -> Result<Answer<Self::Stream>, String>;
    /// The records of `key`.
    fn records(&self, key: &RecordKey) -> Result<Self::Records, String>;
    /// Wall-clock milliseconds since the Unix epoch.
    fn now(&self) -> Millis;
    /// Waits `ms` milliseconds.
    async fn sleep(&self, ms: u64);
    /// Logs a warning.
    fn warn(&self, message: &str);
    /// SHA-256 by the runtime itself (WebCrypto), where it has one; `None`: hash in WASM.
    async fn sha256(&self, message: &[u8]) -> Option<[u8; 32]> {
        let _ = message;
        None
    }
}

/// Handles one request: the client's answer, carrying [`EDGE_HEADER`].
pub async fn handle<R: EdgeRuntime>(
    runtime: &R,
    config: &EdgeConfig,
    head: Head,
    body: R::Body,
) -> Answer<Payload<R::Stream>> {
    if config.origin_in_clear() {
        warn_once(
            runtime,
            &ORIGIN_IN_CLEAR,
            "ORIGIN_URL is http:// to a host off this machine: requests, answers and the \
             EDGE_SECRET cross the network in clear (use https://)",
        );
    }
    PROBLEM_BASE.with(|base| {
        if *base.borrow() != config.problem_base {
            *base.borrow_mut() = config.problem_base.clone();
        }
    });
    // Read only when asked for.
    let origin: Option<Vec<Vec<u8>>> = config
        .cors
        .as_ref()
        .map(|_| head.values("origin").map(<[u8]>::to_vec).collect());
    let mut answer = answer_request(runtime, config, head, body).await;
    if let (Some(cors), Some(origin)) = (&config.cors, origin) {
        add_cors(cors, &origin, &mut answer);
    }
    if contract::fetch_can_send_status(answer.status) {
        return answer;
    }
    // The runtime throws building such an answer (the worker then hangs, for this key's
    // every retry): a final problem in its place.
    runtime.warn(&format!("the origin answered status {}", answer.status));
    refused(&Rejection::undeliverable_status(answer.status)).map_body(Payload::Bytes)
}

/// The CORS headers on an answer the edge made itself (a replay, a refusal), as the
/// origin's layer adds them to its own; never on the origin's answers it relays.
fn add_cors<B>(cors: &contract::Cors, origin: &[Vec<u8>], answer: &mut Answer<B>) {
    let own = header_values(&answer.headers, EDGE_HEADER).any(|v| {
        v == Handled::Replayed.as_str().as_bytes() || v == Handled::Refused.as_str().as_bytes()
    });
    let allowed = header_values(&answer.headers, "access-control-allow-origin")
        .next()
        .is_some();
    if !own || allowed {
        return;
    }
    let carries: Vec<String> = answer
        .headers
        .iter()
        .filter(|(n, _)| !n.eq_ignore_ascii_case(EDGE_HEADER))
        .map(|(n, _)| n.clone())
        .collect();
    let headers = cors.answer_headers(
        origin.iter().map(Vec::as_slice),
        carries.iter().map(String::as_str),
    );
    for (name, value) in headers {
        answer.headers.push((name.into(), value));
    }
}

async fn answer_request<R: EdgeRuntime>(
    runtime: &R,
    config: &EdgeConfig,
    head: Head,
    body: R::Body,
) -> Answer<Payload<R::Stream>> {
    // The request as the origin will get it, for every decision over its headers —
    // its key, who is asking, its fingerprint — made before a byte of the body is read
    // (as the origin's layer does): a header the edge sends the origin is read as the
    // origin will get it (a client's `X-Forwarded-Host` is not what the origin sees,
    // and a header the client's `Connection` names never reaches it); one the edge does
    // not send (the runtime's own, `CF-Connecting-IP`) as the edge got it.
    let seen = as_origin_gets(&head);
    let key = match route(config, &seen) {
        Route::Guard(key) => key,
        Route::Reject(rejection) => return refused(&rejection).map_body(Payload::Bytes),
        Route::PassThrough => return pass(runtime, config, &head, body).await,
    };
    let scope = match config
        .scope
        .scope(|name| seen.all_values(name), runtime.now() / 1_000)
    {
        Ok(scope) => scope,
        Err(rejection) => return refused(&rejection).map_body(Payload::Bytes),
    };
    let body = match read_guarded_body(runtime, config, &head, body).await {
        Ok(body) => body,
        Err(rejection) => return refused(&rejection).map_body(Payload::Bytes),
    };
    let fingerprint = fingerprint_of(runtime, config, &seen, &body).await;
    guarded(
        runtime,
        config,
        head,
        RecordKey::new(&scope, &key),
        fingerprint,
        body,
    )
    .await
    .map_body(Payload::Bytes)
}

/// The request's fingerprint (`head` as the origin gets it), under the edge's rule as
/// the origin's route computes it: SHA-256 in WASM, or by the runtime for bodies of at least
/// [`RUNTIME_SHA256_FROM`] bytes, where that measured faster under workerd
/// (`idem-bench --edge-hash`). The same bytes are hashed either way
/// (`contract::fingerprint_message`; the shared vectors check both).
async fn fingerprint_of<R: EdgeRuntime>(
    runtime: &R,
    config: &EdgeConfig,
    head: &Head,
    body: &[u8],
) -> Fingerprint {
    let content_type = || head.values("content-type");
    if !config.fingerprint.is_whole() {
        // Under a rule, as the origin's route with the same rule: the selection is
        // hashed in WASM (it is the fields kept, not the body).
        return config.fingerprint.fingerprint(
            &head.method,
            &head.path_and_query,
            content_type(),
            body,
            |name| head.all_values(name),
        );
    }
    if body.len() >= RUNTIME_SHA256_FROM {
        let message =
            contract::fingerprint_message(&head.method, &head.path_and_query, content_type(), body);
        if let Some(digest) = runtime.sha256(&message).await {
            return Fingerprint(digest);
        }
        runtime.warn("WebCrypto did not digest a request's fingerprint; hashed in WASM");
    }
    contract::fingerprint(&head.method, &head.path_and_query, content_type(), body)
}

/// A guarded request, its body read: claimed at the edge, forwarded once, its answer
/// kept when the origin stored it.
async fn guarded<R: EdgeRuntime>(
    runtime: &R,
    config: &EdgeConfig,
    head: Head,
    record_key: RecordKey,
    own_fingerprint: Fingerprint,
    body: Vec<u8>,
) -> Answer {
    let fingerprint = own_fingerprint.to_hex();
    let records = match runtime.records(&record_key) {
        Ok(records) => records,
        Err(why) => return degraded(runtime, config, &head, body, &why).await,
    };
    let token = match claim(runtime, config, &records, &head, &fingerprint).await {
        Claimed::Execute(token) => token,
        Claimed::Answered(answer) => return answer,
        Claimed::Unanswered(why) => return degraded(runtime, config, &head, body, &why).await,
        Claimed::SendOn => return send_on(runtime, config, &head, body, Handled::Forwarded).await,
    };
    let release = Op::Release {
        fingerprint: fingerprint.clone(),
        token,
    };
    let answer = match runtime
        .fetch_whole(outbound_guarded(config, &head, body))
        .await
    {
        Ok(answer) => answer,
        Err(e) => {
            // Nothing reached the origin, or its answer was lost: free the key.
            write(runtime, &records, &release).await;
            return refused(&Rejection::origin_unreachable(&e));
        }
    };
    // Keep the answer, or free the key: a claim left behind would answer 409 until
    // its lease ran out, for a key whose answer the origin has.
    let origin_said = answer
        .header(ORIGIN_DISPOSITION)
        .and_then(OriginDisposition::parse);
    if origin_said.is_none() && (200..300).contains(&answer.status) {
        warn_once(
            runtime,
            &SILENT_ORIGIN,
            "the origin said nothing about what it stored (no idem-disposition): it is not an \
             idem origin, or it does not know this edge's EDGE_SECRET (its --edge-secret-file); \
             nothing is kept at the edge until it does",
        );
    }
    let mut handled = Handled::Forwarded;
    let own_tag = config.key_headers.record_tag(&record_key);
    let kept = match contract::edge_keeps(origin_said, own_tag, &own_fingerprint) {
        Ok(expires_at) => match keep(
            runtime.now(),
            config,
            &answer,
            expires_at,
            fingerprint,
            token,
        ) {
            Some(complete) => write(runtime, &records, &complete).await,
            None => false,
        },
        Err(NotKept::OtherRecord) => {
            runtime.warn(&format!(
                "the origin stored this answer under another record than the edge's {}: \
                 the edge's SCOPE_FROM names callers otherwise than the origin's scope \
                 rule, or its KEY_HEADER reads the key from other headers than the \
                 origin's route; nothing is kept at the edge for such requests",
                record_key.as_str()
            ));
            handled = Handled::OtherRecord;
            false
        }
        Err(NotKept::OtherFingerprint) => {
            warn_once(
                runtime,
                &OTHER_FINGERPRINT,
                "the origin stored an answer under another fingerprint than the edge's: its \
                 route's fingerprint rule (fingerprint_except, fingerprint_only, \
                 fingerprint_headers) is not the edge's (FINGERPRINT_EXCEPT, FINGERPRINT_ONLY, \
                 FINGERPRINT_HEADERS); nothing is kept at the edge for such requests, and the \
                 origin answers their retries",
            );
            handled = Handled::OtherFingerprint;
            false
        }
        Err(NotKept::NotStored) => false,
    };
    if !kept {
        write(runtime, &records, &release).await;
    }
    relay(&head.method, answer, handled)
}

/// A request the edge does not guard, streamed both ways.
async fn pass<R: EdgeRuntime>(
    runtime: &R,
    config: &EdgeConfig,
    head: &Head,
    body: R::Body,
) -> Answer<Payload<R::Stream>> {
    match runtime.fetch_streamed(outbound(config, head, body)).await {
        Ok(answer) => relay(&head.method, answer, Handled::Passed).map_body(Payload::Stream),
        // Unguarded: no key to retry with, so no invitation to.
        Err(e) => refused(&Rejection::origin_unreachable_unguarded(&e)).map_body(Payload::Bytes),
    }
}

/// The core's routing, on the request as the origin gets it ([`as_origin_gets`]).
pub fn route(config: &EdgeConfig, head: &Head) -> Route {
    let overrides = contract::METHOD_OVERRIDE_HEADERS
        .iter()
        .flat_map(|name| head.values(name));
    contract::route_by_key_headers(
        contract::guards_request(&DEFAULT_METHODS, &head.method, overrides),
        head.path(),
        &config.key_headers,
        |name| head.all_values(name),
        || contract::listed(&config.require_key_paths, head.path()),
    )
}

/// A guarded request's body, refused over the limit: on its declared length before
/// reading, then as soon as more than the limit has arrived.
async fn read_guarded_body<R: EdgeRuntime>(
    runtime: &R,
    config: &EdgeConfig,
    head: &Head,
    body: R::Body,
) -> Result<Vec<u8>, Rejection> {
    let limit = config.max_body_bytes;
    contract::check_declared_length(head.header("content-length"), limit)?;
    match runtime.read_body(body, limit).await {
        Ok(body) if body.len() <= limit => Ok(body),
        Ok(_) | Err(ReadError::TooLarge) => Err(Rejection::body_too_large(limit)),
        Err(ReadError::Unreadable(_)) => Err(Rejection::new(Problem::BodyUnreadable)),
    }
}

/// How a claim ended.
enum Claimed {
    /// This request holds the key under this token: forward it.
    Execute(u64),
    /// The edge answered: a replay, a mismatch, or still in flight.
    Answered(Answer),
    /// The records could not answer (why): the origin will.
    Unanswered(String),
    /// Forward it unclaimed ([`Reply::SendOn`]): the origin decides.
    SendOn,
}

/// Claims the key, waiting (`Prefer: wait=N`) while another attempt holds it.
async fn claim<R: EdgeRuntime>(
    runtime: &R,
    config: &EdgeConfig,
    records: &R::Records,
    head: &Head,
    fingerprint: &str,
) -> Claimed {
    let op = Op::Claim {
        fingerprint: fingerprint.to_owned(),
        lease_ms: config.policy.lease_ms,
        ttl_ms: config.policy.ttl_ms,
    };
    let wait_ms = contract::wait_ms(head.values("prefer"), config.max_wait_ms);
    let mut waiting = Waiting::new(runtime.now(), wait_ms);
    // The edge's own answers say the wait was honoured, as the origin's do.
    let applied = contract::wait_applied(head.values("prefer"), config.max_wait_ms);
    let answered = |mut answer: Answer| {
        if applied {
            answer
                .headers
                .push((contract::PREFERENCE_APPLIED.into(), "wait".into()));
        }
        Claimed::Answered(answer)
    };
    loop {
        match records.send(&op).await {
            Ok(Reply::Execute { token, .. }) => return Claimed::Execute(token),
            Ok(Reply::Replay {
                response,
                expires_at,
            }) => return answered(replayed(&response, expires_at, runtime.now())),
            Ok(Reply::SendOn) => return Claimed::SendOn,
            Ok(Reply::Mismatch) => return answered(refused(&Rejection::new(Problem::Mismatch))),
            Ok(Reply::InFlight { .. }) => match waiting.poll_after(runtime.now()) {
                Some(ms) => runtime.sleep(ms).await,
                None => return answered(refused(&Rejection::new(Problem::InFlight))),
            },
            Ok(other) => return Claimed::Unanswered(format!("unexpected {other:?}")),
            Err(e) => return Claimed::Unanswered(e),
        }
    }
}

/// The completion that keeps the origin's answer at the edge — an answer the origin
/// stored under the edge's record until `expires_at` ([`contract::edge_keeps`]), kept
/// until then, not over the size limit, and of a
/// status the edge can send —
/// or `None`: keep nothing (the key is released; the origin answers retries).
fn keep(
    now: Millis,
    config: &EdgeConfig,
    answer: &Answer,
    expires_at: Millis,
    fingerprint: String,
    token: u64,
) -> Option<Op> {
    contract::edge_ttl_ms(Some(expires_at), now, MAX_TTL_MS)?;
    if !contract::fetch_can_send_status(answer.status) {
        return None;
    }
    if answer.body.len() > config.max_stored_body_bytes {
        return None;
    }
    // The headers the origin stored, so that the edge's replays carry the same ones.
    let kept = contract::edge_kept_headers(answer.header(STORED_HEADERS))?;
    let headers = answer
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()));
    let stored = StoredResponse {
        status: answer.status,
        headers: contract::stored_headers_of(&kept, headers),
        body: answer.body.clone(),
    };
    Some(Op::Complete {
        fingerprint,
        token,
        response: WireResponse::from(&stored),
        lease_ms: config.policy.lease_ms,
        expires_at,
    })
}

/// Writes a holder's op: whether it landed. One that does not only costs the edge its
/// copy; the origin holds the answer.
async fn write<R: EdgeRuntime>(runtime: &R, records: &R::Records, op: &Op) -> bool {
    match records.send(op).await {
        Ok(Reply::Written) => true,
        Ok(other) => {
            runtime.warn(&format!("edge record write not applied: {other:?}"));
            false
        }
        Err(e) => {
            runtime.warn(&format!("edge record write failed: {e}"));
            false
        }
    }
}

/// The edge's records can't answer for this key: send the request on; the origin,
/// the authority, guards it.
async fn degraded<R: EdgeRuntime>(
    runtime: &R,
    config: &EdgeConfig,
    head: &Head,
    body: Vec<u8>,
    why: &str,
) -> Answer {
    runtime.warn(&format!(
        "edge records unavailable ({why}); forwarding to the origin"
    ));
    send_on(runtime, config, head, body, Handled::Degraded).await
}

/// Sends the request to the origin with no claim at the edge, and relays its answer;
/// nothing of it is kept.
async fn send_on<R: EdgeRuntime>(
    runtime: &R,
    config: &EdgeConfig,
    head: &Head,
    body: Vec<u8>,
    handled: Handled,
) -> Answer {
    match runtime.fetch_whole(outbound(config, head, body)).await {
        Ok(answer) => relay(&head.method, answer, handled),
        Err(e) => refused(&Rejection::origin_unreachable(&e)),
    }
}

/// A guarded request as the origin gets it, claimed at the edge: with the edge's
/// secret, so that the origin says what it stored of the answer. Only these carry it:
/// nothing else the edge forwards needs the origin's word, and the fewer requests hold
/// the secret, the fewer places could let it out.
pub fn outbound_guarded(config: &EdgeConfig, head: &Head, body: Vec<u8>) -> Outbound {
    let mut outbound = outbound(config, head, body);
    outbound
        .headers
        .push((contract::EDGE_SECRET.into(), config.edge_secret.0.clone()));
    outbound
}

thread_local! {
    /// What this isolate's problem types start with (`PROBLEM_BASE`): set from the
    /// config at each request, which every request of an isolate shares.
    static PROBLEM_BASE: std::cell::RefCell<String> =
        std::cell::RefCell::new(contract::DEFAULT_PROBLEM_BASE.into());
    /// Whether this isolate warned that the origin says nothing of what it stores.
    static SILENT_ORIGIN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Whether this isolate warned that the origin fingerprints otherwise.
    static OTHER_FINGERPRINT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Whether this isolate warned that the origin is reached in clear.
    static ORIGIN_IN_CLEAR: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Warns once per isolate (a warning on every request would drown the logs).
fn warn_once<R: EdgeRuntime>(
    runtime: &R,
    warned: &'static std::thread::LocalKey<std::cell::Cell<bool>>,
    message: &str,
) {
    if !warned.with(|w| w.replace(true)) {
        runtime.warn(message);
    }
}

/// The request as the origin gets it.
pub fn outbound<B>(config: &EdgeConfig, head: &Head, body: B) -> Outbound<B> {
    let bodiless = matches!(head.method.as_str(), "GET" | "HEAD");
    Outbound {
        method: head.method.clone(),
        url: format!("{}{}", config.origin_url, head.path_and_query),
        headers: origin_headers(head),
        body: if bodiless { None } else { Some(body) },
    }
}

/// The request headers the origin gets. The client address is the runtime's
/// (`CF-Connecting-IP`), never the client's say; a client's `idem-edge-secret` is never
/// forwarded ([`contract::forwarded_request_header`]).
fn origin_headers(head: &Head) -> Vec<(String, String)> {
    contract::forwarded_headers(
        &head.headers,
        head.header("cf-connecting-ip")
            .and_then(|ip| std::str::from_utf8(ip).ok()),
        &head.scheme,
    )
}

/// `head` with the headers the origin will get ([`origin_headers`]) in place of the
/// client's, and those the edge does not send (the runtime's own) as they came.
fn as_origin_gets(head: &Head) -> Head {
    let mut headers = origin_headers(head);
    headers.extend(
        head.headers
            .iter()
            .filter(|(n, _)| !contract::edge_sends_request_header(n))
            .cloned(),
    );
    Head {
        method: head.method.clone(),
        path_and_query: head.path_and_query.clone(),
        headers,
        scheme: head.scheme.clone(),
    }
}

/// The origin's answer to a `method` request as the client gets it.
fn relay<B>(method: &str, answer: Answer<B>, handled: Handled) -> Answer<B> {
    let mut headers: Vec<(String, String)> =
        contract::relayed_answer_headers(method, &answer.headers)
            .into_iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case(EDGE_HEADER))
            .collect();
    headers.push((EDGE_HEADER.into(), handled.as_str().into()));
    Answer {
        status: answer.status,
        headers,
        body: answer.body,
    }
}

/// A stored answer, replayed, with the key's TTL left at `now` (its copy expires with
/// the origin's record).
fn replayed(response: &WireResponse, expires_at: Millis, now: Millis) -> Answer {
    let Some(stored) = response.to_stored() else {
        return refused(&Rejection::unreadable_replay());
    };
    let mut headers: Vec<(String, String)> = contract::replay_headers(&stored.headers)
        .filter(|(n, _)| !n.eq_ignore_ascii_case(contract::KEY_TTL))
        .map(|(n, v)| (n.to_owned(), String::from_utf8_lossy(v).into_owned()))
        .collect();
    if let Some(ttl) = contract::key_ttl(expires_at, now) {
        headers.push((contract::KEY_TTL.into(), ttl));
    }
    headers.push((EDGE_HEADER.into(), Handled::Replayed.as_str().into()));
    Answer {
        status: stored.status,
        headers,
        body: stored.body,
    }
}

/// The answer of an edge whose configuration is invalid (`why` names the var):
/// nothing is forwarded anywhere.
pub fn misconfigured(why: &str) -> Answer {
    refused(&Rejection::with_detail(Problem::EdgeMisconfigured, why))
}

/// One of idem's refusals.
fn refused(rejection: &Rejection) -> Answer {
    let mut headers: Vec<(String, String)> = rejection
        .headers()
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v))
        .collect();
    headers.push((EDGE_HEADER.into(), Handled::Refused.as_str().into()));
    Answer {
        status: rejection.status(),
        headers,
        body: PROBLEM_BASE.with(|base| rejection.body_under(&base.borrow())),
    }
}

fn header_values<'a>(
    headers: &'a [(String, String)],
    name: &'a str,
) -> impl Iterator<Item = &'a [u8]> + Clone + 'a {
    headers
        .iter()
        .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn only_the_edge_s_own_secret_reaches_the_origin_and_only_on_guarded_requests() {
        let config = EdgeConfig {
            origin_url: "http://origin.test".into(),
            edge_secret: crate::config::EdgeSecret("the-edge-s-secret-0123456789".into()),
            ..EdgeConfig::default()
        };
        let head = Head {
            method: "POST".into(),
            path_and_query: "/v1/charges".into(),
            headers: vec![
                (
                    "Idem-Edge-Secret".into(),
                    "a-client-s-guess-0123456789".into(),
                ),
                ("IDEM-EDGE-SECRET".into(), "another-guess-0123456789".into()),
                ("idempotency-key".into(), "k1".into()),
            ],
            scheme: "https".into(),
        };
        let secrets = |out: &Outbound| -> Vec<String> {
            out.headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(contract::EDGE_SECRET))
                .map(|(_, v)| v.clone())
                .collect()
        };
        let guarded = outbound_guarded(&config, &head, Vec::new());
        assert_eq!(secrets(&guarded), ["the-edge-s-secret-0123456789"]);
        assert!(
            !format!("{guarded:?}").contains("0123456789"),
            "{guarded:?}"
        );
        let passed = outbound(&config, &head, Vec::new());
        assert_eq!(secrets(&passed), Vec::<String>::new(), "unguarded: none");
    }
}
