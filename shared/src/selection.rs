//! Which parts of a request make it "the same" ([`FingerprintRule`]): the whole body
//! (the default), or only some of its JSON — JSON Pointers (RFC 6901) kept or left
//! out — and, if a route says so, some headers. Retries that carry a timestamp, a
//! nonce or a trace id in their body are the same request once those are left out.
//!
//! A rule other than the whole body fingerprints under its own tag, with the rule
//! itself hashed in: a fingerprint made under one rule never equals one made under
//! another (or under none), so changing a route's rule can only turn a retry into a
//! `422`, never into the replay of another request's answer.
//!
//! The selection works on the canonical JSON ([`crate::json::canonicalize`]), so key
//! order and whitespace still do not matter; a body that is not JSON is fingerprinted
//! whole (a rule over JSON fields cannot apply to it, and the stricter choice is
//! safe). `shared/testdata/fingerprints.py` implements the same rule independently.

use crate::fingerprint::Fingerprint;
use crate::json;
use crate::scope::tagged_hash;
use crate::InvalidSetting;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

/// A JSON Pointer (RFC 6901): `/a/b/0`, `~1` for `/` and `~0` for `~` in a token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JsonPointer {
    text: String,
    tokens: Vec<String>,
}

impl JsonPointer {
    /// Parses a pointer to a part of a document (never the whole: `""` is refused,
    /// as a rule that kept or dropped the whole body would be no rule).
    pub fn parse(text: &str) -> Result<JsonPointer, InvalidSetting> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err(InvalidSetting::from(format!(
                "{text:?} is not a JSON Pointer to a field: it starts with / (e.g. /created_at)"
            )));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut token = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                match c {
                    '~' => match chars.next() {
                        Some('0') => token.push('~'),
                        Some('1') => token.push('/'),
                        _ => {
                            return Err(InvalidSetting::from(format!(
                                "{text:?}: `~` must be followed by 0 (for ~) or 1 (for /)"
                            )))
                        }
                    },
                    c => token.push(c),
                }
            }
            tokens.push(token);
        }
        Ok(JsonPointer {
            text: text.to_string(),
            tokens,
        })
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// What of the body a fingerprint covers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum BodyParts {
    /// All of it (the default).
    #[default]
    Whole,
    /// Only these parts, each present or absent.
    Only(Vec<JsonPointer>),
    /// All of it but these parts, each resolved in the document as sent (removing one
    /// array element never shifts what another pointer names).
    Except(Vec<JsonPointer>),
}

/// Which parts of a request its fingerprint covers: see the [module docs](self).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FingerprintRule {
    body: BodyParts,
    /// Lower-case header names whose values are fingerprinted too.
    headers: Vec<String>,
}

const TAG: &[u8] = b"idem/fingerprint/v1/selected";

impl FingerprintRule {
    /// A rule from its parts: `only` or `except` (not both) as JSON Pointers, and
    /// `headers` by name. Each error names what to fix.
    pub fn new(
        only: &[impl AsRef<str>],
        except: &[impl AsRef<str>],
        headers: &[impl AsRef<str>],
    ) -> Result<FingerprintRule, InvalidSetting> {
        fn pointers(list: &[impl AsRef<str>]) -> Result<Vec<JsonPointer>, InvalidSetting> {
            list.iter()
                .map(|p| JsonPointer::parse(p.as_ref()))
                .collect()
        }
        let body = match (only.is_empty(), except.is_empty()) {
            (true, true) => BodyParts::Whole,
            (false, true) => BodyParts::Only(pointers(only)?),
            (true, false) => BodyParts::Except(pointers(except)?),
            (false, false) => {
                return Err(InvalidSetting::from(String::from(
                    "give the fields to keep or the fields to leave out, not both",
                )))
            }
        };
        let mut names: Vec<String> = Vec::new();
        for name in headers {
            let name = name.as_ref().trim().to_ascii_lowercase();
            let token = crate::contract::is_header_name(&name);
            if !token {
                return Err(InvalidSetting::from(format!(
                    "{name:?} is not a header name"
                )));
            }
            // A header the edge sets or drops would read otherwise there than here.
            // `Accept-Encoding`: a CDN sets it anew (Cloudflare: `br, gzip`).
            if name.starts_with("idem-")
                || name == "accept-encoding"
                || crate::contract::forgeable(&name)
                || !crate::contract::forwarded_request_header(&name)
            {
                return Err(InvalidSetting::from(format!(
                    "{name} cannot be fingerprinted: idem, a proxy or the connection sets it, \
                     so it is not what the client sent"
                )));
            }
            if !names.contains(&name) {
                names.push(name);
            }
        }
        Ok(FingerprintRule {
            body,
            headers: names,
        })
    }

