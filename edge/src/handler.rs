//! The Workers runtime under the edge's flow: worker requests and responses in and
//! out, the Durable Objects, the clock and timers. No decision is taken here.

use crate::config::EdgeConfig;
use crate::durable::DurableObjectRecords;
use crate::flow::{self, Answer, EdgeRuntime, Head, Outbound};
use idem_core::{Millis, RecordKey};
use std::time::Duration;
use worker::{
    console_error, console_warn, web_sys, Date, Delay, Env, Fetch, Headers, Request, Response,
    Result,
};

/// The fetch handler.
pub async fn handle(req: Request, env: &Env) -> Result<Response> {
    let config = match EdgeConfig::from_vars(|name| env.var(name).ok().map(|v| v.to_string())) {
        Ok(config) => config,
        Err(why) => {
            console_error!("the edge is misconfigured: {why}");
            return respond(flow::misconfigured(&why));
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
    let answer = flow::handle(&Workers { env }, &config, head, req).await;
    respond(answer)
}

/// The Workers runtime, for one request.
struct Workers<'a> {
    env: &'a Env,
}

impl EdgeRuntime for Workers<'_> {
    type Body = Request;
    type Records = DurableObjectRecords;

    async fn read_body(&self, mut body: Request) -> std::result::Result<Vec<u8>, String> {
        body.bytes().await.map_err(|e| e.to_string())
    }

    async fn fetch(&self, request: Outbound) -> std::result::Result<Answer, String> {
        fetch(request).await.map_err(|e| e.to_string())
    }

    fn records(&self, key: &RecordKey) -> std::result::Result<DurableObjectRecords, String> {
        DurableObjectRecords::new(self.env, key).map_err(|e| e.to_string())
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
}

/// Sends a request to the origin: its method as given (worker's `Method` would turn an
/// unknown one into GET), and redirects not followed — a 3xx is the origin's answer.
async fn fetch(request: Outbound) -> Result<Answer> {
    let headers = Headers::new();
    for (name, value) in &request.headers {
        headers.append(name, value)?;
    }
    let init = web_sys::RequestInit::new();
    init.set_method(&request.method);
    init.set_headers(headers.as_ref());
    init.set_redirect(web_sys::RequestRedirect::Manual);
    if !request.body.is_empty() {
        let body = worker::js_sys::Uint8Array::from(request.body.as_slice());
        init.set_body(&body.into());
    }
    let req = web_sys::Request::new_with_str_and_init(&request.url, &init)
        .map_err(|e| worker::Error::from(format!("{e:?}")))?;
    let mut res = Fetch::Request(Request::from(req)).send().await?;
    Ok(Answer {
        status: res.status_code(),
        headers: res.headers().entries().collect(),
        body: res.bytes().await?,
    })
}

fn respond(answer: Answer) -> Result<Response> {
    let headers = Headers::new();
    for (name, value) in &answer.headers {
        headers.append(name, value)?;
    }
    Ok(Response::from_bytes(answer.body)?
        .with_status(answer.status)
        .with_headers(headers))
}
