//! The RFC 9457 problems idem answers with — type, title, status, `Retry-After`, and
//! the detail the client reads — the same bytes from the edge and the origin.

use crate::InvalidSetting;
use crate::{KeyError, StoredResponse};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

/// Where problem `type` URIs point by default: the repository's page with a section
/// per problem, so that a person who meets one can follow it.
pub const DEFAULT_PROBLEM_BASE: &str =
    "https://github.com/idem-rs/idem/blob/main/docs/problems.md#";

/// Whether `base` may prefix problem types: an absolute `https://` or `http://` URL
/// (ending where the problem's name follows: `#`, `/`, `=`…), or a `urn:`; visible
/// ASCII, no quotes or spaces.
pub fn check_problem_base(base: &str) -> Result<(), InvalidSetting> {
    let scheme_ok = ["https://", "http://", "urn:"].iter().any(|s| {
        base.len() > s.len() && base.as_bytes()[..s.len()].eq_ignore_ascii_case(s.as_bytes())
    });
    let bytes_ok = base
        .bytes()
        .all(|b| b.is_ascii_graphic() && !b"\"<>\\^`{|}".contains(&b));
    if !scheme_ok || !bytes_ok {
        return Err(InvalidSetting::from(format!(
            "{base:?} cannot prefix problem types: give an absolute https:// URL (or a urn:) \
             that the problem's name completes, e.g. https://docs.example/problems#"
        )));
    }
    Ok(())
}

/// Every error idem itself produces, each with a stable problem `type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Problem {
    /// 400: the route requires an `Idempotency-Key` and none was sent.
    KeyMissing,
    /// 400: the key is empty, too long, non-ASCII or a bad sf-string.
    KeyMalformed,
    /// 413: the body is larger than the configured limit.
    BodyTooLarge,
    /// 400: the body could not be read.
    BodyUnreadable,
    /// 408: the body did not arrive within the server's body deadlines (a slow or
    /// stalled client). Nothing was claimed or run.
    BodyTimeout,
    /// 503: the server is at its limit of requests or of request bodies buffered at
    /// once. Nothing was claimed or run; retry after a moment.
    Busy,
    /// 503: the store is at its configured capacity (the memory store's cap on
    /// records or bytes). Nothing was claimed or run.
    StoreFull,
    /// 429: this caller (its scope) is at its quota of requests in progress or of new
    /// keys in a window. Nothing was claimed or run.
    ScopeQuota,
    /// 409: the same request is still running.
    InFlight,
    /// 422: the key was used for a different request.
    Mismatch,
    /// 503: the idempotency store is unreachable; the handler did not run.
    StoreUnavailable,
    /// 500: the handler panicked. Execution began, so this answer is stored.
    HandlerPanicked,
    /// 502: the handler's response broke off mid-body, or it ran past the maximum
    /// execution time. Execution began and its outcome is unknown: this answer is
    /// stored, and the request is never silently run again.
    HandlerFailed,
    /// 500: the request ran and its answer was delivered to the first attempt, but it
    /// was too large to keep for replay. Stored in its place, so the key stays used.
    ResponseNotStored,
    /// 500: the edge's configuration is missing or invalid; nothing was forwarded.
    EdgeMisconfigured,
    /// 409: this attempt lost its claim to a newer attempt (its lease ran out while it
    /// was paused or cut off) and its transaction was rolled back: nothing it did
    /// happened. Never stored; a retry gets the request's result.
    Fenced,
    /// 502: proxy mode could not reach its upstream (connection refused, no such
    /// host): nothing was sent, the key is released, a retry may run it.
    UpstreamUnreachable,
    /// 502: proxy mode sent the request to its upstream and lost the answer (a timeout,
    /// a dropped connection): the upstream may have acted. Stored, and never sent again
    /// for this key (unless configured otherwise).
    UpstreamOutcomeUnknown,
    /// 401: keys are kept per caller, and this request says who it is nowhere the
    /// configuration looks (`--anonymous refused`). Nothing was claimed.
    IdentityMissing,
    /// 401: the bearer JWT did not verify (signature, algorithm, `exp`, `nbf`, the
    /// claim). Never taken for anonymous. Nothing was claimed.
    IdentityInvalid,
    /// 400: a guarded request's path is spelled so that servers disagree on what it
    /// names (an encoded `/` or `\`, a `;` parameter, a `.` or `..` segment): idem
    /// could apply one route's settings and the API serve another's. Nothing ran.
    PathAmbiguous,
    /// 400: the request carries an `Idempotency-Key`, but its route reads the key from
    /// other headers (`key_header`): run unguarded, it would not be what its client
    /// thinks. Nothing ran.
    KeyHeaderNotRead,
    /// 502: the edge could not reach the origin, or lost its answer: the origin may
    /// have run the request. Never stored at the edge; a retry with the same key gets
    /// the request's result (the origin replays what it stored, or runs it if it never
    /// got it). Unlike `handler-failed`, not a final answer.
    OriginUnreachable,
}

