//! The book's Proof chapter (`docs/proof.md`), written from what the tests asserted.
//!
//! Every row of the tables below is declared here, with the cells that do not depend
//! on a run (what was done, and — for a fixed defect — what the code did before).
//! A test records the rest of its row with [`record`] *after* its assertions held, so
//! a row exists only for a claim that was just checked. `scripts/test` then runs the
//! `proof-tables` program, which writes the rows of that run into docs/proof.md, stamped
//! with the commit, and fails when a declared row was not recorded. The test
//! `proof_tables` keeps the chapter's tables in step with these declarations.

use std::path::PathBuf;

/// A table (or block) of the Proof chapter.
pub struct Table {
    /// Its name: the chapter marks it `<!-- proof:NAME … -->` … `<!-- /proof:NAME -->`.
    pub name: &'static str,
    /// The column headers; empty for a block of text lines.
    pub header: &'static [&'static str],
    /// The rows, in order.
    pub rows: &'static [Row],
}

/// A row: its fixed cells around the cells its test records.
pub struct Row {
    /// How its test names it to [`record`].
    pub id: &'static str,
    /// The cells before the recorded ones.
    pub leading: &'static [&'static str],
    /// The cells after the recorded ones (for a fixed defect: what happened before).
    pub trailing: &'static [&'static str],
}

const fn row(
    id: &'static str,
    leading: &'static [&'static str],
    trailing: &'static [&'static str],
) -> Row {
    Row {
        id,
        leading,
        trailing,
    }
}

