//! Traces out of the process (`--otlp-endpoint`): the layer's `tracing` spans
//! (`idem.request`, `idem.store`) become OpenTelemetry spans, sent over OTLP/HTTP
//! (protobuf) in batches from a Tokio task.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::Targets;

/// Where spans go, as OpenTelemetry's variables say unless `--otlp-endpoint` does:
/// the flag (a receiver's base URL, the traces path added), else
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (taken as is), else `OTEL_EXPORTER_OTLP_ENDPOINT`
/// (the traces path added); `None`, no export — also with `OTEL_TRACES_EXPORTER=none`
/// or `OTEL_SDK_DISABLED=true`. Only OTLP over HTTP with protobuf, in plain HTTP, is
/// sent: a protocol variable naming gRPC, or an https endpoint, is refused at start-up
/// rather than exported to in vain. (`OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT` and
/// their `TRACES_` forms are read by the exporter itself.)
pub fn endpoint(
    flag: Option<&str>,
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<String>, String> {
    let set = |name: &str| {
        var(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || set("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
    {
        return Ok(None);
    }
    let url = match (
        flag,
        set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        set("OTEL_EXPORTER_OTLP_ENDPOINT"),
    ) {
        (Some(flag), _, _) => traces_url(flag)?,
        (None, Some(exact), _) => {
            traces_url(&exact)
                .map_err(|e| e.replace("--otlp-endpoint", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))?;
            exact
        }
        (None, None, Some(base)) => traces_url(&base)
            .map_err(|e| e.replace("--otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT"))?,
        (None, None, None) => return Ok(None),
    };
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(protocol) = set(name) {
            if protocol != "http/protobuf" {
                return Err(format!(
                    "{name}={protocol}: idem-origin sends traces over OTLP/HTTP with protobuf \
                     only (http/protobuf); point it at such a receiver (a collector's :4318)"
                ));
            }
            break;
        }
    }
    Ok(Some(url))
}

/// Where spans are sent: `endpoint` (an OTLP/HTTP receiver's base URL) with the traces
/// path, unless it has it.
pub fn traces_url(endpoint: &str) -> Result<String, String> {
    let endpoint = endpoint.trim().trim_end_matches('/');
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(format!(
            "--otlp-endpoint {endpoint:?}: an OTLP/HTTP receiver's URL, e.g. http://127.0.0.1:4318"
        ));
    }
    if endpoint.starts_with("https://") {
        return Err(
            "--otlp-endpoint: https is not supported yet; send to a local collector over http"
                .into(),
        );
    }
    Ok(if endpoint.ends_with("/v1/traces") {
        endpoint.to_owned()
    } else {
        format!("{endpoint}/v1/traces")
    })
}

/// The provider exporting to `url` (the traces endpoint, [`endpoint`]); call within a
/// Tokio runtime. Its service name is `OTEL_SERVICE_NAME`, else `idem-origin`, its
/// `service.version` this build's, `OTEL_RESOURCE_ATTRIBUTES` added; batching follows
/// the `OTEL_BSP_*` variables.
pub fn provider(url: &str) -> Result<SdkTracerProvider, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .build()
        .map_err(|e| format!("cannot build the OTLP exporter: {e}"))?;
    let processor =
        BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    let name = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "idem-origin".into());
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(
            Resource::builder()
                .with_service_name(name)
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .build())
}

/// The `tracing` layer sending idem's spans through `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::Layer as _;
    // idem's spans only: its log events (which may name a whole key) stay in the logs.
    let spans = Targets::new()
        .with_target("idem::idempotency", tracing::Level::DEBUG)
        .with_target("idem::metrics", tracing::Level::DEBUG)
        .and(tracing_subscriber::filter::filter_fn(|m| m.is_span()));
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("idem"))
        .with_filter(spans)
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn opentelemetry_s_variables_say_where_unless_the_flag_does() {
        use super::endpoint;
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        const BASE: &str = "http://c:4318";
        assert_eq!(endpoint(None, env(&[])), Ok(None));
        assert_eq!(
            endpoint(None, env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", BASE)])),
            Ok(Some("http://c:4318/v1/traces".into()))
        );
        assert_eq!(
            endpoint(
                None,
                env(&[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", BASE),
                    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:4318/custom")
                ])
            ),
            Ok(Some("http://t:4318/custom".into())),
            "the signal's own endpoint, as is"
        );
        assert_eq!(
            endpoint(
                Some("http://f:4318"),
                env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", BASE)])
            ),
            Ok(Some("http://f:4318/v1/traces".into())),
            "the flag wins"
        );
        assert_eq!(
            endpoint(
                Some("http://f:4318"),
                env(&[("OTEL_TRACES_EXPORTER", "none")])
            ),
            Ok(None)
        );
        assert_eq!(
            endpoint(
                None,
                env(&[
                    ("OTEL_SDK_DISABLED", "true"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", BASE)
                ])
            ),
            Ok(None)
        );
        let grpc = endpoint(
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ]),
        )
        .unwrap_err();
        assert!(grpc.contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc"), "{grpc}");
        let https =
            endpoint(None, env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c")])).unwrap_err();
        assert!(https.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT"), "{https}");
    }

    #[test]
    fn the_traces_path_is_added_once() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/v1/traces/").unwrap(),
            "http://c:4318/v1/traces"
        );
        assert!(traces_url("127.0.0.1:4318").is_err());
        assert!(traces_url("https://c").is_err());
    }
}
