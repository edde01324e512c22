//! Traces: a span per guarded request (`idem.request`), its store round trips as child
//! spans (`idem.store`, from [`crate::metrics::timed`]), the W3C trace context taken from
//! the request and handed on to the handler, and the execution's trace stored with its
//! answer ([`idem_core::contract::EXECUTION_TRACE`]) so that a replay's span links to it.
//!
//! The spans are `tracing` spans at DEBUG level: without a subscriber that wants them
//! they cost nothing. With the `otel` feature and an OpenTelemetry layer
//! (tracing-opentelemetry), the request's `traceparent` becomes the span's parent, the
//! handler's request carries the span's own `traceparent`, and replays link to the
//! execution; without it those are no-ops.

use http::request::Parts;
use http::HeaderMap;
#[cfg(feature = "otel")]
use idem_core::contract;
use tracing::field::Empty;
use tracing::Span;

/// The span of one guarded request, named as OpenTelemetry's HTTP conventions say
/// (`{method} {http.route}`, `route` the path pattern the request matched, if any);
/// its fields are filled in as the request goes ([`record`]). Its parent is the
/// request's `traceparent`, when it has a valid one.
pub(crate) fn request_span(parts: &Parts, route: Option<&str>) -> Span {
    let span = tracing::debug_span!(
        "idem.request",
        otel.name = %SpanName(&parts.method, route),
        otel.kind = "server",
        http.request.method = %parts.method,
        http.route = route,
        http.response.status_code = Empty,
        server.address = server_address(parts),
        url.path = parts.uri.path(),
        idem.outcome = Empty,
        idem.scope = Empty,
        idem.record_key = Empty,
        idem.token = Empty,
        idem.takeover = Empty,
        idem.replayed = Empty,
    );
    #[cfg(feature = "otel")]
    if !span.is_disabled() {
        otel::adopt_parent(&span, &parts.headers);
    }
    span
}

/// `{method} {route}`, or the method alone: formatted only by a subscriber that
/// wants the span.
struct SpanName<'a>(&'a http::Method, Option<&'a str>);

impl std::fmt::Display for SpanName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.1 {
            Some(route) => write!(f, "{} {route}", self.0),
            None => write!(f, "{}", self.0),
        }
    }
}

/// The host the client asked for, without its port (`Host`, or the target's authority).
fn server_address(parts: &Parts) -> Option<&str> {
    let host = parts
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| parts.uri.host())?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    Some(host).filter(|h| !h.is_empty())
}

/// Records the answer's status on the request's span.
pub(crate) fn record_status(span: &Span, status: u16) {
    if !span.is_disabled() {
        span.record("http.response.status_code", status);
    }
}

/// Records the request's scope and record key (prefixes: enough to find them, not to
/// guess them) on the current span.
pub(crate) fn record_key(scope: &idem_core::Scope, key: &idem_core::RecordKey) {
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    span.record("idem.scope", idem_core::hex(&scope.as_bytes()[..8]));
    span.record("idem.record_key", &key.as_str()[..16]);
}

/// Records the claim on the current span.
pub(crate) fn record_claim(token: u64, took_over: bool) {
    let span = Span::current();
    span.record("idem.token", token);
    span.record("idem.takeover", took_over);
}

/// Records a replay on the current span, linked to the execution that produced it.
pub(crate) fn record_replay(stored: &[(String, Vec<u8>)]) {
    let span = Span::current();
    span.record("idem.replayed", true);
    #[cfg(feature = "otel")]
    if let Some(execution) = contract::execution_trace(stored) {
        otel::link(&span, execution);
    }
    #[cfg(not(feature = "otel"))]
    let _ = stored;
}

/// Sets the handler's `traceparent` to the current span's, so that the handler (and in
/// proxy mode the upstream) continues this trace. Leaves it alone when there is none.
pub(crate) fn hand_on(headers: &mut HeaderMap) {
    #[cfg(feature = "otel")]
    if let Some(value) = traceparent() {
        if let Ok(value) = http::HeaderValue::from_str(&value) {
            headers.insert("traceparent", value);
        }
    }
    #[cfg(not(feature = "otel"))]
    let _ = headers;
}

/// The stored answer's [`idem_core::contract::EXECUTION_TRACE`]: the current span's
/// `traceparent`.
pub(crate) fn execution_header() -> Option<(String, Vec<u8>)> {
    #[cfg(feature = "otel")]
    {
        traceparent().map(|v| (contract::EXECUTION_TRACE.to_owned(), v.into_bytes()))
    }
    #[cfg(not(feature = "otel"))]
    None
}

#[cfg(feature = "otel")]
fn traceparent() -> Option<String> {
    otel::traceparent(&Span::current())
}

#[cfg(feature = "otel")]
mod otel {
    use http::HeaderMap;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::Context;
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    /// Parses a W3C `traceparent` (version 00): `00-<32 hex>-<16 hex>-<2 hex>`.
    pub(super) fn parse(value: &[u8]) -> Option<SpanContext> {
        let value = std::str::from_utf8(value).ok()?.trim();
        let mut parts = value.split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let lower_hex = |s: &str, n: usize| {
            s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        if version != "00"
            || parts.next().is_some()
            || !lower_hex(trace, 32)
            || !lower_hex(span, 16)
            || !lower_hex(flags, 2)
        {
            return None;
        }
        let context = SpanContext::new(
            TraceId::from_hex(trace).ok()?,
            SpanId::from_hex(span).ok()?,
            TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
            true,
            TraceState::default(),
        );
        context.is_valid().then_some(context)
    }

    /// Makes the request's `traceparent` (one, valid) the span's parent — unless the
    /// application already traces the request (a server span of its own is current):
    /// then that span is the parent, as it should be.
    pub(super) fn adopt_parent(span: &Span, headers: &HeaderMap) {
        if Span::current().context().span().span_context().is_valid() {
            return;
        }
        let mut values = headers.get_all("traceparent").iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return;
        };
        if let Some(parent) = parse(value.as_bytes()) {
            let _ = span.set_parent(Context::new().with_remote_span_context(parent));
        }
    }

    /// The span's own `traceparent`, when an OpenTelemetry layer gave it a context.
    pub(super) fn traceparent(span: &Span) -> Option<String> {
        let context = span.context();
        let context = context.span().span_context().clone();
        context.is_valid().then(|| {
            format!(
                "00-{}-{}-{:02x}",
                context.trace_id(),
                context.span_id(),
                context.trace_flags().to_u8()
            )
        })
    }

    /// Links the span to the execution whose `traceparent` the record kept.
    pub(super) fn link(span: &Span, execution: &[u8]) {
        if let Some(context) = parse(execution) {
            span.add_link(context);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::parse;

        #[test]
        fn reads_w3c_traceparent_and_nothing_else() {
            let ok = parse(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
            assert_eq!(
                ok.trace_id().to_string(),
                "0af7651916cd43dd8448eb211c80319c"
            );
            assert_eq!(ok.span_id().to_string(), "b7ad6b7169203331");
            assert!(ok.is_sampled());
            for bad in [
                &b""[..],
                b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
                b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                b"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
                b"00-00000000000000000000000000000000-b7ad6b7169203331-01",
                b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
                b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
                b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-zz",
            ] {
                assert!(parse(bad).is_none(), "{:?}", String::from_utf8_lossy(bad));
            }
        }
    }
}
