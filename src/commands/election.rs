//! `palisade election`: one node of the election cluster.

use crate::output::{complain, say};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use palisade_election::config::{parse_peers, PeerTls, Placement, UiGateway};
use palisade_election::{ElectionConfig, ElectionNode};

#[derive(Debug, Args)]
pub struct ElectionArgs {
    /// This node's id (a key of --peers).
    #[arg(long)]
    id: u64,
    /// Address of the client API. Raft RPC never arrives here.
    #[arg(long)]
    listen: SocketAddr,
    /// Address of the peer listener (Raft RPC and requests forwarded to the
    /// leader). Default: this node's entry in --peers.
    #[arg(long)]
    peer_listen: Option<SocketAddr>,
    /// A directory made by `palisade certs init`: uses ca.pem,
    /// node-<id>.pem and node-<id>-key.pem for mutual TLS between peers.
    #[arg(long, env = "PALISADE_CERTS", conflicts_with_all = ["peer_ca", "insecure_peers"])]
    certs: Option<PathBuf>,
    /// The cluster CA (PEM) that every peer certificate must chain to.
    #[arg(long, requires_all = ["peer_cert", "peer_key"], conflicts_with = "insecure_peers")]
    peer_ca: Option<PathBuf>,
    /// This node's certificate (PEM), naming it node-<id>.palisade.
    #[arg(long, requires = "peer_ca")]
    peer_cert: Option<PathBuf>,
    /// This node's private key (PEM).
    #[arg(long, requires = "peer_ca")]
    peer_key: Option<PathBuf>,
    /// Run peer traffic in plaintext, unauthenticated: anyone who can reach
    /// the peer port can take the cluster over. For experiments only.
    #[arg(long)]
    insecure_peers: bool,
    /// Serve the client API over TLS with this node's certificate from
    /// --certs (clients trust ca.pem: `--ca`, PALISADE_CA).
    #[arg(long, requires = "certs")]
    client_tls: bool,
    /// Who may call the client API: a policy file (JSON, see README's
    /// security model). Without it the API is open to anyone who reaches it.
    #[arg(long, env = "PALISADE_POLICY")]
    policy: Option<PathBuf>,
    /// Local IP that connections to peers leave from (default: the
    /// kernel's choice).
    #[arg(long)]
    source_ip: Option<std::net::IpAddr>,
    /// Directory for the log, vote and snapshots (created if missing).
    #[arg(long)]
    data_dir: PathBuf,
    /// The whole initial membership, as peer addresses: ID=HOST:PORT,...
    #[arg(long, value_parser = parse_peers)]
    peers: std::collections::BTreeMap<u64, String>,
    /// Leader heartbeat, in ms.
    #[arg(long, default_value_t = 20)]
    heartbeat_ms: u64,
    /// Vote and replicate, but never become leader: never start an
    /// election, refuse a leadership transfer (e.g. a node being drained,
    /// or in a zone that must not lead).
    #[arg(long)]
    never_lead: bool,
    /// This node's leadership priority, 0..=1000: the leader hands Raft
    /// leadership to a caught-up member of higher priority after
    /// --priority-checks good checks in a row (equal priorities never move
    /// it).
    #[arg(long, default_value_t = 0)]
    priority: u32,
    /// Consecutive good checks (answered, holding the whole log) before
    /// leadership moves to a higher priority.
    #[arg(long, default_value_t = 3)]
    priority_checks: u32,
    /// Time between two placement checks, in ms.
    #[arg(long, default_value_t = 1000)]
    priority_check_ms: u64,
    /// Replayable election timing: this node's election timeout is one
    /// value drawn from (seed, node ids) inside --election-timeout-ms
    /// rather than a fresh random one per election.
    #[arg(long)]
    timing_seed: Option<u64>,
    /// Election timeout range, in ms: MIN..MAX.
    #[arg(long, default_value = "60..120", value_parser = parse_range)]
    election_timeout_ms: (u64, u64),
    /// Taken off the leader lease renewals are answered on (the minimum
    /// election timeout), for clock-rate drift between nodes; default a
    /// tenth of it (covers 5%). Every voter must share
    /// --election-timeout-ms.
    #[arg(long)]
    lease_margin_ms: Option<u64>,
    /// Shortest lease ttl accepted, in ms.
    #[arg(long, default_value_t = 500)]
    min_ttl_ms: u64,
    /// Longest lease ttl accepted, in ms.
    #[arg(long, default_value_t = 3_600_000)]
    max_ttl_ms: u64,
    /// A snapshot every this many log entries (older entries are purged).
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// Transitions each lease's history keeps (1..=255). The leader stamps
    /// its own into every entry it proposes, so all nodes keep the same.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=255))]
    history_len: u16,
    /// Raft groups (partitions) the cluster runs, 1..=64, each electing its
    /// own leader; a lease belongs to one by a hash of its name. Fixed when
    /// the data dir is made: a node started with another count refuses.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    partitions: u32,
    /// Blocking acquires and watches allowed to wait at once on this node;
    /// one more gets 429 with Retry-After.
    #[arg(long, default_value_t = 10_000)]
    max_waiters: usize,
    /// Requests in flight at once on the client listener (over every
    /// connection); one more gets a fast 503. Admission per principal
    /// shares them out: a quarter for calls that wait, an eighth for
    /// renewals alone, the rest but an eighth for other calls.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(64..=1_000_000))]
    max_requests: u64,
    /// The longest a blocking acquire or watch waits on this node; longer
    /// `wait_ms` (up to the API's 60 000) are cut to it.
    #[arg(long, default_value_t = 60_000)]
    max_wait_ms: u64,
    /// A request body must arrive within this of its handler's first read
    /// (else 408), a renewal stream's frame whole within it, and a renewal
    /// stream whose answers the client does not take within it is ended
    /// and its seat freed.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    body_deadline_ms: u64,
    /// A free lease's record is forgotten this long after it was freed, in ms
    /// (GET and watch then answer 404 for it; a later grant still gets a
    /// higher token).
    #[arg(long, default_value_t = 300_000)]
    reclaim_after_ms: u64,
    /// Leases the table may hold (held or free, not yet reclaimed); an
    /// acquire of a new name beyond it gets 429 `too_many_leases`.
    #[arg(long, default_value_t = 1_000_000)]
    max_leases: usize,
    /// Under a policy, leases one principal may own (held, or freed and not
    /// yet reclaimed) unless its policy entry sets `max_leases`; beyond it
    /// an acquire of another lease gets 429 `over_quota`. Default: a
    /// quarter of --max-leases.
    #[arg(long)]
    max_leases_per_principal: Option<usize>,
    /// A gateway whose refused writes the status page (/ui) shows.
    #[arg(long)]
    ui_gateway: Option<String>,
    /// The API key (a file) to read that gateway's fences with (`read` on
    /// every lease), when it has a policy.
    #[arg(long, requires = "ui_gateway")]
    ui_gateway_key_file: Option<PathBuf>,
    /// The CA (PEM) to trust for an https --ui-gateway.
    #[arg(long, requires = "ui_gateway")]
    ui_gateway_ca: Option<PathBuf>,
    /// The URL(s) browsers reach this node's client API at
    /// (`https://status.example:7001`, comma-separated): the only origins
    /// the status page's sign-in and sign-out forms are accepted from.
    /// Default: `--listen` (with its loopback names for a loopback or
    /// unspecified address).
    #[arg(long, value_delimiter = ',')]
    public_url: Vec<String>,
    /// A status-page session unused this long ends.
    #[arg(long, default_value_t = 1800)]
    ui_session_idle_secs: u64,
    /// A status-page session ends this long after sign-in, used or not.
    #[arg(long, default_value_t = 28_800)]
    ui_session_lifetime_secs: u64,
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
    let config = match node_config(args) {
        Ok(config) => config,
        Err(line) => {
            complain!("error: {line}");
            return Ok(ExitCode::from(2));
        }
    };
    // The data dir holds the signing key (in the log and snapshots): every
    // file and directory this process creates is its owner's alone.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let id = config.id;
    let scheme = if config.client_tls.is_some() {
        "https"
    } else {
        "http"
    };
    let node = ElectionNode::start(config).await?;
    say!(
        "palisade election node {id} (peers on {}) listening on {scheme}://{}",
        node.peer_addr,
        node.local_addr
    );
    tracing::info!(id, addr = %node.local_addr, peer_addr = %node.peer_addr, "election node started");
    node.serve(crate::shutdown::shutdown_signal()).await?;
    tracing::info!(id, "election node stopped");
    Ok(ExitCode::SUCCESS)
}

