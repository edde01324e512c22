//! Where the edge keeps its records: an adapter trait, the messages of the Durable
//! Object protocol, and [`apply`], the pure function the Durable Object executes —
//! the core decides, the object only stores the result.

use idem_core::contract;
use idem_core::{
    complete, decide_at_edge, release, Decision, Fingerprint, Holder, Millis, Policy, Record,
    StoredResponse,
};
use serde::{Deserialize, Serialize};

/// What the worker asks of a key's records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Claim the key for a request with this fingerprint (hex).
    Claim {
        fingerprint: String,
        lease_ms: u64,
        ttl_ms: u64,
    },
    /// Store the holder's response until `expires_at`, when the origin's record of it
    /// expires (the object counts the time left on its own clock).
    Complete {
        fingerprint: String,
        token: u64,
        response: WireResponse,
        lease_ms: u64,
        expires_at: Millis,
    },
    /// Free the key.
    Release { fingerprint: String, token: u64 },
}

/// The answer to an [`Op`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// Run it (forward to the origin) as holder `token`.
    Execute { token: u64, took_over: bool },
    /// Answer with this stored response, kept until `expires_at` (0 from an older
    /// Durable Object: the key's TTL is then not advertised).
    Replay {
        response: WireResponse,
        #[serde(default)]
        expires_at: Millis,
    },
    /// Another attempt holds the key.
    InFlight { lease_until: Millis },
    /// The key belongs to a different request.
    Mismatch,
    /// Send the request on without a claim: the record is a claim past its lease,
    /// which can't say what the key is bound to; the origin decides.
    SendOn,
    /// The holder's write was stored.
    Written,
    /// The holder's write was refused (fenced out, completed already, or gone).
    Refused { reason: String },
}

/// A stored response on the wire (JSON): header values as text, body in hex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body_hex: String,
}

impl From<&StoredResponse> for WireResponse {
    fn from(r: &StoredResponse) -> Self {
        WireResponse {
            status: r.status,
            headers: r
                .headers
                .iter()
                .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect(),
            body_hex: idem_core::hex(&r.body),
        }
    }
}

impl WireResponse {
    /// Back to the core's type; `None` if the hex is damaged.
    pub fn to_stored(&self) -> Option<StoredResponse> {
        Some(StoredResponse {
            status: self.status,
            headers: self
                .headers
                .iter()
                .map(|(n, v)| (n.clone(), v.as_bytes().to_vec()))
                .collect(),
            body: unhex(&self.body_hex)?,
        })
    }
}

/// Lower-case or upper-case hex to bytes.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

fn fingerprint(hex: &str) -> Result<Fingerprint, String> {
    unhex(hex)
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .map(Fingerprint)
        .ok_or_else(|| "bad fingerprint".into())
}

/// What the Durable Object's storage holds for its key.
#[derive(Debug, PartialEq, Eq)]
pub enum Stored {
    /// No record.
    Absent,
    /// A record.
    Present(Record),
    /// Something this version cannot decode (a newer encoding, say). Never "absent":
    /// a claim decided over it would overwrite a record that may be live.
    Undecodable,
}

