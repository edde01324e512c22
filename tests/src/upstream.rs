//! The payments API in Python (tests/upstream/payments.py): an upstream that knows
//! nothing about idempotency, for proxy mode's tests. Counts come from its own SQLite
//! database.

use crate::client;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Python payments API, on a port and a database of its own (both removed when
/// dropped).
pub struct Payments {
    child: Option<Child>,
    port: u16,
    db: PathBuf,
    /// Extra arguments (TLS), kept for a restart.
    args: Vec<String>,
}

impl Payments {
    pub async fn start() -> Payments {
        let port = crate::procs::free_port();
        let db = std::env::temp_dir().join(format!(
            "idem-payments-{}-{port}.sqlite",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&db);
        let mut payments = Payments {
            child: None,
            port,
            db,
            args: Vec::new(),
        };
        payments.spawn().await;
        payments
    }

    /// The API over TLS with `cert` and `key` (PEM); with `client_ca`, it asks for a
    /// client certificate signed by it and refuses a connection without one.
    pub async fn start_tls(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Payments {
        let port = crate::procs::free_port();
        let db = std::env::temp_dir().join(format!(
            "idem-payments-{}-{port}.sqlite",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&db);
        let mut args = vec![
            "--tls-cert".to_owned(),
            cert.display().to_string(),
            "--tls-key".to_owned(),
            key.display().to_string(),
        ];
        if let Some(ca) = client_ca {
            args.extend(["--client-ca".to_owned(), ca.display().to_string()]);
        }
        let mut payments = Payments {
            child: None,
            port,
            db,
            args,
        };
        payments.spawn().await;
        payments
    }

    /// `https://127.0.0.1:<port>`, for one started with [`Payments::start_tls`].
    pub fn tls_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub async fn spawn(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("upstream/payments.py");
        let child = Command::new("python3")
            .arg(&script)
            .args(["--port", &self.port.to_string(), "--db"])
            .arg(&self.db)
            .args(&self.args)
            .stdin(Stdio::null())
            .spawn()
            .expect("python3 runs the payments API");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        if !self.args.is_empty() {
            // Over TLS: listening is enough (the tests' client does not speak it).
            while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_err()
            {
                assert!(Instant::now() < deadline, "the payments API did not start");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            return;
        }
        loop {
            if let Ok(r) = client().get(format!("{}/healthz", self.url())).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "the payments API did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills it at once (SIGKILL): requests in flight lose their connection.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// One number from its database.
    pub fn count(&self, query: &str) -> i64 {
        self.text(query).parse().unwrap()
    }

    pub fn charges_for(&self, key: &str) -> i64 {
        self.count(&format!(
            "SELECT count(*) FROM charges WHERE idempotency_key = '{key}'"
        ))
    }

    pub fn calls_for(&self, key: &str) -> i64 {
        self.count(&format!(
            "SELECT count(*) FROM calls WHERE idempotency_key = '{key}'"
        ))
    }

    /// One query's output from its database, trimmed.
    pub fn text(&self, query: &str) -> String {
        sqlite(&self.db, query)
            .unwrap_or_else(|e| panic!("{e}"))
            .trim()
            .to_owned()
    }
}

/// One query's output from the `sqlite3` shell (scripts/edge-toolchain installs it),
/// waiting up to 5 s for a lock; its error as text. How the tests read databases other
/// programs wrote: the upstream's, and the Durable Objects' as workerd keeps them.
pub fn sqlite(db: &Path, query: &str) -> Result<String, String> {
    let out = Command::new("sqlite3")
        .args(["-cmd", ".timeout 5000"])
        .arg(db)
        .arg(query)
        .output()
        .expect("sqlite3 runs (scripts/edge-toolchain installs it)");
    if !out.status.success() {
        return Err(format!(
            "sqlite3 {} {query:?}: {}",
            db.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Drop for Payments {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.db);
    }
}
