//! Who may use the admin API: bearer tokens read from a file, compared in constant time.

use sha2::{Digest, Sha256};

/// Shortest token accepted: a guessable token would make the admin listener a way in.
pub const MIN_TOKEN_LEN: usize = 16;

/// The operators' tokens, kept as SHA-256 digests.
#[derive(Clone)]
pub struct Tokens {
    operators: Vec<(String, [u8; 32])>,
}

impl std::fmt::Debug for Tokens {
    /// Names the operators, never their tokens.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.operators.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Tokens").field("operators", &names).finish()
    }
}

impl Tokens {
    /// Parses a token file: one token per line, as `<operator>:<token>` or a bare
    /// token (operator `admin`); blank lines and lines starting with `#` are skipped.
    /// The error names the line, never the token.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut operators = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, token) = match line.split_once(':') {
                Some((name, token)) => (name.trim(), token.trim()),
                None => ("admin", line),
            };
            let line_no = n + 1;
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
            {
                return Err(format!(
                    "line {line_no}: an operator's name is letters, digits and - _ . @"
                ));
            }
            if token.len() < MIN_TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "line {line_no}: a token is at least {MIN_TOKEN_LEN} visible ASCII characters"
                ));
            }
            operators.push((name.to_owned(), digest(token.as_bytes())));
        }
        if operators.is_empty() {
            return Err("no token in the file".into());
        }
        Ok(Tokens { operators })
    }

    /// Reads and parses a token file.
    pub fn from_file(path: &std::path::Path) -> Result<Tokens, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the admin token file {}: {e}", path.display()))?;
        Tokens::parse(&text).map_err(|e| format!("admin token file {}: {e}", path.display()))
    }

    /// The operator whose token `presented` is. Every token is compared, each in
    /// constant time over fixed-length digests: neither the length nor the position of
    /// a match shows in the time taken.
    pub fn operator(&self, presented: &[u8]) -> Option<&str> {
        let presented = digest(presented);
        let mut found = None;
        for (name, expected) in &self.operators {
            if constant_time_eq(&presented, expected) {
                found = Some(name.as_str());
            }
        }
        found
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    std::hint::black_box(difference) == 0
}

/// What an `Authorization` header presents.
#[derive(Debug, PartialEq, Eq)]
pub enum Presented<'a> {
    /// No header, or not a bearer token.
    Nothing,
    /// A bearer token.
    Bearer(&'a [u8]),
}

/// Reads the bearer token of an `Authorization` value.
pub fn presented(value: Option<&[u8]>) -> Presented<'_> {
    match value {
        Some(v) if v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ") => {
            Presented::Bearer(v[7..].trim_ascii())
        }
        _ => Presented::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_operators_and_refuses_short_or_missing_tokens() {
        let t = Tokens::parse("# on-call\nalice:0123456789abcdef0123\n\n0123456789abcdefXYZW\n")
            .unwrap();
        assert_eq!(t.operator(b"0123456789abcdef0123"), Some("alice"));
        assert_eq!(t.operator(b"0123456789abcdefXYZW"), Some("admin"));
        assert_eq!(t.operator(b"0123456789abcdef012"), None);
        assert_eq!(t.operator(b""), None);
        assert!(Tokens::parse("bob:short").unwrap_err().contains("line 1"));
        assert!(Tokens::parse("# nothing\n")
            .unwrap_err()
            .contains("no token"));
        assert!(Tokens::parse("b b:0123456789abcdef0123").is_err());
        assert!(!format!("{t:?}").contains("0123"));
    }

    #[test]
    fn reads_bearer_tokens_only() {
        assert_eq!(presented(Some(b"Bearer  abc ")), Presented::Bearer(b"abc"));
        assert_eq!(presented(Some(b"bearer x")), Presented::Bearer(b"x"));
        assert_eq!(presented(Some(b"Basic abc")), Presented::Nothing);
        assert_eq!(presented(Some(b"Bearer ")), Presented::Nothing);
        assert_eq!(presented(None), Presented::Nothing);
    }
}
