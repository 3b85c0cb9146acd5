//! `palisade election`: one node of the election cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use palisade_election::config::parse_peers;
use palisade_election::{ElectionConfig, ElectionNode};

#[derive(Debug, Args)]
pub struct ElectionArgs {
    /// This node's id (a key of --peers).
    #[arg(long)]
    id: u64,
    /// Address to listen on (client API and Raft RPC).
    #[arg(long)]
    listen: SocketAddr,
    /// Local IP that connections to peers leave from (default: the
    /// kernel's choice).
    #[arg(long)]
    source_ip: Option<std::net::IpAddr>,
    /// Directory for the log, vote and snapshots (created if missing).
    #[arg(long)]
    data_dir: PathBuf,
    /// The whole initial membership: ID=HOST:PORT,...
    #[arg(long, value_parser = parse_peers)]
    peers: std::collections::BTreeMap<u64, String>,
    /// Leader heartbeat, in ms.
    #[arg(long, default_value_t = 20)]
    heartbeat_ms: u64,
    /// Election timeout range, in ms: MIN..MAX.
    #[arg(long, default_value = "60..120", value_parser = parse_range)]
    election_timeout_ms: (u64, u64),
    /// Shortest lease ttl accepted, in ms.
    #[arg(long, default_value_t = 500)]
    min_ttl_ms: u64,
    /// Longest lease ttl accepted, in ms.
    #[arg(long, default_value_t = 3_600_000)]
    max_ttl_ms: u64,
    /// A snapshot every this many log entries (older entries are purged).
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
}

fn parse_range(text: &str) -> Result<(u64, u64), String> {
    let (min, max) = text.split_once("..").ok_or("expected MIN..MAX")?;
    let min = min
        .trim()
        .parse()
        .map_err(|_| format!("{min:?} is not a number"))?;
    let max = max
        .trim()
        .parse()
        .map_err(|_| format!("{max:?} is not a number"))?;
    Ok((min, max))
}

pub async fn run(args: ElectionArgs) -> anyhow::Result<ExitCode> {
    let mut config = ElectionConfig::new(args.id, args.listen, args.data_dir, args.peers);
    config.source_ip = args.source_ip;
    config.heartbeat = Duration::from_millis(args.heartbeat_ms);
    config.election_timeout = (
        Duration::from_millis(args.election_timeout_ms.0),
        Duration::from_millis(args.election_timeout_ms.1),
    );
    config.ttl_range = (
        Duration::from_millis(args.min_ttl_ms),
        Duration::from_millis(args.max_ttl_ms),
    );
    config.snapshot_every = args.snapshot_every;
    if let Err(problem) = config.validate() {
        eprintln!("error: {problem}");
        return Ok(ExitCode::from(2));
    }
    let id = config.id;
    let node = ElectionNode::start(config).await?;
    println!(
        "palisade election node {id} listening on http://{}",
        node.local_addr
    );
    tracing::info!(id, addr = %node.local_addr, "election node started");
    node.serve(super::shutdown_signal()).await?;
    tracing::info!(id, "election node stopped");
    Ok(ExitCode::SUCCESS)
}
