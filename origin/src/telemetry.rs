//! Traces out of the process (`--otlp-endpoint`): the layer's `tracing` spans
//! (`idem.request`, `idem.store`) become OpenTelemetry spans, sent over OTLP/HTTP
//! (protobuf) in batches from a Tokio task.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::Targets;

/// Where spans are sent: `endpoint` (an OTLP/HTTP receiver's base URL) with the traces
/// path, unless it has it. (Not read from `OTEL_EXPORTER_OTLP_ENDPOINT`: a deployment
/// may set that for other programs, to a gRPC port or over https.)
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

/// The provider exporting to `endpoint`; call within a Tokio runtime. Its service name
/// is `OTEL_SERVICE_NAME`, else `idem-origin`; batching follows the `OTEL_BSP_*`
/// variables.
pub fn provider(endpoint: &str) -> Result<SdkTracerProvider, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(traces_url(endpoint)?)
        .build()
        .map_err(|e| format!("cannot build the OTLP exporter: {e}"))?;
    let processor =
        BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    let name = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "idem-origin".into());
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(Resource::builder().with_service_name(name).build())
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
