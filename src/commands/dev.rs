//! `palisade dev`: a whole local cluster in one command — three election
//! nodes and a gateway, as child processes of this binary on loopback — with
//! the endpoints and a copy-paste walkthrough printed once it is ready.
//! With `--postgres`: a throwaway PostgreSQL (`dev_postgres.rs`) and two
//! gateways sharing it. A process of the cluster that dies is reported and
//! started again, within a limit (`dev_supervise.rs`).

use crate::output::{complain, say};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use palisade_local_cluster::{
    ready, stop_gracefully, Cluster, ClusterConfig, GatewayKeys, Logs, Node, NodeSpec, PeerAuth,
    PostgresServer,
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
    /// Keep objects in a throwaway PostgreSQL (in the data dir; needs
    /// Debian's postgresql package) and run two gateways on it, on the
    /// gateway port and the next one.
    #[arg(long)]
    postgres: bool,
    /// Serve clients over TLS (election nodes and gateways, https://) with
    /// the certificates dev makes in the data dir; clients trust
    /// certs/ca.pem (`--ca`, PALISADE_CA), which dev prints.
    #[arg(long)]
    tls: bool,
    /// Raft groups (partitions), each with its own leader (the nodes'
    /// --partitions; fixed when the data dir is made).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    partitions: u32,
    /// Slower, steadier elections on the nodes: heartbeat 100 ms, election
    /// timeout 600..1200 ms (and leases of at least 2 s). Leadership then
    /// stays put on a loaded machine (tests beside builds, a busy laptop);
    /// a failover takes 1-2 s instead of a few hundred ms.
    #[arg(long)]
    slow_elections: bool,
    /// A process that died is restarted at most 3 times within this many
    /// seconds; once more and dev leaves it down (and says so).
    #[arg(long, default_value_t = 60, hide = true)]
    restart_window_secs: u64,
}

/// The cluster and its gateways, stopped like Ctrl-C would stop them
/// (SIGTERM, SIGKILL after 5 s) when dropped; then PostgreSQL, if any (fast).
struct Running {
    cluster: Cluster,
    gateways: Vec<Node>,
    postgres: Option<PostgresServer>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let nodes = self.cluster.running_nodes().chain(self.gateways.iter_mut());
        stop_gracefully(nodes, Duration::from_secs(5));
        if let Some(postgres) = &self.postgres {
            postgres.stop("fast");
        }
    }
}