    /// Whether this is the default rule: the whole body, no header.
    pub fn is_whole(&self) -> bool {
        self.body == BodyParts::Whole && self.headers.is_empty()
    }

    /// The headers it fingerprints, lower-case.
    pub fn headers(&self) -> &[String] {
        &self.headers
    }

    /// The fingerprint of a request under this rule. `content_type` and `header_values`
    /// give every value of a header in order (repeated values are read joined by `", "`,
    /// as a runtime that folds them hands them over). Under the default rule, exactly
    /// [`crate::contract::fingerprint`].
    pub fn fingerprint<'a, I>(
        &self,
        method: &str,
        path_and_query: &str,
        content_type: impl IntoIterator<Item = &'a [u8]>,
        body: &[u8],
        header_values: impl Fn(&str) -> I,
    ) -> Fingerprint
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        if self.is_whole() {
            return crate::contract::fingerprint(method, path_and_query, content_type, body);
        }
        let content_type = folded(content_type);
        let essence = crate::fingerprint::media_essence(content_type.as_deref());
        let canonical = match crate::fingerprint::is_json(essence.as_bytes()) {
            true => json::canonicalize(body).ok(),
            false => None,
        };
        let (body_tag, selected): (&[u8], Vec<u8>) = match canonical {
            Some(doc) => (b"json", self.select(&doc)),
            None => (b"raw", body.to_vec()),
        };
        let mut headers = Vec::new();
        headers.push(b'[');
        for (i, name) in self.headers.iter().enumerate() {
            if i > 0 {
                headers.push(b',');
            }
            headers.push(b'[');
            json::write_string(name.as_bytes(), &mut headers);
            headers.push(b',');
            match folded(header_values(name)) {
                Some(value) => json::write_string(value.as_bytes(), &mut headers),
                None => headers.extend_from_slice(b"null"),
            }
            headers.push(b']');
        }
        headers.push(b']');
        let path = if path_and_query.is_empty() {
            "/"
        } else {
            path_and_query
        };
        Fingerprint(tagged_hash(
            TAG,
            &[
                method.as_bytes(),
                path.as_bytes(),
                essence.as_bytes(),
                body_tag,
                &selected,
                &self.describe(),
                &headers,
            ],
        ))
    }

    /// The rule as canonical JSON: `[mode, [pointers], [headers]]`.
    fn describe(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let (mode, pointers): (&[u8], &[JsonPointer]) = match &self.body {
            BodyParts::Whole => (b"whole", &[]),
            BodyParts::Only(p) => (b"only", p),
            BodyParts::Except(p) => (b"except", p),
        };
        out.push(b'[');
        json::write_string(mode, &mut out);
        out.extend_from_slice(b",[");
        for (i, p) in pointers.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json::write_string(p.text.as_bytes(), &mut out);
        }
        out.extend_from_slice(b"],[");
        for (i, h) in self.headers.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json::write_string(h.as_bytes(), &mut out);
        }
        out.extend_from_slice(b"]]");
        out
    }

    /// The part of the canonical document `doc` this rule covers, as canonical JSON.
    fn select(&self, doc: &[u8]) -> Vec<u8> {
        let mut at = 0;
        let tree = Node::parse(doc, &mut at);
        let mut out = Vec::with_capacity(doc.len());
        match &self.body {
            BodyParts::Whole => out.extend_from_slice(doc),
            BodyParts::Except(pointers) => {
                let removed: Vec<Vec<usize>> = pointers
                    .iter()
                    .filter_map(|p| tree.index_path(&p.tokens))
                    .collect();
                tree.write_except(&mut Vec::new(), &removed, &mut out);
            }
            // None of the fields there: the request is told apart by its whole body
            // (two bodies without any kept field are not the same request).
            BodyParts::Only(pointers) if pointers.iter().all(|p| tree.get(&p.tokens).is_none()) => {
                out.extend_from_slice(doc);
            }
            BodyParts::Only(pointers) => {
                // [[pointer, value] or [pointer] when absent, ...]
                out.push(b'[');
                for (i, p) in pointers.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.push(b'[');
                    json::write_string(p.text.as_bytes(), &mut out);
                    if let Some(value) = tree.get(&p.tokens) {
                        out.push(b',');
                        value.write(&mut out);
                    }
                    out.push(b']');
                }
                out.push(b']');
            }
        }
        out
    }
}

