//! `idem-origin`: serve the demo charges API behind the idempotency layer.

use clap::Parser;
use idem_origin::config::{Config, LogFormat, StoreKind};
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

// mimalloc rather than the C library's malloc, which took ~15% of the origin's CPU
// under load (glibc), and more with musl's in the static image.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == "admin") {
        return idem_origin::admin_cli::run(std::env::args_os().skip(1)).await;
    }
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "convert-keys")
    {
        return idem_origin::convert_cli::run(std::env::args_os().skip(1)).await;
    }
    let config = Config::parse();
    if let Err(e) = config.validate() {
        eprintln!("idem-origin: error: {e}");
        return ExitCode::from(2);
    }
    let traces = match init_tracing(&config) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("idem-origin: error: {e}");
            return ExitCode::from(2);
        }
    };
    warn_about_settings(&config);
    let origin = match idem_origin::app::build(&config).await {
        Ok(origin) => origin,
        Err(e) => {
            eprintln!("idem-origin: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "idem-origin: error: cannot listen on {}: {e}",
                config.listen
            );
            return ExitCode::FAILURE;
        }
    };
    let (admin, ops) = match (
        serve_admin(&origin, &config).await,
        serve_ops(&origin, &config).await,
    ) {
        (Ok(admin), Ok(ops)) => (admin, ops),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("idem-origin: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sweeper = idem::spawn_sweeper(origin.store.clone(), config.sweep_interval);
    tracing::info!(listen = %config.listen, store = origin.store.name(), "idem-origin listening");
    let limits = idem_origin::serve::Limits {
        // With --ops-listen, /healthz and the like are the API's here.
        serves_probes: config.ops_listen.is_none(),
        ..config.limits()
    };
    idem_origin::serve::serve(listener, origin.router.clone(), limits, shutdown_signal()).await;
    sweeper.abort();
    if let Some(admin) = admin {
        admin.abort();
    }
    if let Some(ops) = ops {
        ops.abort();
    }
    drain(&origin, &config, traces).await;
    tracing::info!("shut down cleanly");
    ExitCode::SUCCESS
}

/// Says, at start-up, which settings trade a guarantee away or may surprise.
fn warn_about_settings(config: &Config) {
    let release_on = config.release_on_default();
    if release_on != idem_core::contract::ReleaseOn::NONE {
        // A status freed here runs again on retry: the operator must know the list.
        tracing::info!(
            statuses = %release_on.to_list(),
            "answers of these statuses free their key (--release-on): a retry with the same key runs again; take off any your API answers after acting (a payment declined by the bank, say)"
        );
        let risky: Vec<String> = release_on.risky().map(|s| s.to_string()).collect();
        if !risky.is_empty() {
            tracing::warn!(
                statuses = %risky.join(","),
                "--release-on frees the key on statuses an API often answers after it acted (409 \"already paid\", a lookup's 404 after a write): a retry runs the request again"
            );
        }
    }
    if config.pass_ambiguous_paths {
        tracing::warn!("--pass-ambiguous-paths: unguarded requests whose path servers read differently reach the upstream, which may take them for another resource than idem did");
    }
    if config.store_kind() == StoreKind::Memory {
        tracing::warn!(
            "store = memory: records live in this process only — NOT durable, NOT shared between \
             replicas; a restart forgets every key. Use --store postgres in production."
        );
    }
}

/// The admin API on its own listener (`--admin-listen`), over TLS when asked.
async fn serve_admin(
    origin: &idem_origin::app::Origin,
    config: &Config,
) -> Result<Option<tokio::task::JoinHandle<()>>, String> {
    let (Some(router), Some(addr)) = (&origin.admin, config.admin_listen) else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} (--admin-listen): {e}"))?;
    // Read again here (checked by `validate`): a certificate that cannot be read now
    // stops the process, never serves the admin API in clear.
    let tls = config.admin_tls()?;
    tracing::info!(listen = %addr, tls = tls.is_some(), "admin API listening");
    if tls.is_none() && !addr.ip().is_loopback() {
        tracing::warn!(listen = %addr, "the admin API is plain HTTP on an address off this machine: its tokens, and the identities looked up, cross the network in clear (--admin-tls-cert and --admin-tls-key serve it over TLS)");
    }
    Ok(Some(tokio::spawn(idem_origin::serve::serve_with(
        listener,
        router.clone(),
        config.limits(),
        tls,
        std::future::pending(),
    ))))
}

/// `/healthz`, `/readyz` and `/metrics` on a listener of their own (`--ops-listen`).
async fn serve_ops(
    origin: &idem_origin::app::Origin,
    config: &Config,
) -> Result<Option<tokio::task::JoinHandle<()>>, String> {
    let (Some(router), Some(addr)) = (&origin.ops, config.ops_listen) else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} (--ops-listen): {e}"))?;
    tracing::info!(listen = %addr, "/healthz, /readyz and /metrics listening apart (--ops-listen)");
    Ok(Some(tokio::spawn(idem_origin::serve::serve(
        listener,
        router.clone(),
        config.limits(),
        std::future::pending(),
    ))))
}

/// After the server answered every client it had: waits (bounded) for executions
/// still running and final writes still retrying, writes out what the store buffers,
/// and sends the last spans.
async fn drain(
    origin: &idem_origin::app::Origin,
    config: &Config,
    traces: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
) {
    // Executions whose client left may still run: the async tiered store's outbox
    // is written out after them.
    let draining = std::time::Instant::now();
    let running = origin.executions.running();
    let unwritten = origin.executions.drain(config.drain_timeout).await;
    tracing::info!(running, unwritten = unwritten.len(), elapsed = ?draining.elapsed(), "executions drained");
    let flushing = std::time::Instant::now();
    if let Err(e) = origin.store.flush().await {
        tracing::error!(error = %e, "flushing the store failed");
    }
    tracing::info!(elapsed = ?flushing.elapsed(), "store flushed");
    if let Some(traces) = traces {
        // The spans of the last requests, still batched (its shutdown blocks while the
        // batch task, on the runtime, sends them).
        // Bounded: a collector that does not answer must not hold the exit.
        let flushing = tokio::task::spawn_blocking(move || traces.shutdown());
        match tokio::time::timeout(std::time::Duration::from_secs(5), flushing).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "flushing the traces failed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "flushing the traces failed"),
            Err(_) => tracing::warn!("flushing the traces took more than 5 s; some are lost"),
        }
    }
}

/// Logs to stderr (as `RUST_LOG` filters them), and with `--otlp-endpoint` idem's spans
/// to an OTLP receiver: the provider to shut down at exit.
fn init_tracing(
    config: &Config,
) -> Result<Option<opentelemetry_sdk::trace::SdkTracerProvider>, String> {
    use tracing_subscriber::prelude::*;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = match config.log_format {
        LogFormat::Text => logs.boxed(),
        LogFormat::Json => logs.json().boxed(),
    };
    let provider = match config.traces_endpoint()? {
        Some(url) => Some(idem_origin::telemetry::provider(&url)?),
        None => None,
    };
    let traces = provider.as_ref().map(idem_origin::telemetry::layer);
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(traces)
        .init();
    Ok(provider)
}

/// Resolves on SIGTERM or Ctrl-C; in-flight requests then finish before exit.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutdown signal received; finishing in-flight requests");
}