/// The node's configuration from its flags, validated, with its policy
/// loaded; or the line to print before exiting with status 2.
fn node_config(args: ElectionArgs) -> Result<ElectionConfig, String> {
    let peer_tls = peer_tls(&args)?;
    let ui_gateway = ui_gateway(&args)?;
    let mut config = ElectionConfig::new(
        args.id,
        args.listen,
        args.data_dir.clone(),
        args.peers.clone(),
    );
    config.source_ip = args.source_ip;
    config.peer_listen = args.peer_listen;
    if args.client_tls {
        if let Some(dir) = &args.certs {
            config.client_tls = Some((
                dir.join(format!("node-{}.pem", args.id)),
                dir.join(format!("node-{}-key.pem", args.id)),
            ));
        }
    }
    config.peer_tls = peer_tls;
    set_timing(&mut config, &args);
    set_limits(&mut config, &args);
    config.ui_gateway = ui_gateway;
    config.ui.public_urls = args.public_url;
    config.ui.idle = Duration::from_secs(args.ui_session_idle_secs);
    config.ui.lifetime = Duration::from_secs(args.ui_session_lifetime_secs);
    config.validate()?;
    config.policy = super::policy::load_policy(args.policy.as_deref(), "client API")?;
    Ok(config)
}

/// How peers authenticate each other: from --certs, from
/// --peer-ca/--peer-cert/--peer-key, or not at all (--insecure-peers).
fn peer_tls(args: &ElectionArgs) -> Result<Option<PeerTls>, String> {
    match (&args.certs, &args.peer_ca, args.insecure_peers) {
        (Some(dir), _, _) => Ok(Some(PeerTls {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("node-{}.pem", args.id)),
            key: dir.join(format!("node-{}-key.pem", args.id)),
        })),
        (None, Some(ca), _) => Ok(Some(PeerTls {
            ca: ca.clone(),
            cert: args.peer_cert.clone().unwrap_or_default(),
            key: args.peer_key.clone().unwrap_or_default(),
        })),
        (None, None, true) => Ok(None),
        (None, None, false) => Err(
            "peer traffic needs --certs DIR (from `palisade certs init`) or \
             --peer-ca/--peer-cert/--peer-key; --insecure-peers runs it in plaintext"
                .to_owned(),
        ),
    }
}