pub async fn run(args: DevArgs) -> anyhow::Result<ExitCode> {
    if args.postgres {
        if let Err(line) = super::dev_postgres::check_installed() {
            complain!("error: {line}");
            return Ok(ExitCode::from(2));
        }
    }
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
    let certs = make_credentials(&root)?;
    let ca = certs.join("ca.pem");
    let scheme = if args.tls { "https" } else { "http" };
    let env = vec![(
        "RUST_LOG".to_owned(),
        std::env::var("RUST_LOG").unwrap_or_else(|_| "info,openraft=warn".into()),
    )];
    let config = cluster_config(&args, &root, &certs, &env);
    let postgres = match args.postgres {
        true => Some(super::dev_postgres::start(&root)?),
        false => None,
    };
    let cluster = Cluster::start(&exe, config)?;
    let election_urls = cluster.urls();
    let launch = GatewayLaunch {
        exe: &exe,
        root: &root,
        certs: &certs,
        env: &env,
        scheme,
    };
    let (gateways, gateway_urls) =
        start_gateways(&args, &launch, &election_urls, postgres.as_ref())?;
    let pg_url = postgres.as_ref().map(|pg| pg.url("postgres"));
    let mut running = Running {
        cluster,
        gateways,
        postgres,
    };

    let trusted = args.tls.then_some(ca.as_path());
    for gateway_url in &gateway_urls {
        wait_ready(&mut running, gateway_url, trusted).await?;
    }
    let urls = Urls {
        elections: &election_urls,
        gateways: &gateway_urls,
        postgres: pg_url.as_deref(),
        ca: trusted,
    };
    print_walkthrough(&root, &urls);
    let window = Duration::from_secs(args.restart_window_secs);
    supervise_until_shutdown(&mut running, &exe, &root, window).await;
    say!("stopping the cluster...");
    drop(running);
    say!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Makes what the cluster's processes authenticate with, once per data dir
/// (a reused `--data-dir` keeps them), and answers the certificates' dir.
/// Peers authenticate each other with mutual TLS; clients need an API key:
/// one principal, `admin`, may do everything, its key in admin.key.
fn make_credentials(root: &Path) -> anyhow::Result<PathBuf> {
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
    let policy = root.join("policy.json");
    if !policy.exists() {
        palisade_serve::policy::add(root, "admin", &palisade_serve::policy::operator())?;
    }
    Ok(certs)
}

/// The `--policy` arguments every process of the cluster takes.
fn policy_args(root: &Path) -> Vec<String> {
    let policy = root.join("policy.json");
    vec!["--policy".to_owned(), policy.display().to_string()]
}

/// The three election nodes: their ports, environment, arguments and logs.
fn cluster_config(
    args: &DevArgs,
    root: &Path,
    certs: &Path,
    env: &[(String, String)],
) -> ClusterConfig {
    let ca = certs.join("ca.pem");
    let scheme = if args.tls { "https" } else { "http" };
    let first_peer_port = args
        .peer_port
        .unwrap_or_else(|| args.election_port.saturating_add(100));
    let mut config = ClusterConfig::new(root, 3, PeerAuth::Certs(certs.to_owned()));
    config.client_tls = args.tls;
    for (i, node) in (0..).zip(&mut config.nodes) {
        node.port = args.election_port + i;
        node.peer_port = first_peer_port + i;
        node.env = env.to_vec();
        node.args = policy_args(root);
        node.args
            .extend(["--max-wait-ms".to_owned(), args.max_wait_ms.to_string()]);
        node.args
            .extend(["--partitions".to_owned(), args.partitions.to_string()]);
        if args.slow_elections {
            node.args.extend(
                [
                    "--heartbeat-ms",
                    "100",
                    "--election-timeout-ms",
                    "600..1200",
                    "--min-ttl-ms",
                    "2000",
                ]
                .map(str::to_owned),
            );
        }
        // The status page shows the gateway's refused writes.
        node.args.extend([
            "--ui-gateway".to_owned(),
            format!("{scheme}://127.0.0.1:{}", args.gateway_port),
            "--ui-gateway-key-file".to_owned(),
            root.join("admin.key").display().to_string(),
        ]);
        if args.tls {
            node.args
                .extend(["--ui-gateway-ca".to_owned(), ca.display().to_string()]);
        }
        node.logs = Logs::File(root.join(format!("election-{}.log", i + 1)));
    }
    config
}

/// What every gateway dev starts shares.
struct GatewayLaunch<'a> {
    /// This binary, which the gateways run as.
    exe: &'a Path,
    /// The data dir, for the gateways' data and logs.
    root: &'a Path,
    /// The certificates' dir, for `--certs` under `--tls`.
    certs: &'a Path,
    /// The environment every process of the cluster gets.
    env: &'a [(String, String)],
    /// `https` under `--tls`, else `http`.
    scheme: &'a str,
}

