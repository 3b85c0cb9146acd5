//! `palisade-bench election`: a real 3-node cluster on loopback (temp dirs,
//! durable, mutual TLS between peers unless `--insecure-peers`), driven over
//! HTTP.
//!
//! - acquire+release cycles/s over many lease names, and renew/s on held
//!   leases, at each concurrency, over HTTP/2 (one connection, as the SDK
//!   runs); renew/s over HTTP/1.1 (a connection per task) for comparison;
//!   and renewals/s through `POST /v1/renew` batches of `--batch` leases
//!   per task (what an SDK client holding many leases sends);
//! - failover: SIGKILL the Raft leader under light load, time until the first
//!   successful acquire through a survivor (restarting the victim between
//!   trials);
//! - with `--ops N`: N acquire+release cycles, then disk use and the nodes' RSS.
//!
//! This file runs the phases in turn (set up the cluster, the load rows,
//! failover, the footprint, the report); `rows.rs` holds the load rows,
//! `requests.rs` the requests they send, `cluster.rs` the clients, the
//! failover trials' view of the cluster and its footprint, `soak.rs` the
//! `--ops` cycles.

mod cluster;
mod partitions;
mod requests;
mod rows;
mod soak;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use palisade_local_cluster::{make_certs, Cluster, ClusterConfig, Logs, PeerAuth};
use serde_json::{json, Value};

pub(crate) use cluster::{disk_bytes, rss_kib};
pub(crate) use requests::{holder_token, post, renew};

use crate::load::{
    failover_summary, failovers, http2_client, http_client, print_table, Failover, Figures,
    LoadArgs,
};

#[derive(Debug, Args)]
pub struct ElectionBench {
    #[command(flatten)]
    load: LoadArgs,
    /// Failover trials.
    #[arg(long, default_value_t = 10)]
    failovers: usize,
    /// Also run this many acquire+release cycles and report disk and RSS.
    #[arg(long)]
    ops: Option<u64>,
    /// Run peer traffic in plaintext (`--insecure-peers`), to measure what
    /// mutual TLS between peers costs.
    #[arg(long)]
    insecure_peers: bool,
    /// Serve clients over TLS (`--client-tls`) and enforce a policy (the
    /// bench calls as its `admin` principal), to measure what client TLS
    /// and authorization cost. Needs peer certificates (not with
    /// --insecure-peers).
    #[arg(long, conflicts_with = "insecure_peers")]
    secure_clients: bool,
    /// Leases per batch renewal request (each task holds this many).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Only the rows whose name starts with this, or with one of these
    /// comma-separated prefixes (e.g. `renew sdk`, to profile one path).
    #[arg(long)]
    only: Option<String>,
    /// Run the cluster with this many partitions (`--partitions`); each
    /// lease's calls go to its partition's leader, as the SDKs send them,
    /// and the failover kills the node leading the most partitions.
    #[arg(long, default_value_t = 1)]
    partitions: u32,
    /// Before the load, measure the idle cluster for this many seconds:
    /// each node's CPU, RSS and peer requests/s.
    #[arg(long)]
    idle_secs: Option<u64>,
}

/// The clients the benchmark calls the cluster with.
struct Clients {
    /// Speaks HTTP/2 (by ALPN over TLS).
    client: reqwest::Client,
    /// Speaks HTTP/1.1, a connection per task (none with `--secure-clients`).
    http1: Option<reqwest::Client>,
    /// Gives up after 300 ms, for the failover probes.
    short: reqwest::Client,
}

