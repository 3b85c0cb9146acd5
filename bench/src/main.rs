//! `palisade-bench`: throughput, latency and failover of real Palisade
//! processes, and of etcd doing the same work, for ratios. Release builds
//! only mean anything: `cargo build --release -p palisade -p palisade-bench`.
//!
//! - `load.rs`: the load engine (concurrent tasks for a duration, latency
//!   percentiles, errors by kind), the table, and the failover trials any
//!   replicated system runs through the `Failover` trait.
//! - `gateway.rs`, `gateway_postgres.rs`, `election/`, `etcd.rs` (+ `etcd_grpc.rs`, etcd's
//!   native client, with `--features etcd-grpc`): one benchmark each; each uses
//!   `load`, none uses another. `scale.rs` (big table, many watchers,
//!   reclamation) borrows `election/`'s request helpers and footprint; `hold.rs` (one
//!   SDK client keeping many leases) uses the SDK itself. Palisade's processes come from
//!   `palisade-local-cluster`, started from the binary `--palisade` names.

mod cpu;
mod election;
mod etcd;
#[cfg(feature = "etcd-grpc")]
mod etcd_grpc;
mod gateway;
mod gateway_postgres;
mod hold;
mod load;
mod scale;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// The load generator shares the cores with what it measures: mimalloc (as
/// the `palisade` binary uses) keeps its own allocation from taking their
/// CPU; glibc's malloc was ~4% of all CPU under the SDK renewal load. The
/// etcd rows are driven by the same process, so every ratio gains alike.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Measure Palisade's throughput, latency and failover (release builds only
/// mean anything).
#[derive(Debug, Parser)]
#[command(name = "palisade-bench", version, about)]
struct Cli {
    /// The `palisade` binary to run (default: `palisade` next to this
    /// executable).
    #[arg(long, env = "PALISADE_BIN", global = true)]
    palisade: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Fenced PUT through a gateway vs. the engine's ceiling.
    Gateway(gateway::GatewayBench),
    /// Fencing's cost on PostgreSQL (fenced put vs. a plain upsert, same
    /// pool), and PUTs through one and two gateways on PostgreSQL and one
    /// on sled (needs Debian's postgresql package).
    GatewayPostgres(gateway_postgres::GatewayPostgresBench),
    /// Acquire/release and renew throughput, and failover time, on a real
    /// 3-node cluster.
    Election(election::ElectionBench),
    /// The same work against etcd (needs `etcd` on PATH), for ratios.
    Etcd(etcd::EtcdBench),
    /// Renewals with a big table and many idle watchers against an empty
    /// table; memory and disk per held lease; memory after a million names
    /// used once and reclaimed.
    Scale(scale::ScaleBench),
    /// One SDK client holding many leases (10 000 by default) that renew
    /// themselves: the leader's CPU per renewal.
    Hold(hold::HoldBench),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Gateway(args) => gateway::run(args, &palisade(cli.palisade)?).await,
        Command::GatewayPostgres(args) => {
            gateway_postgres::run(args, &palisade(cli.palisade)?).await
        }
        Command::Election(args) => election::run(args, &palisade(cli.palisade)?).await,
        Command::Etcd(args) => etcd::run(args).await,
        Command::Scale(args) => scale::run(args, &palisade(cli.palisade)?).await,
        Command::Hold(args) => hold::run(args, &palisade(cli.palisade)?).await,
    }
}

/// The `palisade` binary: as given, or next to this executable.
fn palisade(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let path = match given {
        Some(path) => path,
        None => std::env::current_exe()
            .context("cannot find this executable")?
            .with_file_name("palisade"),
    };
    anyhow::ensure!(
        path.is_file(),
        "no palisade binary at {} (build it: cargo build --release -p palisade; \
         or pass --palisade PATH / PALISADE_BIN)",
        path.display()
    );
    Ok(path)
}