/// Starts one gateway, or two sharing `postgres`, on the gateway port and
/// the next one; answers them and their URLs.
fn start_gateways(
    args: &DevArgs,
    launch: &GatewayLaunch<'_>,
    election_urls: &[String],
    postgres: Option<&PostgresServer>,
) -> anyhow::Result<(Vec<Node>, Vec<String>)> {
    let root = launch.root;
    // A gateway over TLS serves gateway.pem and trusts the CA for the
    // nodes' https:// JWKS.
    let mut gateway_args = policy_args(root);
    if args.tls {
        gateway_args.extend(["--certs".to_owned(), launch.certs.display().to_string()]);
    }
    let count = if postgres.is_some() { 2 } else { 1 };
    let mut gateways = Vec::new();
    let mut gateway_urls = Vec::new();
    for i in 0..count {
        let port = args.gateway_port + i;
        let listen = format!("127.0.0.1:{port}");
        let keys = GatewayKeys::Election(election_urls.to_vec());
        let spec = match postgres {
            Some(pg) => NodeSpec::gateway_on_postgres(listen, pg.url("postgres"), keys),
            None => NodeSpec::gateway(listen, root.join("gateway"), keys),
        };
        let log = match i {
            0 => root.join("gateway.log"),
            _ => root.join(format!("gateway-{}.log", i + 1)),
        };
        gateways.push(Node::start(
            launch.exe,
            NodeSpec {
                env: launch.env.to_vec(),
                args: gateway_args.clone(),
                logs: Logs::File(log),
                ..spec
            },
        )?);
        gateway_urls.push(format!("{}://127.0.0.1:{port}", launch.scheme));
    }
    Ok((gateways, gateway_urls))
}

/// Restarts what dies (within the restart window) every 500 ms until
/// Ctrl-C or SIGTERM.
async fn supervise_until_shutdown(
    running: &mut Running,
    exe: &Path,
    root: &Path,
    window: Duration,
) {
    let mut supervisor = super::dev_supervise::Supervisor::new(window);
    let shutdown = crate::shutdown::shutdown_signal();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = tick.tick() => {
                let Running { cluster, gateways, .. } = running;
                supervisor.check(exe, root, cluster, gateways);
            }
        }
    }
}

/// Waits until node 1 has the signing key and `gateway` answers healthy
/// (trusting `ca` for https://).
async fn wait_ready(
    running: &mut Running,
    gateway: &str,
    ca: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let mut client = reqwest::Client::builder().timeout(Duration::from_millis(500));
    if let Some(ca) = ca {
        let pem = std::fs::read(ca)?;
        client = client.add_root_certificate(reqwest::Certificate::from_pem(&pem)?);
    }
    let client = client.build()?;
    let first = running.cluster.url(1);
    for _ in 0..200 {
        let gateway_exited = running.gateways.iter_mut().find_map(|g| g.exited());
        if let Some(status) = running.cluster.exited().or(gateway_exited) {
            bail!("a cluster process exited early ({status}); see the logs in the data dir (ports in use?)");
        }
        // Every node answers, not only a quorum: on a loaded machine a
        // node could still be starting when dev said the cluster was up.
        let mut all_answer = true;
        for url in running.cluster.urls() {
            all_answer &= ready::healthy(&client, &url).await;
        }
        if all_answer
            && ready::signing_key_installed(&client, &first).await
            && ready::healthy(&client, gateway).await
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the cluster was not ready within 20 s")
}

/// Where the running cluster answers, for the walkthrough.
struct Urls<'a> {
    elections: &'a [String],
    gateways: &'a [String],
    postgres: Option<&'a str>,
    /// The CA clients trust, under `--tls`.
    ca: Option<&'a std::path::Path>,
}

