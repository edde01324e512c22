//! The store modes the bench runs, and what each is compared against.

use clap::ValueEnum;
use idem::PgStrategy;
use serde::Serialize;

/// One way to run the origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The embedded default: no backend.
    Memory,
    /// Postgres, `INSERT … ON CONFLICT` claims.
    PgOnConflict,
    /// Postgres, advisory-lock claims.
    PgAdvisoryLock,
    /// A standalone Redis.
    Redis,
    /// The 6-node Redis Cluster.
    RedisCluster,
    /// The 6-node Redis Cluster, each write `WAIT`ing for one replica
    /// (`--redis-wait-replicas 1`).
    RedisClusterWait1,
    /// Redis Cluster in front of Postgres, claims written to Postgres first.
    TieredSync,
    /// Redis Cluster in front of Postgres, Postgres written behind.
    TieredAsync,
    /// Postgres, with the demo's charges in it too: each charge committed on its own,
    /// then its answer stored (`--demo-completion separate`).
    PgDemoSeparate,
    /// The same, each charge committed with its answer in one transaction
    /// (`--demo-completion transactional`): the crash-safe path.
    PgDemoTransactional,
}

/// The raw backend operation a mode's throughput is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Raw {
    /// `pgbench` running the store's own claim statements.
    Pgbench(PgStrategy),
    /// `redis-benchmark` `SET <random key> v NX EX 86400` on the standalone Redis.
    RedisSetNx,
    /// The same with `--cluster` on the Redis Cluster.
    ClusterSetNx,
}

/// Which Redis a mode talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisKind {
    Standalone,
    Cluster,
}

/// Where the services are.
#[derive(Clone, Debug)]
pub struct Targets {
    pub database_url: String,
    pub redis_url: String,
    pub cluster_urls: Vec<String>,
    /// Prefix of every Redis key the origin writes in this run.
    pub namespace: String,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Memory => "memory",
            Mode::PgOnConflict => "pg-on-conflict",
            Mode::PgAdvisoryLock => "pg-advisory-lock",
            Mode::Redis => "redis",
            Mode::RedisCluster => "redis-cluster",
            Mode::RedisClusterWait1 => "redis-cluster-wait1",
            Mode::TieredSync => "tiered-sync",
            Mode::TieredAsync => "tiered-async",
            Mode::PgDemoSeparate => "pg-demo-separate",
            Mode::PgDemoTransactional => "pg-demo-transactional",
        }
    }

    /// The backend the ratio is taken against: the one each request waits on most.
    /// Tiered sync waits on Postgres for every claim; async only on Redis.
    pub fn raw(self) -> Option<Raw> {
        match self {
            Mode::Memory => None,
            Mode::PgOnConflict
            | Mode::TieredSync
            | Mode::PgDemoSeparate
            | Mode::PgDemoTransactional => Some(Raw::Pgbench(PgStrategy::OnConflict)),
            Mode::PgAdvisoryLock => Some(Raw::Pgbench(PgStrategy::AdvisoryLock)),
            Mode::Redis => Some(Raw::RedisSetNx),
            Mode::RedisCluster | Mode::RedisClusterWait1 | Mode::TieredAsync => {
                Some(Raw::ClusterSetNx)
            }
        }
    }

    pub fn uses_postgres(self) -> bool {
        matches!(
            self,
            Mode::PgOnConflict
                | Mode::PgAdvisoryLock
                | Mode::TieredSync
                | Mode::TieredAsync
                | Mode::PgDemoSeparate
                | Mode::PgDemoTransactional
        )
    }

    pub fn redis(self) -> Option<RedisKind> {
        match self {
            Mode::Redis => Some(RedisKind::Standalone),
            Mode::RedisCluster | Mode::RedisClusterWait1 | Mode::TieredSync | Mode::TieredAsync => {
                Some(RedisKind::Cluster)
            }
            _ => None,
        }
    }

    /// `idem-origin` flags for this mode (listen address and logging aside).
    pub fn origin_args(self, t: &Targets) -> Vec<String> {
        let mut args: Vec<String> = match self {
            Mode::Memory => vec!["--store", "memory"],
            Mode::PgOnConflict => vec!["--store", "postgres", "--pg-strategy", "on-conflict"],
            Mode::PgAdvisoryLock => vec!["--store", "postgres", "--pg-strategy", "advisory-lock"],
            Mode::Redis | Mode::RedisCluster => vec!["--store", "redis"],
            Mode::RedisClusterWait1 => vec!["--store", "redis", "--redis-wait-replicas", "1"],
            Mode::TieredSync => vec!["--store", "tiered", "--durability", "sync"],
            Mode::TieredAsync => vec!["--store", "tiered", "--durability", "async"],
            Mode::PgDemoSeparate => vec!["--store", "postgres", "--demo-completion", "separate"],
            Mode::PgDemoTransactional => {
                vec!["--store", "postgres", "--demo-completion", "transactional"]
            }
        }
        .into_iter()
        .map(String::from)
        .collect();
        if self.uses_postgres() {
            args.extend(["--database-url".into(), t.database_url.clone()]);
        }
        match self.redis() {
            Some(RedisKind::Standalone) => {
                args.extend(["--redis-url".into(), t.redis_url.clone()]);
            }
            Some(RedisKind::Cluster) => {
                args.extend([
                    "--redis-url".into(),
                    t.cluster_urls.join(","),
                    "--redis-cluster".into(),
                ]);
            }
            None => {}
        }
        if self.redis().is_some() {
            args.extend(["--redis-namespace".into(), t.namespace.clone()]);
        }
        // The demo ledger in memory — the bench measures idem, not the demo's INSERT —
        // except where the charge is what is compared. A short TTL keeps what the bench
        // leaves behind from piling up.
        let ledger = match self {
            Mode::PgDemoSeparate | Mode::PgDemoTransactional => "postgres",
            _ => "memory",
        };
        args.extend(
            [
                "--demo-ledger",
                ledger,
                "--ttl",
                "1h",
                "--sweep-interval",
                "1h",
            ]
            .map(String::from),
        );
        args
    }
}

impl Raw {
    pub fn describe(self) -> &'static str {
        match self {
            Raw::Pgbench(PgStrategy::OnConflict) => "pgbench: on-conflict claim",
            Raw::Pgbench(PgStrategy::AdvisoryLock) => "pgbench: advisory-lock claim",
            Raw::Pgbench(PgStrategy::Naive) => "pgbench: naive claim",
            // A strategy of a later idem, which this bench does not know.
            Raw::Pgbench(_) => "pgbench",
            Raw::RedisSetNx => "redis-benchmark: SET NX",
            Raw::ClusterSetNx => "redis-benchmark --cluster: SET NX",
        }
    }

    /// Whether the raw backend is Postgres (else Redis).
    pub fn is_postgres(self) -> bool {
        matches!(self, Raw::Pgbench(_))
    }

    /// The benchmark tool's program name.
    pub fn tool(self) -> &'static str {
        if self.is_postgres() {
            "pgbench"
        } else {
            "redis-benchmark"
        }
    }

    /// The server's program name.
    pub fn server(self) -> &'static str {
        if self.is_postgres() {
            "postgres"
        } else {
            "redis-server"
        }
    }
}
