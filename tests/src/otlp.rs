//! An OTLP/HTTP receiver (protobuf, `POST /v1/traces`), as a collector runs one: the
//! trace tests send real exports to it and read back the spans they carried.

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// A span as received.
#[derive(Clone, Debug)]
pub struct Span {
    /// The resource's `service.name`.
    pub service: String,
    /// The resource's `service.version`.
    pub version: String,
    /// OTLP's span kind: 2 server, 3 client.
    pub kind: i32,
    /// The span's name.
    pub name: String,
    /// Hex ids.
    pub trace_id: String,
    /// Its own id.
    pub span_id: String,
    /// Its parent's id; empty for a root.
    pub parent_span_id: String,
    /// Its attributes, as text.
    pub attributes: BTreeMap<String, String>,
    /// Its links: (trace id, span id).
    pub links: Vec<(String, String)>,
}

/// The receiver: its address, and the spans received so far.
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    /// Exports that were not a valid ExportTraceServiceRequest.
    rejected: Arc<Mutex<usize>>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// What the receiver keeps: the spans, and how many exports it refused.
type Received = (Arc<Mutex<Vec<Span>>>, Arc<Mutex<usize>>);

async fn export(
    State((spans, rejected)): State<Received>,
    body: Bytes,
) -> (http::StatusCode, [(&'static str, &'static str); 1], Vec<u8>) {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        *rejected.lock().unwrap() += 1;
        return (
            http::StatusCode::BAD_REQUEST,
            [("content-type", "text/plain")],
            b"not an ExportTraceServiceRequest".to_vec(),
        );
    };
    let mut received = spans.lock().unwrap();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|a| a.key == "service.name")
            .map(|a| text(&a.value))
            .unwrap_or_default();
        let version = resource_spans
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|a| a.key == "service.version")
            .map(|a| text(&a.value))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                received.push(Span {
                    service: service.clone(),
                    version: version.clone(),
                    kind: span.kind,
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), text(&a.value)))
                        .collect(),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                });
            }
        }
    }
    (
        http::StatusCode::OK,
        [("content-type", "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

impl Receiver {
    /// Starts listening on a loopback port.
    pub async fn start() -> Receiver {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let rejected = Arc::new(Mutex::new(0));
        let app = Router::new()
            .route("/v1/traces", post(export))
            .with_state((spans.clone(), rejected.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver {
            addr,
            spans,
            rejected,
        }
    }

    /// Its base URL, as `--otlp-endpoint` takes it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The spans received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// Exports refused as malformed.
    pub fn rejected(&self) -> usize {
        *self.rejected.lock().unwrap()
    }

    /// Waits (at most `within`) until `done` holds of the spans received.
    pub async fn wait_for(
        &self,
        within: std::time::Duration,
        done: impl Fn(&[Span]) -> bool,
    ) -> Vec<Span> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let spans = self.spans();
            if done(&spans) || std::time::Instant::now() > deadline {
                return spans;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}
