//! [`ElectionNode`]: opens storage, starts Raft, bootstraps the cluster,
//! starts the background duties, and serves both listeners until shutdown.
//! Wiring only: each part lives in its own module.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::{BasicNode, Config, SnapshotPolicy};
use palisade_serve::admission::{Admission, Seats};
use palisade_serve::rustls::ServerConfig;
use palisade_serve::tls::ClientCerts;
use tokio::net::TcpListener;

use crate::api;
use crate::api::state::{ApiParts, ApiState};
use crate::api::StatusPage;
use crate::config::ElectionConfig;
use crate::group::Group;
use crate::group_id::GroupId;
use crate::io_error::io_err;
use crate::leader::duties::LeaderDuties;
use crate::leader::lessor::Lessor;
use crate::leader::placement::{learn_standings, place_leadership, Placing};
use crate::leader::retirement::KeyRetirer;
use crate::metrics::ElectionMetrics;
use crate::peer::acquaint::{acquaint_peers, forget_removed_nodes};
use crate::peer::dialer::PeerDialer;
use crate::peer::incarnation::Incarnations;
use crate::peer::server::peer_router;
use crate::peer::settings::{PeerSettings, Settings};
use crate::peer::standing::Standing;
use crate::raft::applied::SharedState;
use crate::raft::durable::Durable;
use crate::raft::log_store::SledLogStore;
use crate::raft::propose::Proposer;
use crate::raft::read_batcher::ReadBatcher;
use crate::raft::state_machine::StateMachine;
use crate::raft::Raft;
use crate::signing::TokenCache;

/// How long a stopping node waits for requests in flight (a blocking acquire
/// or watch is cut short; its client retries elsewhere).
pub const DRAIN: Duration = Duration::from_secs(5);

/// A running election node.
#[derive(Debug)]
pub struct ElectionNode {
    /// The node's API state (Raft, table, lessor).
    pub state: ApiState,
    /// The status pages' state (the gateway they read, the sessions).
    status: Arc<StatusPage>,
    /// The client API's bound address.
    pub local_addr: std::net::SocketAddr,
    /// The peer listener's bound address.
    pub peer_addr: std::net::SocketAddr,
    listener: TcpListener,
    peer_listener: TcpListener,
    /// The peer listener's TLS (mutual); `None` with `--insecure-peers`.
    peer_tls: Option<Arc<ServerConfig>>,
    /// The client API's TLS; `None` for plain HTTP.
    client_tls: Option<Arc<ServerConfig>>,
    /// Background duties, stopped when the node is dropped.
    duties: Duties,
}

