//! `idem-origin admin …`: the admin API from a shell, for on-call use.
//!
//! ```text
//! idem-origin admin get <record-key> [--body]
//! idem-origin admin get --key <Idempotency-Key> --scope authorization --identity 'Bearer …'
//! idem-origin admin list [--older-than 30s] [--limit 100] [--all]
//! idem-origin admin purge <record-key> [--force] [--resend] [--token <t> --state <s>]
//! ```
//!
//! It prints the API's JSON answer; a problem goes to stderr with exit code 1, a
//! failure to reach the API or read the token with exit code 2.

use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::process::ExitCode;
use std::time::Duration;

/// The admin API of a running idem-origin.
#[derive(Parser, Debug)]
#[command(name = "idem-origin admin", bin_name = "idem-origin admin")]
pub struct AdminCli {
    /// The admin listener's base URL.
    #[arg(
        long,
        env = "IDEM_ADMIN_URL",
        default_value = "http://127.0.0.1:9090",
        global = true
    )]
    url: String,

    /// A file holding your token (a bare token, or `<operator>:<token>`: the first such
    /// line is used).
    #[arg(long, env = "IDEM_ADMIN_TOKEN_FILE", global = true)]
    token_file: Option<std::path::PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show a record: by record key, or by a request's key and caller.
    Get(Get),
    /// List in-progress records (attempts a crash may have orphaned).
    List(List),
    /// Purge a record: the key is free again, on every replica.
    Purge(Purge),
}

#[derive(Args, Debug)]
struct Get {
    /// The record key (64 hex digits); or give --key and --scope.
    record_key: Option<String>,
    /// The request's Idempotency-Key, as it was sent.
    #[arg(long, conflicts_with = "record_key", requires = "scope")]
    key: Option<String>,
    /// Where the caller's scope came from: authorization, header:<name>, jwt:<claim> or
    /// anonymous.
    #[arg(long)]
    scope: Option<String>,
    /// The caller's Authorization value, header value or claim value.
    #[arg(long)]
    identity: Option<String>,
    /// Include the stored body.
    #[arg(long)]
    body: bool,
}

#[derive(Args, Debug)]
struct List {
    /// Only records claimed longer ago than this (500ms, 30s, 5m, 2h).
    #[arg(long, default_value = "0s")]
    older_than: String,
    /// Records per page (1–1000).
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Start at this page (a previous answer's next_cursor).
    #[arg(long)]
    cursor: Option<String>,
    /// Follow every page and print all the records as one list.
    #[arg(long)]
    all: bool,
}

#[derive(Args, Debug)]
struct Purge {
    /// The record key (64 hex digits).
    record_key: String,
    /// Purge even while an attempt holds the key under a live lease (only when its
    /// holder is known to be gone: a retry after this may run the handler again).
    #[arg(long)]
    force: bool,
    /// In proxy mode, purge an in-progress record even though its request may have
    /// reached the upstream: a retry after this sends it again. Without it, such a
    /// purge is refused, and the key's next retry stores the outcome as unknown.
    #[arg(long)]
    resend: bool,
    /// Purge only the attempt with this token (as `list` or `get` showed it) …
    #[arg(long, requires = "state")]
    token: Option<u64>,
    /// … in this state: if it has changed since (an orphan whose holder completed it
    /// after all), nothing is deleted and the record as it is now is shown.
    #[arg(long, requires = "token", value_parser = ["in_progress", "completed"])]
    state: Option<String>,
}

impl Purge {
    fn path(&self) -> String {
        let mut query = Vec::new();
        if self.force {
            query.push("force=true".to_string());
        }
        if self.resend {
            query.push("resend=true".to_string());
        }
        if let (Some(token), Some(state)) = (self.token, &self.state) {
            query.push(format!("token={token}&state={state}"));
        }
        let query = match query.is_empty() {
            true => String::new(),
            false => format!("?{}", query.join("&")),
        };
        format!("/admin/v1/records/{}{query}", encode(&self.record_key))
    }
}

/// Runs the command in `args` (`admin` and what follows it).
pub async fn run(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = match AdminCli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.execute().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("idem-origin admin: error: {e}");
            ExitCode::from(2)
        }
    }
}

