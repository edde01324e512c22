//! The raw backends, measured with their own benchmark tools at the bench's concurrency:
//! `redis-benchmark` for `SET <random key> v NX EX 86400`, `pgbench` for the Postgres
//! store's own claim statements.

use anyhow::{anyhow, bail, Context, Result};
use idem::internal::{claim_statements, completion_statement};
use idem::IdColumn;
use idem::PgStrategy;
use idem_core::{decide, Decision, Fingerprint, Policy, StoredResponse};
use serde::Serialize;
use std::path::Path;
use std::time::Duration;
use tokio::process::Command;

/// What a raw run measured.
#[derive(Clone, Debug, Serialize)]
pub struct RawResult {
    /// Backend round trips per second (statements for pgbench, commands for Redis).
    pub ops_per_s: f64,
    /// The tool's own mean latency of one operation (one pgbench script), in ms.
    pub mean_latency_ms: f64,
}

/// `redis-benchmark` against `host:port`, sized to run for about `duration`.
pub async fn redis_set_nx(
    host: &str,
    port: u16,
    cluster: bool,
    clients: usize,
    duration: Duration,
) -> Result<RawResult> {
    // A short calibration run sizes the real one: redis-benchmark counts requests, not time.
    let probe = redis_benchmark(host, port, cluster, clients, 5_000.max(clients * 200)).await?;
    let n = (probe.ops_per_s * duration.as_secs_f64()).max(10_000.0) as usize;
    redis_benchmark(host, port, cluster, clients, n).await
}

async fn redis_benchmark(
    host: &str,
    port: u16,
    cluster: bool,
    clients: usize,
    requests: usize,
) -> Result<RawResult> {
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-h", host, "-p", &port.to_string()])
        .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
        .args(["-r", "1000000000", "--csv"]);
    // `{tag}` lets redis-benchmark route each random key to its slot's node.
    let key = if cluster {
        cmd.arg("--cluster");
        "idem-bench:{tag}:raw:__rand_int__"
    } else {
        "idem-bench:raw:__rand_int__"
    };
    cmd.args(["SET", key, "v", "NX", "EX", "86400"]);
    let out = run(cmd, "redis-benchmark").await?;
    parse_redis_benchmark_csv(&out)
}

/// Reads the `--csv` line of one custom-command run.
pub fn parse_redis_benchmark_csv(out: &str) -> Result<RawResult> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with("\"SET "))
        .ok_or_else(|| anyhow!("no result line in redis-benchmark's output:\n{out}"))?;
    let fields: Vec<&str> = line.split("\",\"").map(|f| f.trim_matches('"')).collect();
    if fields.len() < 3 {
        bail!("unexpected redis-benchmark line: {line}");
    }
    let num = |i: usize| -> Result<f64> {
        fields[i]
            .parse()
            .with_context(|| format!("field {i} of redis-benchmark line {line:?}"))
    };
    Ok(RawResult {
        ops_per_s: num(1)?,
        mean_latency_ms: num(2)?,
    })
}

/// The pgbench script for `strategy`: the statements of one request for a new key —
/// the store's claim, then its completion — with a random id and representative
/// records (an in-progress claim; a completed 201 with a demo charge's body).
pub fn pgbench_script(strategy: PgStrategy, id: IdColumn) -> String {
    let policy = Policy::default();
    let now = 1_800_000_000_000;
    let Decision::Execute(claim) = decide(None, &Fingerprint([7; 32]), now, &policy) else {
        unreachable!("no record always executes")
    };
    let response = StoredResponse {
        status: 201,
        headers: vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("location".into(), b"/v1/charges/ch_0123456789abcdef".to_vec()),
        ],
        body: br#"{"amount":1999,"created":1800000000,"currency":"usd","customer":"cus_0123456789-0-1234","id":"ch_0123456789abcdef"}"#.to_vec(),
    };
    let completed = claim.holder().completed(response, now, &policy);
    let mut script = String::from("\\set n random(1, 9000000000000000000)\n");
    let statements = claim_statements(strategy, id)
        .into_iter()
        .map(|s| (s, &claim.record))
        .chain([(completion_statement(id), &completed)]);
    for (statement, record) in statements {
        let hex: String = record.encode().iter().map(|b| format!("{b:02x}")).collect();
        let s = statement
            // 64 hex characters, like a record key.
            .replace("$1", "(md5(:n::text) || md5((:n::int8 + 1)::text))")
            .replace("$2", ":n")
            .replace("$3", &record.state_code().to_string())
            // Expiry from the database's clock, as the origin's varies with its clock
            // (whether a holder's write moves an indexed value decides HOT updates).
            .replace(
                "$4",
                &format!(
                    "((extract(epoch from clock_timestamp()) * 1000)::int8 + {})",
                    record.expires_at() - now
                ),
            )
            .replace("$5", &format!("'\\x{hex}'::bytea"))
            // The caller's clock is the database's own here: the clock check passes.
            .replace("$6", "(extract(epoch from clock_timestamp()) * 1000)::int8")
            .replace("$7", "1000");
        // pgbench reads one command per line.
        script.push_str(&s.split_whitespace().collect::<Vec<_>>().join(" "));
        script.push_str(";\n");
    }
    script
}

