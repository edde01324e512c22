//! The demo business API: charges that a double execution makes countable.
//!
//! * `POST /v1/charges` — `{"amount": int > 0, "currency": "abc", "customer": "id",
//!   "simulate_latency_ms": 0..=10000}` → `201` with the charge. Invalid bodies get a
//!   `400` problem sent with idem's release signal, so the key stays free.
//! * `GET /v1/charges?customer=<id>` → `{"data": [...]}`.
//!
//! The ledger has no unique constraint on the idempotency key on purpose: a duplicate
//! execution shows up as a second row.
//!
//! When the charges and idem's records share a Postgres, a charge and its record
//! commit in one transaction ([`idem::Transaction`]): a crash between
//! the two, or a holder paused past its lease, can't charge twice. With `--demo-faults`
//! a request can ask for such a fault (see [`Fault`]).

mod fault;
mod ledger;

pub use fault::Fault;
pub use ledger::{insert_charge, Execution, Ledger, LedgerError, MemoryLedger, PgLedger};

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Query, State};
use axum::routing::post;
use axum::{Extension, Router};
use futures_util::FutureExt;
use http::{header, request::Parts, HeaderValue, Response, StatusCode};
use idem::IdempotencyContext;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One charge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// `ch_` and 24 hex digits.
    pub id: String,
    /// In the currency's minor unit.
    pub amount: i64,
    /// Three lower-case letters.
    pub currency: String,
    /// The customer charged.
    pub customer: String,
    /// Unix seconds.
    pub created: i64,
}

/// The longest `simulate_latency_ms` accepted.
pub const MAX_SIMULATED_LATENCY_MS: u64 = 10_000;

/// The demo API's set-up.
#[derive(Clone)]
pub struct Demo {
    /// Where charges are written.
    pub ledger: Arc<dyn Ledger>,
    /// Whether a charge commits in the transaction that stores its answer (the layer
    /// must be [`idem::IdempotencyLayer::transactional`], and the ledger
    /// in the records' Postgres).
    pub transactional: bool,
    /// Whether requests may ask for faults (`Demo-Fault`).
    pub faults: bool,
}

impl Demo {
    /// The demo over `ledger`: charges committed on their own, no faults.
    pub fn new(ledger: Arc<dyn Ledger>) -> Self {
        Demo {
            ledger,
            transactional: false,
            faults: false,
        }
    }
}

/// The charges routes.
pub fn routes(demo: Demo) -> Router {
    Router::new()
        .route("/v1/charges", post(create).get(list))
        .with_state(demo)
}

/// A validated charge request.
#[derive(Debug, PartialEq, Eq)]
pub struct NewCharge {
    /// In the currency's minor unit, positive.
    pub amount: i64,
    /// Three lowercase letters.
    pub currency: String,
    /// Non-empty, at most 255 bytes.
    pub customer: String,
    /// How long the handler pretends to work.
    pub latency: Duration,
}

/// Validates a `POST /v1/charges` body; the error is a message for the client.
pub fn validate(body: &[u8]) -> Result<NewCharge, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let Value::Object(mut obj) = value else {
        return Err("the body must be a JSON object".into());
    };
    let amount = match take(&mut obj, "amount")? {
        Value::Number(n) => n.as_i64().filter(|&a| a > 0),
        _ => None,
    }
    .ok_or("amount must be a positive integer (in the currency's minor unit)")?;
    let currency = match take(&mut obj, "currency")? {
        Value::String(c) if c.len() == 3 && c.bytes().all(|b| b.is_ascii_alphabetic()) => {
            c.to_ascii_lowercase()
        }
        _ => return Err("currency must be a three-letter ISO 4217 code, e.g. \"usd\"".into()),
    };
    let customer = match take(&mut obj, "customer")? {
        Value::String(c) if !c.trim().is_empty() && c.len() <= 255 => c,
        _ => return Err("customer must be a non-empty string of at most 255 bytes".into()),
    };
    let latency = match obj.remove("simulate_latency_ms") {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|&ms| ms <= MAX_SIMULATED_LATENCY_MS)
            .ok_or("simulate_latency_ms must be an integer from 0 to 10000")?,
        Some(_) => return Err("simulate_latency_ms must be an integer from 0 to 10000".into()),
    };
    if let Some(unknown) = obj.keys().next() {
        return Err(format!("unknown field {unknown:?}"));
    }
    Ok(NewCharge {
        amount,
        currency,
        customer,
        latency: Duration::from_millis(latency),
    })
}

fn take(obj: &mut Map<String, Value>, field: &str) -> Result<Value, String> {
    obj.remove(field)
        .ok_or_else(|| format!("{field} is required"))
}

/// Rejected before anything happened: idem's release signal frees the key for the
/// corrected retry.
fn rejected(slug: &str, title: &str, detail: &str) -> Response<Body> {
    idem::release(demo_problem(StatusCode::BAD_REQUEST, slug, title, detail))
}

/// The fault a request asks for, read off its headers in place (axum's `HeaderMap`
/// extractor copies them all, on every charge).
struct AskedFault(Fault);

impl FromRequestParts<Demo> for AskedFault {
    type Rejection = Response<Body>;

    async fn from_request_parts(parts: &mut Parts, demo: &Demo) -> Result<Self, Self::Rejection> {
        Fault::from_headers(&parts.headers, demo.faults)
            .map(AskedFault)
            .map_err(|detail| rejected("invalid-fault", "Fault refused", &detail))
    }
}

