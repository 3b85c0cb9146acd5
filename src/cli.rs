//! [`Cli`]: the command line, one subcommand per module under
//! `commands/`, and [`run`], which hands each to its module.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::commands::{
    certs, cluster, dev, election, fence, gateway, health, lease, object, policy, proxy, run, sql,
    worker,
};
use crate::logging::LogFormat;

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
    Election(Box<election::ElectionArgs>),
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
    Cluster(cluster::ClusterCommand),
    /// Read and write objects through a gateway.
    #[command(subcommand)]
    Object(object::ObjectCommand),
    /// Read or raise a lease's fence at a gateway.
    #[command(subcommand)]
    Fence(fence::FenceCommand),
    /// Fenced transactions in your own PostgreSQL: install the fence
    /// schema, guard tables.
    #[command(subcommand)]
    Sql(sql::SqlCommand),
    /// Exit 0 if a URL answers 2xx (for container healthchecks).
    Health(health::HealthArgs),
    /// A demo leader that writes a sequence through the gateway while it
    /// holds a lease (for fault tests and demos).
    Worker(worker::WorkerArgs),
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Dev(args) => dev::run(args).await,
        Command::Certs(command) => certs::run(command),
        Command::Policy(command) => policy::run(command),
        Command::Election(args) => election::run(*args).await,
        Command::Gateway(args) => gateway::run(args).await,
        Command::Lease(command) => lease::run(command).await,
        Command::Run(args) => run::run(args).await,
        Command::Proxy(args) => proxy::run(args).await,
        Command::Cluster(command) => cluster::run(command).await,
        Command::Object(command) => object::run(command).await,
        Command::Fence(command) => fence::run(command).await,
        Command::Sql(command) => sql::run(command).await,
        Command::Health(args) => health::run(args).await,
        Command::Worker(args) => worker::run(args).await,
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use crate::cli::Cli;

    /// Every subcommand's flags are unique and well formed (clap checks a
    /// subcommand only when it is parsed; this checks them all).
    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
