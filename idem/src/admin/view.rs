//! Records as the admin API shows them (JSON), and the query values it reads.

use idem_core::{Millis, Record, RecordKey};
use serde_json::{json, Value};

/// A record as JSON: its state, fingerprint, token, lease and times (store time, ms
/// since the epoch), the stored answer's status and headers, and its body when asked.
pub(crate) fn record(key: &RecordKey, record: &Record, now: Millis, with_body: bool) -> Value {
    let signed = |at: Millis| i128::from(at) - i128::from(now);
    let mut out = json!({
        "record_key": key.as_str(),
        "fingerprint": record.fingerprint().to_hex(),
        "token": record.token(),
        "claimed_at_ms": record.claimed_at(),
        "expires_at_ms": record.expires_at(),
        "expires_in_ms": signed(record.expires_at()),
    });
    match record {
        Record::InProgress { lease_until, .. } => {
            out["state"] = json!("in_progress");
            out["lease_until_ms"] = json!(lease_until);
            out["lease_live"] = json!(*lease_until > now);
            out["age_ms"] = json!(signed(record.claimed_at()).saturating_neg());
        }
        Record::Completed { response, .. } => {
            out["state"] = json!("completed");
            let headers: Vec<Value> = idem_core::contract::visible_headers(&response.headers)
                .map(|(name, value)| json!([name, String::from_utf8_lossy(value)]))
                .collect();
            // The execution's trace (a private header, never sent): where to look.
            if let Some(trace) = idem_core::contract::execution_trace(&response.headers) {
                out["execution_traceparent"] = json!(String::from_utf8_lossy(trace));
            }
            let mut answer = json!({
                "status": response.status,
                "headers": headers,
                "body_bytes": response.body.len(),
            });
            if with_body {
                match std::str::from_utf8(&response.body) {
                    Ok(text) => answer["body"] = json!(text),
                    Err(_) => answer["body_base64"] = json!(base64(&response.body)),
                }
            }
            out["response"] = answer;
        }
    }
    out
}

/// Standard base64 with padding (RFC 4648), for bodies that are not UTF-8.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Parses an age such as `500ms`, `30s`, `5m`, `2h` or `1d` into ms.
pub(crate) fn age_ms(text: &str) -> Result<Millis, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let amount: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not an age: use a number and ms, s, m, h or d (30s)"))?;
    let scale = match unit {
        "ms" => 1,
        "s" | "" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text:?}: the unit is ms, s, m, h or d")),
    };
    amount
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too long an age"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (input, output) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), output);
        }
    }

    #[test]
    fn ages() {
        assert_eq!(age_ms("500ms"), Ok(500));
        assert_eq!(age_ms("30s"), Ok(30_000));
        assert_eq!(age_ms("30"), Ok(30_000));
        assert_eq!(age_ms("2h"), Ok(7_200_000));
        assert!(age_ms("-1s").is_err());
        assert!(age_ms("1w").is_err());
        assert!(age_ms("").is_err());
        assert!(age_ms("99999999999999999999d").is_err());
    }
}
