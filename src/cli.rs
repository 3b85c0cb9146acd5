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
#[command(name = "palisade", version, about, after_help = EXIT_CODES)]
pub struct Cli {
    /// Log lines as `text` (colour only on a terminal) or `json` (one
    /// object per line, for log shippers).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "PALISADE_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// What `palisade --help` says of exit codes (`exit.rs`, README).
const EXIT_CODES: &str = "Exit codes: 0 done, 1 other failure, 2 usage or bad request, 3 lease \
lost, 4 not found, 5 held or conflict, 6 stale token, 7 precondition failed, 8 unauthorized or \
forbidden, 9 unavailable (no quorum, unreachable, unhealthy), 130 interrupted.";

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

    /// Every `palisade ...` command in README.md's shell blocks parses, as
    /// written (a flag the README names that does not exist fails here);
    /// `tests/first_day.rs` runs the proxy line against `palisade dev`.
    #[test]
    fn every_command_in_the_readme_parses() {
        use clap::Parser;
        let readme = include_str!("../README.md");
        // What the blocks export (DATABASE_URL_FILE for `sql install`),
        // as a reader's shell would have it. No other test of this binary
        // reads these variables.
        for line in readme.lines() {
            if let Some((name, _)) = line.strip_prefix("export ").and_then(|l| l.split_once('=')) {
                if name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                    std::env::set_var(name, "a".repeat(64));
                }
            }
        }
        let commands = readme_commands(readme);
        assert!(commands.len() > 30, "{commands:?}");
        for command in commands {
            let words = shell_words(&command);
            if let Err(err) = Cli::try_parse_from(&words) {
                panic!("README: `{command}` does not parse: {err}");
            }
        }
    }

    /// The `palisade` commands of `readme`'s `sh` blocks: continuation
    /// lines joined, comments cut, `;`-separated commands apart.
    fn readme_commands(readme: &str) -> Vec<String> {
        let mut commands = Vec::new();
        let mut in_shell = false;
        let mut pending = String::new();
        for line in readme.lines() {
            if line.starts_with("```") {
                in_shell = line == "```sh" && !in_shell;
                continue;
            }
            if !in_shell {
                continue;
            }
            let line = match line.find(" #") {
                Some(at) => &line[..at],
                None => line,
            };
            pending.push_str(line.trim_end_matches('\\'));
            if line.ends_with('\\') {
                pending.push(' ');
                continue;
            }
            for command in std::mem::take(&mut pending).split(" ; ") {
                let command = command.trim();
                if command.starts_with("palisade ") {
                    commands.push(command.to_owned());
                }
            }
        }
        commands
    }

    /// `command` split as a shell would split these simple lines (single
    /// and double quotes); `$VAR` words become a placeholder every flag
    /// accepts (a 64-hex secret).
    fn shell_words(command: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut word = String::new();
        let mut quote = None;
        for c in command.chars() {
            match (quote, c) {
                (None, '\'' | '"') => quote = Some(c),
                (Some(q), c) if c == q => quote = None,
                (None, c) if c.is_whitespace() => {
                    if !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                }
                (_, c) => word.push(c),
            }
        }
        if !word.is_empty() {
            words.push(word);
        }
        words
            .into_iter()
            .map(|w| {
                if w.starts_with('$') {
                    "a".repeat(64)
                } else {
                    w
                }
            })
            .collect()
    }
}