async fn create(
    State(demo): State<Demo>,
    context: Option<Extension<IdempotencyContext>>,
    AskedFault(fault): AskedFault,
    body: Bytes,
) -> Response<Body> {
    let new = match validate(&body) {
        Ok(new) => new,
        Err(detail) => return rejected("invalid-charge", "Invalid charge request", &detail),
    };
    if !new.latency.is_zero() {
        // (A zero sleep still waits for the timer's next 1 ms tick.)
        tokio::time::sleep(new.latency).await;
    }
    let charge = Charge {
        id: new_charge_id(),
        amount: new.amount,
        currency: new.currency,
        customer: new.customer,
        created: i64::try_from(idem::now() / 1000).unwrap_or(i64::MAX),
    };
    let context = context.map(|Extension(c)| c);
    let processor_key = context.as_ref().map(|c| c.downstream_key("charge"));
    let execution = Execution {
        idempotency_key: context.as_ref().map(|c| c.key.as_str()),
        fencing_token: context.as_ref().map(|c| c.token),
        processor_key: processor_key.as_deref(),
    };
    let response = match (&context, demo.transactional) {
        (Some(context), true) => charge_in_transaction(context, &charge, &execution, fault).await,
        _ => match fault
            .before_commit()
            .then(|()| demo.ledger.insert(&charge, &execution))
            .await
        {
            Ok(()) => created(&charge),
            // The ledger failed, perhaps after its COMMIT landed (a lost acknowledgement):
            // the outcome is unknown, so this 503 is the result, stored and replayed —
            // never a second charge.
            Err(e) => ledger_unavailable(
                &e,
                "the ledger did not confirm the charge; it will not be retried under this key",
            ),
        },
    };
    if response.status() == StatusCode::CREATED {
        fault.after_commit().await;
    }
    response
}

/// The charge and its idempotency record, in one transaction.
async fn charge_in_transaction(
    context: &IdempotencyContext,
    charge: &Charge,
    execution: &Execution<'_>,
    fault: Fault,
) -> Response<Body> {
    let tx = match context.transaction().await {
        Ok(tx) => tx,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = insert_charge(tx.client(), charge, execution).await {
        tx.rollback().await;
        // Rolled back: no charge was made, so the key is freed for a retry.
        return idem::release(ledger_unavailable(&e, "the charge was not made; retry"));
    }
    fault.before_commit().await;
    tx.commit(created(charge))
        .await
        .unwrap_or_else(|e| e.into_response())
}

fn ledger_unavailable(error: &LedgerError, detail: &str) -> Response<Body> {
    tracing::error!(%error, "ledger unavailable");
    demo_problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "ledger-unavailable",
        "Ledger unavailable",
        detail,
    )
}

fn created(charge: &Charge) -> Response<Body> {
    // Written straight from the struct: no `Value` tree in between.
    let body = serde_json::to_vec(charge).unwrap_or_default();
    let mut res = Response::new(Body::from(body));
    *res.status_mut() = StatusCode::CREATED;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/charges/{}", charge.id)) {
        res.headers_mut().insert(header::LOCATION, location);
    }
    res
}

#[derive(Deserialize)]
struct ListQuery {
    customer: Option<String>,
}

async fn list(
    State(Demo { ledger, .. }): State<Demo>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response<Body> {
    let customer = query
        .ok()
        .and_then(|Query(q)| q.customer)
        .filter(|c| !c.is_empty());
    let Some(customer) = customer else {
        return demo_problem(
            StatusCode::BAD_REQUEST,
            "missing-customer",
            "customer is required",
            "use GET /v1/charges?customer=<id>",
        );
    };
    match ledger.list(&customer).await {
        Ok(data) => json_response(StatusCode::OK, &json!({ "data": data })),
        Err(e) => ledger_unavailable(&e, "retry later"),
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut res = Response::new(Body::from(value.to_string()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// A problem+json answer of the demo API, marked `no-store`.
pub fn demo_problem(status: StatusCode, slug: &str, title: &str, detail: &str) -> Response<Body> {
    let body = json!({ "type": format!("urn:idem:demo:problem:{slug}"), "title": title, "status": status.as_u16(), "detail": detail });
    let mut res = json_response(status, &body);
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(idem::core::contract::PROBLEM_CONTENT_TYPE),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

fn new_charge_id() -> String {
    use sha2::{Digest, Sha256};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = Sha256::new();
    h.update(nanos.to_be_bytes());
    // (`process::id` is a system call each time.)
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    h.update(PID.get_or_init(std::process::id).to_be_bytes());
    h.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    format!("ch_{}", idem_core::hex(&h.finalize()[..12]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_charges() {
        let ok =
            validate(br#"{"amount":100,"currency":"USD","customer":"c1","simulate_latency_ms":5}"#)
                .unwrap();
        assert_eq!(
            ok,
            NewCharge {
                amount: 100,
                currency: "usd".into(),
                customer: "c1".into(),
                latency: Duration::from_millis(5)
            }
        );
        for (body, needle) in [
            (&b"not json"[..], "not valid JSON"),
            (b"[]", "JSON object"),
            (
                br#"{"currency":"usd","customer":"c"}"#,
                "amount is required",
            ),
            (
                br#"{"amount":0,"currency":"usd","customer":"c"}"#,
                "positive integer",
            ),
            (
                br#"{"amount":1.5,"currency":"usd","customer":"c"}"#,
                "positive integer",
            ),
            (
                br#"{"amount":1,"currency":"usdd","customer":"c"}"#,
                "three-letter",
            ),
            (
                br#"{"amount":1,"currency":"usd","customer":""}"#,
                "customer",
            ),
            (
                br#"{"amount":1,"currency":"usd","customer":"c","simulate_latency_ms":10001}"#,
                "0 to 10000",
            ),
            (
                br#"{"amount":1,"currency":"usd","customer":"c","extra":1}"#,
                "unknown field",
            ),
        ] {
            let err = validate(body).unwrap_err();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        }
    }
}