/// Every table of the Proof section.
pub const TABLES: &[Table] = &[
    Table {
        name: "race",
        header: &["store", "charges", "keys charged twice", "answers"],
        rows: &[
            row("on-conflict", &["`postgres` `on-conflict`"], &[]),
            row("advisory-lock", &["`postgres` `advisory-lock`"], &[]),
            row("redis", &["`redis` standalone"], &[]),
            row("redis-cluster", &["`redis` cluster"], &[]),
            row("tiered-sync", &["`tiered` sync (cluster)"], &[]),
            row("tiered-async", &["`tiered` async (cluster)"], &[]),
            row("memory", &["`memory` (50 keys)"], &[]),
            row(
                "edge",
                &["**edge** (workerd via `wrangler dev`, origin on Postgres; 100 keys × 8)"],
                &[],
            ),
            row("naive", &["`postgres` `naive` (SELECT then INSERT): the race the suite must catch"], &[]),
        ],
    },
    Table {
        name: "campaign",
        header: &[],
        rows: &[
            row("postgres", &[], &[]),
            row("tiered-sync", &[], &[]),
            row("tiered-async", &[], &[]),
        ],
    },
    Table {
        name: "faults",
        header: &["fault", "mode", "result (this run)", "before the fix"],
        rows: &[
            row(
                "failover-sync",
                &["`kill -9` a Redis Cluster master under 120 keys × 8 retries", "tiered sync"],
                &["—"],
            ),
            row(
                "failover-async",
                &["same (charges measured, not asserted: a claim lost with the master can run twice when the charge is committed on its own)", "tiered async"],
                &["—"],
            ),
            row(
                "flushall",
                &["`FLUSHALL` mid-run (60 completed keys, 60 in flight × 4)", "tiered sync / async"],
                &["—"],
            ),
            row(
                "postgres-stop",
                &["Postgres `pg_ctl stop -m immediate` under load", "postgres"],
                &["—"],
            ),
            row("redis-kill", &["Redis killed", "redis"], &["—"]),
            row(
                "lost-replies",
                &["replies lost after their writes landed (a proxy cuts each connection once a request went through, 150 ms in every 500 ms for 3 s) under 40 keys × 2 attempts, lease 2 s", "redis / postgres"],
                &["—"],
            ),
            row(
                "reshard",
                &["`redis-cli --cluster reshard` of 1000 slots, then a 7th node added as a master and `rebalance` onto it, while new keys race (4 attempts each)", "redis cluster"],
                &["a slot refresh left unanswered stalled the cluster client: 503 × 2 669 / 3 635 / 3 618 (10–27 % of requests) in 3 of 8 runs; then, beside three busy loops, the master joining without slots wedged the data connection (next row): 503 × 3 580 / 3 600 in 2 of 3 runs; 0 doubled"],
            ),
            row(
                "empty-master",
                &["a master joined with no slot yet, listed (in-progress listing) and probed (replay cache's purge probe) 5 times while 4 writers claim", "redis cluster"],
                &["reached through the data connection, unknown to its slot map: 5/5 listings and 5/5 probes failed, 140 reconnects from the initial nodes, each pausing every write"],
            ),
            row(
                "outage-while-finishing",
                &["Postgres `stop -m immediate` for 4 s just as 40 handlers finish (charges kept outside Postgres, lease 8 s)", "postgres"],
                &["the completion was kept retrying under a live lease: 80 charges"],
            ),
            row(
                "partition-before-renewal",
                &["Postgres cut off by a network partition (iptables drops its packets) for 3.8 s, just under the 0.65 lease promised, from just before a renewal was due; 12 handlers of 9.5 s, lease 6 s; retries every 30 ms as the lease would end", "postgres"],
                &["renewals every third of a lease, an abandoned heartbeat's connection handed to the next: 24 charges, all 12 keys twice"],
            ),
            row(
                "clock-ahead",
                &["two replicas on one Postgres, one with its clock 60 s ahead (libfaketime); 5 keys with 4 s handlers on the other, 3 waves of retries to the skewed one", "postgres"],
                &["every retry took over, 10 charges"],
            ),
            row(
                "swap-race",
                &["slow holder completes (or renews) between a takeover's read and its swap, forced", "postgres"],
                &["the swap succeeded and destroyed the holder's answer, 4/4"],
            ),
            row(
                "swap-race-redis",
                &["same", "redis, redis cluster"],
                &["the swap succeeded and destroyed the holder's answer, 4/4"],
            ),
            row(
                "gateway-results",
                &["handler answers 502/503/504 or `Cache-Control: no-store` after its effect; retried", "every store"],
                &["released, 2 effects each"],
            ),
            row(
                "stale-redis",
                &["Redis holds a stale in-progress record while Postgres holds the completion (as after a failover)", "tiered async"],
                &["a takeover, 2 charges"],
            ),
            row(
                "released-in-postgres",
                &["Redis still holds a claim that a release freed in Postgres (the mirror failed); a corrected retry", "tiered sync"],
                &["422 from Redis"],
            ),
            row(
                "pool-starvation",
                &["replica A's only pooled connection held by a claim waiting on a lock; a 4 s handler on A, lease 600 ms; a retry on replica B after 2 s", "postgres advisory-lock"],
                &["heartbeats shared the pool: B took over, 2 charges"],
            ),
            row(
                "slow-connects",
                &["new connections to Postgres take 150 ms (a proxy delays them) once the store is up; a 3 s handler, lease 1 s (a renewal is given up after 83 ms); a retry after 1.5 s", "postgres"],
                &["the heartbeats' connections were opened by the first renewal, each given up with it: the retry took over, 2 charges"],
            ),
            row(
                "cut-slow-connects",
                &["as above with 8 charges at once (twice the renewals' connections), and every store connection cut 300 ms into them (the server closed its sessions)", "postgres"],
                &["the heartbeats' connections were opened again only by a renewal, each given up with it: the retry took over, 2 charges"],
            ),
            row(
                "partition-slow-connects",
                &["2 charges of 7 s, lease 4 s (a renewal is given up after 333 ms), new connections to Postgres taking 500 ms; a 1 s partition 1 s in, both claimed by then (connections cut, new ones refused); retries at 4.5 s", "postgres"],
                &["—"],
            ),
            row(
                "drain-deadline",
                &["SIGTERM while a completion can't be written (Postgres down), `--drain-timeout 2s`", "postgres"],
                &["—"],
            ),
            row(
                "evicting-redis",
                &["Redis with `maxmemory 100mb`, `maxmemory-policy allkeys-lru`", "redis"],
                &["started"],
            ),
            row(
                "too-large",
                &["an answer of 3 MiB with `--max-stored-body-bytes` 1 MiB", "memory"],
                &["—"],
            ),
            row(
                "sigterm-client-gone",
                &["client gives up, SIGTERM while its 1.5 s handler runs, restart, retry", "postgres"],
                &["exit in 20 ms, retry 409 for the whole lease"],
            ),
            row(
                "body-panics",
                &["the response body panics mid-stream (lease 300 ms)", "memory"],
                &["the heartbeat renewed the lease forever, 409"],
            ),
            row(
                "sigterm-async-load",
                &["SIGTERM during async load (400 keys)", "tiered async"],
                &["—"],
            ),
            row(
                "outbox-full",
                &["Postgres writes blocked, outbox capacity 4", "tiered async"],
                &["—"],
            ),
            row(
                "path-spellings",
                &["one key `PUT` in 9 spellings of a route guarding `PUT /v1/payouts/*` (`;x`, `%2F`, `%5c`, `\\`, `..`, `%2e`, case), then 3 keyless; a lenient upstream", "proxy"],
                &["7 payouts for one key, 3 keyless payouts"],
            ),
            row(
                "short-ttl-orphan",
                &["`--ttl 3s --lease 2s`, idem killed mid-request, retry 4 s after", "proxy, postgres"],
                &["201, 2 upstream calls"],
            ),
            row(
                "purged-orphan",
                &["an orphan (lease over) purged through the admin API, then retried; another with `resend=true`", "proxy, postgres"],
                &["purge 200, retry 201, 2 upstream calls"],
            ),
            row(
                "late-heartbeat",
                &["a heartbeat stamped before its holder's release lands after it (the conformance suite)", "every store"],
                &["Written: the freed key renewed, the corrected request 422"],
            ),
            row(
                "refused-copy",
                &["Redis lost a claim; the holder's completion reads Postgres while a retry's claim lands in Redis, its copy refused", "tiered async"],
                &["Ok(Written), Redis kept the retry's claim, a retry past the lease took over: 2 executions"],
            ),
            row(
                "edge-other-scope",
                &["edge `SCOPE_FROM=authorization` before an origin `--scope-from header:x-api-key`; tenants a and b, one key and body", "edge, proxy"],
                &["tenant b replayed tenant a's charge, 1 charge"],
            ),
        ],
    },
    Table {
        name: "admin",
        header: &["what", "store", "result (this run)", "before the fix"],
        rows: &[
            row(
                "purge-postgres",
                &["purge through replica A; replica B replaying the key from its cache is polled until it executes afresh", "postgres"],
                &["(no purge before)"],
            ),
            row("purge-redis-cluster", &["same", "redis cluster"], &["(no purge before)"]),
            row("purge-tiered-sync", &["same", "tiered sync"], &["(no purge before)"]),
            row("purge-tiered-async", &["same", "tiered async"], &["(no purge before)"]),
            row(
                "listen-cut",
                &["replica B's LISTEN backend terminated, the record deleted meanwhile without a notice", "postgres"],
                &["—"],
            ),
            row(
                "skew-postgres",
                &["purge (not forced) through a replica 60 s ahead, during a live 30 s lease; a retry", "postgres"],
                &["purged (200), the retry ran the handler again"],
            ),
            row(
                "skew-redis-cluster",
                &["same", "redis cluster"],
                &["purged (200), the retry ran again: 2 charges"],
            ),
            row(
                "skew-tiered-async",
                &["same", "tiered async"],
                &["purged (200), the retry ran the handler again"],
            ),
            row(
                "orphan",
                &["`kill -9` replica A mid-handler (lease 30 s); list and purge with the CLI through replica B; retry", "postgres"],
                &["—"],
            ),
            row(
                "auth",
                &["no token, wrong tokens, bad parameters; then a retry", "postgres"],
                &["—"],
            ),
            row(
                "traces",
                &["`--otlp-endpoint` to an OTLP/HTTP receiver the test runs; a request with a `traceparent`, its retry with another (proxy mode)", "postgres"],
                &["—"],
            ),
            row(
                "status-page",
                &["the status page in headless Chromium after 4 intervals of traffic, against a scrape of `/metrics`", "postgres"],
                &["—"],
            ),
        ],
    },
];