/// Owns the node's background tasks and aborts them on drop.
#[derive(Debug)]
struct Duties(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Duties {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// What a node keeps on disk, opened: the database every group shares, the
/// node's metrics and peers' incarnations, and the cluster's partitions.
struct Storage {
    durable: Durable,
    metrics: Arc<ElectionMetrics>,
    incarnations: Arc<Incarnations>,
    settings: Arc<PeerSettings>,
    partitions: u32,
}

impl ElectionNode {
    /// Opens the data dir, starts Raft and binds the listener. A fresh node
    /// initializes the cluster with the whole `peers` membership (every fresh
    /// node does the same, with the same membership, which openraft allows);
    /// a node with data resumes from it.
    ///
    /// # Errors
    /// Storage, Raft or bind failures.
    pub async fn start(config: ElectionConfig) -> std::io::Result<Self> {
        config.validate().map_err(io_err)?;
        let storage = open_storage(&config)?;
        let dialer = PeerDialer::new(
            config.id,
            (
                storage.incarnations.clone(),
                storage.settings.clone(),
                storage.metrics.clone(),
            ),
            Duration::from_millis(200),
            config.source_ip,
            config.peer_tls.as_ref(),
        )
        .map_err(io_err)?;
        let dialer = if storage.partitions > 1 {
            dialer.carrying_beats_together()
        } else {
            dialer
        };
        // Refuse to start with TLS material that does not load, before
        // anything is bound.
        let (peer_tls, client_tls) = load_tls(&config)?;
        let mut groups = Vec::new();
        let mut read_rounds = Vec::new();
        for id in GroupId::all(storage.partitions) {
            let keys = groups.first().map(|zero: &Group| zero.keys.clone());
            let (group, rounds) = start_group(id, &config, &storage, &dialer, keys).await?;
            groups.push(group);
            read_rounds.push(rounds);
        }
        let listener = TcpListener::bind(config.listen).await?;
        let peer_listener = TcpListener::bind(config.peer_listen_addr().map_err(io_err)?).await?;
        let state = api_state(
            groups,
            storage.metrics,
            Arc::new(config),
            dialer,
            (storage.incarnations, storage.settings),
        );
        let status = StatusPage::new(&state.config);
        let mut duties = spawn_duties(&state, &status);
        duties.0.extend(read_rounds);
        Ok(Self {
            local_addr: listener.local_addr()?,
            peer_addr: peer_listener.local_addr()?,
            state,
            status,
            listener,
            peer_listener,
            peer_tls,
            client_tls,
            duties,
        })
    }

    /// The client API's router, status pages included.
    pub fn router(&self) -> axum::Router {
        api::router(self.state.clone(), self.status.clone())
    }

    /// Serves the client API and the peer listener until `shutdown`, drains
    /// requests in flight for at most [`DRAIN`], then stops Raft.
    ///
    /// # Errors
    /// A listener's error.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let api = self.router();
        let rafts: Vec<_> = self
            .state
            .groups()
            .iter()
            .map(|g| (g.id, g.raft.clone()))
            .collect();
        let peers = peer_router(
            &rafts,
            (self.state.incarnations.clone(), self.state.settings.clone()),
            api.clone(),
            self.peer_tls.is_some(),
            (
                Standing::of(&self.state.config),
                figures_source(&self.state),
            ),
        );
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let signal = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|&s| s).await;
        };
        let mut client_config = palisade_serve::ServeConfig::new("client API");
        client_config.drain = DRAIN;
        client_config.max_requests = self.state.config.max_requests;
        client_config.tls = self.client_tls.clone();
        let mut peer_config = palisade_serve::ServeConfig::new("peer RPC");
        peer_config.drain = DRAIN;
        // Only members get past the peer listener's TLS (a silent stranger
        // is cut by the handshake timeout): an idle forwarding connection to
        // the leader is kept, not closed under a request about to use it.
        peer_config.idle_timeout = Duration::from_secs(3600);
        peer_config.tls = self.peer_tls.clone();
        let client =
            palisade_serve::serve(self.listener, api, client_config, signal(stopped.clone()));
        let peer = palisade_serve::serve(self.peer_listener, peers, peer_config, signal(stopped));
        let trigger = async move {
            shutdown.await;
            let _ = stop.send(true);
        };
        let (served, peer_served, ()) = tokio::join!(client, peer, trigger);
        drop(self.duties);
        for (group, raft) in rafts {
            if let Err(err) = raft.shutdown().await {
                tracing::warn!(%err, %group, "raft did not shut down cleanly");
            }
        }
        served.and(peer_served)
    }
}

