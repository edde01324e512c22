//! Canonical JSON against an independent implementation: for random documents written
//! with shuffled keys, random whitespace and random escapes, `canonicalize` gives what
//! serde_json prints for the same value with sorted keys.
#![cfg(not(target_arch = "wasm32"))]

use idem_core::json::canonicalize;
use proptest::prelude::*;
use serde_json::{Map, Value};

/// Values serde_json prints the way canonical JSON does: integers (other numbers
/// are kept verbatim by us and reformatted by serde_json), any strings, nesting.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Writes `v` as valid JSON that is not canonical: members in the order `shuffle`
/// picks, whitespace and escapes chosen by `noise`.
fn write(v: &Value, noise: &mut impl FnMut() -> u32, out: &mut String) {
    let ws = |noise: &mut dyn FnMut() -> u32, out: &mut String| {
        for _ in 0..noise() % 3 {
            out.push([' ', '\n', '\t', '\r'][(noise() % 4) as usize]);
        }
    };
    ws(noise, out);
    match v {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, noise, out);
            }
            ws(noise, out);
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            for i in (1..members.len()).rev() {
                members.swap(i, (noise() as usize) % (i + 1));
            }
            out.push('{');
            for (i, (k, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(noise, out);
                write_string(k, noise, out);
                ws(noise, out);
                out.push(':');
                write(item, noise, out);
            }
            ws(noise, out);
            out.push('}');
        }
        Value::String(s) => write_string(s, noise, out),
        other => out.push_str(&other.to_string()),
    }
    ws(noise, out);
}

fn write_string(s: &str, noise: &mut impl FnMut() -> u32, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let must = c == '"' || c == '\\' || (c as u32) < 0x20;
        if must || noise() % 4 == 0 {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{:04X}", u));
            }
        } else if c == '/' && noise() % 2 == 0 {
            out.push_str("\\/");
        } else {
            out.push(c);
        }
    }
    out.push('"');
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn canonical_form_is_serde_jsons_sorted_form(v in value(), seed: u64) {
        let mut state = seed | 1;
        let mut noise = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as u32
        };
        let mut text = String::new();
        write(&v, &mut noise, &mut text);
        let canonical = canonicalize(text.as_bytes())
            .unwrap_or_else(|e| panic!("valid JSON refused at {}: {text}", e.offset));
        prop_assert_eq!(String::from_utf8(canonical).unwrap(), serde_json::to_string(&v).unwrap());
    }
}
