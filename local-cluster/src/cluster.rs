use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use crate::error::Error;
use crate::node::Node;
use crate::ports::free_ports;
use crate::ready;
use crate::spec::{Logs, NodeSpec, PeerAuth, Role};

/// How long one look at a node may take in a leader lookup.
const PROBE: Duration = Duration::from_secs(1);

/// How one election node of a [`Cluster`] runs.
#[derive(Debug, Clone)]
pub struct NodeSetup {
    /// Its data directory (kept across restarts).
    pub data_dir: PathBuf,
    /// The IP it listens on, for clients and for peers.
    pub host: String,
    /// Its client API port; 0 picks a free one when the cluster starts
    /// (peers must know every port before any node starts, so the OS
    /// cannot pick it).
    pub port: u16,
    /// Its peer listener's port; 0 as for `port`.
    pub peer_port: u16,
    /// Whether its connections to peers leave from `host` (`--source-ip`),
    /// as nodes on their own loopback addresses need for partitions to cut
    /// them; otherwise the kernel chooses.
    pub source_ip: bool,
    /// Extra flags.
    pub args: Vec<String>,
    /// Extra environment (`RUST_LOG`, libfaketime, ...).
    pub env: Vec<(String, String)>,
    /// Where its logs go.
    pub logs: Logs,
}

impl NodeSetup {
    /// A node on 127.0.0.1 with free ports and its data in `data_dir`,
    /// logs discarded.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            host: "127.0.0.1".into(),
            port: 0,
            peer_port: 0,
            source_ip: false,
            args: Vec::new(),
            env: Vec::new(),
            logs: Logs::Discard,
        }
    }
}

/// What [`Cluster::start`] starts.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Node `i + 1` runs as `nodes[i]`.
    pub nodes: Vec<NodeSetup>,
    /// How the nodes authenticate each other.
    pub peer_auth: PeerAuth,
    /// If set, every start of a node waits this long for its `listening
    /// on` line (and fails without it).
    pub wait_listening: Option<Duration>,
    /// Serve the client API over TLS (`--client-tls`, with the
    /// certificates of [`PeerAuth::Certs`]); URLs are then `https://`.
    pub client_tls: bool,
    /// The policy file every node enforces (`--policy`); `None`: open.
    pub policy: Option<PathBuf>,
}

impl ClusterConfig {
    /// `size` nodes as [`NodeSetup::new`] says, node `id` keeping its data
    /// in `dir/election-<id>`; not waited for.
    pub fn new(dir: &Path, size: u64, peer_auth: PeerAuth) -> Self {
        Self {
            nodes: (1..=size)
                .map(|id| NodeSetup::new(dir.join(format!("election-{id}"))))
                .collect(),
            peer_auth,
            wait_listening: None,
            client_tls: false,
            policy: None,
        }
    }
}

/// An election cluster of `palisade election` processes on this machine.
/// Nodes are numbered from 1; each keeps its addresses and data dir across
/// kills and restarts. Every node is killed when the cluster is dropped.
#[derive(Debug)]
pub struct Cluster {
    binary: PathBuf,
    /// Node `i + 1`'s setup, its ports chosen: it starts this way every
    /// time.
    setups: Vec<NodeSetup>,
    /// From [`ClusterConfig::peer_auth`].
    peer_auth: PeerAuth,
    /// Node `i + 1`'s process; `None` while it is killed.
    nodes: Vec<Option<Node>>,
    /// From [`ClusterConfig::wait_listening`].
    wait_listening: Option<Duration>,
    /// From [`ClusterConfig::client_tls`].
    client_tls: bool,
    /// From [`ClusterConfig::policy`].
    policy: Option<PathBuf>,
}

impl Cluster {
    /// Starts every node of `config` from `binary`, in order.
    ///
    /// # Errors
    /// No free ports, or a node could not start (or, with
    /// `wait_listening`, did not listen).
    pub fn start(binary: &Path, config: ClusterConfig) -> Result<Self, Error> {
        let mut setups = config.nodes;
        let wanted = setups
            .iter()
            .flat_map(|s| [s.port, s.peer_port])
            .filter(|port| *port == 0)
            .count();
        let mut free = free_ports(wanted)?.into_iter();
        for port in setups
            .iter_mut()
            .flat_map(|s| [&mut s.port, &mut s.peer_port])
            .filter(|port| **port == 0)
        {
            *port = free.next().unwrap_or(0);
        }
        let mut cluster = Self {
            binary: binary.to_owned(),
            nodes: setups.iter().map(|_| None).collect(),
            setups,
            peer_auth: config.peer_auth,
            wait_listening: config.wait_listening,
            client_tls: config.client_tls,
            policy: config.policy,
        };
        for id in cluster.ids() {
            cluster.start_node(id)?;
        }
        Ok(cluster)
    }

    /// The node ids, `1..=size`.
    pub fn ids(&self) -> std::ops::RangeInclusive<u64> {
        1..=self.setups.len() as u64
    }

    /// Starts (or restarts) node `id` on its address and data dir.
    ///
    /// # Errors
    /// As [`Node::start`] and [`Node::wait_listening`].
    ///
    /// # Panics
    /// If the cluster has no node `id`.
    pub fn start_node(&mut self, id: u64) -> Result<(), Error> {
        let mut node = Node::start(&self.binary, self.spec(id))?;
        if let Some(timeout) = self.wait_listening {
            node.wait_listening(timeout)?;
        }
        self.nodes[index(id)] = Some(node);
        Ok(())
    }