fn print_walkthrough(root: &std::path::Path, urls: &Urls<'_>) {
    let Urls {
        elections,
        gateways,
        postgres,
        ca,
    } = *urls;
    let e = &elections[0];
    let gateway = &gateways[0];
    let late = &gateways[gateways.len() - 1];
    let through = if gateways.len() > 1 {
        " (through the other gateway)"
    } else {
        ""
    };
    let on = match postgres {
        Some(url) => format!(
            "\n  on PostgreSQL:  {url} (in {root}/postgres; every gateway shares it: write through one, \
             read or be refused through the other)",
            root = root.display()
        ),
        None => String::new(),
    };
    let exports = exports(root, elections, gateway, ca);
    let (tls, curl) = match ca {
        Some(ca) => (
            format!(
                "\n  clients speak TLS: trust {ca} (the CLI and SDKs read PALISADE_CA)",
                ca = ca.display(),
            ),
            format!("curl -s --cacert {}", ca.display()),
        ),
        None => (String::new(), "curl -s".to_owned()),
    };
    say!(
        "\
Palisade dev cluster is up (data and logs in {root}).

  election nodes: {elections}
  gateway:        {gateways}{on}{tls}

The CLI and the SDKs find this cluster and its API key through these
variables (the key in {root}/admin.key is principal `admin`, allowed
everything by {root}/policy.json):

  export {exports}

curl sends the key from PALISADE_API_KEY:

  export PALISADE_API_KEY=$(cat {root}/admin.key)

Walkthrough: a paused leader's late write is refused.

  # A acquires a 2 s lease and writes with its token
  A=$({curl} -XPOST -H \"x-palisade-key: $PALISADE_API_KEY\" -H 'content-type: application/json' -d '{{\"holder\":\"A\",\"ttl_ms\":2000}}' {e}/v1/leases/orders/acquire)
  JWT_A=$(echo \"$A\" | sed 's/.*\"jwt\":\"\\([^\"]*\\)\".*/\\1/')
  {curl} -XPUT -H \"x-palisade-key: $PALISADE_API_KEY\" -H \"authorization: Bearer $JWT_A\" --data 'from A' {gateway}/v1/objects/orders/state

  # A stops renewing; after 2 s B gets the lease (waiting up to 5 s), raises the fence, writes
  B=$({curl} -XPOST -H \"x-palisade-key: $PALISADE_API_KEY\" -H 'content-type: application/json' -d '{{\"holder\":\"B\",\"ttl_ms\":10000,\"wait_ms\":5000}}' {e}/v1/leases/orders/acquire)
  JWT_B=$(echo \"$B\" | sed 's/.*\"jwt\":\"\\([^\"]*\\)\".*/\\1/')
  {curl} -XPOST -H \"x-palisade-key: $PALISADE_API_KEY\" -H \"authorization: Bearer $JWT_B\" {gateway}/v1/fences/orders
  {curl} -XPUT -H \"x-palisade-key: $PALISADE_API_KEY\" -H \"authorization: Bearer $JWT_B\" --data 'from B' {gateway}/v1/objects/orders/state

  # A wakes up and writes{through}: 409 stale_token, nothing changed
  {curl} -XPUT -H \"x-palisade-key: $PALISADE_API_KEY\" -H \"authorization: Bearer $JWT_A\" --data 'late A' {late}/v1/objects/orders/state
  {curl} -H \"x-palisade-key: $PALISADE_API_KEY\" {late}/v1/objects/orders/state

  palisade cluster status      # who leads (after the export line above)

Ctrl-C stops everything.",
        root = root.display(),
        elections = elections.join(" "),
        gateways = gateways.join(" "),
    );
}

/// The walkthrough's `export` line's variables: the CA under `--tls`, the
/// endpoints and the API key's file.
fn exports(root: &Path, elections: &[String], gateway: &str, ca: Option<&Path>) -> String {
    let mut exports = Vec::new();
    if let Some(ca) = ca {
        exports.push(format!(
            "PALISADE_CA={}",
            shell_word(&ca.display().to_string())
        ));
    }
    exports.extend([
        format!("PALISADE_ELECTION={}", elections.join(",")),
        format!("PALISADE_GATEWAY={gateway}"),
        format!(
            "PALISADE_API_KEY_FILE={}",
            shell_word(&root.join("admin.key").display().to_string())
        ),
    ]);
    exports.join(" ")
}

/// `text` as one shell word: as it is when it holds only characters no
/// shell treats specially, else in single quotes.
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-:,=+@%".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        return text.to_owned();
    }
    format!("'{}'", text.replace('\'', "'\\''"))
}
