//! A Postgres server of a test's own.

use super::{free_port, temp_dir, TestCa};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A Postgres server of its own (initdb in a temporary directory).
pub struct PgProc {
    /// Its port.
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
    /// Environment of the server (libfaketime's, for a skewed clock).
    env: Vec<(String, String)>,
}

fn pg_bin() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("Postgres server binaries under /usr/lib/postgresql (scripts/services-start installs them)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("pg_ctl").exists())
        .collect();
    dirs.sort();
    dirs.pop().expect("a Postgres version with pg_ctl")
}

/// Runs a Postgres tool as the `postgres` OS user when we are root (it refuses root).
fn as_postgres(bin: &Path, tool: &str, args: &[&str]) -> std::process::Output {
    as_postgres_with(bin, tool, args, &[])
}

fn as_postgres_with(
    bin: &Path,
    tool: &str,
    args: &[&str],
    env: &[(String, String)],
) -> std::process::Output {
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false);
    let mut cmd = if is_root {
        // The environment (libfaketime's LD_PRELOAD among it) reaches the tool only, by
        // `env` as postgres: given to runuser, root's runuser loaded libfaketime first,
        // which made its shared semaphore as root, and the tool, as postgres, could not
        // open it ("sem_open failed … Permission denied"), now and then.
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", "env"])
            .args(env.iter().map(|(k, v)| format!("{k}={v}")))
            .arg(bin.join(tool));
        c
    } else {
        let mut c = Command::new(bin.join(tool));
        c.envs(env.iter().map(|(k, v)| (k, v)));
        c
    };
    cmd.args(args).output().expect("Postgres tool runs")
}

impl PgProc {
    /// initdb and start.
    pub fn start(label: &str) -> PgProc {
        Self::start_with(label, None, Vec::new())
    }

    /// initdb and start a server whose clock reads `offset` (as libfaketime's
    /// `FAKETIME` takes it: `"-2s"`) from the machine's.
    pub fn start_skewed(label: &str, offset: &str) -> PgProc {
        let env = vec![
            ("LD_PRELOAD".into(), crate::faketime_lib()),
            ("FAKETIME".into(), offset.into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ];
        let pg = Self::start_with(label, None, env);
        pg.assert_clock_ahead_ms(
            offset
                .trim_end_matches('s')
                .parse::<i64>()
                .expect("an offset in whole seconds")
                * 1_000,
        );
        pg
    }

    /// Fails unless this server's clock runs `ms` ahead of this process' (negative:
    /// behind), within 500 ms: a libfaketime preload that fails does so silently.
    fn assert_clock_ahead_ms(&self, ms: i64) {
        let out = as_postgres(
            &pg_bin(),
            "psql",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-Atc",
                "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint",
            ],
        );
        let ours = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let theirs: i64 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| {
                panic!(
                    "psql did not read the clock: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        assert!(
            (theirs - ours - ms).abs() <= 500,
            "Postgres runs {} ms ahead, not {ms} ms: the clock skew did not take",
            theirs - ours
        );
    }

    /// initdb and start with `ssl = on`, serving `ca`'s server certificate.
    pub fn start_tls(label: &str, ca: &TestCa) -> PgProc {
        Self::start_with(label, Some(ca), Vec::new())
    }

    fn start_with(label: &str, tls: Option<&TestCa>, env: Vec<(String, String)>) -> PgProc {
        let dir = temp_dir(label);
        let _ = Command::new("chown")
            .args(["-R", "postgres:postgres", dir.to_str().unwrap()])
            .status();
        let bin = pg_bin();
        let data = dir.join("data");
        let out = as_postgres(
            &bin,
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(ca) = tls {
            std::fs::copy(&ca.server_cert, data.join("server.crt")).unwrap();
            std::fs::copy(&ca.server_key, data.join("server.key")).unwrap();
            let mut conf = std::fs::OpenOptions::new()
                .append(true)
                .open(data.join("postgresql.conf"))
                .unwrap();
            std::io::Write::write_all(
                &mut conf,
                b"\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
            )
            .unwrap();
            let _ = Command::new("chown")
                .args(["-R", "postgres:postgres", data.to_str().unwrap()])
                .status();
            let _ = Command::new("chmod")
                .args(["600", data.join("server.key").to_str().unwrap()])
                .status();
        }
        let p = PgProc {
            port: free_port(),
            dir,
            bin,
            env,
        };
        p.start_server();
        p
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn start_server(&self) {
        let data = self.dir.join("data");
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("log");
        let out = as_postgres_with(
            &self.bin,
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-o",
                &opts,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "30",
                "start",
            ],
            &self.env,
        );
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops it abruptly (`-m immediate`: like a crash).
    pub fn stop(&self) {
        let data = self.dir.join("data");
        let _ = as_postgres(
            &self.bin,
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    /// Starts it again (crash recovery included).
    pub fn restart(&self) {
        self.start_server();
    }
}

impl Drop for PgProc {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
