//! The Durable Object: one per (scope, key). It holds that key's record and executes
//! [`apply`] between one storage read and one storage write — no outbound fetch ever
//! happens inside it, so no other request for the key can interleave.

use crate::records::{apply, decode_value, EdgeRecords, Op, Reply, Stored, Value};
use idem_core::{Millis, RecordKey};
use worker::js_sys::{JsString, Uint8Array};
use worker::wasm_bindgen::JsCast;
use worker::wasm_bindgen_futures::JsFuture;
use worker::{
    durable_object, Date, DurableObject, Env, Method, Request, RequestInit, Response, Result,
    State, Stub,
};

const RECORD: &str = "record";
/// When the alarm looks again at a record it cannot decode.
const UNDECODABLE_RECHECK_MS: i64 = 3_600_000;
/// The Durable Object namespace binding (wrangler.toml).
pub const BINDING: &str = "IDEM_RECORDS";

#[durable_object]
pub struct IdemRecord {
    state: State,
    #[allow(dead_code)]
    env: Env,
}

impl IdemRecord {
    /// The stored record. A failed read is an error, never "no record": a claim decided
    /// over it would overwrite a record that may be live.
    async fn load(&self) -> Result<Stored> {
        let storage = self.state.storage();
        let value = JsFuture::from(storage.as_raw().get(RECORD)?).await?;
        if value.is_undefined() {
            return Ok(decode_value(None));
        }
        if let Some(bytes) = value.dyn_ref::<Uint8Array>() {
            return Ok(decode_value(Some(Value::Binary(&bytes.to_vec()))));
        }
        let text = value.dyn_ref::<JsString>().map(String::from);
        Ok(decode_value(Some(
            text.as_deref().map_or(Value::Other, Value::Text),
        )))
    }
}

impl DurableObject for IdemRecord {
    fn new(state: State, env: Env) -> Self {
        IdemRecord { state, env }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let op: Op = match req.json().await {
            Ok(op) => op,
            Err(e) => return Response::error(format!("bad op: {e}"), 400),
        };
        // Unreadable or undecodable: the edge answers nothing for this key and the
        // request goes to the origin, which is authoritative.
        let record = match self.load().await {
            Ok(Stored::Absent) => None,
            Ok(Stored::Present(record)) => Some(record),
            Ok(Stored::Undecodable) => {
                return Response::error("the stored record cannot be decoded", 503)
            }
            Err(e) => return Response::error(format!("storage read failed: {e}"), 503),
        };
        let now = Date::now().as_millis();
        let (reply, write) = match apply(&op, record.as_ref(), now) {
            Ok(done) => done,
            Err(e) => return Response::error(e, 400),
        };
        if let Some(record) = write {
            let storage = self.state.storage();
            // Bytes, not text: half the size of hex, in storage and on every read.
            let put = storage.put_raw(RECORD, Uint8Array::from(record.encode().as_slice()));
            let alarm = storage.set_alarm(alarm_in(record.delete_after(), now));
            // Both issued in one turn, with no await between them, which the runtime
            // coalesces into one atomic write: awaited one after the other, a put that
            // landed before a failed alarm left a record nothing would ever delete.
            futures_util::future::try_join(put, alarm).await?;
        }
        Response::from_json(&reply)
    }

    async fn alarm(&self) -> Result<Response> {
        let now = Date::now().as_millis();
        // A failed read fails the alarm, which the runtime retries.
        match self.load().await? {
            // Renewed or completed since the alarm was set: come back at the new expiry.
            Stored::Present(r) if r.delete_after() > now => {
                let at = alarm_in(r.delete_after(), now);
                self.state.storage().set_alarm(at).await?;
            }
            Stored::Present(_) | Stored::Absent => self.state.storage().delete_all().await?,
            // Not ours to judge (a newer version's encoding, say): its expiry is unknown,
            // so it is kept, and looked at again later.
            Stored::Undecodable => {
                self.state
                    .storage()
                    .set_alarm(UNDECODABLE_RECHECK_MS)
                    .await?
            }
        }
        Response::ok("")
    }
}

/// Milliseconds from `now` to `at`, at least one, as the alarm API takes them.
fn alarm_in(at: Millis, now: Millis) -> i64 {
    i64::try_from(at.saturating_sub(now).max(1)).unwrap_or(i64::MAX)
}

/// [`EdgeRecords`] on the Durable Object of one key.
pub struct DurableObjectRecords {
    stub: Stub,
}

impl DurableObjectRecords {
    /// The object named by `key` in the `IDEM_RECORDS` namespace.
    pub fn new(env: &Env, key: &RecordKey) -> Result<Self> {
        let stub = env
            .durable_object(BINDING)?
            .id_from_name(key.as_str())?
            .get_stub()?;
        Ok(DurableObjectRecords { stub })
    }
}

impl EdgeRecords for DurableObjectRecords {
    async fn send(&self, op: &Op) -> std::result::Result<Reply, String> {
        let body = serde_json::to_string(op).map_err(|e| e.to_string())?;
        let mut init = RequestInit::new();
        init.with_method(Method::Post).with_body(Some(body.into()));
        let req =
            Request::new_with_init("https://idem-record/op", &init).map_err(|e| e.to_string())?;
        let mut res = self
            .stub
            .fetch_with_request(req)
            .await
            .map_err(|e| e.to_string())?;
        if res.status_code() != 200 {
            let text = res.text().await.unwrap_or_default();
            return Err(format!(
                "durable object answered {}: {text}",
                res.status_code()
            ));
        }
        res.json::<Reply>().await.map_err(|e| e.to_string())
    }
}
