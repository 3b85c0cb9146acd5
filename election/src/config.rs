//! [`ElectionConfig`]: one typed config per election node, with the relations
//! between settings checked in [`ElectionConfig::validate`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::raft::lease::RenewLease;
use crate::raft::NodeId;

pub mod ui;

pub use crate::group_id::MAX_PARTITIONS;
pub use ui::UiAccess;

/// The files of a node's peer identity: the cluster CA, and this node's
/// certificate (naming it `node-<id>.palisade`) and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTls {
    /// The cluster CA every peer certificate must chain to.
    pub ca: PathBuf,
    /// This node's certificate.
    pub cert: PathBuf,
    /// This node's private key.
    pub key: PathBuf,
}

/// How an election node runs.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// This node's id; must be a key of `peers`.
    pub id: NodeId,
    /// Where the client API listens. Raft RPC never arrives here.
    pub listen: SocketAddr,
    /// Where peers' Raft RPC and forwarded client requests arrive. `None`:
    /// this node's own entry in `peers` (its port on all interfaces when
    /// the entry names a host rather than an IP).
    pub peer_listen: Option<SocketAddr>,
    /// Mutual TLS between peers; `None` runs peer traffic in plaintext
    /// (only with the explicit `--insecure-peers`).
    pub peer_tls: Option<PeerTls>,
    /// TLS for the client API: (certificate, key). `None`: plain HTTP.
    pub client_tls: Option<(PathBuf, PathBuf)>,
    /// Who may call the client API ([`palisade_serve::policy`]); `None`
    /// runs it open to anyone who can reach it.
    pub policy: Option<std::sync::Arc<palisade_serve::policy::LivePolicy>>,
    /// The local address that Raft RPC and forwarded requests leave from;
    /// `None` lets the kernel choose. On a multi-homed host this pins peer
    /// traffic to one interface (the fault suite gives each node its own
    /// loopback address this way, so a partition can cut node pairs).
    pub source_ip: Option<std::net::IpAddr>,
    /// Directory for the sled database (log, vote, snapshots).
    pub data_dir: PathBuf,
    /// The whole initial voting membership: id -> `host:port` peers dial.
    pub peers: BTreeMap<NodeId, String>,
    /// Leader heartbeat period. Default 20 ms.
    pub heartbeat: Duration,
    /// A follower that hears nothing for a random time in this range runs a
    /// (pre-)election. Default 60..120 ms: measured failover (SIGKILL of the
    /// leader to the first acquire through a survivor) has a median near
    /// 220 ms on loopback, against ~330 ms with 100..200 ms; still 3x the
    /// heartbeat, and no spurious elections were seen at 64 concurrent
    /// clients on 2 cores.
    pub election_timeout: (Duration, Duration),
    /// Taken off the leader lease a renewal is answered under, for the
    /// drift of clock rates between nodes (`raft::lease`); `None`: a tenth
    /// of the minimum election timeout (at least 1 ms), which covers a rate
    /// difference of 5%.
    pub lease_margin: Option<Duration>,
    /// The shortest and longest ttl a lease may ask for. Default 500 ms .. 1 h.
    pub ttl_range: (Duration, Duration),
    /// The longest `wait_ms` of a blocking acquire or watch. Default 60 s.
    pub max_wait: Duration,
    /// How many blocking acquires and watches may wait at once on this
    /// node; one more is answered 429 with `Retry-After`. Default 10 000.
    pub max_waiters: usize,
    /// Requests in flight at once on the client listener; admission per
    /// principal shares them out (`palisade_serve::admission::Seats::within`).
    /// Default 4 096.
    pub max_requests: usize,
    /// How long a request body may take to arrive once its handler reads
    /// it; a slower one is answered 408 and frees its slot. Default 5 s.
    pub body_deadline: Duration,
    /// How long a proposal or quorum confirmation may take before the client
    /// gets a 503. Default 2 s.
    pub quorum_timeout: Duration,
    /// A snapshot is built every this many log entries; older entries are
    /// purged. Default 10 000.
    pub snapshot_every: u64,
    /// How many transitions each lease's history keeps (1..=255). The
    /// leader stamps it into the entries it proposes, so a history is
    /// trimmed alike on every node whatever their own setting; a node that
    /// becomes leader applies its own from then on. Default 8.
    pub history_len: u16,
    /// A free lease's record leaves the table this long after it was freed
    /// (its name used again later starts afresh, with a higher token).
    /// Default 5 min.
    pub reclaim_after: Duration,
    /// An acquire naming a lease the table does not hold yet is refused
    /// (429 `too_many_leases`) once the table has this many; checked on the
    /// leader before proposing, so concurrent acquires may pass it by the
    /// number in flight. Bounds the table's memory (~200 bytes per lease
    /// plus its name, on every node). Default 1 000 000.
    pub max_leases: usize,
    /// Under a policy, the leases one principal may own — hold, or have held
    /// and not yet reclaimed — unless its policy entry sets `max_leases`;
    /// an acquire that would add one more is refused (429 `over_quota`).
    /// Checked like `max_leases`. Default a quarter of `max_leases`, so no
    /// principal fills the table alone.
    pub max_leases_per_principal: usize,
    /// This node votes and replicates but never becomes leader (ICE's
    /// "out of service"): it never starts an election and refuses a
    /// leadership transfer to it. A cluster needs a quorum of nodes that
    /// may lead among those up to elect. Default false.
    pub never_lead: bool,
    /// Leadership placement (ICE's server priority): the leader hands Raft
    /// leadership to a member of strictly higher priority once that member
    /// has answered and been caught up for `checks` checks in a row, one
    /// check every `every` ([`crate::leader::placement`]). Equal priorities never
    /// move leadership (the leader is sticky). Default: priority 0, 3
    /// checks, 1 s apart.
    pub placement: Placement,
    /// Replayable election timing: with a seed, this node's election timeout
    /// is one fixed value drawn from (seed, its id, the peer ids) inside
    /// `election_timeout` instead of a fresh random one per election
    /// ([`ElectionConfig::raft_election_timeout`]). Default `None`.
    pub timing_seed: Option<u64>,
    /// Raft groups (partitions) this cluster runs, 1..=[`MAX_PARTITIONS`]:
    /// each elects its own leader; a lease belongs to one for ever
    /// ([`crate::group_id::GroupId::of`]). Fixed when the data dir is
    /// created; a data dir made before partitions is 1. Default 1.
    pub partitions: u32,
    /// A gateway whose fencing audit the status page shows (`/ui`), with
    /// the API key and CA to call it with.
    pub ui_gateway: Option<UiGateway>,
    /// The status page's sign-in: the public URLs its forms may come from,
    /// and how long and how many sessions last ([`UiAccess`]).
    pub ui: UiAccess,
}

