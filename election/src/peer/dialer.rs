//! [`PeerDialer`]: the outgoing side of peer traffic. It dials peers for
//! openraft (see `client.rs`), forwards client requests to the leader, and
//! asks peers their standing.
//!
//! Every RPC carries openraft's deadline as the request timeout, so a hung
//! peer costs one timeout and never stalls the Raft core (openraft #1810).
//! Connections are pooled per peer by one shared HTTP client.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use std::collections::HashSet;
use std::sync::Mutex;

use palisade_serve::certs::node_name;

use super::beats::{Beats, BEATS_ROUTE};
use super::incarnation::{Incarnations, INCARNATION_HEADER};
use super::settings::{PeerSettings, SETTINGS_HEADER};
use super::standing::Standing;
use crate::config::PeerTls;
use crate::group_id::GroupId;
use crate::raft::NodeId;

/// Dials peers: a pool of HTTP/1.1 connections for Raft RPC (a snapshot
/// in flight never holds up heartbeats on a shared connection), one
/// HTTP/2 connection per peer that every forwarded client request shares,
/// and, with partitions, HTTP/1.1 connections that carry every group's
/// heartbeats to a peer together (`beats.rs`: at most two batches in
/// flight, so two connections; a batch that times out drops its own, so a
/// healed network cut is not followed by waits on a dead connection, as an
/// HTTP/2 connection would be until its keep-alive ping failed).
/// With mutual TLS a peer is addressed by its certificate name
/// (`node-<id>.palisade`), which a resolver maps to the address the
/// membership gives it; so the server certificate must name the very node
/// the membership says is there. Every request says which node sends it
/// ([`FROM_HEADER`]), and the receiver checks that against the client
/// certificate.
#[derive(Debug, Clone)]
pub struct PeerDialer {
    client: reqwest::Client,
    forwarding: reqwest::Client,
    beating: reqwest::Client,
    /// The heartbeat carriers, when heartbeats are carried together
    /// ([`PeerDialer::carrying_beats_together`]).
    pub(super) beats: Option<Arc<Beats>>,
    /// Counts the requests sent (`palisade_peer_requests`) and heartbeats
    /// carried.
    pub(super) metrics: Arc<crate::metrics::ElectionMetrics>,
    me: NodeId,
    tls: bool,
    /// This node's incarnation (sent) and its peers' (checked on answers).
    incarnations: Arc<Incarnations>,
    /// This node's settings, sent with every request; the peers' ones,
    /// checked on every answer (`settings.rs`).
    settings: Arc<PeerSettings>,
    /// Answers already logged as coming from a node that lost its data.
    logged: Arc<Mutex<HashSet<NodeId>>>,
    /// Node id -> `host:port`, as the membership names it.
    book: Arc<RwLock<HashMap<NodeId, String>>>,
    /// Which peers answer: the log lines about them, the heartbeat backoff.
    pub(super) reachability: Arc<super::reachability::Reachability>,
    /// The Raft group whose network this is, as openraft's network
    /// factory ([`PeerDialer::for_group`]); group 0 otherwise.
    pub(super) group: GroupId,
}

/// The header naming the sending node on every peer request.
pub const FROM_HEADER: &str = "x-palisade-from";

/// Maps `node-<id>.palisade` to the address the membership gives node `id`.
#[derive(Debug, Clone)]
struct PeerResolver {
    book: Arc<RwLock<HashMap<NodeId, String>>>,
}

impl reqwest::dns::Resolve for PeerResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let book = self.book.clone();
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let id = node_id_of_name(&name).ok_or_else(|| format!("{name} is not a peer name"))?;
            let addr = palisade_plumbing::sync::read(&book)
                .get(&id)
                .cloned()
                .ok_or_else(|| format!("node {id} has no known address"))?;
            let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host(addr).await?.collect();
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// `node-7.palisade` -> 7.
fn node_id_of_name(name: &str) -> Option<NodeId> {
    name.strip_prefix("node-")?
        .strip_suffix(".palisade")?
        .parse()
        .ok()
}

impl PeerDialer {
    /// A dialer for node `me`: connections time out after `connect_timeout`,
    /// leave from `source_ip` (kernel's choice when `None`), and use mutual
    /// TLS with `tls` (plaintext when `None`).
    ///
    /// # Errors
    /// The TLS files could not be loaded.
    pub fn new(
        me: NodeId,
        (incarnations, settings, metrics): (
            Arc<Incarnations>,
            Arc<PeerSettings>,
            Arc<crate::metrics::ElectionMetrics>,
        ),
        connect_timeout: Duration,
        source_ip: Option<std::net::IpAddr>,
        tls: Option<&PeerTls>,
    ) -> Result<Self, String> {
        let book = Arc::new(RwLock::new(HashMap::new()));
        let config = tls
            .map(|tls| palisade_serve::tls::client_config(&tls.ca, Some((&tls.cert, &tls.key))))
            .transpose()
            .map_err(|e| e.to_string())?;
        let build = |http2: bool| {
            let mut builder = reqwest::Client::builder()
                .connect_timeout(connect_timeout)
                .local_address(source_ip)
                .pool_idle_timeout(Duration::from_secs(30))
                .tcp_nodelay(true);
            if let Some(config) = &config {
                let mut config = config.clone();
                if http2 {
                    config.alpn_protocols = vec![b"h2".to_vec()];
                }
                builder = builder
                    .use_preconfigured_tls(config)
                    .https_only(true)
                    .dns_resolver(Arc::new(PeerResolver { book: book.clone() }));
            } else if http2 {
                builder = builder.http2_prior_knowledge();
            }
            if http2 {
                builder = builder
                    .http2_adaptive_window(true)
                    .http2_keep_alive_interval(Duration::from_secs(5))
                    .http2_keep_alive_timeout(Duration::from_secs(5));
            }
            builder.build().map_err(|e| e.to_string())
        };
        Ok(Self {
            client: build(false)?,
            forwarding: build(true)?,
            beating: build(false)?,
            beats: None,
            metrics,
            me,
            tls: tls.is_some(),
            incarnations,
            settings,
            logged: Arc::default(),
            book,
            reachability: Arc::default(),
            group: GroupId::ZERO,
        })
    }

