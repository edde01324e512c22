//! Backend round trips counted by the servers themselves: Postgres with
//! `pg_stat_statements`, Redis with `INFO commandstats` on every master. Also the
//! bench's housekeeping: a database of its own, and deleting what it wrote.

use anyhow::{anyhow, bail, Context, Result};
use idem::IdColumn;
use redis::aio::MultiplexedConnection;
use std::str::FromStr;
use tokio_postgres::{Client, NoTls};

/// Commands the store's Lua scripts call inside Redis. Redis counts those calls in
/// its statistics too, but they are not round trips: the client never sends them.
const SCRIPT_INNER_COMMANDS: &[&str] = &["get", "set", "hget", "pexpireat", "time"];

/// A connection to the bench database.
pub struct Postgres {
    client: Client,
}

impl Postgres {
    /// Connects to `url`, creating its database (from the `postgres` database) when
    /// missing, and the `pg_stat_statements` view in it.
    pub async fn connect(url: &str) -> Result<Self> {
        let config = tokio_postgres::Config::from_str(url).context("--database-url")?;
        let db = config.get_dbname().unwrap_or("postgres").to_string();
        let client = match connect(&config).await {
            Ok(c) => c,
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_DATABASE) => {
                let mut admin = config.clone();
                admin.dbname("postgres");
                let c = connect(&admin)
                    .await
                    .with_context(|| format!("connecting to Postgres at {url}"))?;
                c.batch_execute(&format!("CREATE DATABASE \"{}\"", db.replace('"', "")))
                    .await
                    .context("creating the bench database")?;
                connect(&config).await?
            }
            Err(e) => return Err(e).with_context(|| format!("connecting to Postgres at {url}")),
        };
        client
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await
            .context("creating pg_stat_statements")?;
        // The view errors unless the library was preloaded; say how to fix it.
        client
            .simple_query("SELECT 1 FROM pg_stat_statements LIMIT 1")
            .await
            .map_err(|e| {
                anyhow!(
                    "pg_stat_statements is not loaded ({e}); the bench counts Postgres round \
                     trips with it: run scripts/services-start, or add \
                     shared_preload_libraries = 'pg_stat_statements' and restart Postgres"
                )
            })?;
        Ok(Postgres { client })
    }

    /// Statements executed in this database so far (the bench's own excluded).
    pub async fn statements(&self) -> Result<u64> {
        let row = self
            .client
            .query_one(
                "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND query NOT LIKE '%pg_stat_statements%'
                   AND query NOT LIKE 'TRUNCATE%'",
                &[],
            )
            .await?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// The connection itself, for the scale bench's bulk writes and sizes.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// How the records table (created by the origin) holds keys.
    pub async fn id_column(&self) -> Result<IdColumn> {
        id_column(&self.client).await
    }

    /// Empties the records table (when the origin has created it).
    pub async fn truncate_records(&self) -> Result<()> {
        self.client
            .batch_execute(
                "DO $$ BEGIN
                   IF to_regclass('idem_records') IS NOT NULL THEN TRUNCATE idem_records; END IF;
                   IF to_regclass('charges') IS NOT NULL THEN TRUNCATE charges; END IF;
                 END $$",
            )
            .await
            .context("emptying idem_records")?;
        Ok(())
    }
}

/// How `idem_records` (created by the origin) holds keys.
pub async fn id_column(client: &Client) -> Result<IdColumn> {
    idem::internal::id_column(client)
        .await
        .map_err(|e| anyhow!("reading the type of idem_records.id: {e}"))
}