/// How a node takes part in leadership placement ([`crate::leader::placement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// This node's priority, 0..=[`Placement::MAX_PRIORITY`].
    pub priority: u32,
    /// Consecutive good checks before leadership moves (at least 1).
    pub checks: u32,
    /// The time between two checks.
    pub every: Duration,
}

impl Placement {
    /// The highest priority a node may have.
    pub const MAX_PRIORITY: u32 = 1000;
}

impl Default for Placement {
    fn default() -> Self {
        Self {
            priority: 0,
            checks: 3,
            every: Duration::from_secs(1),
        }
    }
}

/// Where the status page reads a gateway's refused writes from.
#[derive(Debug, Clone)]
pub struct UiGateway {
    /// The gateway's base URL.
    pub url: String,
    /// An API key with `read` on every lease, if the gateway has a policy.
    pub key: Option<String>,
    /// The CA (PEM) to trust for an https gateway.
    pub ca: Option<PathBuf>,
}

impl ElectionConfig {
    /// A config with the documented defaults.
    pub fn new(
        id: NodeId,
        listen: SocketAddr,
        data_dir: PathBuf,
        peers: BTreeMap<NodeId, String>,
    ) -> Self {
        Self {
            id,
            listen,
            peer_listen: None,
            peer_tls: None,
            client_tls: None,
            policy: None,
            source_ip: None,
            data_dir,
            peers,
            heartbeat: Duration::from_millis(20),
            election_timeout: (Duration::from_millis(60), Duration::from_millis(120)),
            lease_margin: None,
            ttl_range: (Duration::from_millis(500), Duration::from_secs(3600)),
            max_wait: Duration::from_secs(60),
            max_waiters: 10_000,
            body_deadline: Duration::from_secs(5),
            max_requests: 4096,
            quorum_timeout: Duration::from_secs(2),
            snapshot_every: 10_000,
            history_len: 8,
            reclaim_after: Duration::from_secs(300),
            max_leases: 1_000_000,
            max_leases_per_principal: 250_000,
            never_lead: false,
            placement: Placement::default(),
            timing_seed: None,
            partitions: 1,
            ui_gateway: None,
            ui: UiAccess::default(),
        }
    }