impl Problem {
    /// All problems, for documentation and tests.
    pub const ALL: [Problem; 23] = [
        Problem::KeyMissing,
        Problem::KeyMalformed,
        Problem::BodyTooLarge,
        Problem::BodyUnreadable,
        Problem::BodyTimeout,
        Problem::Busy,
        Problem::StoreFull,
        Problem::ScopeQuota,
        Problem::InFlight,
        Problem::Mismatch,
        Problem::StoreUnavailable,
        Problem::HandlerPanicked,
        Problem::HandlerFailed,
        Problem::ResponseNotStored,
        Problem::Fenced,
        Problem::EdgeMisconfigured,
        Problem::UpstreamUnreachable,
        Problem::UpstreamOutcomeUnknown,
        Problem::IdentityMissing,
        Problem::IdentityInvalid,
        Problem::PathAmbiguous,
        Problem::KeyHeaderNotRead,
        Problem::OriginUnreachable,
    ];

    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            Problem::KeyMissing
            | Problem::KeyMalformed
            | Problem::BodyUnreadable
            | Problem::PathAmbiguous
            | Problem::KeyHeaderNotRead => 400,
            Problem::BodyTooLarge => 413,
            Problem::BodyTimeout => 408,
            Problem::Busy | Problem::StoreFull => 503,
            Problem::ScopeQuota => 429,
            Problem::IdentityMissing | Problem::IdentityInvalid => 401,
            Problem::InFlight | Problem::Fenced => 409,
            Problem::Mismatch => 422,
            Problem::StoreUnavailable => 503,
            Problem::HandlerPanicked => 500,
            Problem::HandlerFailed
            | Problem::UpstreamUnreachable
            | Problem::UpstreamOutcomeUnknown
            | Problem::OriginUnreachable => 502,
            Problem::ResponseNotStored | Problem::EdgeMisconfigured => 500,
        }
    }

    /// The problem's stable name: the last part of its `type` URI, and the heading of
    /// its section in `docs/problems.md`.
    pub fn slug(self) -> &'static str {
        match self {
            Problem::KeyMissing => "idempotency-key-missing",
            Problem::KeyMalformed => "idempotency-key-malformed",
            Problem::BodyTooLarge => "body-too-large",
            Problem::BodyUnreadable => "body-unreadable",
            Problem::BodyTimeout => "body-timeout",
            Problem::Busy => "server-busy",
            Problem::StoreFull => "store-full",
            Problem::ScopeQuota => "scope-quota",
            Problem::InFlight => "request-in-flight",
            Problem::Mismatch => "idempotency-key-reused",
            Problem::StoreUnavailable => "store-unavailable",
            Problem::HandlerPanicked => "handler-panicked",
            Problem::HandlerFailed => "handler-failed",
            Problem::ResponseNotStored => "response-not-stored",
            Problem::Fenced => "fenced",
            Problem::EdgeMisconfigured => "edge-misconfigured",
            Problem::UpstreamUnreachable => "upstream-unreachable",
            Problem::OriginUnreachable => "origin-unreachable",
            Problem::UpstreamOutcomeUnknown => "upstream-outcome-unknown",
            Problem::IdentityMissing => "identity-missing",
            Problem::IdentityInvalid => "identity-invalid",
            Problem::PathAmbiguous => "path-ambiguous",
            Problem::KeyHeaderNotRead => "idempotency-key-header-not-read",
        }
    }

    /// The `type` URI under the default base ([`DEFAULT_PROBLEM_BASE`]): the section of
    /// the repository's `docs/problems.md` that explains it.
    pub fn type_uri(self) -> String {
        self.type_uri_under(DEFAULT_PROBLEM_BASE)
    }

    /// The `type` URI under `base` (an operator's own page: [`check_problem_base`]).
    pub fn type_uri_under(self, base: &str) -> String {
        let mut uri = String::with_capacity(base.len() + 32);
        uri.push_str(base);
        uri.push_str(self.slug());
        uri
    }

    /// The short human-readable summary.
    pub fn title(self) -> &'static str {
        match self {
            Problem::KeyMissing => "Idempotency-Key header required",
            Problem::KeyMalformed => "Malformed Idempotency-Key header",
            Problem::BodyTooLarge => "Request body too large",
            Problem::BodyUnreadable => "Request body could not be read",
            Problem::BodyTimeout => "Request body not received in time",
            Problem::Busy => "The server is at its limit of requests in progress",
            Problem::StoreFull => "The idempotency store is full",
            Problem::ScopeQuota => "This caller is at its quota",
            Problem::InFlight => "A request with this Idempotency-Key is still being processed",
            Problem::Mismatch => "Idempotency-Key reused with a different request",
            Problem::StoreUnavailable => "Idempotency store unavailable",
            Problem::HandlerPanicked => "The request handler failed",
            Problem::HandlerFailed => "The request handler's outcome is unknown",
            Problem::ResponseNotStored => "The answer was too large to keep for replay",
            Problem::Fenced => {
                "This attempt lost its claim to a newer one; nothing it did was kept"
            }
            Problem::EdgeMisconfigured => "The edge is misconfigured",
            Problem::UpstreamUnreachable => "The upstream could not be reached",
            Problem::OriginUnreachable => "The origin could not be reached, or its answer was lost",
            Problem::UpstreamOutcomeUnknown => "The upstream's outcome is unknown",
            Problem::IdentityMissing => "Who is asking is needed to keep the key apart",
            Problem::IdentityInvalid => "The caller's token was not accepted",
            Problem::PathAmbiguous => "The request's path is spelled ambiguously",
            Problem::KeyHeaderNotRead => "This path reads its idempotency key from another header",
        }
    }

    /// The detail sent when there is nothing more specific to say.
    pub fn detail(self) -> &'static str {
        match self {
            Problem::KeyMissing => {
                "send an Idempotency-Key header, e.g. Idempotency-Key: \"<uuid>\""
            }
            Problem::KeyMalformed => "the Idempotency-Key header is not a valid key",
            Problem::BodyTooLarge => "the request body is larger than this route accepts",
            Problem::BodyUnreadable => "the request body could not be read",
            Problem::BodyTimeout => "the request body did not arrive within the time this server allows; nothing was run",
            Problem::Busy => "the server is at its limit of requests or request bodies in progress; nothing was run, retry later",
            Problem::StoreFull => "the idempotency store holds as many records as it is allowed to; nothing was run",
            Problem::ScopeQuota => "this caller has as many requests in progress, or has made as many new keys lately, as it is allowed to; nothing was run, retry later",
            Problem::InFlight => "retry later, or send Prefer: wait=<seconds> to wait for it",
            Problem::Mismatch => "this Idempotency-Key was already used with a different method, path, content type or body",
            Problem::StoreUnavailable => {
                "the idempotency store did not answer; the request was not processed"
            }
            Problem::HandlerPanicked => "the handler failed; it will not run again for this key",
            Problem::HandlerFailed => "the handler's response broke off; its outcome is unknown and it will not run again for this key",
            Problem::ResponseNotStored => {
                "the request was executed; its answer was delivered to the first attempt only"
            }
            Problem::Fenced => "another attempt took over this request; the transaction was rolled back",
            Problem::EdgeMisconfigured => "the edge's configuration is invalid; nothing was forwarded",
            Problem::UpstreamUnreachable => "nothing was sent to the upstream; retry with the same key",
            Problem::OriginUnreachable => "the request may have been processed; retry with the same key to get its result",
            Problem::UpstreamOutcomeUnknown => "the request was sent to the upstream and its answer was lost; it will not be sent again for this key",
            Problem::IdentityMissing => "send the identity this API scopes keys by",
            Problem::IdentityInvalid => "the bearer token was not accepted",
            Problem::KeyHeaderNotRead => "this path does not read Idempotency-Key; send the key in the header it reads",
            Problem::PathAmbiguous => "send the path as the API spells it: no encoded / or \\ (%2F, %5C), no ; parameters, no . or .. segments",
        }
    }

    /// Whether the answer carries `Retry-After`.
    pub fn retry_after_secs(self) -> Option<u64> {
        match self {
            Problem::InFlight
            | Problem::StoreUnavailable
            | Problem::Fenced
            | Problem::OriginUnreachable
            | Problem::Busy
            | Problem::ScopeQuota => Some(1),
            Problem::StoreFull => Some(30),
            _ => None,
        }
    }

    /// The `application/problem+json` body, with `detail` when given.
    pub fn body(self, detail: Option<&str>) -> Vec<u8> {
        self.body_under(DEFAULT_PROBLEM_BASE, detail)
    }

    /// [`Problem::body`] with its type under `base`.
    pub fn body_under(self, base: &str, detail: Option<&str>) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"{\"type\":");
        crate::json::write_string(self.type_uri_under(base).as_bytes(), &mut out);
        out.extend_from_slice(b",\"title\":");
        crate::json::write_string(self.title().as_bytes(), &mut out);
        out.extend_from_slice(format!(",\"status\":{}", self.status()).as_bytes());
        if let Some(detail) = detail {
            out.extend_from_slice(b",\"detail\":");
            crate::json::write_string(detail.as_bytes(), &mut out);
        }
        out.push(b'}');
        out
    }
}