/// Round trips of one pgbench script (the claim statements and the completion).
pub fn pgbench_round_trips(strategy: PgStrategy) -> usize {
    claim_statements(strategy, IdColumn::Bytes).len() + 1
}

/// `pgbench` with the store's statements for a new key, `clients` connections, for `duration`.
pub async fn pgbench(
    database_url: &str,
    strategy: PgStrategy,
    id: IdColumn,
    clients: usize,
    duration: Duration,
    workdir: &Path,
) -> Result<RawResult> {
    let config: tokio_postgres::Config = database_url.parse().context("--database-url")?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => bail!("pgbench needs a TCP host in --database-url"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres").to_string();
    let db = config.get_dbname().unwrap_or("postgres").to_string();
    let script_path = workdir.join(format!("pgbench-{strategy:?}.sql").to_lowercase());
    std::fs::write(&script_path, pgbench_script(strategy, id))
        .with_context(|| format!("writing {}", script_path.display()))?;
    let statements = pgbench_round_trips(strategy) as f64;
    let mut cmd = Command::new("pgbench");
    cmd.args(["-n", "-M", "prepared"])
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
        ])
        .args(["-T", &duration.as_secs().max(1).to_string()])
        .arg("-f")
        .arg(&script_path)
        .args(["-h", &host, "-p", &port.to_string(), "-U", &user, &db]);
    if let Some(pw) = config.get_password() {
        cmd.env("PGPASSWORD", String::from_utf8_lossy(pw).into_owned());
    }
    let out = run(cmd, "pgbench").await?;
    let (tps, latency) = parse_pgbench(&out)?;
    Ok(RawResult {
        ops_per_s: tps * statements,
        mean_latency_ms: latency,
    })
}

/// Reads `tps = …` and `latency average = … ms` from pgbench's report.
pub fn parse_pgbench(out: &str) -> Result<(f64, f64)> {
    let value_after = |prefix: &str| -> Option<f64> {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    let tps = value_after("tps = ")
        .ok_or_else(|| anyhow!("no \"tps = \" line in pgbench's output:\n{out}"))?;
    let latency = value_after("latency average = ").unwrap_or(f64::NAN);
    Ok((tps, latency))
}

async fn run(mut cmd: Command, name: &str) -> Result<String> {
    let out = cmd.kill_on_drop(true).output().await.with_context(|| {
        format!("cannot run {name}: is it installed? (scripts/services-start installs it)")
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{name} failed ({}):\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_redis_benchmark_csv() {
        // Output of redis-benchmark 7.0.15 with --csv and a custom command.
        let out = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                   \"SET idem-bench:raw:__rand_int__ v NX EX 86400\",\"82304.52\",\"0.060\",\"0.016\",\"0.055\",\"0.103\",\"0.183\",\"0.463\"\n";
        let r = parse_redis_benchmark_csv(out).unwrap();
        assert_eq!(r.ops_per_s, 82304.52);
        assert_eq!(r.mean_latency_ms, 0.060);
        assert!(parse_redis_benchmark_csv("\"test\",\"rps\"\n").is_err());
        assert!(parse_redis_benchmark_csv("\"SET x\",\"fast\",\"1\"").is_err());
    }

    #[test]
    fn reads_pgbench_report() {
        // The tail of pgbench 15's report.
        let out = "number of failed transactions: 0 (0.000%)\n\
                   latency average = 1.234 ms\n\
                   initial connection time = 5.678 ms\n\
                   tps = 6482.123456 (without initial connection time)\n";
        assert_eq!(parse_pgbench(out).unwrap(), (6482.123456, 1.234));
        assert!(parse_pgbench("latency average = 1 ms\n").is_err());
    }

    #[test]
    fn pgbench_script_is_the_store_statements_one_per_line() {
        let s = pgbench_script(PgStrategy::OnConflict, IdColumn::Bytes);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 3, "{s}");
        assert!(lines[1].starts_with("WITH clock AS MATERIALIZED"), "{s}");
        assert!(lines[1].contains("INSERT INTO idem_records"), "{s}");
        assert!(
            lines[2].contains("UPDATE idem_records SET state = 1,"),
            "{s}"
        );
        assert!(!s.contains('$'), "every parameter is replaced: {s}");
        let s = pgbench_script(PgStrategy::AdvisoryLock, IdColumn::Bytes);
        assert_eq!(s.lines().count(), 7, "{s}");
        assert_eq!(pgbench_round_trips(PgStrategy::AdvisoryLock), 6);
        assert!(s.contains(
            "pg_advisory_xact_lock(hashtext((md5(:n::text) || md5((:n::int8 + 1)::text))::text))"
        ));
    }
}