impl AdminCli {
    async fn execute(&self) -> Result<ExitCode, String> {
        let token = self.token()?;
        let (method, path) = match &self.command {
            Command::Get(get) => ("GET", get.path()?),
            Command::Purge(purge) => ("DELETE", purge.path()),
            Command::List(list) if list.all => return self.list_all(list, &token).await,
            Command::List(list) => ("GET", list.path(list.cursor.as_deref())),
        };
        let (status, body) = self.call(method, &path, &token).await?;
        Ok(self.print(status, &body))
    }

    /// Every page, one after the other, as one list.
    async fn list_all(&self, list: &List, token: &str) -> Result<ExitCode, String> {
        let mut records = Vec::new();
        let mut cursor = list.cursor.clone();
        loop {
            let (status, body) = self
                .call("GET", &list.path(cursor.as_deref()), token)
                .await?;
            if status != 200 {
                return Ok(self.print(status, &body));
            }
            let page: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|e| format!("the admin API answered something that is not JSON: {e}"))?;
            if let Some(found) = page["records"].as_array() {
                records.extend(found.iter().cloned());
            }
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => break,
            }
        }
        let all = serde_json::json!({ "records": records, "count": records.len() });
        println!("{}", serde_json::to_string_pretty(&all).unwrap_or_default());
        Ok(ExitCode::SUCCESS)
    }

    fn token(&self) -> Result<String, String> {
        let Some(file) = &self.token_file else {
            return Err("--token-file (or IDEM_ADMIN_TOKEN_FILE) is required".into());
        };
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        text.lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                l.split_once(':')
                    .map_or(l, |(_, token)| token)
                    .trim()
                    .to_owned()
            })
            .ok_or_else(|| format!("{} holds no token", file.display()))
    }

    async fn call(&self, method: &str, path: &str, token: &str) -> Result<(u16, Bytes), String> {
        let base = self.url.trim_end_matches('/');
        if !base.starts_with("http://") {
            return Err(format!(
                "--url {base:?}: the admin API is served over http://"
            ));
        }
        let request = http::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("cannot make the request: {e}"))?;
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let answered = tokio::time::timeout(Duration::from_secs(30), async {
            let response = client.request(request).await.map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((status, body))
        })
        .await
        .map_err(|_| format!("{base} did not answer within 30 s"))?;
        answered.map_err(|e| format!("cannot reach the admin API at {base}: {e}"))
    }

    fn print(&self, status: u16, body: &[u8]) -> ExitCode {
        let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
        if (200..300).contains(&status) {
            match json {
                Some(v) => println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
                None => println!("{}", String::from_utf8_lossy(body)),
            }
            return ExitCode::SUCCESS;
        }
        match json.as_ref().and_then(|v| v["detail"].as_str()) {
            Some(detail) => eprintln!("idem-origin admin: {status}: {detail}"),
            None => eprintln!(
                "idem-origin admin: {status}: {}",
                String::from_utf8_lossy(body)
            ),
        }
        ExitCode::from(1)
    }
}

impl Get {
    fn path(&self) -> Result<String, String> {
        let body = if self.body { "body=true" } else { "" };
        match (&self.record_key, &self.key, &self.scope) {
            (Some(record_key), _, _) => Ok(format!(
                "/admin/v1/records/{}{}{body}",
                encode(record_key),
                if self.body { "?" } else { "" }
            )),
            (None, Some(key), Some(scope)) => {
                let mut query = format!("key={}&scope={}", encode(key), encode(scope));
                if let Some(identity) = &self.identity {
                    query.push_str(&format!("&identity={}", encode(identity)));
                }
                if self.body {
                    query.push_str("&body=true");
                }
                Ok(format!("/admin/v1/records?{query}"))
            }
            _ => Err("give a record key, or --key and --scope".into()),
        }
    }
}

impl List {
    fn path(&self, cursor: Option<&str>) -> String {
        let mut path = format!(
            "/admin/v1/in-progress?older_than={}&limit={}",
            encode(&self.older_than),
            self.limit
        );
        if let Some(cursor) = cursor {
            path.push_str(&format!("&cursor={}", encode(cursor)));
        }
        path
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::encode;

    #[test]
    fn encodes_query_values() {
        assert_eq!(encode("Bearer a+b/c"), "Bearer%20a%2Bb%2Fc");
        assert_eq!(encode("\"k1\""), "%22k1%22");
        assert_eq!(encode("header:x-tenant"), "header%3Ax-tenant");
    }
}