/// Opens the node's sled database in its data dir (0700: the log and
/// snapshots hold the cluster's signing key; the binary also sets umask 077,
/// so the files sled creates inside are 0600).
fn open_storage(config: &ElectionConfig) -> std::io::Result<Storage> {
    std::fs::create_dir_all(&config.data_dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&config.data_dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let durable = Durable::open(&config.data_dir.join("raft"))?;
    let incarnations = Arc::new(Incarnations::open(&durable)?);
    let partitions = durable.partitions(config.partitions)?;
    let rule = config.renew_lease();
    let settings = Arc::new(PeerSettings::new(Settings {
        partitions,
        lease_ms: rule.lease.as_millis() as u64,
        margin_ms: rule.margin.as_millis() as u64,
    }));
    Ok(Storage {
        durable,
        metrics: Arc::default(),
        incarnations,
        settings,
        partitions,
    })
}

/// Opens group `id`'s storage, starts its Raft (initializing a fresh
/// cluster's) and builds the [`Group`], with its read rounds' task. `keys`
/// is group 0's applied state (`None` when this is group 0).
async fn start_group(
    id: GroupId,
    config: &ElectionConfig,
    storage: &Storage,
    dialer: &PeerDialer,
    keys: Option<SharedState>,
) -> std::io::Result<(Group, tokio::task::JoinHandle<()>)> {
    let names = id.names();
    let snapshots = names.snapshot_path(&config.data_dir);
    let metrics = storage.metrics.clone();
    let state_machine = StateMachine::open(&storage.durable, names, &snapshots, metrics.clone())?;
    let log_store = SledLogStore::open(&storage.durable, names, metrics.log_fsync_seconds.clone())?;
    let applied = state_machine.shared();
    let raft = Raft::new(
        config.id,
        Arc::new(raft_config(config, id)?),
        dialer.for_group(id),
        log_store,
        state_machine,
    )
    .await
    .map_err(io_err)?;
    let raft = Arc::new(raft);
    initialize_if_fresh(&raft, config).await?;
    let (reads, read_rounds) = ReadBatcher::start(raft.clone(), config.quorum_timeout);
    let proposer = Proposer::new(
        raft.clone(),
        config.id,
        config.quorum_timeout,
        metrics.proposal_failures.clone(),
        config.history_len,
    );
    let group = Group {
        id,
        raft,
        proposer,
        keys: keys.unwrap_or_else(|| applied.clone()),
        applied,
        // The longest any leader answers renewals on its lease.
        lessor: Arc::new(Lessor::with_takeover_grace(Duration::from_millis(
            config.group_election_timeout(id).1,
        ))),
        signer: Arc::new(Mutex::new(None)),
        tokens: Arc::default(),
        reads,
        handoff: Arc::default(),
        rule: config.renew_lease(),
        settings: storage.settings.clone(),
    };
    Ok((group, read_rounds))
}

/// openraft's configuration for `group` from the node's.
fn raft_config(config: &ElectionConfig, group: GroupId) -> std::io::Result<Config> {
    let (election_timeout_min, election_timeout_max) = config.group_election_timeout(group);
    if let Some(seed) = config.timing_seed {
        tracing::info!(
            seed,
            %group,
            timeout_ms = election_timeout_min,
            "seeded election timing: one fixed election timeout"
        );
    }
    Config {
        cluster_name: "palisade".into(),
        heartbeat_interval: config.heartbeat.as_millis() as u64,
        election_timeout_min,
        election_timeout_max,
        enable_pre_vote: Some(true),
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every),
        max_in_snapshot_log_to_keep: 1000,
        // Sending a snapshot of 100k leases (~10 MB) takes well over
        // openraft's 200 ms default; it blocks only that follower's
        // replication stream.
        install_snapshot_timeout: 60_000,
        // `--never-lead`: no election timer; transfers are refused by the
        // peer listener.
        enable_elect: !config.never_lead,
        ..Config::default()
    }
    .validate()
    .map_err(io_err)
}

/// The peer listener's TLS (mutual; `None` with `--insecure-peers`, loudly)
/// and the client API's (`None` for plain HTTP).
type ServerTls = Option<Arc<ServerConfig>>;

fn load_tls(config: &ElectionConfig) -> std::io::Result<(ServerTls, ServerTls)> {
    let peer_tls = match &config.peer_tls {
        Some(tls) => Some(
            palisade_serve::tls::server_config(&tls.cert, &tls.key, Some(&tls.ca))
                .map_err(io_err)?,
        ),
        None => {
            tracing::warn!(
                "PEER TRAFFIC IS NOT AUTHENTICATED OR ENCRYPTED (--insecure-peers): \
                 anyone who can reach the peer port can take this cluster over"
            );
            None
        }
    };
    // A client may present a certificate from the peers' CA (the same
    // `--certs` directory): a policy may name it as a principal.
    let clients = config.peer_tls.as_ref().map_or(ClientCerts::None, |tls| {
        ClientCerts::Optional(tls.ca.as_path())
    });
    let client_tls = match &config.client_tls {
        Some((cert, key)) => {
            Some(palisade_serve::tls::server_config_with(cert, key, clients).map_err(io_err)?)
        }
        None => None,
    };
    Ok((peer_tls, client_tls))
}

/// Initializes a fresh node with the whole `--peers` membership; a node
/// with data (or a cluster already formed) is left as it is.
async fn initialize_if_fresh(raft: &Raft, config: &ElectionConfig) -> std::io::Result<()> {
    if raft.is_initialized().await.map_err(io_err)? {
        return Ok(());
    }
    let members: BTreeMap<_, _> = config
        .peers
        .iter()
        .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
        .collect();
    match raft.initialize(members).await {
        Ok(()) => tracing::info!(peers = ?config.peers, "initialized a fresh cluster membership"),
        Err(err) => tracing::info!(%err, "not initializing: the cluster already exists"),
    }
    Ok(())
}