/// One of idem's own answers: a problem and the detail the client reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// What went wrong.
    pub problem: Problem,
    /// What the client should know or do about it.
    pub detail: String,
}

impl Rejection {
    /// The problem with its standard detail ([`Problem::detail`]).
    pub fn new(problem: Problem) -> Rejection {
        Rejection {
            problem,
            detail: problem.detail().into(),
        }
    }

    /// The problem with a detail of its own.
    pub fn with_detail(problem: Problem, detail: impl Into<String>) -> Rejection {
        Rejection {
            problem,
            detail: detail.into(),
        }
    }

    /// A single `Idempotency-Key` header that is not a valid key.
    pub fn key_malformed(error: KeyError) -> Rejection {
        Rejection::with_detail(Problem::KeyMalformed, error.to_string())
    }

    /// Two `Idempotency-Key` headers, or one whose value a runtime joined from two.
    pub fn several_keys() -> Rejection {
        Rejection::with_detail(
            Problem::KeyMalformed,
            "send exactly one Idempotency-Key header",
        )
    }

    /// A guarded request's body over `limit` bytes.
    pub fn body_too_large(limit: usize) -> Rejection {
        Rejection::with_detail(Problem::BodyTooLarge, format!("the limit is {limit} bytes"))
    }

    /// A handler that ran past its maximum execution time: the request's result.
    pub fn execution_timed_out() -> Rejection {
        Rejection::with_detail(
            Problem::HandlerFailed,
            "the handler ran past its maximum execution time; its outcome is unknown and it will not run again for this key",
        )
    }

