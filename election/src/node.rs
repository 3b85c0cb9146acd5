//! [`ElectionNode`]: opens storage, starts Raft, bootstraps the cluster, runs
//! the leader duties, and serves HTTP until shutdown.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::{BasicNode, Config, SnapshotPolicy};
use tokio::net::TcpListener;

use crate::api::{self, ApiState};
use crate::command::{Command, CommandResult, KeySecret};
use crate::incarnation::Incarnations;
use crate::lessor::Lessor;
use crate::log_store::SledLogStore;
use crate::network::{peer_router, PeerDialer};
use crate::placement::{place_leadership, Standing};
use crate::propose::Proposer;
use crate::read_batcher::ReadBatcher;
use crate::retirement::KeyRetirer;
use crate::signing::{generate_key, TokenCache};
use crate::state_machine::{SharedState, StateMachine};
use crate::{ElectionConfig, Raft};

/// How long a stopping node waits for requests in flight (a blocking acquire
/// or watch is cut short; its client retries elsewhere).
pub const DRAIN: Duration = Duration::from_secs(5);

/// A running election node.
#[derive(Debug)]
pub struct ElectionNode {
    /// The node's API state (Raft, table, lessor).
    pub state: ApiState,
    /// The client API's bound address.
    pub local_addr: std::net::SocketAddr,
    /// The peer listener's bound address.
    pub peer_addr: std::net::SocketAddr,
    listener: TcpListener,
    peer_listener: TcpListener,
    /// The peer listener's TLS (mutual); `None` with `--insecure-peers`.
    peer_tls: Option<Arc<palisade_serve::rustls::ServerConfig>>,
    /// The client API's TLS; `None` for plain HTTP.
    client_tls: Option<Arc<palisade_serve::rustls::ServerConfig>>,
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

fn io_err(err: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(err.to_string())
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
        std::fs::create_dir_all(&config.data_dir)?;
        // The log and snapshots hold the cluster's signing key: the data dir
        // is its owner's alone (the binary also sets umask 077, so the files
        // sled creates inside are 0600).
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&config.data_dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let db = sled::Config::new()
            .path(config.data_dir.join("raft"))
            .cache_capacity(64 * 1024 * 1024)
            .flush_every_ms(Some(1000))
            .open()
            .map_err(io_err)?;
        let incarnations = Arc::new(Incarnations::open(&db)?);
        let state_machine = StateMachine::open(&db)?;
        let shared = state_machine.shared();
        let log_store = SledLogStore::open(&db, shared.metrics.log_fsync_seconds.clone())?;

        let (election_timeout_min, election_timeout_max) = config.raft_election_timeout();
        if let Some(seed) = config.timing_seed {
            tracing::info!(
                seed,
                timeout_ms = election_timeout_min,
                "seeded election timing: one fixed election timeout"
            );
        }
        let raft_config = Config {
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
            // `--never-lead`: no election timer; transfers are refused in
            // `network.rs`.
            enable_elect: !config.never_lead,
            ..Config::default()
        }
        .validate()
        .map_err(io_err)?;
        let dialer = PeerDialer::new(
            config.id,
            incarnations.clone(),
            Duration::from_millis(200),
            config.source_ip,
            config.peer_tls.as_ref(),
        )
        .map_err(io_err)?;
        // Refuse to start with TLS material that does not load, before
        // anything is bound.
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
        let network = dialer.clone();
        let client_tls = match &config.client_tls {
            Some((cert, key)) => {
                Some(palisade_serve::tls::server_config(cert, key, None).map_err(io_err)?)
            }
            None => None,
        };
        let raft = Raft::new(
            config.id,
            Arc::new(raft_config),
            network,
            log_store,
            state_machine,
        )
        .await
        .map_err(io_err)?;
        let raft = Arc::new(raft);

        if !raft.is_initialized().await.map_err(io_err)? {
            let members: std::collections::BTreeMap<_, _> = config
                .peers
                .iter()
                .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
                .collect();
            match raft.initialize(members).await {
                Ok(()) => {
                    tracing::info!(peers = ?config.peers, "initialized a fresh cluster membership")
                }
                Err(err) => tracing::info!(%err, "not initializing: the cluster already exists"),
            }
        }

        let listener = TcpListener::bind(config.listen).await?;
        let local_addr = listener.local_addr()?;
        let peer_listener = TcpListener::bind(config.peer_listen_addr().map_err(io_err)?).await?;
        let peer_addr = peer_listener.local_addr()?;
        let lessor = Arc::new(Lessor::default());
        let (reads, read_rounds) = ReadBatcher::start(raft.clone(), config.quorum_timeout);
        let config = Arc::new(config);
        let proposer = Proposer::new(
            raft.clone(),
            config.id,
            config.quorum_timeout,
            shared.metrics.proposal_failures.clone(),
        );
        let state = ApiState {
            raft: raft.clone(),
            proposer: proposer.clone(),
            shared: shared.clone(),
            lessor: lessor.clone(),
            config: config.clone(),
            forwarder: dialer,
            incarnations: incarnations.clone(),
            waiters: Arc::new(tokio::sync::Semaphore::new(config.max_waiters)),
            signer: Arc::new(Mutex::new(None)),
            jwts: Arc::default(),
            reads,
        };
        let duties = Duties(vec![
            tokio::spawn(leader_duties(
                raft.clone(),
                proposer,
                shared,
                lessor,
                // The longest a JWT lives (renewals reuse one signed for
                // `LIFETIME_TTLS` ttls), plus the second `exp` rounds up to.
                KeyRetirer::new(
                    config.ttl_range.1 * TokenCache::LIFETIME_TTLS as u32 + Duration::from_secs(2),
                ),
                config.reclaim_after,
            )),
            tokio::spawn(place_leadership(
                raft.clone(),
                state.forwarder.clone(),
                config.id,
                config.placement,
                state.shared.metrics.leader_transfers.clone(),
            )),
            tokio::spawn(acquaint_peers(
                raft.clone(),
                state.forwarder.clone(),
                incarnations.clone(),
                config.id,
            )),
            tokio::spawn(report_waiting(raft.clone(), config)),
            tokio::spawn(forget_removed_nodes(raft, incarnations.clone())),
            read_rounds,
        ]);
        Ok(Self {
            state,
            local_addr,
            peer_addr,
            listener,
            peer_listener,
            peer_tls,
            client_tls,
            duties,
        })
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
        let api = api::router(self.state.clone());
        let raft = self.state.raft.clone();
        let peers = peer_router(
            raft.clone(),
            self.state.incarnations.clone(),
            api.clone(),
            self.peer_tls.is_some(),
            Standing {
                priority: self.state.config.placement.priority,
                never_lead: self.state.config.never_lead,
            },
        );
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let signal = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|&s| s).await;
        };
        let mut client_config = palisade_serve::ServeConfig::new("client API");
        client_config.drain = DRAIN;
        client_config.tls = self.client_tls.clone();
        let mut peer_config = palisade_serve::ServeConfig::new("peer RPC");
        peer_config.drain = DRAIN;
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
        if let Err(err) = raft.shutdown().await {
            tracing::warn!(%err, "raft did not shut down cleanly");
        }
        served.and(peer_served)
    }
}