/// Raft's timing and leadership placement.
fn set_timing(config: &mut ElectionConfig, args: &ElectionArgs) {
    config.heartbeat = Duration::from_millis(args.heartbeat_ms);
    config.never_lead = args.never_lead;
    config.placement = Placement {
        priority: args.priority,
        checks: args.priority_checks,
        every: Duration::from_millis(args.priority_check_ms),
    };
    config.timing_seed = args.timing_seed;
    config.election_timeout = (
        Duration::from_millis(args.election_timeout_ms.0),
        Duration::from_millis(args.election_timeout_ms.1),
    );
    config.lease_margin = args.lease_margin_ms.map(Duration::from_millis);
}

/// The bounds on leases, snapshots, waiters and requests.
fn set_limits(config: &mut ElectionConfig, args: &ElectionArgs) {
    config.ttl_range = (
        Duration::from_millis(args.min_ttl_ms),
        Duration::from_millis(args.max_ttl_ms),
    );
    config.snapshot_every = args.snapshot_every;
    config.max_waiters = args.max_waiters;
    config.max_requests = args.max_requests as usize;
    config.max_wait = Duration::from_millis(args.max_wait_ms.min(60_000));
    config.body_deadline = Duration::from_millis(args.body_deadline_ms);
    config.reclaim_after = Duration::from_millis(args.reclaim_after_ms);
    config.max_leases = args.max_leases;
    config.history_len = args.history_len;
    config.partitions = args.partitions;
    config.max_leases_per_principal = args
        .max_leases_per_principal
        .unwrap_or(args.max_leases / 4)
        .max(1);
}

/// The gateway whose refused writes the status page shows, with the key
/// read from --ui-gateway-key-file.
fn ui_gateway(args: &ElectionArgs) -> Result<Option<UiGateway>, String> {
    let Some(url) = &args.ui_gateway else {
        return Ok(None);
    };
    let key = match &args.ui_gateway_key_file {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(key) => Some(key.trim().to_owned()),
            Err(err) => {
                return Err(format!(
                    "cannot read --ui-gateway-key-file {}: {err}",
                    path.display()
                ))
            }
        },
        None => None,
    };
    Ok(Some(UiGateway {
        url: url.clone(),
        key,
        ca: args.ui_gateway_ca.clone(),
    }))
}