async fn connect(config: &tokio_postgres::Config) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = config.connect(NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// The Redis servers of one deployment: a standalone server, or a cluster's masters.
pub struct Redis {
    nodes: Vec<MultiplexedConnection>,
    pub addresses: Vec<String>,
}

impl Redis {
    pub async fn standalone(url: &str) -> Result<Self> {
        let conn = open(url).await?;
        Ok(Redis {
            nodes: vec![conn],
            addresses: vec![url.to_string()],
        })
    }

    /// The cluster's masters, found with `CLUSTER NODES` from the first reachable seed.
    pub async fn cluster_masters(seeds: &[String]) -> Result<Self> {
        let mut last = None;
        for seed in seeds {
            match open(seed).await {
                Ok(mut c) => {
                    let nodes: String = redis::cmd("CLUSTER")
                        .arg("NODES")
                        .query_async(&mut c)
                        .await?;
                    let mut masters = Vec::new();
                    for line in nodes.lines() {
                        let f: Vec<&str> = line.split_whitespace().collect();
                        if f.len() > 2 && f[2].contains("master") && !f[2].contains("fail") {
                            let addr = f[1].split('@').next().unwrap_or_default();
                            masters.push(format!("redis://{addr}"));
                        }
                    }
                    if masters.is_empty() {
                        bail!("CLUSTER NODES at {seed} lists no healthy master");
                    }
                    let mut nodes = Vec::new();
                    for m in &masters {
                        nodes.push(open(m).await?);
                    }
                    return Ok(Redis {
                        nodes,
                        addresses: masters,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow!("no Redis Cluster seed URL given")))
    }

    /// Commands clients sent to these servers so far: every `cmdstat_*` call except
    /// `INFO` (the bench's own) and the commands our scripts run inside Redis.
    pub async fn commands(&mut self) -> Result<u64> {
        let mut total = 0;
        for node in &mut self.nodes {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(node)
                .await?;
            total += client_commands(&info);
        }
        Ok(total)
    }

    /// Memory the servers use for data and overhead (`used_memory`), summed.
    pub async fn used_memory(&mut self) -> Result<u64> {
        let mut total = 0;
        for node in &mut self.nodes {
            let info: String = redis::cmd("INFO").arg("memory").query_async(node).await?;
            total += info_field(&info, "used_memory")
                .with_context(|| format!("INFO memory has no used_memory: {info}"))?;
        }
        Ok(total)
    }

    /// Keys stored on these servers (`DBSIZE`), summed.
    pub async fn keys(&mut self) -> Result<u64> {
        let mut total = 0;
        for node in &mut self.nodes {
            total += redis::cmd("DBSIZE").query_async::<u64>(node).await?;
        }
        Ok(total)
    }

    /// Deletes every key that starts with `idem-bench` (what this bench writes).
    pub async fn delete_bench_keys(&mut self) -> Result<u64> {
        let mut deleted = 0;
        for node in &mut self.nodes {
            let mut cursor: u64 = 0;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg("idem-bench*")
                    .arg("COUNT")
                    .arg(10_000)
                    .query_async(node)
                    .await?;
                if !keys.is_empty() {
                    // One slot per UNLINK on a cluster node: keys differ in slot.
                    let mut pipe = redis::pipe();
                    for k in &keys {
                        pipe.cmd("UNLINK").arg(k).ignore();
                    }
                    pipe.query_async::<()>(node).await?;
                    deleted += keys.len() as u64;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(deleted)
    }
}

async fn open(url: &str) -> Result<MultiplexedConnection> {
    redis::Client::open(url)
        .with_context(|| format!("Redis URL {url}"))?
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("connecting to Redis at {url}"))
}

/// `<name>:<number>` from an `INFO` answer.
fn info_field(info: &str, name: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// Sums the `calls=` of an `INFO commandstats` answer, leaving out `INFO` and the
/// commands our scripts call inside the server.
pub fn client_commands(info: &str) -> u64 {
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, stats) = l.split_once(':')?;
            let name = name.to_ascii_lowercase();
            if name == "info" || SCRIPT_INNER_COMMANDS.contains(&name.as_str()) {
                return None;
            }
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            calls.parse::<u64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_clients_sent() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=1000,usec=5000,usec_per_call=5.00,rejected_calls=0,failed_calls=1\r\n\
            cmdstat_set:calls=900,usec=900,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_get:calls=1000,usec=900,usec_per_call=0.90,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_script|load:calls=3,usec=9,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_info:calls=7,usec=70,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_ping:calls=2,usec=1,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n";
        assert_eq!(client_commands(info), 1000 + 3 + 2);
        assert_eq!(client_commands(""), 0);
        let memory = "# Memory\r\nused_memory:1048576\r\nused_memory_human:1.00M\r\n";
        assert_eq!(info_field(memory, "used_memory"), Some(1_048_576));
        assert_eq!(info_field(memory, "used_memory_rss"), None);
    }
}