/// A header's values joined by `", "`, with bytes that are not UTF-8 replaced; `None`
/// without one.
fn folded<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<String> {
    let mut out: Option<String> = None;
    for value in values {
        let text = String::from_utf8_lossy(value);
        match &mut out {
            None => out = Some(text.into_owned()),
            Some(joined) => {
                joined.push_str(", ");
                joined.push_str(&text);
            }
        }
    }
    out
}

/// A canonical JSON document as a tree of its own bytes: object keys in their
/// canonical (quoted, escaped) spelling, scalars as written.
enum Node<'a> {
    Object(Vec<(&'a [u8], Node<'a>)>),
    Array(Vec<Node<'a>>),
    Scalar(&'a [u8]),
}

impl<'a> Node<'a> {
    /// Parses canonical JSON (no whitespace, valid: what `canonicalize` wrote) from `at`.
    fn parse(s: &'a [u8], at: &mut usize) -> Node<'a> {
        match s.get(*at) {
            Some(b'{') => {
                *at += 1;
                let mut members = Vec::new();
                while s.get(*at) != Some(&b'}') && *at < s.len() {
                    let start = *at;
                    skip_string(s, at);
                    let key = &s[start..*at];
                    *at += 1; // ':'
                    members.push((key, Node::parse(s, at)));
                    if s.get(*at) == Some(&b',') {
                        *at += 1;
                    }
                }
                *at += 1;
                Node::Object(members)
            }
            Some(b'[') => {
                *at += 1;
                let mut items = Vec::new();
                while s.get(*at) != Some(&b']') && *at < s.len() {
                    items.push(Node::parse(s, at));
                    if s.get(*at) == Some(&b',') {
                        *at += 1;
                    }
                }
                *at += 1;
                Node::Array(items)
            }
            Some(b'"') => {
                let start = *at;
                skip_string(s, at);
                Node::Scalar(&s[start..*at])
            }
            _ => {
                let start = *at;
                while *at < s.len() && !matches!(s[*at], b',' | b']' | b'}') {
                    *at += 1;
                }
                Node::Scalar(&s[start..*at])
            }
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Node::Scalar(bytes) => out.extend_from_slice(bytes),
            Node::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            Node::Object(members) => {
                out.push(b'{');
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(key);
                    out.push(b':');
                    value.write(out);
                }
                out.push(b'}');
            }
        }
    }

    /// The child a pointer token names, by index among members or items.
    fn child_index(&self, token: &str) -> Option<usize> {
        match self {
            Node::Object(members) => {
                let mut key = Vec::with_capacity(token.len() + 2);
                json::write_string(token.as_bytes(), &mut key);
                members.iter().position(|(k, _)| *k == key.as_slice())
            }
            Node::Array(items) => array_index(token).filter(|i| *i < items.len()),
            Node::Scalar(_) => None,
        }
    }

    fn get(&self, tokens: &[String]) -> Option<&Node<'a>> {
        let Some((first, rest)) = tokens.split_first() else {
            return Some(self);
        };
        let index = self.child_index(first)?;
        let child = match self {
            Node::Object(members) => &members[index].1,
            Node::Array(items) => &items[index],
            Node::Scalar(_) => return None,
        };
        child.get(rest)
    }

    /// Where `tokens` lead, as the index of each step among members or items; `None`
    /// when nothing is there (or for the document itself).
    fn index_path(&self, tokens: &[String]) -> Option<Vec<usize>> {
        let mut path = Vec::with_capacity(tokens.len());
        let mut node = self;
        for token in tokens {
            let index = node.child_index(token)?;
            path.push(index);
            node = match node {
                Node::Object(members) => &members[index].1,
                Node::Array(items) => &items[index],
                Node::Scalar(_) => return None,
            };
        }
        (!path.is_empty()).then_some(path)
    }

    /// Writes the node without the children at `removed` (index paths from the
    /// document's root; `at` is this node's).
    fn write_except(&self, at: &mut Vec<usize>, removed: &[Vec<usize>], out: &mut Vec<u8>) {
        let (open, close) = match self {
            Node::Scalar(bytes) => return out.extend_from_slice(bytes),
            Node::Array(_) => (b'[', b']'),
            Node::Object(_) => (b'{', b'}'),
        };
        out.push(open);
        let count = match self {
            Node::Object(members) => members.len(),
            Node::Array(items) => items.len(),
            Node::Scalar(_) => 0,
        };
        let mut first = true;
        for i in 0..count {
            at.push(i);
            if !removed.iter().any(|r| r == at) {
                if !first {
                    out.push(b',');
                }
                first = false;
                match self {
                    Node::Object(members) => {
                        out.extend_from_slice(members[i].0);
                        out.push(b':');
                        members[i].1.write_except(at, removed, out);
                    }
                    Node::Array(items) => items[i].write_except(at, removed, out),
                    Node::Scalar(_) => {}
                }
            }
            at.pop();
        }
        out.push(close);
    }
}

