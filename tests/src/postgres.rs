//! The shared Postgres: one fresh schema per test, so tests can count rows in
//! parallel. Found at `IDEM_TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/idem` (what `scripts/services-start` starts).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};

/// The Postgres the tests use.
pub fn database_url() -> String {
    std::env::var("IDEM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/idem".into())
}

/// A schema of its own for one test, so tests can count rows in parallel.
pub struct TestDb {
    /// The schema's name.
    pub schema: String,
    /// A URL whose connections use the schema.
    pub url: String,
}

impl TestDb {
    /// Creates a fresh, empty schema.
    pub async fn new(label: &str) -> TestDb {
        static N: AtomicU32 = AtomicU32::new(0);
        let schema = format!(
            "t_{label}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let client = connect(&database_url()).await;
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            ))
            .await
            .unwrap_or_else(|e| panic!("cannot create schema {schema}: {e}"));
        let url = with_search_path(&database_url(), &schema);
        TestDb { schema, url }
    }

    /// A client on the schema.
    pub async fn client(&self) -> tokio_postgres::Client {
        connect(&self.url).await
    }

    /// The schema's URL with its sessions named `name` (idem keeps a given name), so
    /// that [`TestDb::wait_sessions_gone`] can tell them.
    pub fn url_named(&self, name: &str) -> String {
        format!("{}&application_name={name}", self.url)
    }

    /// Waits (up to 30 s) until no session named `name` is connected: a session
    /// reports its statistics (`pg_stat_user_tables`…) when it ends.
    pub async fn wait_sessions_gone(&self, name: &str) {
        let c = self.client().await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let open: i64 = c
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                    &[&name],
                )
                .await
                .unwrap()
                .get(0);
            if open == 0 {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{open} sessions of {name} still open"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// One statistics counter of the schema's `idem_records` (`seq_scan`, …) or of one
    /// of its indexes (`index` = `Some(name)`: `idx_tup_read`, …), read on a new
    /// session (no statistics snapshot of its own yet).
    pub async fn table_stat(&self, index: Option<&str>, column: &str) -> i64 {
        let (view, name) = match index {
            None => ("pg_stat_user_tables WHERE relname", "idem_records"),
            Some(index) => ("pg_stat_user_indexes WHERE indexrelname", index),
        };
        let sql =
            format!("SELECT coalesce({column}, 0)::int8 FROM {view} = $2 AND schemaname = $1");
        let c = self.client().await;
        c.query_one(&sql, &[&self.schema, &name])
            .await
            .unwrap()
            .get(0)
    }

    /// One integer from `sql`.
    pub async fn count(&self, sql: &str) -> i64 {
        self.client()
            .await
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    }

    /// Runs `sql` (statements without results).
    pub async fn exec(&self, sql: &str) {
        self.client()
            .await
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// (Charges, keys charged, keys charged more than once.)
    pub async fn charge_counts(&self) -> (i64, i64, i64) {
        let charges = self.charges().await;
        let keys = self
            .count("SELECT count(DISTINCT idempotency_key) FROM charges")
            .await;
        let doubled = self
            .count("SELECT count(*) FROM (SELECT 1 FROM charges GROUP BY idempotency_key HAVING count(*) > 1) d")
            .await;
        (charges, keys, doubled)
    }

    /// Rows in `charges`.
    pub async fn charges(&self) -> i64 {
        self.count("SELECT count(*) FROM charges").await
    }

    /// Charges made under `key`.
    pub async fn charges_for(&self, key: &str) -> i64 {
        let client = self.client().await;
        client
            .query_one(
                "SELECT count(*) FROM charges WHERE idempotency_key = $1",
                &[&key],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Records still in force (claimed or completed, not expired or released).
    pub async fn live_records(&self) -> i64 {
        let now = idem::now() as i64;
        self.client()
            .await
            .query_one(
                "SELECT count(*) FROM idem_records WHERE expires_at > $1",
                &[&now],
            )
            .await
            .unwrap()
            .get(0)
    }
}

/// `url` with `search_path` set to `schema` for every connection.
pub fn with_search_path(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20search_path%3D{schema}")
}

/// A plain connection (panics with the reason when Postgres is not there).
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!("cannot connect to Postgres at {url}: {e} — run scripts/services-start")
        });
    tokio::spawn(conn);
    client
}

/// The socket address of a `postgres://…@host:port/…` URL.
pub fn pg_addr(url: &str) -> SocketAddr {
    let config: tokio_postgres::Config = url.parse().expect("valid URL");
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(_) => panic!("tests need a TCP Postgres URL"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let host = if host == "localhost" {
        "127.0.0.1".to_owned()
    } else {
        host
    };
    format!("{host}:{port}").parse().expect("an IP host")
}

/// `url` pointed at `addr` instead of its own host and port.
pub fn via(url: &str, addr: SocketAddr) -> String {
    let target = pg_addr(url);
    url.replacen(
        &format!("{}:{}", target.ip(), target.port()),
        &addr.to_string(),
        1,
    )
}