/// Where a run's rows go: `target/idem-reports/proof/<table>/<id>`.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/idem-reports/proof")
}

/// Records the cells of row `id` of `table` for this run. Call it after the test's
/// assertions: a recorded row is a claim that held. Panics on a row that is not
/// declared in [`TABLES`], or cells that would break the table.
pub fn record(table: &str, id: &str, cells: &[&str]) {
    let declared = TABLES
        .iter()
        .find(|t| t.name == table)
        .and_then(|t| t.rows.iter().find(|r| r.id == id));
    assert!(
        declared.is_some(),
        "proof row {table}/{id} is not declared in tests/src/proof.rs"
    );
    for cell in cells {
        assert!(
            !cell.contains(['\t', '\n', '|']),
            "proof cell for {table}/{id} must not contain a tab, newline or '|': {cell:?}"
        );
    }
    let dir = dir().join(table);
    std::fs::create_dir_all(&dir).expect("the reports directory");
    std::fs::write(dir.join(id), cells.join("\t")).expect("the row is written");
}

/// The cells recorded for row `id` of `table`, if any.
pub fn recorded(table: &str, id: &str) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(dir().join(table).join(id)).ok()?;
    Some(text.split('\t').map(str::to_owned).collect())
}

/// Renders `table` from this run's rows (with `stamp` in its opening marker), or the
/// ids of the rows no test recorded.
pub fn render(table: &Table, stamp: &str) -> Result<String, Vec<String>> {
    let mut missing = Vec::new();
    let mut lines = vec![format!("<!-- proof:{} {stamp} -->", table.name)];
    if table.header.is_empty() {
        lines.push("```text".into());
    } else {
        lines.push(format!("| {} |", table.header.join(" | ")));
        lines.push(format!("|{}", "---|".repeat(table.header.len())));
    }
    for row in table.rows {
        let Some(cells) = recorded(table.name, row.id) else {
            missing.push(format!("{}/{}", table.name, row.id));
            continue;
        };
        if table.header.is_empty() {
            lines.extend(cells);
            continue;
        }
        let all: Vec<String> = row
            .leading
            .iter()
            .map(|c| (*c).to_owned())
            .chain(cells)
            .chain(row.trailing.iter().map(|c| (*c).to_owned()))
            .collect();
        lines.push(format!("| {} |", all.join(" | ")));
    }
    if table.header.is_empty() {
        lines.push("```".into());
    }
    lines.push(format!("<!-- /proof:{} -->", table.name));
    if missing.is_empty() {
        Ok(lines.join("\n"))
    } else {
        Err(missing)
    }
}

/// The chapter's block for `table`: the text from its opening marker to its closing one.
pub fn block<'a>(chapter: &'a str, table: &str) -> Option<&'a str> {
    let open = format!("<!-- proof:{table} ");
    let close = format!("<!-- /proof:{table} -->");
    let start = chapter.find(&open)?;
    let end = chapter[start..].find(&close)? + start + close.len();
    Some(&chapter[start..end])
}

/// Counts as the chapter shows them: `201 × 216, 409 × 2984`.
pub fn counts<K: std::fmt::Display>(counts: impl IntoIterator<Item = (K, usize)>) -> String {
    counts
        .into_iter()
        .map(|(k, n)| format!("{k} × {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