    /// The execution ended without an answer (its task was lost): nothing is known of
    /// its outcome, and its claim is left to its lease.
    pub fn execution_lost() -> Rejection {
        Rejection::with_detail(
            Problem::HandlerPanicked,
            "the execution ended without an answer; its outcome is unknown",
        )
    }

    /// An answer too large to keep, stored in its place: the request's result.
    pub fn response_not_stored(limit: usize) -> Rejection {
        Rejection::with_detail(
            Problem::ResponseNotStored,
            format!("the request was executed; its answer, larger than {limit} bytes, was delivered to the first attempt only"),
        )
    }

    /// The edge could not reach the origin (or lost its answer): a retry with the same
    /// key learns the outcome. Only the error's first line, at most 200 characters,
    /// reaches the client: a runtime's error may carry a stack trace.
    pub fn origin_unreachable(error: &str) -> Rejection {
        let shown = first_line_of(error);
        Rejection::with_detail(
            Problem::OriginUnreachable,
            format!("the origin could not be reached, or its answer was lost ({shown}); retry with the same key to get the request's result"),
        )
    }

    /// The edge could not reach the origin with a request it does not guard (no key):
    /// the request may have reached it. Nothing invites a retry.
    pub fn origin_unreachable_unguarded(error: &str) -> Rejection {
        let shown = first_line_of(error);
        Rejection::with_detail(
            Problem::HandlerFailed,
            format!("the origin could not be reached, or its answer was lost: {shown}"),
        )
    }

