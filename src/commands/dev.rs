//! `palisade dev`: a whole local cluster in one command — three election
//! nodes and a gateway, as child processes of this binary on loopback — with
//! the endpoints and a copy-paste walkthrough printed once it is ready.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use palisade_local_cluster::{
    ready, stop_gracefully, Cluster, ClusterConfig, GatewayKeys, Logs, Node, NodeSpec, PeerAuth,
};

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Keep data here instead of a fresh temp dir (reused across runs).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// First election port; nodes use it and the next two.
    #[arg(long, default_value_t = 7001)]
    election_port: u16,
    /// First peer port (Raft RPC, mutual TLS); default: election port + 100.
    #[arg(long)]
    peer_port: Option<u16>,
    /// The gateway's port.
    #[arg(long, default_value_t = 8080)]
    gateway_port: u16,
    /// The longest a blocking acquire or watch waits (the nodes'
    /// --max-wait-ms; CI's fuzzing keeps it short).
    #[arg(long, default_value_t = 60_000)]
    max_wait_ms: u64,
}

/// The cluster and its gateway, stopped like Ctrl-C would stop them (SIGTERM,
/// SIGKILL after 5 s) when dropped.
struct Running {
    cluster: Cluster,
    gateway: Node,
}

impl Drop for Running {
    fn drop(&mut self) {
        let nodes = self
            .cluster
            .running_nodes()
            .chain(std::iter::once(&mut self.gateway));
        stop_gracefully(nodes, Duration::from_secs(5));
    }
}

pub async fn run(args: DevArgs) -> anyhow::Result<ExitCode> {
    let temp;
    let root = match &args.data_dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::Builder::new().prefix("palisade-dev-").tempdir()?;
            temp.path().to_owned()
        }
    };
    std::fs::create_dir_all(&root)?;
    let exe = std::env::current_exe()?;

    // Peers authenticate each other with mutual TLS: the certificates live
    // with the data (made once; a reused --data-dir keeps them).
    let certs = root.join("certs");
    if !certs.join("ca.pem").exists() {
        palisade_serve::certs::init(
            &certs,
            &palisade_serve::certs::Layout {
                nodes: 3,
                dns: vec!["localhost".into()],
                ips: vec![std::net::Ipv4Addr::LOCALHOST.into()],
            },
        )?;
    }

    // Clients need an API key: one principal, `admin`, may do everything;
    // its key is in admin.key (made once, like the certificates).
    let policy = root.join("policy.json");
    if !policy.exists() {
        palisade_serve::policy::add(&root, "admin", &palisade_serve::policy::operator())?;
    }
    let policy_args = vec!["--policy".to_owned(), policy.display().to_string()];

    let env = vec![(
        "RUST_LOG".to_owned(),
        std::env::var("RUST_LOG").unwrap_or_else(|_| "info,openraft=warn".into()),
    )];
    let first_peer_port = args
        .peer_port
        .unwrap_or_else(|| args.election_port.saturating_add(100));
    let mut config = ClusterConfig::new(&root, 3, PeerAuth::Certs(certs));
    for (i, node) in (0..).zip(&mut config.nodes) {
        node.port = args.election_port + i;
        node.peer_port = first_peer_port + i;
        node.env = env.clone();
        node.args.clone_from(&policy_args);
        node.args
            .extend(["--max-wait-ms".to_owned(), args.max_wait_ms.to_string()]);
        // The status page shows the gateway's refused writes.
        node.args.extend([
            "--ui-gateway".to_owned(),
            format!("http://127.0.0.1:{}", args.gateway_port),
            "--ui-gateway-key-file".to_owned(),
            root.join("admin.key").display().to_string(),
        ]);
        node.logs = Logs::File(root.join(format!("election-{}.log", i + 1)));
    }
    let cluster = Cluster::start(&exe, config)?;
    let election_urls = cluster.urls();
    let gateway_url = format!("http://127.0.0.1:{}", args.gateway_port);
    let gateway = Node::start(
        &exe,
        NodeSpec {
            env,
            args: policy_args,
            logs: Logs::File(root.join("gateway.log")),
            ..NodeSpec::gateway(
                format!("127.0.0.1:{}", args.gateway_port),
                root.join("gateway"),
                GatewayKeys::Election(election_urls.clone()),
            )
        },
    )?;
    let mut running = Running { cluster, gateway };

    wait_ready(&mut running, &gateway_url).await?;
    print_walkthrough(&root, &election_urls, &gateway_url);
    super::shutdown_signal().await;
    println!("stopping the cluster...");
    drop(running);
    println!("stopped");
    Ok(ExitCode::SUCCESS)
}

