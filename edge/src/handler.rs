//! The Workers runtime under the edge's flow: worker requests and responses in and
//! out, the Durable Objects, the clock and timers. No decision is taken here.

use crate::config::EdgeConfig;
use crate::durable::DurableObjectRecords;
use crate::flow::{self, Answer, EdgeRuntime, Head, Outbound, Payload, ReadError};
use futures_util::StreamExt;
use idem_core::{Millis, RecordKey};
use std::time::Duration;
use worker::{
    console_error, console_warn, web_sys, Context, Date, Delay, Env, Fetch, Headers, Request,
    Response, ResponseBody, Result,
};

/// The fetch handler. The request's work — claim, forward, keep or release — runs
/// under `wait_until`: a client that hangs up does not cancel it halfway, which would
/// leave the key claimed at the edge (409s) for an answer the origin already has.
pub async fn handle(req: Request, env: Env, ctx: Context) -> Result<Response> {
    if req.path() == crate::bench::PATH && var(&env, "IDEM_BENCH").as_deref() == Some("fingerprint")
    {
        return crate::bench::serve(req).await;
    }
    let config = match EdgeConfig::from_vars(|name| var(&env, name)) {
        Ok(config) => config,
        Err(why) => {
            console_error!("the edge is misconfigured: {why}");
            return respond(flow::misconfigured(&why).map_body(Payload::Bytes));
        }
    };
    let url = req.url()?;
    let head = Head {
        // As sent: `Request::method` names only the methods it knows, and reads any
        // other (PROPFIND, QUERY, PURGE…) as GET.
        method: req.inner().method(),
        path_and_query: match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        },
        headers: req.headers().entries().collect(),
        scheme: url.scheme().to_owned(),
    };
    let (answered, answer) = futures_channel::oneshot::channel();
    ctx.wait_until(async move {
        let answer = flow::handle(&Workers { env }, &config, head, req).await;
        // The client may be gone; the work is done either way.
        let _ = answered.send(answer);
    });
    match answer.await {
        Ok(answer) => respond(answer),
        Err(_) => Err("the edge's work for this request ended without an answer".into()),
    }
}

/// A var as text. A number written unquoted in wrangler.toml arrives as a JS number,
/// which `Env::var` refuses: read as absent, it would take the default without a word.
fn var(env: &Env, name: &str) -> Option<String> {
    let value = worker::js_sys::Reflect::get(env, &name.into()).ok()?;
    if value.is_undefined() || value.is_null() {
        return None;
    }
    Some(match (value.as_string(), value.as_f64()) {
        (Some(text), _) => text,
        (None, Some(number)) => number.to_string(),
        // A table in wrangler's [vars] (a JWKS written as one) arrives as an object:
        // its JSON. A flag or anything else: shown as such, and refused by the checks.
        (None, None) if value.is_object() => worker::js_sys::JSON::stringify(&value)
            .ok()
            .and_then(|s| s.as_string())
            .unwrap_or_else(|| format!("{value:?}")),
        (None, None) => format!("{value:?}"),
    })
}

/// The Workers runtime, for one request.
struct Workers {
    env: Env,
}

/// A body streamed by the runtime; `None` for none.
type Stream = Option<web_sys::ReadableStream>;

impl EdgeRuntime for Workers {
    type Body = Request;
    type Stream = Stream;
    type Records = DurableObjectRecords;

    async fn read_body(
        &self,
        mut body: Request,
        limit: usize,
    ) -> std::result::Result<Vec<u8>, ReadError> {
        if body.inner().body().is_none() {
            return Ok(Vec::new());
        }
        let mut chunks = body
            .stream()
            .map_err(|e| ReadError::Unreadable(e.to_string()))?;
        let mut read = Vec::new();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| ReadError::Unreadable(e.to_string()))?;
            if read.len() + chunk.len() > limit {
                // Stop here: the rest is never read, nor held.
                return Err(ReadError::TooLarge);
            }
            read.extend_from_slice(&chunk);
        }
        Ok(read)
    }

    async fn fetch_whole(&self, request: Outbound) -> std::result::Result<Answer, String> {
        let body = request
            .body
            .as_ref()
            .filter(|b| !b.is_empty())
            .map(|b| worker::js_sys::Uint8Array::from(b.as_slice()).into());
        let mut res = send(&request, body).await.map_err(|e| e.to_string())?;
        let body = res.bytes().await.map_err(|e| e.to_string())?;
        Ok(answer_of(&res, body))
    }

    async fn fetch_streamed(
        &self,
        request: Outbound<Request>,
    ) -> std::result::Result<Answer<Stream>, String> {
        let body = request
            .body
            .as_ref()
            .and_then(|r| r.inner().body())
            .map(Into::into);
        let res = send(&request, body).await.map_err(|e| e.to_string())?;
        let stream = match res.body() {
            ResponseBody::Stream(stream) => Some(stream.clone()),
            ResponseBody::Empty | ResponseBody::Body(_) => None,
        };
        Ok(answer_of(&res, stream))
    }

    fn records(&self, key: &RecordKey) -> std::result::Result<DurableObjectRecords, String> {
        DurableObjectRecords::new(&self.env, key).map_err(|e| e.to_string())
    }

    fn now(&self) -> Millis {
        Date::now().as_millis()
    }

    async fn sleep(&self, ms: u64) {
        Delay::from(Duration::from_millis(ms)).await
    }

    fn warn(&self, message: &str) {
        console_warn!("{message}");
    }

    async fn sha256(&self, message: &[u8]) -> Option<[u8; 32]> {
        crate::webcrypto::sha256(message).await
    }
}

/// Sends a request to the origin: its method as given (worker's `Method` would turn an
/// unknown one into GET), and redirects not followed — a 3xx is the origin's answer.
async fn send<B>(
    request: &Outbound<B>,
    body: Option<worker::wasm_bindgen::JsValue>,
) -> Result<Response> {
    let headers = Headers::new();
    for (name, value) in &request.headers {
        headers.append(name, value)?;
    }
    let init = web_sys::RequestInit::new();
    init.set_method(&request.method);
    init.set_headers(headers.as_ref());
    init.set_redirect(web_sys::RequestRedirect::Manual);
    if let Some(body) = body {
        init.set_body(&body);
    }
    let req = web_sys::Request::new_with_str_and_init(&request.url, &init)
        .map_err(|e| worker::Error::from(format!("{e:?}")))?;
    Fetch::Request(Request::from(req)).send().await
}

fn answer_of<B>(res: &Response, body: B) -> Answer<B> {
    Answer {
        status: res.status_code(),
        headers: res.headers().entries().collect(),
        body,
    }
}

fn respond(answer: Answer<Payload<Stream>>) -> Result<Response> {
    let headers = Headers::new();
    for (name, value) in &answer.headers {
        headers.append(name, value)?;
    }
    let builder = Response::builder()
        .with_status(answer.status)
        .with_headers(headers);
    Ok(match answer.body {
        Payload::Bytes(bytes) => builder.fixed(bytes),
        // The origin's body goes to the client as it arrives, never held whole.
        Payload::Stream(Some(stream)) => builder.stream(stream),
        Payload::Stream(None) => builder.empty(),
    })
}