    /// Checks the relations between settings.
    ///
    /// # Errors
    /// A sentence naming the broken relation.
    pub fn validate(&self) -> Result<(), String> {
        if !self.peers.contains_key(&self.id) {
            return Err(format!(
                "--peers must include this node's own id {}",
                self.id
            ));
        }
        let peer = self.peer_listen_addr()?;
        if peer.port() == self.listen.port()
            && peer.port() != 0
            && (peer.ip() == self.listen.ip()
                || peer.ip().is_unspecified()
                || self.listen.ip().is_unspecified())
        {
            return Err(format!(
                "peer traffic ({peer}) must not share the client port ({}): give --peers the peer ports",
                self.listen
            ));
        }
        let (min, max) = self.election_timeout;
        if min >= max {
            return Err("election timeout min must be below its max".into());
        }
        if self.heartbeat * 2 > min {
            return Err("the heartbeat must be at most half the minimum election timeout".into());
        }
        let rule = self.renew_lease();
        if rule.margin * 50 < rule.lease {
            return Err(format!(
                "--lease-margin-ms ({}) must be at least a fiftieth of the minimum election \
                 timeout ({} ms): it covers the drift of clock rates between nodes",
                rule.margin.as_millis(),
                rule.lease.as_millis()
            ));
        }
        if rule.usable() <= self.heartbeat {
            return Err(format!(
                "the minimum election timeout less --lease-margin-ms ({} ms) must exceed the \
                 heartbeat ({} ms), or every renewal would wait for a heartbeat",
                rule.usable().as_millis(),
                self.heartbeat.as_millis()
            ));
        }
        if self.ttl_range.0 <= max {
            return Err("the minimum lease ttl must exceed the maximum election timeout".into());
        }
        if self.ttl_range.0 > self.ttl_range.1 {
            return Err("the minimum lease ttl must not exceed the maximum".into());
        }
        let most = crate::lease_table::history::MAX_HISTORY_LEN;
        if self.history_len == 0 || usize::from(self.history_len) > most {
            return Err(format!("--history-len must be in 1..={most}"));
        }
        if self.partitions == 0 || self.partitions > MAX_PARTITIONS {
            return Err(format!("--partitions must be in 1..={MAX_PARTITIONS}"));
        }
        if self.snapshot_every < 100 {
            return Err("snapshot interval must be at least 100 entries".into());
        }
        if self.timing_seed.is_some() && (max - min).as_millis() < 2 * self.peers.len() as u128 {
            return Err(
                "--timing-seed needs an election timeout range of at least 2 ms per node".into(),
            );
        }
        if self.placement.priority > Placement::MAX_PRIORITY {
            return Err(format!(
                "the priority must be at most {}",
                Placement::MAX_PRIORITY
            ));
        }
        if self.placement.checks == 0 {
            return Err("leadership placement needs at least one check".into());
        }
        if self.placement.every < Duration::from_millis(10) {
            return Err("placement checks must be at least 10 ms apart".into());
        }
        self.ui.validate()
    }

    /// The election timeout range openraft draws from, in ms. Without a
    /// timing seed, `election_timeout` itself. With one, a one-millisecond
    /// range (openraft draws from `min..max`, max excluded, with its own
    /// unseedable generator, so this pins the draw) at a point chosen from
    /// the seed: the peers are ranked by a hash of (seed, id), each rank owns
    /// an equal slot of the range, and a node sits in the first half of its
    /// slot at a seeded offset. So every node's timeout differs from every
    /// other's by at least half a slot (10 ms for 3 nodes in 60..120), which
    /// keeps a fixed timing from splitting votes over and over, and the same
    /// seed gives every node the same timeout on every start. This is group
    /// 0's; [`ElectionConfig::group_election_timeout`] each partition's.
    pub fn raft_election_timeout(&self) -> (u64, u64) {
        self.group_election_timeout(crate::group_id::GroupId::ZERO)
    }