async fn wait_ready(running: &mut Running, gateway: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()?;
    let first = running.cluster.url(1);
    for _ in 0..200 {
        if let Some(status) = running
            .cluster
            .exited()
            .or_else(|| running.gateway.exited())
        {
            bail!("a cluster process exited early ({status}); see the logs in the data dir (ports in use?)");
        }
        if ready::signing_key_installed(&client, &first).await
            && ready::healthy(&client, gateway).await
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the cluster was not ready within 20 s")
}

fn print_walkthrough(root: &std::path::Path, elections: &[String], gateway: &str) {
    let e = &elections[0];
    println!(
        "\
Palisade dev cluster is up (data and logs in {root}).

  election nodes: {elections}
  gateway:        {gateway}

Clients need the API key in {root}/admin.key (principal `admin`, allowed
everything by {root}/policy.json): the CLI and SDK read PALISADE_API_KEY.

  export PALISADE_API_KEY=$(cat {root}/admin.key)

Walkthrough: a paused leader's late write is refused.

  # A acquires a 2 s lease and writes with its token
  A=$(curl -s -XPOST -H \"x-palisade-key: $PALISADE_API_KEY\" -H 'content-type: application/json' -d '{{\"holder\":\"A\",\"ttl_ms\":2000}}' {e}/v1/leases/orders/acquire)
  JWT_A=$(echo \"$A\" | sed 's/.*\"jwt\":\"\\([^\"]*\\)\".*/\\1/')
  curl -s -XPUT -H \"x-palisade-key: $PALISADE_API_KEY\" -H \"authorization: Bearer $JWT_A\" --data 'from A' {gateway}/v1/objects/orders/state

  # A stops renewing; after 2 s B gets the lease (waiting up to 5 s), raises the fence, writes
  B=$(curl -s -XPOST -H \"x-palisade-key: $PALISADE_API_KEY\" -H 'content-type: application/json' -d '{{\"holder\":\"B\",\"ttl_ms\":10000,\"wait_ms\":5000}}' {e}/v1/leases/orders/acquire)
  JWT_B=$(echo \"$B\" | sed 's/.*\"jwt\":\"\\([^\"]*\\)\".*/\\1/')
  curl -s -XPOST -H \"x-palisade-key: $PALISADE_API_KEY\" -H \"authorization: Bearer $JWT_B\" {gateway}/v1/fences/orders
  curl -s -XPUT -H \"x-palisade-key: $PALISADE_API_KEY\" -H \"authorization: Bearer $JWT_B\" --data 'from B' {gateway}/v1/objects/orders/state

  # A wakes up and writes: 409 stale_token, nothing changed
  curl -s -XPUT -H \"x-palisade-key: $PALISADE_API_KEY\" -H \"authorization: Bearer $JWT_A\" --data 'late A' {gateway}/v1/objects/orders/state
  curl -s -H \"x-palisade-key: $PALISADE_API_KEY\" {gateway}/v1/objects/orders/state

  palisade cluster status      # who leads (the CLI defaults to these endpoints)

Ctrl-C stops everything.",
        root = root.display(),
        elections = elections.join(" "),
    );
}