pub async fn run(args: ElectionBench, palisade: &Path) -> anyhow::Result<ExitCode> {
    let dir = tempfile::tempdir()?;
    let (mut cluster, clients) = start(&args, palisade, dir.path())?;
    let Clients {
        client,
        http1,
        short,
    } = clients;
    if Failover::leader(&cluster, &client).await.is_none() {
        anyhow::bail!("the cluster did not elect a leader");
    }
    let map = partitions::settled(&cluster, &client, Duration::from_secs(60)).await?;
    let idle = match args.idle_secs {
        Some(secs) => {
            Some(partitions::idle_cost(&cluster, &client, Duration::from_secs(secs)).await)
        }
        None => None,
    };
    let rows = rows::Rows {
        client: &client,
        http1: http1.as_ref(),
        cluster: &cluster,
        map: &map,
        duration: args.load.duration(),
        only: args.only.as_deref(),
        batch: args.batch,
        sdk: !args.secure_clients,
    };
    let mut results = Vec::new();
    for &concurrency in &args.load.concurrency {
        rows.run(concurrency, &mut results).await?;
    }

    let (mut failovers, of_most) = if args.partitions > 1 {
        let mut trials = Vec::new();
        for trial in 0..args.failovers {
            let map = partitions::settled(&cluster, &client, Duration::from_secs(60)).await?;
            let of_most =
                partitions::failover_of_most(&mut cluster, &client, &short, (&map, trial));
            trials.push(of_most.await?);
        }
        (Vec::new(), Some(trials))
    } else {
        let trials = failovers(&mut cluster, &client, &short, args.failovers).await?;
        (trials, None)
    };

    let footprint = match args.ops {
        Some(ops) => Some(soak::footprint(&cluster, &client, ops).await?),
        None => None,
    };
    let extra = json!({ "idle": idle, "partition_failovers": of_most });
    report(&args, &results, &mut failovers, (footprint, extra))?;
    Ok(ExitCode::SUCCESS)
}

/// Starts the 3-node cluster in `dir` (certificates and a policy there as
/// the flags ask) and makes the clients to call it with.
fn start(args: &ElectionBench, palisade: &Path, dir: &Path) -> anyhow::Result<(Cluster, Clients)> {
    let peer_auth = if args.insecure_peers {
        PeerAuth::Insecure
    } else {
        let certs = dir.join("certs");
        make_certs(palisade, &certs, 3, &[])?;
        PeerAuth::Certs(certs)
    };
    let mut config = ClusterConfig::new(dir, 3, peer_auth);
    for node in &mut config.nodes {
        // `BENCH_NODE_LOG=info` shows what the nodes do (a slow failover).
        let log = std::env::var("BENCH_NODE_LOG").unwrap_or_else(|_| "error".into());
        node.env = vec![("RUST_LOG".into(), log)];
        node.logs = Logs::Inherit;
        node.args = vec!["--partitions".into(), args.partitions.to_string()];
    }
    let clients = if args.secure_clients {
        let (client, policy) = cluster::secure_client(palisade, dir, Duration::from_secs(5))?;
        let (short, _) = cluster::secure_client(palisade, dir, Duration::from_millis(300))?;
        config.client_tls = true;
        config.policy = Some(policy);
        Clients {
            client,
            http1: None,
            short,
        }
    } else {
        Clients {
            client: http2_client(Duration::from_secs(5))?,
            http1: Some(http_client(Duration::from_secs(5), 128)?),
            short: http_client(Duration::from_millis(300), 1)?,
        }
    };
    Ok((Cluster::start(palisade, config)?, clients))
}

/// Prints the rows, the failover summary and the footprint: as one JSON
/// document under `--json`, else as a table and two lines.
fn report(
    args: &ElectionBench,
    results: &[Figures],
    failovers: &mut [Duration],
    (footprint, extra): (Option<Value>, Value),
) -> anyhow::Result<()> {
    let failover = failover_summary(failovers);
    if args.load.json {
        let all = json!({
            "partitions": args.partitions,
            "load": results,
            "failover": failover,
            "footprint": footprint,
            "idle": extra["idle"],
            "partition_failovers": extra["partition_failovers"],
        });
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else {
        println!("partitions: {}", args.partitions);
        if !extra["idle"].is_null() {
            println!("idle: {}", extra["idle"]);
        }
        print_table(results);
        if failovers.is_empty() {
            println!(
                "failover of the node leading the most partitions: {}",
                extra["partition_failovers"]
            );
        } else {
            println!("failover (SIGKILL leader -> first acquire via a survivor): {failover}");
        }
        if let Some(footprint) = footprint {
            println!("footprint: {footprint}");
        }
    }
    Ok(())
}