/// Learns every member's incarnation as soon as both are up, by calling
/// each member it has not met (an authenticated `POST /raft/standing`:
/// the request teaches the peer this node's incarnation, the answer teaches
/// this node the peer's). Raft alone never makes two followers talk: a
/// follower that never met another could not tell that one came back
/// without its data, and would vote for it (seen: a wiped follower elected
/// with the vote of the other, which it had never met, one run in five).
/// Every 100 ms for the first 10 s, then every 2 s; nothing is sent once
/// every member is known.
async fn acquaint_peers(
    raft: Arc<Raft>,
    dialer: crate::network::PeerDialer,
    incarnations: Arc<Incarnations>,
    me: crate::NodeId,
) {
    let started = tokio::time::Instant::now();
    loop {
        let pause = if started.elapsed() < Duration::from_secs(10) {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(2)
        };
        tokio::time::sleep(pause).await;
        let metrics = raft.metrics().borrow_watched().clone();
        let strangers: Vec<(crate::NodeId, String)> = metrics
            .membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != me && !incarnations.knows(**id))
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect();
        dialer
            .standings(&strangers, Duration::from_millis(500))
            .await;
    }
}

/// The most free leases one `Reclaim` entry names (~50 KB).
const RECLAIM_BATCH: usize = 1000;