/// A value as the Durable Object's storage returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value<'a> {
    /// Bytes: [`Record::encode`], as records are written.
    Binary(&'a [u8]),
    /// Text: the hex of [`Record::encode`], as records were written before they were
    /// binary (still read, so an upgrade keeps what the edge holds).
    Text(&'a str),
    /// Anything else.
    Other,
}

/// Decodes the stored value.
pub fn decode_value(value: Option<Value<'_>>) -> Stored {
    let decoded = match value {
        None => return Stored::Absent,
        Some(Value::Binary(bytes)) => Record::decode(bytes).ok(),
        Some(Value::Text(hex)) => unhex(hex).and_then(|b| Record::decode(&b).ok()),
        Some(Value::Other) => None,
    };
    decoded.map_or(Stored::Undecodable, Stored::Present)
}

/// The longest the edge keeps an answer (and the most `TTL_MS` may be): a year. An
/// alarm date past it would be refused by the runtime.
pub const MAX_TTL_MS: u64 = 365 * 24 * 3_600_000;

/// The largest encoded record one Durable Object value holds: a SQLite-backed object
/// takes 2 MB for a key and its value together; this leaves room for the key and
/// the value's serialisation header.
pub const MAX_RECORD_BYTES: usize = 2_000_000 - 4_096;

/// Executes `op` against the stored record at `now`: the reply, and the record to
/// store when it changes. The Durable Object calls this between one storage read and
/// one storage write, with no outbound I/O in between, so it is atomic.
pub fn apply(
    op: &Op,
    stored: Option<&Record>,
    now: Millis,
) -> Result<(Reply, Option<Record>), String> {
    Ok(match op {
        Op::Claim {
            fingerprint: fp,
            lease_ms,
            ttl_ms,
        } => {
            let policy = Policy {
                lease_ms: *lease_ms,
                ttl_ms: *ttl_ms,
            };
            let Some(decision) = decide_at_edge(stored, &fingerprint(fp)?, now, &policy) else {
                return Ok((Reply::SendOn, None));
            };
            match decision {
                Decision::Execute(c) => (
                    Reply::Execute {
                        token: c.token,
                        took_over: false,
                    },
                    Some(c.record),
                ),
                Decision::TakeOver(c) => (
                    Reply::Execute {
                        token: c.token,
                        took_over: true,
                    },
                    Some(c.record),
                ),
                Decision::Replay {
                    response: r,
                    expires_at,
                } => (
                    Reply::Replay {
                        response: WireResponse::from(&r),
                        expires_at,
                    },
                    None,
                ),
                Decision::InFlight { lease_until } => (Reply::InFlight { lease_until }, None),
                Decision::Mismatch => (Reply::Mismatch, None),
            }
        }
        Op::Complete {
            fingerprint: fp,
            token,
            response,
            lease_ms,
            expires_at,
        } => {
            let holder = Holder {
                fingerprint: fingerprint(fp)?,
                token: *token,
            };
            let Some(ttl_ms) = contract::edge_ttl_ms(Some(*expires_at), now, MAX_TTL_MS) else {
                let reason = "the origin's record has expired".to_owned();
                return Ok((Reply::Refused { reason }, None));
            };
            let policy = Policy {
                lease_ms: *lease_ms,
                ttl_ms,
            };
            let response = response.to_stored().ok_or("bad response body")?;
            match complete(stored, &holder, response, now, &policy) {
                Ok(record) => match record.encode().len() {
                    len if len > MAX_RECORD_BYTES => (
                        Reply::Refused {
                            reason: format!(
                                "the record is {len} bytes, more than one Durable Object value holds ({MAX_RECORD_BYTES})"
                            ),
                        },
                        None,
                    ),
                    _ => (Reply::Written, Some(record)),
                },
                Err(refusal) => (
                    Reply::Refused {
                        reason: refusal.to_string(),
                    },
                    None,
                ),
            }
        }
        Op::Release {
            fingerprint: fp,
            token,
        } => {
            let holder = Holder {
                fingerprint: fingerprint(fp)?,
                token: *token,
            };
            match release(stored, &holder, now) {
                Ok(record) => (Reply::Written, Some(record)),
                Err(refusal) => (
                    Reply::Refused {
                        reason: refusal.to_string(),
                    },
                    None,
                ),
            }
        }
    })
}

/// The durable backend of the edge, for one key. The Durable Object implementation is
/// the one in use; the trait keeps the handler independent of it.
#[allow(async_fn_in_trait)]
pub trait EdgeRecords {
    /// Sends `op` and returns the reply.
    async fn send(&self, op: &Op) -> Result<Reply, String>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    const FP: &str = "0101010101010101010101010101010101010101010101010101010101010101";
    const OTHER: &str = "0202020202020202020202020202020202020202020202020202020202020202";

    #[wasm_bindgen_test(unsupported = test)]
    fn an_undecodable_record_is_not_an_absent_one() {
        assert_eq!(decode_value(None), Stored::Absent);
        let (_, Some(record)) = apply(&claim(FP), None, 1_000).unwrap() else {
            panic!("a claim writes a record")
        };
        let bytes = record.encode();
        assert_eq!(
            decode_value(Some(Value::Binary(&bytes))),
            Stored::Present(record.clone())
        );
        let hex = idem_core::hex(&bytes);
        assert_eq!(
            decode_value(Some(Value::Text(&hex))),
            Stored::Present(record),
            "a record written as hex, before records were binary, still reads"
        );
        assert_eq!(decode_value(Some(Value::Text("zz"))), Stored::Undecodable);
        assert_eq!(decode_value(Some(Value::Text("ff00"))), Stored::Undecodable);
        assert_eq!(
            decode_value(Some(Value::Binary(&[0xff, 0]))),
            Stored::Undecodable
        );
        assert_eq!(decode_value(Some(Value::Other)), Stored::Undecodable);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_copy_expires_with_the_origin_s_record_on_the_object_s_clock() {
        let mut stored = None;
        let Reply::Execute { token, .. } = run(&mut stored, &claim(FP), 0) else {
            panic!()
        };
        let until = |expires_at| Op::Complete {
            fingerprint: FP.into(),
            token,
            response: response(),
            lease_ms: 1_000,
            expires_at,
        };
        // Arriving at the object late: the time the message took is not added on top.
        assert!(matches!(
            run(&mut stored, &until(5_000), 5_000),
            Reply::Refused { .. }
        ));
        assert_eq!(run(&mut stored, &until(9_000), 5_000), Reply::Written);
        assert_eq!(stored.as_ref().map(Record::expires_at), Some(9_000));
        let mut far = None;
        let Reply::Execute { token, .. } = run(&mut far, &claim(FP), 0) else {
            panic!()
        };
        let forever = Op::Complete {
            fingerprint: FP.into(),
            token,
            response: response(),
            lease_ms: 1_000,
            expires_at: u64::MAX,
        };
        assert_eq!(run(&mut far, &forever, 10), Reply::Written);
        assert_eq!(
            far.as_ref().map(Record::expires_at),
            Some(10 + MAX_TTL_MS),
            "never past a year"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_record_too_large_for_one_value_is_refused_not_written() {
        let mut stored = None;
        let Reply::Execute { token, .. } = run(&mut stored, &claim(FP), 0) else {
            panic!()
        };
        let huge = Op::Complete {
            fingerprint: FP.into(),
            token,
            response: WireResponse {
                status: 201,
                headers: vec![],
                body_hex: idem_core::hex(&vec![7; MAX_RECORD_BYTES]),
            },
            lease_ms: 1_000,
            expires_at: 10_000,
        };
        let (reply, write) = apply(&huge, stored.as_ref(), 5).unwrap();
        let Reply::Refused { reason } = reply else {
            panic!("{reply:?}")
        };
        assert!(
            reason.contains("more than one Durable Object value"),
            "{reason}"
        );
        assert_eq!(write, None, "nothing is written");
        let fits = Op::Complete {
            fingerprint: FP.into(),
            token,
            response: response(),
            lease_ms: 1_000,
            expires_at: 10_000,
        };
        assert_eq!(run(&mut stored, &fits, 6), Reply::Written);
    }

    fn claim(fp: &str) -> Op {
        Op::Claim {
            fingerprint: fp.into(),
            lease_ms: 1_000,
            ttl_ms: 10_000,
        }
    }

    fn response() -> WireResponse {
        WireResponse {
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            body_hex: idem_core::hex(b"{}"),
        }
    }

    /// Plays ops against one stored record like the Durable Object does.
    fn run(stored: &mut Option<Record>, op: &Op, now: Millis) -> Reply {
        let (reply, write) = apply(op, stored.as_ref(), now).unwrap();
        if let Some(w) = write {
            *stored = Some(w);
        }
        reply
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn the_object_follows_the_core() {
        let mut stored = None;
        let Reply::Execute {
            token,
            took_over: false,
        } = run(&mut stored, &claim(FP), 100)
        else {
            panic!()
        };
        assert_eq!(
            run(&mut stored, &claim(FP), 200),
            Reply::InFlight { lease_until: 1_100 }
        );
        assert_eq!(
            run(&mut stored, &claim(OTHER), 200),
            Reply::SendOn,
            "another request over a claim in flight: the origin decides"
        );
        let Reply::Execute {
            token: t2,
            took_over: true,
        } = run(&mut stored, &claim(FP), 1_100)
        else {
            panic!()
        };
        assert!(t2 > token);
        let late = Op::Complete {
            fingerprint: FP.into(),
            token,
            response: response(),
            lease_ms: 1_000,
            expires_at: 10_000,
        };
        assert!(matches!(
            run(&mut stored, &late, 1_200),
            Reply::Refused { .. }
        ));
        let done = Op::Complete {
            fingerprint: FP.into(),
            token: t2,
            response: response(),
            lease_ms: 1_000,
            expires_at: 10_000,
        };
        assert_eq!(run(&mut stored, &done, 1_200), Reply::Written);
        assert_eq!(
            run(&mut stored, &claim(FP), 1_300),
            Reply::Replay {
                response: response(),
                expires_at: 10_000,
            }
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn release_frees_the_key_and_bad_input_is_an_error() {
        let mut stored = None;
        let Reply::Execute { token, .. } = run(&mut stored, &claim(FP), 0) else {
            panic!()
        };
        assert_eq!(
            run(
                &mut stored,
                &Op::Release {
                    fingerprint: FP.into(),
                    token
                },
                5
            ),
            Reply::Written
        );
        assert!(matches!(
            run(&mut stored, &claim(OTHER), 5),
            Reply::Execute { .. }
        ));
        assert!(apply(&claim("zz"), None, 0).is_err());
        assert_eq!(unhex("0aFf"), Some(vec![10, 255]));
        assert_eq!(unhex("abc"), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn ops_round_trip_as_json() {
        let op = Op::Complete {
            fingerprint: FP.into(),
            token: 7,
            response: response(),
            lease_ms: 1,
            expires_at: 2,
        };
        let json = serde_json::to_string(&op).unwrap();
        assert_eq!(serde_json::from_str::<Op>(&json).unwrap(), op);
    }
}
