//! The fetch handler: the HTTP contract at the edge, over the core and the records.

use crate::contract::{self, EdgeConfig, Route};
use crate::durable::DurableObjectRecords;
use crate::records::{EdgeRecords, Op, Reply, WireResponse};
use idem_core::contract::{
    edge_ttl_ms, OriginDisposition, Problem, DEFAULT_CACHED_HEADERS, IDEMPOTENT_REPLAYED,
    ORIGIN_DISPOSITION, PROBLEM_CONTENT_TYPE,
};
use idem_core::StoredResponse;
use std::time::Duration;
use worker::{
    console_warn, Date, Delay, Env, Fetch, Headers, Method, Request, RequestInit, Response, Result,
};

/// Diagnostic header: what the edge did (`replayed`, `forwarded`, `passed`, `degraded`, `refused`).
const EDGE_HEADER: &str = "idem-edge";

/// A response as plain values.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

pub async fn handle(mut req: Request, env: &Env) -> Result<Response> {
    let config = EdgeConfig::from_vars(|name| env.var(name).ok().map(|v| v.to_string()));
    let method = req.method().to_string();
    let url = req.url()?;
    let path = url.path().to_owned();
    let path_and_query = match url.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.clone(),
    };
    let headers: Vec<(String, String)> = req.headers().entries().collect();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };

    let key = match contract::route(
        &config,
        &method,
        &path,
        headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())),
    ) {
        Route::PassThrough => {
            let body = req.bytes().await?;
            return match forward(&config, &method, &path_and_query, &headers, body).await {
                Ok(a) => respond(a, "passed"),
                Err(e) => problem(
                    Problem::HandlerFailed,
                    &format!("the origin could not be reached: {e}"),
                ),
            };
        }
        Route::Reject(p, detail) => return problem(p, &detail),
        Route::Guard(key) => key,
    };
    let body = req.bytes().await?;
    if body.len() > config.max_body_bytes {
        return problem(
            Problem::BodyTooLarge,
            &format!("the limit is {} bytes", config.max_body_bytes),
        );
    }
    let (record_key, fingerprint) = contract::identify(
        &key,
        header("authorization").map(str::as_bytes),
        &method,
        &path_and_query,
        header("content-type"),
        &body,
    );
    let fp = fingerprint.to_hex();
    let records = match DurableObjectRecords::new(env, &record_key) {
        Ok(r) => r,
        Err(e) => {
            return degraded(
                &config,
                &method,
                &path_and_query,
                &headers,
                body,
                &e.to_string(),
            )
            .await
        }
    };

    // Claim, waiting (Prefer: wait=N) while another attempt holds the key.
    let claim = Op::Claim {
        fingerprint: fp.clone(),
        lease_ms: config.policy.lease_ms,
        ttl_ms: config.policy.ttl_ms,
    };
    let deadline =
        Date::now().as_millis() + contract::wait_ms(&config, header("prefer").map(str::as_bytes));
    let mut poll = 25u64;
    let token = loop {
        match records.send(&claim).await {
            Ok(Reply::Execute { token, .. }) => break token,
            Ok(Reply::Replay { response }) => return replay(&response),
            Ok(Reply::Mismatch) => {
                return problem(
                    Problem::Mismatch,
                    "this Idempotency-Key was already used with a different method, path, content type or body",
                )
            }
            Ok(Reply::InFlight { .. }) => {
                let now = Date::now().as_millis();
                if now >= deadline {
                    return problem(Problem::InFlight, "retry later, or send Prefer: wait=<seconds> to wait for it");
                }
                Delay::from(Duration::from_millis(poll.min(deadline - now))).await;
                poll = (poll * 2).min(400);
            }
            // The edge can't answer for this key: the origin, the authority, will.
            Ok(other) => return degraded(&config, &method, &path_and_query, &headers, body, &format!("unexpected {other:?}")).await,
            Err(e) => return degraded(&config, &method, &path_and_query, &headers, body, &e).await,
        }
    };
    let release = Op::Release {
        fingerprint: fp.clone(),
        token,
    };

    let answer = match forward(&config, &method, &path_and_query, &headers, body).await {
        Ok(a) => a,
        Err(e) => {
            // Nothing reached the origin, or its answer was lost: free the key.
            let _ = records.send(&release).await;
            return problem(
                Problem::HandlerFailed,
                &format!("the origin could not be reached: {e}"),
            );
        }
    };
    // The edge keeps exactly what the origin stored, until the origin's record expires:
    // never an answer the origin released or did not make (a CDN's 524, a WAF's 429).
    let origin_said = answer
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(ORIGIN_DISPOSITION))
        .and_then(|(_, v)| OriginDisposition::parse(v.as_bytes()));
    let write = match edge_ttl_ms(origin_said, Date::now().as_millis()) {
        Some(ttl_ms) if answer.body.len() <= config.max_stored_body_bytes => {
            let stored = StoredResponse {
                status: answer.status,
                headers: answer
                    .headers
                    .iter()
                    .filter(|(n, _)| {
                        DEFAULT_CACHED_HEADERS
                            .iter()
                            .any(|c| n.eq_ignore_ascii_case(c))
                    })
                    .map(|(n, v)| (n.to_ascii_lowercase(), v.as_bytes().to_vec()))
                    .collect(),
                body: answer.body.clone(),
            };
            Op::Complete {
                fingerprint: fp.clone(),
                token,
                response: WireResponse::from(&stored),
                lease_ms: config.policy.lease_ms,
                ttl_ms,
            }
        }
        // Too big to keep at the edge (the origin replays it), or not stored at the origin.
        _ => release,
    };
    match records.send(&write).await {
        Ok(Reply::Written) => {}
        Ok(other) => console_warn!("edge record write not applied: {other:?}"),
        Err(e) => console_warn!("edge record write failed: {e}"),
    }
    respond(answer, "forwarded")
}