    /// [`ElectionConfig::raft_election_timeout`] for `group`: drawn from
    /// the seed XOR the group's id (Kommander's `ElectionTimeoutSeed ^
    /// partitionId`), so each partition's timeouts are reproducible yet
    /// differ from the others' (group 0's are the seed's own).
    pub fn group_election_timeout(&self, group: crate::group_id::GroupId) -> (u64, u64) {
        let (min, max) = (
            self.election_timeout.0.as_millis() as u64,
            self.election_timeout.1.as_millis() as u64,
        );
        let Some(seed) = self.timing_seed.map(|seed| seed ^ u64::from(group.0)) else {
            return (min, max);
        };
        let mut ranked: Vec<(u64, NodeId)> =
            self.peers.keys().map(|&id| (mix(seed, id), id)).collect();
        ranked.sort_unstable();
        let rank = ranked
            .iter()
            .position(|&(_, id)| id == self.id)
            .unwrap_or(0) as u64;
        let slot = (max - min) / ranked.len().max(1) as u64;
        let offset = mix(seed ^ 0x5eed, self.id) % (slot / 2).max(1);
        let timeout = min + rank * slot + offset;
        (timeout, timeout + 1)
    }

    /// When a renewal may be answered without a round of its own
    /// ([`crate::raft::lease`]): inside the shortest vote lease any voter
    /// keeps (the minimum election timeout: with or without a timing seed,
    /// every node's openraft lease, its `election_timeout_max`, is at least
    /// that), less the margin.
    pub fn renew_lease(&self) -> RenewLease {
        let lease = self.election_timeout.0;
        let margin = self
            .lease_margin
            .unwrap_or_else(|| (lease / 10).max(Duration::from_millis(1)));
        RenewLease {
            lease,
            margin,
            patience: self.patience(),
            first_ack: Duration::from_millis(self.raft_election_timeout().1),
        }
    }

    /// How long a leader whose lease lapsed waits for a quorum's
    /// acknowledgement before it refuses calls, counted from the last one:
    /// three of its openraft leases (by then its followers' election
    /// timers, at most one lease each, have fired), but at least a second.
    /// A loaded machine's fsyncs stall acknowledgements for hundreds of
    /// milliseconds, longer than a 60-120 ms lease; refusing at three
    /// leases turned such stalls into 503s that cost the fault suite's
    /// preemptions their bound, where the proposer alone waits them out.
    pub fn patience(&self) -> Duration {
        (Duration::from_millis(self.raft_election_timeout().1) * 3).max(Duration::from_secs(1))
    }

    /// The address peers dial for this node.
    pub fn advertised(&self) -> &str {
        self.peers.get(&self.id).map_or("", String::as_str)
    }

    /// Where the peer listener binds: `peer_listen`, or the port of this
    /// node's `peers` entry (on its IP, or on all interfaces for a host name).
    ///
    /// # Errors
    /// A sentence when neither gives an address.
    pub fn peer_listen_addr(&self) -> Result<SocketAddr, String> {
        if let Some(addr) = self.peer_listen {
            return Ok(addr);
        }
        let own = self.advertised();
        if let Ok(addr) = own.parse::<SocketAddr>() {
            return Ok(addr);
        }
        let port = own
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse::<u16>().ok())
            .ok_or_else(|| format!("this node's --peers entry {own:?} has no port"))?;
        Ok(SocketAddr::from(([0, 0, 0, 0], port)))
    }
}

/// A fixed 64-bit mix of (seed, id) (splitmix64's finalizer): the same
/// inputs give the same number on every machine and every build.
fn mix(seed: u64, id: NodeId) -> u64 {
    let mut z = seed
        .wrapping_add(id.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Parses `1=127.0.0.1:7001,2=127.0.0.1:7002`.
///
/// # Errors
/// A sentence naming the bad item.
pub fn parse_peers(text: &str) -> Result<BTreeMap<NodeId, String>, String> {
    let mut peers = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addr) = item
            .split_once('=')
            .ok_or_else(|| format!("peer {item:?} is not ID=HOST:PORT"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| format!("peer id {id:?} is not a number"))?;
        let addr = addr.trim();
        if !addr.contains(':') || addr.contains('/') {
            return Err(format!("peer address {addr:?} is not HOST:PORT"));
        }
        if peers.insert(id, addr.to_owned()).is_some() {
            return Err(format!("peer id {id} appears twice"));
        }
    }
    if peers.is_empty() {
        return Err("--peers lists no peer".into());
    }
    Ok(peers)
}

#[cfg(test)]
mod tests;