/// What the leader alone does: track lease deadlines (promote on taking over,
/// demote on losing it), propose `Expire` for passed deadlines, `Reclaim` for
/// leases free for `reclaim_after`, retire rotated-out keys, and install the
/// signing key if the cluster has none.
async fn leader_duties(
    raft: Arc<Raft>,
    proposer: Proposer,
    shared: SharedState,
    lessor: Arc<Lessor>,
    mut retirer: KeyRetirer,
    reclaim_after: Duration,
) {
    let retirer_failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Set while an InstallKey proposal is in flight; cleared when it ends, so
    // a failed proposal (a fresh leader refusing writes for a moment) is
    // retried on the next tick.
    let installing_key = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Set while a Reclaim proposal is in flight: one at a time.
    let reclaiming = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut seen_leader = None;
    loop {
        tick.tick().await;
        // Drained on every node, leader or not, so the feed stays small.
        let touched = shared.take_touched();
        let metrics = raft.metrics().borrow_watched().clone();
        if metrics.current_leader != seen_leader {
            if seen_leader.is_some() {
                shared.metrics.leader_changes.inc();
            }
            seen_leader = metrics.current_leader;
        }
        let leading = crate::leads(&metrics);
        if !leading {
            if lessor.leading().is_some() {
                tracing::info!(
                    term = metrics.current_term,
                    "no longer leader: lease expiry stops here"
                );
            }
            lessor.demote();
            continue;
        }
        if lessor.leading() != Some(metrics.current_term) {
            tracing::info!(
                term = metrics.current_term,
                "became leader: every held lease gets a full ttl from now"
            );
            lessor.promote(metrics.current_term);
        }
        let reclaim_now = !reclaiming.load(std::sync::atomic::Ordering::SeqCst);
        let (expired, reclaim, has_key, retiring) = shared.read(|s| {
            let previous = s.table.previous_keys.iter().map(|k| k.kid.as_str());
            // Whether each is a reservation nobody had claimed, as the
            // lessor tracked it (a claim seen since is tracked afresh).
            let expired: Vec<_> = lessor
                .reconcile_changes(&s.table, &touched)
                .into_iter()
                .map(|(lease, token)| {
                    let unclaimed = lessor.is_reservation(&lease, token);
                    (lease, token, unclaimed)
                })
                .collect();
            let reclaim = if reclaim_now {
                lessor.reclaimable(&s.table, reclaim_after, RECLAIM_BATCH)
            } else {
                Vec::new()
            };
            (
                expired,
                reclaim,
                s.table.signing_key.is_some(),
                retirer.due(metrics.current_term, previous),
            )
        });
        if !reclaim.is_empty() {
            reclaiming.store(true, std::sync::atomic::Ordering::SeqCst);
            let (proposer, reclaiming) = (proposer.clone(), reclaiming.clone());
            tokio::spawn(async move {
                let count = reclaim.len();
                let command = Command::Reclaim { leases: reclaim };
                match proposer.propose(command).await {
                    Ok(_) => tracing::debug!(count, "reclaimed free leases"),
                    Err(err) => {
                        tracing::debug!(%err, "could not reclaim free leases; the next full scan finds them again")
                    }
                }
                reclaiming.store(false, std::sync::atomic::Ordering::SeqCst);
            });
        }
        for kid in std::mem::take(
            &mut *retirer_failures
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ) {
            retirer.failed(&kid);
        }
        for kid in retiring {
            let (proposer, failures) = (proposer.clone(), retirer_failures.clone());
            tokio::spawn(async move {
                match proposer
                    .propose(Command::RetireKey { kid: kid.clone() })
                    .await
                {
                    Ok(_) => tracing::info!(%kid, "retired a rotated-out signing key"),
                    Err(_) => failures
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(kid),
                }
            });
        }
        for (lease, token, unclaimed) in expired {
            let (proposer, lessor) = (proposer.clone(), lessor.clone());
            tokio::spawn(async move {
                let command = Command::Expire {
                    lease: lease.clone(),
                    token,
                    unclaimed,
                };
                match proposer.propose(command).await {
                    Ok(CommandResult::Freed) => tracing::info!(%lease, %token, "lease expired"),
                    // Not applied: released or replaced meanwhile (the feed
                    // drops it), or a reservation claimed first (tracked
                    // afresh). Re-armed in case the lessor still holds it.
                    Ok(_) | Err(_) => lessor.expire_failed(&lease, token),
                }
            });
        }
        if !has_key && !installing_key.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let (proposer, installing_key) = (proposer.clone(), installing_key.clone());
            tokio::spawn(async move {
                let (kid, secret) = generate_key();
                let command = Command::InstallKey {
                    kid: kid.clone(),
                    secret: KeySecret(secret),
                };
                match proposer.propose(command).await {
                    Ok(_) => tracing::info!(%kid, "installed the cluster signing key"),
                    Err(err) => {
                        tracing::debug!(%err, "could not install a signing key yet; retrying")
                    }
                }
                installing_key.store(false, std::sync::atomic::Ordering::SeqCst);
            });
        }
    }
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

/// Forgets the incarnations of nodes that left the membership, so a node
/// removed and added back (with a fresh data dir) is learned afresh.
async fn forget_removed_nodes(raft: Arc<Raft>, incarnations: Arc<Incarnations>) {
    let mut membership = raft.metrics();
    loop {
        let members: Vec<crate::NodeId> = membership
            .borrow_watched()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect();
        if !members.is_empty() {
            incarnations.forget_all_but(&members);
        }
        if membership.changed().await.is_err() {
            return;
        }
    }
}
