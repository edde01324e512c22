//! `idem-origin admin …`: the admin API from a shell, for on-call use.
//!
//! ```text
//! idem-origin admin get <record-key> [--body]
//! idem-origin admin get --key <Idempotency-Key> --scope authorization --identity-file - <<< 'Bearer …'
//! idem-origin admin list [--older-than 30s] [--limit 100] [--all]
//! idem-origin admin purge <record-key> [--force] [--resend] [--token <t> --state <s>]
//! ```
//!
//! It prints the API's JSON answer; a problem goes to stderr with exit code 1, a
//! failure to reach the API or read the token with exit code 2.

use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
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

    /// Send the token over plain http:// to a host off this machine (it crosses the
    /// network in clear). Refused without it.
    #[arg(long, global = true)]
    insecure_http: bool,

    /// The CA certificates (PEM) that verify an https:// admin listener's certificate
    /// (its chain and host name): the one its --admin-tls-cert was issued by.
    #[arg(long, env = "IDEM_ADMIN_CA_FILE", global = true)]
    ca_file: Option<std::path::PathBuf>,

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
    /// A file holding the caller's Authorization value, header value or claim value
    /// (a trailing newline is not part of it), or `-` to read it from stdin: never an
    /// argument, which shell history and `ps` show. Sent in a header, never in the URL.
    #[arg(long, requires = "key")]
    identity_file: Option<std::path::PathBuf>,
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
        let mut identity = None;
        let (method, path) = match &self.command {
            Command::Get(get) => {
                identity = get.identity()?;
                ("GET", get.path()?)
            }
            Command::Purge(purge) => ("DELETE", purge.path()),
            Command::List(list) if list.all => return self.list_all(list, &token).await,
            Command::List(list) => ("GET", list.path(list.cursor.as_deref())),
        };
        let (status, body) = self
            .call(method, &path, &token, identity.as_deref())
            .await?;
        Ok(self.print(status, &body))
    }

    /// Every page, one after the other, as one list.
    async fn list_all(&self, list: &List, token: &str) -> Result<ExitCode, String> {
        let mut records = Vec::new();
        let mut cursor = list.cursor.clone();
        loop {
            let (status, body) = self
                .call("GET", &list.path(cursor.as_deref()), token, None)
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

    async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        identity: Option<&str>,
    ) -> Result<(u16, Bytes), String> {
        let base = self.url.trim_end_matches('/');
        let target = AdminUrl::parse(base)?;
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, target.authority.as_str())
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        if let Some(identity) = identity {
            // Sent as UTF-8 bytes: a claim's value may be any text.
            let value = http::HeaderValue::from_bytes(identity.as_bytes()).map_err(|_| {
                "the identity is not a header value (no line breaks or control characters)"
                    .to_owned()
            })?;
            request = request.header(idem::admin::IDENTITY_HEADER, value);
        }
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|_| "cannot make the request: check --url".to_owned())?;
        let tls = match target.tls {
            false => {
                if self.ca_file.is_some() {
                    return Err(format!(
                        "--url {base:?} is http://, and --ca-file is for https://: nothing \
                         would be verified (use https://)"
                    ));
                }
                if !target.loopback() && !self.insecure_http {
                    return Err(format!(
                        "--url {base:?}: the token would cross the network in clear; use \
                         https:// (the listener's --admin-tls-cert), or --insecure-http"
                    ));
                }
                None
            }
            true => Some(self.tls_connector()?),
        };
        let answered = tokio::time::timeout(Duration::from_secs(30), async {
            let stream = tokio::net::TcpStream::connect(target.authority.as_str())
                .await
                .map_err(|e| e.to_string())?;
            match tls {
                None => exchange(stream, request).await,
                Some(tls) => {
                    let name = rustls::pki_types::ServerName::try_from(target.host.clone())
                        .map_err(|e| format!("{}: {e}", target.host))?;
                    let stream = tls.connect(name, stream).await.map_err(|e| e.to_string())?;
                    exchange(stream, request).await
                }
            }
        })
        .await
        .map_err(|_| format!("{base} did not answer within 30 s"))?;
        answered.map_err(|e| format!("cannot reach the admin API at {base}: {e}"))
    }

    /// A TLS client that verifies the listener's chain and host name against
    /// `--ca-file`.
    fn tls_connector(&self) -> Result<tokio_rustls::TlsConnector, String> {
        let ca_file = self.ca_file.as_deref().ok_or(
            "an https:// --url needs --ca-file (or IDEM_ADMIN_CA_FILE): the CA that issued \
             the listener's certificate",
        )?;
        let config =
            idem::internal::tls::client_config(idem::internal::tls::Verify::Full, Some(ca_file))?;
        Ok(tokio_rustls::TlsConnector::from(std::sync::Arc::new(
            config,
        )))
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
    /// The caller's identity, from `--identity-file` (or stdin for `-`).
    fn identity(&self) -> Result<Option<String>, String> {
        let Some(file) = &self.identity_file else {
            return Ok(None);
        };
        let text = match file.as_os_str() == "-" {
            true => std::io::read_to_string(std::io::stdin())
                .map_err(|e| format!("cannot read the identity from stdin: {e}"))?,
            false => std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?,
        };
        let identity = text.trim_end_matches(['\r', '\n']);
        if identity.is_empty() {
            return Err("--identity-file: the identity is empty".into());
        }
        Ok(Some(identity.to_owned()))
    }

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

/// Where the admin API is: `http://host:port` or `https://host:port`.
struct AdminUrl {
    tls: bool,
    host: String,
    authority: String,
}

impl AdminUrl {
    /// Whether the host is this machine.
    fn loopback(&self) -> bool {
        self.host.eq_ignore_ascii_case("localhost")
            || self
                .host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    fn parse(base: &str) -> Result<AdminUrl, String> {
        let uri: http::Uri = base
            .parse()
            .map_err(|_| format!("--url {base:?} is not a URL"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(format!("--url {base:?}: use http:// or https://")),
        };
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(format!(
                "--url {base:?}: give the listener's base URL, no path"
            ));
        }
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("--url {base:?} has no host"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let authority = match host.contains(':') {
            true => format!("[{host}]:{port}"),
            false => format!("{host}:{port}"),
        };
        Ok(AdminUrl {
            tls,
            host,
            authority,
        })
    }
}

/// One request on a fresh connection, its answer read whole.
async fn exchange<IO>(io: IO, request: http::Request<Full<Bytes>>) -> Result<(u16, Bytes), String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body))
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