    /// The origin's answer has a status the edge's runtime cannot send
    /// ([`super::fetch_can_send_status`]): the request ran, and its answer is final —
    /// the origin replays it to every retry, which the edge answers with this again.
    pub fn undeliverable_status(status: u16) -> Rejection {
        Rejection::with_detail(
            Problem::HandlerFailed,
            format!("the origin answered with status {status}, outside the 200-599 the edge can send: the request was processed, and its answer cannot be delivered here"),
        )
    }

    /// A stored answer that cannot be decoded any more.
    pub fn unreadable_replay() -> Rejection {
        Rejection::with_detail(
            Problem::HandlerFailed,
            "the stored response could not be read",
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.problem.status()
    }

    /// The `application/problem+json` body.
    pub fn body(&self) -> Vec<u8> {
        self.problem.body(Some(&self.detail))
    }

    /// [`Rejection::body`] with its type under `base`.
    pub fn body_under(&self, base: &str) -> Vec<u8> {
        self.problem.body_under(base, Some(&self.detail))
    }

    /// The headers of the refusal, in this order: never cacheable, and `Retry-After`
    /// where a retry may succeed.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = vec![
            ("content-type", String::from(super::PROBLEM_CONTENT_TYPE)),
            ("cache-control", String::from("no-store")),
        ];
        if let Some(secs) = self.problem.retry_after_secs() {
            headers.push(("retry-after", secs.to_string()));
        }
        // RFC 9110 §15.5.2: a 401 carries a challenge.
        if self.status() == 401 {
            headers.push(("www-authenticate", String::from("Bearer")));
        }
        headers
    }

    /// The problem as the request's result — stored and replayed like any answer
    /// (a handler that panicked, failed or answered too much): its content type only.
    pub fn as_result(&self) -> StoredResponse {
        self.as_result_under(DEFAULT_PROBLEM_BASE)
    }

    /// [`Rejection::as_result`] with its type under `base`.
    pub fn as_result_under(&self, base: &str) -> StoredResponse {
        StoredResponse {
            status: self.status(),
            headers: vec![(
                String::from("content-type"),
                super::PROBLEM_CONTENT_TYPE.as_bytes().to_vec(),
            )],
            body: self.body_under(base),
        }
    }
}

/// A runtime error's first line, at most 200 characters: what of it reaches a client
/// (an error may carry a stack trace).
/// The first line of a runtime's error, at most 200 characters, with the credentials
/// of any URL in it cut out: the error of a fetch may name `ORIGIN_URL`, user and
/// password included, and this text goes to the client.
fn first_line_of(error: &str) -> String {
    let line: String = error
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect();
    without_userinfo(&line)
}

