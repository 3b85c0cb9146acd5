//! The command-line interface: one module per command group.

mod certs;
mod dev;
mod election;
mod fence;
mod gateway;
mod health;
mod http;
mod lease;
mod object;
mod policy;
mod proxy;
mod run;
mod worker;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Leases with fencing tokens, and a storage gateway that enforces them.
#[derive(Debug, Parser)]
#[command(name = "palisade", version, about)]
pub struct Cli {
    /// Log lines as `text` (colour only on a terminal) or `json` (one
    /// object per line, for log shippers).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "PALISADE_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable; ANSI colour only when stderr is a terminal.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a local cluster (3 election nodes and a gateway) until Ctrl-C.
    Dev(dev::DevArgs),
    /// Make the certificates a cluster needs (mutual TLS between peers).
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// Make a policy file (who may call the servers) and API keys.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Run one node of the election cluster.
    Election(election::ElectionArgs),
    /// Run the storage gateway.
    Gateway(gateway::GatewayArgs),
    /// Acquire, renew, release, inspect and watch leases.
    #[command(subcommand)]
    Lease(lease::LeaseCommand),
    /// Run a command only while holding a lease.
    Run(run::RunArgs),
    /// Hold a lease and serve a loopback endpoint that forwards object
    /// reads and writes to the gateway with its current JWT (a sidecar).
    Proxy(proxy::ProxyArgs),
    /// The election cluster's state.
    #[command(subcommand)]
    Cluster(lease::ClusterCommand),
    /// Read and write objects through a gateway.
    #[command(subcommand)]
    Object(object::ObjectCommand),
    /// Read or raise a lease's fence at a gateway.
    #[command(subcommand)]
    Fence(fence::FenceCommand),
    /// Exit 0 if a URL answers 2xx (for container healthchecks).
    Health(health::HealthArgs),
    /// A demo leader that writes a sequence through the gateway while it
    /// holds a lease (for fault tests and demos).
    Worker(worker::WorkerArgs),
}

/// Logs go to stderr, filtered by `RUST_LOG` (default `info`), as `format`
/// says.
pub fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
    };
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Dev(args) => dev::run(args).await,
        Command::Certs(command) => certs::run(command),
        Command::Policy(command) => policy::run(command),
        Command::Election(args) => election::run(args).await,
        Command::Gateway(args) => gateway::run(args).await,
        Command::Lease(command) => lease::run(command).await,
        Command::Run(args) => run::run(args).await,
        Command::Proxy(args) => proxy::run(args).await,
        Command::Cluster(command) => lease::cluster(command).await,
        Command::Object(command) => object::run(command).await,
        Command::Fence(command) => fence::run(command).await,
        Command::Health(args) => health::run(args).await,
        Command::Worker(args) => worker::run(args).await,
    }
}

/// Loads `--policy` for `server`: `Err(line)` when the file is refused (the
/// server must not start), `None` with a loud warning when there is none.
pub fn load_policy(
    path: Option<&std::path::Path>,
    server: &str,
) -> Result<Option<std::sync::Arc<palisade_serve::policy::Policy>>, String> {
    let Some(path) = path else {
        eprintln!(
            "warning: no --policy: the {server} is open to anyone who can reach it \
             (no API keys, no per-lease rights)"
        );
        tracing::warn!(
            server,
            "running without a policy: every client is allowed everything"
        );
        return Ok(None);
    };
    let policy = palisade_serve::policy::Policy::load(path).map_err(|e| format!("--policy {e}"))?;
    tracing::info!(
        server,
        principals = policy.principals().count(),
        "policy loaded"
    );
    Ok(Some(std::sync::Arc::new(policy)))
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(err) => {
                    tracing::error!(%err, "cannot listen for SIGTERM");
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => tracing::info!("SIGINT received"),
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every subcommand's flags are unique and well formed (clap checks a
    /// subcommand only when it is parsed; this checks them all).
    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