/// Moves `at` past the canonical string that starts there.
fn skip_string(s: &[u8], at: &mut usize) {
    *at += 1;
    while *at < s.len() {
        match s[*at] {
            b'\\' => *at += 2,
            b'"' => {
                *at += 1;
                return;
            }
            _ => *at += 1,
        }
    }
}

/// An array index token: `0`, or digits without a leading zero (RFC 6901 §4).
fn array_index(token: &str) -> Option<usize> {
    let digits = token.as_bytes();
    let valid = !digits.is_empty()
        && digits.iter().all(u8::is_ascii_digit)
        && (digits[0] != b'0' || digits.len() == 1);
    if valid {
        token.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_bindgen_test::wasm_bindgen_test;

    const JSON: [&[u8]; 1] = [b"application/json"];

    fn fp(rule: &FingerprintRule, body: &str) -> Fingerprint {
        rule.fingerprint("POST", "/v1/charges", JSON, body.as_bytes(), |_| {
            core::iter::empty()
        })
    }

    fn except(pointers: &[&str]) -> FingerprintRule {
        FingerprintRule::new(&[] as &[&str], pointers, &[] as &[&str]).unwrap()
    }

    fn only(pointers: &[&str]) -> FingerprintRule {
        FingerprintRule::new(pointers, &[] as &[&str], &[] as &[&str]).unwrap()
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn fields_left_out_do_not_change_it_and_kept_ones_do() {
        let rule = except(&["/sent_at", "/meta/trace"]);
        let a = fp(
            &rule,
            r#"{"amount":1,"sent_at":"10:00","meta":{"trace":"x","v":1}}"#,
        );
        let b = fp(
            &rule,
            r#"{"meta":{"v":1,"trace":"y"}, "sent_at":"10:01","amount":1}"#,
        );
        let c = fp(
            &rule,
            r#"{"amount":2,"sent_at":"10:00","meta":{"trace":"x","v":1}}"#,
        );
        let d = fp(&rule, r#"{"amount":1,"meta":{"v":1}}"#);
        assert_eq!(a, b, "only the left-out fields differ");
        assert_ne!(a, c, "a kept field differs");
        assert_eq!(a, d, "absent is as left out");
        let kept = only(&["/amount", "/currency"]);
        assert_eq!(
            fp(&kept, r#"{"amount":1,"currency":"usd","nonce":1}"#),
            fp(&kept, r#"{"currency":"usd","amount":1,"nonce":2}"#)
        );
        assert_ne!(
            fp(&kept, r#"{"amount":1}"#),
            fp(&kept, r#"{"amount":1,"currency":null}"#),
            "absent is not null"
        );
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_rule_never_shares_fingerprints_with_another() {
        let body = r#"{"amount":1}"#;
        let whole = FingerprintRule::default();
        assert_eq!(
            fp(&whole, body),
            crate::contract::fingerprint("POST", "/v1/charges", JSON, body.as_bytes()),
            "the default rule is the fingerprint without a rule"
        );
        let all = [
            fp(&whole, body),
            fp(&except(&["/nonce"]), body),
            fp(&except(&["/other"]), body),
            fp(&only(&["/amount"]), body),
        ];
        for (i, x) in all.iter().enumerate() {
            for y in &all[i + 1..] {
                assert_ne!(x, y);
            }
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn pointers_follow_rfc_6901() {
        let two = except(&["/items/0", "/items/1"]);
        assert_ne!(
            fp(&two, r#"{"items":["A","B","C"]}"#),
            fp(&two, r#"{"items":["A","B","D"]}"#),
            "each pointer names an element of the body as sent: the third is kept"
        );
        let kept = only(&["/amount"]);
        assert_ne!(
            fp(&kept, r#"{"charge":{"amount":5}}"#),
            fp(&kept, r#"{"charge":{"amount":9000}}"#),
            "no kept field at all: the whole body tells them apart"
        );
        let rule = except(&["/a~1b", "/m~0n", "/items/1", "/items/01", "/x/"]);
        assert_eq!(
            fp(
                &rule,
                r#"{"a/b":1,"m~n":2,"items":[1,2,3],"x":{"":1},"k":0}"#
            ),
            fp(&rule, r#"{"items":[1,9,3],"x":{"":2},"k":0}"#)
        );
        assert_ne!(
            fp(&rule, r#"{"items":[1,2,3],"k":0}"#),
            fp(&rule, r#"{"items":[1,2,4],"k":0}"#),
            "only the element named is left out"
        );
        assert!(JsonPointer::parse("").is_err());
        assert!(JsonPointer::parse("a").is_err());
        assert!(JsonPointer::parse("/a~2").is_err());
        assert!(JsonPointer::parse("/a~").is_err());
        assert!(FingerprintRule::new(&["/a"], &["/b"], &[] as &[&str]).is_err());
        for bad in [
            "idem-edge-secret",
            "x-forwarded-for",
            "host",
            "connection",
            "a b",
        ] {
            assert!(
                FingerprintRule::new(&[] as &[&str], &[] as &[&str], &[bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn headers_named_are_fingerprinted_as_a_folding_runtime_reads_them() {
        let rule = FingerprintRule::new(&[] as &[&str], &[] as &[&str], &["X-Tenant"]).unwrap();
        let with = |values: &'static [&'static [u8]]| {
            rule.fingerprint("POST", "/", JSON, b"{}", move |name| {
                assert_eq!(name, "x-tenant");
                values.iter().copied()
            })
        };
        assert_ne!(with(&[b"a"]), with(&[b"b"]));
        assert_ne!(with(&[]), with(&[b""]), "absent is not empty");
        assert_eq!(with(&[b"a", b"b"]), with(&[b"a, b"]));
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_body_that_is_not_json_is_fingerprinted_whole() {
        let rule = except(&["/nonce"]);
        let text: [&[u8]; 1] = [b"text/plain"];
        let raw = |body: &[u8]| rule.fingerprint("POST", "/", text, body, |_| core::iter::empty());
        assert_ne!(raw(b"nonce=1"), raw(b"nonce=2"));
        assert_ne!(fp(&rule, r#"{"nonce":1,"#), fp(&rule, r#"{"nonce":2,"#));
    }
}