/// `text` with every URL's `user:password@` removed.
fn without_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c.is_whitespace() || "/?#\"'<>(){}".contains(c))
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        out.push_str(
            authority
                .rfind('@')
                .map_or(authority, |i| &authority[i + 1..]),
        );
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    #[wasm_bindgen_test::wasm_bindgen_test(unsupported = test)]
    fn a_problem_base_is_checked_without_panicking() {
        use super::check_problem_base;
        assert!(check_problem_base("https://docs.example/errors#").is_ok());
        assert!(check_problem_base("urn:acme:problem:").is_ok());
        for bad in [
            "urné",
            "é",
            "",
            "https://",
            "docs/problems#",
            "https://a b/",
        ] {
            assert!(check_problem_base(bad).is_err(), "{bad:?}");
        }
    }

    #[wasm_bindgen_test::wasm_bindgen_test(unsupported = test)]
    fn a_fetch_error_never_shows_the_origin_s_credentials() {
        let shown = Rejection::origin_unreachable(
            "Network connection lost to https://edge:s3cret@origin.example:8443/v1 (retry)\nmore",
        );
        assert!(
            !shown.detail.contains("s3cret") && !shown.detail.contains("edge:"),
            "{}",
            shown.detail
        );
        assert!(
            shown
                .detail
                .contains("https://origin.example:8443/v1 (retry)"),
            "{}",
            shown.detail
        );
        assert!(!shown.detail.contains("more"));
        let unguarded = Rejection::origin_unreachable_unguarded("fetch http://u@[::1]:80/x failed");
        assert!(
            unguarded.detail.contains("fetch http://[::1]:80/x failed"),
            "{}",
            unguarded.detail
        );
        assert_eq!(without_userinfo("no url here"), "no url here");
        assert_eq!(without_userinfo("a://b@c d://e"), "a://c d://e");
        assert_eq!(without_userinfo("x://"), "x://");
    }

    use super::super::PROBLEM_CONTENT_TYPE;
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    /// Found untested by cargo-mutants (docs/mutants.md): each problem has a title of
    /// its own, and details that say something.
    #[wasm_bindgen_test(unsupported = test)]
    fn titles_are_distinct_and_details_say_something() {
        let titles: alloc::collections::BTreeSet<&str> =
            Problem::ALL.iter().map(|p| p.title()).collect();
        assert_eq!(titles.len(), Problem::ALL.len());
        assert!(!titles.contains(""));
        let details: alloc::collections::BTreeSet<&str> =
            Problem::ALL.iter().map(|p| p.detail()).collect();
        assert!(details.len() > 1 && !details.contains(""));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn problem_bodies_are_json() {
        for p in Problem::ALL {
            let body = p.body(Some("say \"hi\"\n"));
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["status"], p.status());
            assert_eq!(v["type"], p.type_uri());
            assert_eq!(v["detail"], "say \"hi\"\n");
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn refusals_are_never_cacheable_and_results_keep_only_their_type() {
        let busy = Rejection::new(Problem::InFlight);
        assert_eq!(
            busy.headers(),
            [
                ("content-type", String::from(PROBLEM_CONTENT_TYPE)),
                ("cache-control", String::from("no-store")),
                ("retry-after", String::from("1")),
            ]
        );
        assert_eq!(Rejection::new(Problem::Mismatch).headers().len(), 2);
        let result = Rejection::execution_timed_out().as_result();
        assert_eq!(result.status, 502);
        assert_eq!(
            result.headers,
            [(
                String::from("content-type"),
                PROBLEM_CONTENT_TYPE.as_bytes().to_vec()
            )]
        );
        let v: serde_json::Value = serde_json::from_slice(&result.body).unwrap();
        assert_eq!(
            v["detail"],
            Rejection::execution_timed_out().detail.as_str()
        );
        let traced =
            Rejection::origin_unreachable("TypeError: Invalid URL\n    at f (index.js:1:2)");
        assert_eq!(traced.problem, Problem::OriginUnreachable);
        assert_eq!(
            traced.detail,
            "the origin could not be reached, or its answer was lost (TypeError: Invalid URL); retry with the same key to get the request's result"
        );
        let long = "x".repeat(1_000);
        assert!(Rejection::origin_unreachable(&long).detail.len() < 400);
        for p in Problem::ALL {
            assert!(!p.detail().is_empty());
            assert_eq!(Rejection::new(p).status(), p.status());
        }
    }
}