/// The edge's records are unavailable: send the request on; the origin guards it.
async fn degraded(
    config: &EdgeConfig,
    method: &str,
    path_and_query: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
    why: &str,
) -> Result<Response> {
    console_warn!("edge records unavailable ({why}); forwarding to the origin");
    match forward(config, method, path_and_query, headers, body).await {
        Ok(a) => respond(a, "degraded"),
        Err(e) => problem(
            Problem::HandlerFailed,
            &format!("the origin could not be reached: {e}"),
        ),
    }
}

async fn forward(
    config: &EdgeConfig,
    method: &str,
    path_and_query: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> Result<Answer> {
    let out = Headers::new();
    for (name, value) in headers.iter().filter(|(n, _)| contract::forwardable(n)) {
        out.append(name, value)?;
    }
    let mut init = RequestInit::new();
    init.with_method(Method::from(method.to_owned()))
        .with_headers(out);
    if !body.is_empty() && method != "GET" && method != "HEAD" {
        init.with_body(Some(
            worker::js_sys::Uint8Array::from(body.as_slice()).into(),
        ));
    }
    let req = Request::new_with_init(&format!("{}{path_and_query}", config.origin_url), &init)?;
    let mut res = Fetch::Request(req).send().await?;
    let status = res.status_code();
    let headers = res.headers().entries().collect();
    let body = res.bytes().await?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}

fn respond(answer: Answer, what: &str) -> Result<Response> {
    let headers = Headers::new();
    for (name, value) in answer.headers.iter().filter(|(n, _)| {
        // The origin's disposition is for the edge alone.
        let n = n.to_ascii_lowercase();
        !matches!(
            n.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) && n != ORIGIN_DISPOSITION
    }) {
        headers.append(name, value)?;
    }
    headers.set(EDGE_HEADER, what)?;
    Ok(Response::from_bytes(answer.body)?
        .with_status(answer.status)
        .with_headers(headers))
}

fn replay(response: &WireResponse) -> Result<Response> {
    let Some(stored) = response.to_stored() else {
        return problem(
            Problem::HandlerFailed,
            "the stored response could not be read",
        );
    };
    let headers = Headers::new();
    for (name, value) in &stored.headers {
        headers.append(name, &String::from_utf8_lossy(value))?;
    }
    headers.set(IDEMPOTENT_REPLAYED, "true")?;
    headers.set(EDGE_HEADER, "replayed")?;
    Ok(Response::from_bytes(stored.body)?
        .with_status(stored.status)
        .with_headers(headers))
}

fn problem(p: Problem, detail: &str) -> Result<Response> {
    let headers = Headers::new();
    headers.set("content-type", PROBLEM_CONTENT_TYPE)?;
    headers.set("cache-control", "no-store")?;
    headers.set(EDGE_HEADER, "refused")?;
    if let Some(secs) = p.retry_after_secs() {
        headers.set("retry-after", &secs.to_string())?;
    }
    Ok(Response::from_bytes(p.body(Some(detail)))?
        .with_status(p.status())
        .with_headers(headers))
}
