//! `idem-origin convert-keys`: converts a Postgres table of idem 0.1 (keys as 64 hex
//! characters) to binary keys, with every replica stopped (docs/stores.md).
//!
//! Exit code 0 when converted or already binary, 1 when refused or failed (the reason
//! on stderr), 2 for a bad command line.

use clap::Parser;
use idem::{convert_keys, Converted};
use std::process::ExitCode;
use std::time::Duration;

/// Converts `idem_records` to binary keys: 65 bytes less per record.
#[derive(Parser, Debug)]
#[command(
    name = "idem-origin convert-keys",
    bin_name = "idem-origin convert-keys"
)]
pub struct ConvertCli {
    /// The database whose `idem_records` to convert (its search_path picks the table).
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,

    /// CA certificates (PEM) to verify the server with.
    #[arg(long, env = "IDEM_DATABASE_CA_FILE")]
    database_ca_file: Option<std::path::PathBuf>,

    /// How long to wait for the connection and for the table's lock.
    #[arg(long, default_value = "5s", value_parser = crate::config::parse_duration)]
    timeout: Duration,

    /// Convert even though other sessions of idem, or that used the table, are
    /// connected (the check sees what `pg_stat_activity` shows this role: stop the
    /// replicas first either way). Their replicas fail closed afterwards; a handler one of them is
    /// running can't store its answer and runs again on a retry after its lease.
    #[arg(long)]
    force: bool,
}

/// Runs `idem-origin convert-keys …` (`args` starts at `convert-keys`).
pub async fn run(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = match ConvertCli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let url = crate::app::redact(&cli.database_url);
    match convert_keys(
        &cli.database_url,
        cli.database_ca_file.as_deref(),
        cli.timeout,
        cli.force,
    )
    .await
    {
        Ok(Converted::Rows { rows, took }) => {
            println!(
                "converted idem_records at {url}: {rows} records now keyed by 32 bytes ({:.1} s)",
                took.as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Ok(Converted::AlreadyBinary) => {
            println!("idem_records at {url} already holds binary keys: nothing to do");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idem-origin convert-keys: {url}: {e}");
            ExitCode::FAILURE
        }
    }
}