    /// How node `id` starts.
    fn spec(&self, id: u64) -> NodeSpec {
        let setup = &self.setups[index(id)];
        let mut args = Vec::new();
        if self.client_tls {
            args.push("--client-tls".to_owned());
        }
        if let Some(policy) = &self.policy {
            args.extend(["--policy".to_owned(), policy.display().to_string()]);
        }
        args.extend(setup.args.iter().cloned());
        NodeSpec {
            role: Role::Election {
                id,
                peers: self.ids().map(|id| (id, self.peer_addr(id))).collect(),
                source_ip: setup.source_ip.then(|| setup.host.clone()),
                peer_auth: self.peer_auth.clone(),
            },
            listen: format!("{}:{}", setup.host, setup.port),
            data_dir: setup.data_dir.clone(),
            args,
            env: setup.env.clone(),
            logs: setup.logs.clone(),
        }
    }

    /// SIGKILLs node `id` (nothing if it is not running).
    pub fn kill(&mut self, id: u64) {
        if let Some(mut node) = self.nodes.get_mut(index(id)).and_then(Option::take) {
            node.kill();
        }
    }

    /// SIGSTOPs node `id`.
    ///
    /// # Errors
    /// [`Error::NotRunning`] if it is killed; as [`Node::pause`].
    pub fn pause(&self, id: u64) -> Result<(), Error> {
        self.running(id)?.pause()
    }

    /// SIGCONTs node `id`.
    ///
    /// # Errors
    /// As [`Cluster::pause`].
    pub fn resume(&self, id: u64) -> Result<(), Error> {
        self.running(id)?.resume()
    }

    /// Whether node `id` is running (started and not killed since).
    pub fn is_running(&self, id: u64) -> bool {
        self.node(id).is_some()
    }

    /// Node `id`'s process, while it is running.
    pub fn node(&self, id: u64) -> Option<&Node> {
        self.nodes.get(index(id))?.as_ref()
    }

    /// Every running node (e.g. for [`crate::stop_gracefully`]).
    pub fn running_nodes(&mut self) -> impl Iterator<Item = &mut Node> {
        self.nodes.iter_mut().flatten()
    }

    /// The exit status of a running node that has exited on its own, if any.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.running_nodes().find_map(Node::exited)
    }

    /// Every running node that has exited on its own: its id and exit
    /// status (it stays counted as running until [`Cluster::start_node`] or
    /// [`Cluster::kill`]).
    pub fn exited_nodes(&mut self) -> Vec<(u64, ExitStatus)> {
        (1..)
            .zip(self.nodes.iter_mut())
            .filter_map(|(id, node)| Some((id, node.as_mut()?.exited()?)))
            .collect()
    }

    /// Node `id`'s client URL.
    ///
    /// # Panics
    /// If the cluster has no node `id` (so do the other accessors by id).
    pub fn url(&self, id: u64) -> String {
        let setup = &self.setups[index(id)];
        let scheme = if self.client_tls { "https" } else { "http" };
        format!("{scheme}://{}:{}", setup.host, setup.port)
    }

    /// Where node `id`'s peers reach it: `host:port` of its peer listener.
    pub fn peer_addr(&self, id: u64) -> String {
        let setup = &self.setups[index(id)];
        format!("{}:{}", setup.host, setup.peer_port)
    }

    /// Node `id`'s setup, with the ports it was given.
    pub fn setup(&self, id: u64) -> &NodeSetup {
        &self.setups[index(id)]
    }

    /// Node `id`'s setup to change: its next [`Cluster::start_node`] runs
    /// it so (its ports are fixed once the cluster started: peers know them).
    pub fn setup_mut(&mut self, id: u64) -> &mut NodeSetup {
        &mut self.setups[index(id)]
    }

    /// Every node's client URL, in id order.
    pub fn urls(&self) -> Vec<String> {
        self.ids().map(|id| self.url(id)).collect()
    }

    /// A running node among `ids` that says it leads (of several, the one of
    /// the newest term), polled up to `polls` times 50 ms apart.
    pub async fn leader_among(
        &self,
        client: &reqwest::Client,
        ids: &[u64],
        polls: u32,
    ) -> Option<u64> {
        self.poll_leader(client, ids, polls, false).await
    }

    /// A leader that can grant: it leads and its signing key is installed.
    /// Polled up to `polls` times 50 ms apart.
    pub async fn granting_leader(&self, client: &reqwest::Client, polls: u32) -> Option<u64> {
        let ids: Vec<u64> = self.ids().collect();
        self.poll_leader(client, &ids, polls, true).await
    }

    async fn poll_leader(
        &self,
        client: &reqwest::Client,
        ids: &[u64],
        polls: u32,
        needs_key: bool,
    ) -> Option<u64> {
        for _ in 0..polls {
            // Every node at once, each for at most PROBE: a stopped node
            // costs one PROBE a round, not a client timeout.
            let mut probes = tokio::task::JoinSet::new();
            for id in ids.iter().copied().filter(|id| self.is_running(*id)) {
                let (client, url) = (client.clone(), self.url(id));
                probes.spawn(async move {
                    let probe = async {
                        let term = ready::leading_term(&client, &url).await?;
                        let usable =
                            !needs_key || ready::signing_key_installed(&client, &url).await;
                        usable.then_some((term, id))
                    };
                    tokio::time::timeout(PROBE, probe).await.ok().flatten()
                });
            }
            // Of the nodes that say they lead, the one of the newest term: a
            // leader cut off from its peers says so until it hears of it.
            let newest = probes.join_all().await.into_iter().flatten().max();
            if let Some((_, id)) = newest {
                return Some(id);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    fn running(&self, id: u64) -> Result<&Node, Error> {
        self.node(id).ok_or_else(|| Error::NotRunning {
            name: format!("election-{id}"),
        })
    }
}

/// Node ids start at 1.
fn index(id: u64) -> usize {
    (id as usize).wrapping_sub(1)
}