    /// The URL of `path` at node `target`, whose peer address is `addr`.
    pub(super) fn url(&self, target: NodeId, addr: &str, path: &str) -> String {
        if !self.tls {
            return format!("http://{addr}{path}");
        }
        palisade_plumbing::sync::write(&self.book).insert(target, addr.to_owned());
        let port = addr.rsplit_once(':').map_or("", |(_, port)| port);
        format!("https://{}:{port}{path}", node_name(target))
    }

    /// A Raft RPC to `path` at node `target` (peer address `addr`), marked
    /// as coming from this node.
    pub fn request(
        &self,
        method: reqwest::Method,
        target: NodeId,
        addr: &str,
        path: &str,
    ) -> reqwest::RequestBuilder {
        self.request_with(&self.client, method, target, addr, path)
    }

    /// This dialer as `group`'s network: its Raft RPCs go to that group's
    /// routes; connections, addresses and reachability stay shared.
    pub fn for_group(&self, group: GroupId) -> Self {
        Self {
            group,
            ..self.clone()
        }
    }

    /// This dialer, carrying every group's heartbeats to a peer together
    /// (a node with partitions; `beats.rs`).
    #[must_use]
    pub fn carrying_beats_together(mut self) -> Self {
        self.beats = Some(Arc::default());
        self
    }

    /// A batch of heartbeats, like [`PeerDialer::request`] but over the
    /// connection that carries only heartbeats to `target`.
    pub(super) fn beats_request(&self, target: NodeId, addr: &str) -> reqwest::RequestBuilder {
        self.request_with(
            &self.beating,
            reqwest::Method::POST,
            target,
            addr,
            BEATS_ROUTE,
        )
    }

    /// A forwarded client request, like [`PeerDialer::request`] but over
    /// the HTTP/2 connection all forwards to `target` share.
    pub fn forward(
        &self,
        method: reqwest::Method,
        target: NodeId,
        addr: &str,
        path: &str,
    ) -> reqwest::RequestBuilder {
        self.request_with(&self.forwarding, method, target, addr, path)
    }

    pub(super) fn request_with(
        &self,
        client: &reqwest::Client,
        method: reqwest::Method,
        target: NodeId,
        addr: &str,
        path: &str,
    ) -> reqwest::RequestBuilder {
        self.metrics.peer_requests.inc();
        client
            .request(method, self.url(target, addr, path))
            .header(FROM_HEADER, self.me.to_string())
            .header(INCARNATION_HEADER, self.incarnations.mine())
            .header(SETTINGS_HEADER, self.settings.header())
    }

    /// Asks each of `peers` (id, peer address) for its [`Standing`] at
    /// once, waiting at most `timeout`; the answers in the same order (an
    /// `Err` says why there is none to trust). Either way of an exchange
    /// teaches the incarnations: the peer learns this node's from the
    /// request, this node the peer's from the answer.
    pub async fn standings(
        &self,
        peers: &[(NodeId, String)],
        timeout: Duration,
    ) -> Vec<Result<Standing, String>> {
        futures::future::join_all(
            peers
                .iter()
                .map(|(id, addr)| self.standing(*id, addr, timeout)),
        )
        .await
    }

    async fn standing(
        &self,
        target: NodeId,
        addr: &str,
        timeout: Duration,
    ) -> Result<Standing, String> {
        let response = self
            .request(reqwest::Method::POST, target, addr, "/raft/standing")
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("node {target} answered {}", response.status()));
        }
        // Its settings are recorded, but a standing is read whatever they
        // are: it is how `cluster add` names a node that runs another
        // partition count (`settings.rs` refuses every other exchange).
        let seen = response
            .headers()
            .get(INCARNATION_HEADER)
            .and_then(|v| v.to_str().ok());
        self.incarnations.check(target, seen)?;
        let announced = response
            .headers()
            .get(SETTINGS_HEADER)
            .and_then(|v| v.to_str().ok());
        let _ = self.settings.check(target, announced);
        response.json().await.map_err(|e| e.to_string())
    }

    /// Whether an answer from `target` comes from the incarnation this node
    /// knows (its first answer teaches it). An answer from a node that lost
    /// its data — a vote, an ack — must not count.
    pub(super) fn answer_is_trusted(
        &self,
        target: NodeId,
        response: &reqwest::Response,
    ) -> Result<(), String> {
        let seen = response
            .headers()
            .get(INCARNATION_HEADER)
            .and_then(|v| v.to_str().ok());
        let announced = response
            .headers()
            .get(SETTINGS_HEADER)
            .and_then(|v| v.to_str().ok());
        self.incarnations
            .check(target, seen)
            .and_then(|()| self.settings.check(target, announced))
            .inspect_err(|reason| {
                let mut logged = palisade_plumbing::sync::lock(&self.logged);
                if logged.insert(target) {
                    tracing::warn!(target, %reason, "discarding answers from a peer (logged once)");
                }
            })
    }
}

/// Why a call to a peer failed, in one line: whether it timed out, could
/// not connect, or what the transport below said (reqwest's own message
/// names only the URL; its sources say what went wrong).
pub fn explain(err: &reqwest::Error) -> String {
    let what = if err.is_timeout() {
        "no answer in time"
    } else if err.is_connect() {
        "could not connect"
    } else {
        "the exchange broke"
    };
    let mut line = what.to_owned();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}