/// The state every client API handler shares.
fn api_state(
    groups: Vec<Group>,
    metrics: Arc<ElectionMetrics>,
    config: Arc<ElectionConfig>,
    dialer: PeerDialer,
    (incarnations, settings): (Arc<Incarnations>, Arc<PeerSettings>),
) -> ApiState {
    ApiState::new(ApiParts {
        groups,
        metrics,
        waiters: Arc::new(tokio::sync::Semaphore::new(config.max_waiters)),
        admission: Admission::new(Seats::within(config.max_requests)),
        config,
        dialer,
        incarnations,
        settings,
        series: Arc::default(),
        // A call over its share is refused before it opens a stream: the
        // pools may take every stream of the connection.
        forwarding: Admission::new(Seats::of(
            palisade_serve::ServeConfig::new("peer RPC").max_streams_per_connection as usize,
        )),
    })
}

/// Starts the node's background tasks: the leader's duties, leadership
/// placement, meeting and forgetting peers, the no-leader report and the
/// status page's sampler.
fn spawn_duties(state: &ApiState, status: &Arc<StatusPage>) -> Duties {
    let config = &state.config;
    let zero = state.group_zero();
    let mut duties = vec![
        tokio::spawn(acquaint_peers(
            zero.raft.clone(),
            state.dialer.clone(),
            state.incarnations.clone(),
            config.id,
        )),
        tokio::spawn(report_waiting(zero.raft.clone(), config.clone())),
        tokio::spawn(crate::api::sample_status(state.clone(), status.clone())),
        tokio::spawn(forget_removed_nodes(
            zero.raft.clone(),
            (state.incarnations.clone(), state.settings.clone()),
        )),
        tokio::spawn(crate::peer::settings::report_differences(
            state.settings.clone(),
        )),
    ];
    let known = Arc::default();
    if state.partitions() > 1 {
        duties.push(tokio::spawn(learn_standings(
            zero.raft.clone(),
            state.dialer.clone(),
            config.id,
            Arc::clone(&known),
            config.placement.every,
        )));
    }
    for group in state.groups() {
        // Only group 0 keeps the signing keys: its leader installs,
        // rotates and retires them.
        let retirer = (group.id == GroupId::ZERO).then(|| {
            // The longest a JWT lives (renewals reuse one signed for
            // `LIFETIME_TTLS` ttls), plus the second `exp` rounds up to.
            KeyRetirer::new(
                config.ttl_range.1 * TokenCache::LIFETIME_TTLS as u32 + Duration::from_secs(2),
            )
        });
        let leader = LeaderDuties::of(group, retirer, config.reclaim_after);
        duties.push(tokio::spawn(leader.run()));
        let placing = Placing {
            group: (group.id, state.partitions()),
            me: (config.id, Standing::of(config)),
            placement: config.placement,
            known: Arc::clone(&known),
        };
        duties.push(tokio::spawn(place_leadership(
            group.raft.clone(),
            group.handoff.clone(),
            state.dialer.for_group(group.id),
            placing,
            state.metrics.leader_transfers.clone(),
        )));
    }
    Duties(duties)
}

/// Logs, every few seconds, that there is no leader yet and whom we wait for.
async fn report_waiting(raft: Arc<Raft>, config: Arc<ElectionConfig>) {
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let metrics = raft.metrics().borrow_watched().clone();
        if metrics.current_leader.is_none() {
            let others: Vec<_> = config
                .peers
                .iter()
                .filter(|(id, _)| **id != config.id)
                .map(|(id, addr)| format!("{id}={addr}"))
                .collect();
            tracing::warn!(term = metrics.current_term, waiting_for = ?others, "no leader yet: waiting for a quorum of peers");
        }
    }
}

/// What this node tells a peer's status page (`POST /raft/figures`).
fn figures_source(state: &ApiState) -> crate::peer::figures::FiguresSource {
    let (raft, series) = (state.group_zero().raft.clone(), state.series.clone());
    Arc::new(move || crate::peer::figures::Figures::of(&raft, &series))
}
