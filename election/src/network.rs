//! Peer traffic, on its own listener and never on the client port: the
//! client side openraft calls ([`PeerDialer`], which also forwards client
//! requests to the leader) and the server side that answers it
//! ([`peer_router`]: Raft RPC and forwarded requests, behind a gate that
//! admits only current members whose certificate names them).
//!
//! Every RPC carries openraft's deadline as the request timeout, so a hung
//! peer costs one timeout and never stalls the Raft core (openraft #1810).
//! Connections are pooled per peer by one shared HTTP client. Bodies are JSON.

use std::collections::HashMap;
use std::future::Future;
use std::io::Cursor;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use std::collections::HashSet;
use std::sync::Mutex;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use openraft::alias::{SnapshotOf, VoteOf};
use openraft::async_runtime::WatchReceiver;
use openraft::error::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::vote::RaftLeaderId;
use openraft::{BasicNode, OptionalSend, Snapshot};
use palisade_serve::certs::node_name;
use palisade_serve::tls::certificate_names;
use palisade_serve::PeerCertificate;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::PeerTls;
use crate::error::ApiError;
use crate::incarnation::{Incarnations, INCARNATION_HEADER};
use crate::placement::Standing;
use crate::{NodeId, Raft, TypeConfig};

/// Dials peers: a pool of HTTP/1.1 connections for Raft RPC (a snapshot
/// in flight never holds up heartbeats on a shared connection), and one
/// HTTP/2 connection per peer that every forwarded client request shares.
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
    me: NodeId,
    tls: bool,
    /// This node's incarnation (sent) and its peers' (checked on answers).
    incarnations: Arc<Incarnations>,
    /// Answers already logged as coming from a node that lost its data.
    logged: Arc<Mutex<HashSet<NodeId>>>,
    /// Node id -> `host:port`, as the membership names it.
    book: Arc<RwLock<HashMap<NodeId, String>>>,
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
            let addr = book
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        incarnations: Arc<Incarnations>,
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
            me,
            tls: tls.is_some(),
            incarnations,
            logged: Arc::default(),
            book,
        })
    }

    /// The URL of `path` at node `target`, whose peer address is `addr`.
    fn url(&self, target: NodeId, addr: &str, path: &str) -> String {
        if !self.tls {
            return format!("http://{addr}{path}");
        }
        self.book
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(target, addr.to_owned());
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

    fn request_with(
        &self,
        client: &reqwest::Client,
        method: reqwest::Method,
        target: NodeId,
        addr: &str,
        path: &str,
    ) -> reqwest::RequestBuilder {
        client
            .request(method, self.url(target, addr, path))
            .header(FROM_HEADER, self.me.to_string())
            .header(INCARNATION_HEADER, self.incarnations.mine())
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
        self.answer_is_trusted(target, &response)?;
        response.json().await.map_err(|e| e.to_string())
    }

    /// Whether an answer from `target` comes from the incarnation this node
    /// knows (its first answer teaches it). An answer from a node that lost
    /// its data — a vote, an ack — must not count.
    fn answer_is_trusted(
        &self,
        target: NodeId,
        response: &reqwest::Response,
    ) -> Result<(), String> {
        let seen = response
            .headers()
            .get(INCARNATION_HEADER)
            .and_then(|v| v.to_str().ok());
        self.incarnations.check(target, seen).inspect_err(|reason| {
            let mut logged = self
                .logged
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if logged.insert(target) {
                tracing::warn!(target, %reason, "discarding answers from a peer (logged once)");
            }
        })
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerDialer {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerClient {
            target,
            addr: node.addr.clone(),
            dialer: self.clone(),
        }
    }
}

/// Sends Raft RPCs to one peer.
#[derive(Debug)]
pub struct PeerClient {
    target: NodeId,
    addr: String,
    dialer: PeerDialer,
}

impl PeerClient {
    async fn call<Req, Resp>(
        &self,
        path: &str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        self.exchange(path, |builder| builder.json(request), timeout)
            .await
    }

    /// One RPC: `body` fills the request; the answer is JSON.
    async fn exchange<Resp>(
        &self,
        path: &str,
        body: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Resp: DeserializeOwned,
    {
        let request = self.dialer.request(
            reqwest::Method::POST,
            self.target,
            &self.addr,
            &format!("/raft/{path}"),
        );
        let response = body(request).timeout(timeout).send().await.map_err(|e| {
            if e.is_connect() {
                RPCError::Unreachable(Unreachable::new(&e))
            } else {
                RPCError::Network(NetworkError::new(&e))
            }
        })?;
        if !response.status().is_success() {
            return Err(RPCError::Network(NetworkError::from_string(format!(
                "node {} answered {} to {path}",
                self.target,
                response.status()
            ))));
        }
        if let Err(reason) = self.dialer.answer_is_trusted(self.target, &response) {
            return Err(RPCError::Unreachable(Unreachable::from_string(reason)));
        }
        let result: Result<Resp, RaftError<TypeConfig>> = response
            .json()
            .await
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("append", &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("vote", &rpc, option.hard_ttl()).await
    }

    /// Over the wire: the default would grant every pre-vote unconditionally.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("pre-vote", &rpc, option.hard_ttl()).await
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, Self::SnapshotData>,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let frame = snapshot_frame(&vote, &snapshot.meta, snapshot.snapshot.get_ref())
            .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        let send = self.exchange(
            "snapshot",
            |builder| {
                builder
                    .header(http::header::CONTENT_TYPE, "application/octet-stream")
                    .body(frame)
            },
            option.hard_ttl(),
        );
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            result = send => Ok(result?),
        }
    }

    async fn transfer_leader(
        &mut self,
        request: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("transfer-leader", &request, option.hard_ttl())
            .await
    }
}

/// Which node sent a peer request, once [`authenticate`] has checked it.
#[derive(Debug, Clone, Copy)]
pub struct PeerId(pub NodeId);

/// What the peer listener's gate needs.
#[derive(Debug, Clone)]
struct PeerGate {
    raft: Arc<Raft>,
    incarnations: Arc<Incarnations>,
    /// Whether a client certificate must name the sender (mutual TLS).
    tls: bool,
    /// Refusals already logged, one line per (node, reason).
    logged: Arc<Mutex<HashSet<String>>>,
}

impl PeerGate {
    fn refuse(&self, reason: String) -> Response {
        let mut logged = self
            .logged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if logged.len() > 1024 {
            logged.clear();
        }
        if logged.insert(reason.clone()) {
            tracing::warn!(%reason, "peer request refused (logged once per peer and reason)");
        }
        ApiError::Forbidden(reason).into_response()
    }

    fn is_member(&self, id: NodeId) -> bool {
        self.raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .nodes()
            .any(|(member, _)| *member == id)
    }
}

/// Admits a peer request only from a current member (voter or learner)
/// whose certificate (with TLS) names the node it claims to be, and that is
/// the incarnation first seen for it (it has not lost its data); answers
/// carry this node's incarnation.
async fn authenticate(State(gate): State<PeerGate>, mut request: Request, next: Next) -> Response {
    let from = request
        .headers()
        .get(FROM_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<NodeId>().ok());
    let Some(from) = from else {
        return gate.refuse(format!("a peer request without {FROM_HEADER}"));
    };
    if gate.tls {
        let named = request
            .extensions()
            .get::<PeerCertificate>()
            .is_some_and(|cert| certificate_names(&cert.0, &node_name(from)));
        if !named {
            return gate.refuse(format!("the client certificate does not name node {from}"));
        }
    }
    if !gate.is_member(from) {
        return gate.refuse(format!("node {from} is not a member"));
    }
    let incarnation = request
        .headers()
        .get(INCARNATION_HEADER)
        .and_then(|v| v.to_str().ok());
    if let Err(reason) = gate.incarnations.check(from, incarnation) {
        return gate.refuse(reason);
    }
    request.extensions_mut().insert(PeerId(from));
    let mut response = next.run(request).await;
    if let Ok(mine) = http::HeaderValue::from_str(gate.incarnations.mine()) {
        response.headers_mut().insert(INCARNATION_HEADER, mine);
    }
    response
}

/// What peers call on the peer listener: Raft RPC under `/raft/` and client
/// requests forwarded to the leader under `/forward/` (the client API), all
/// behind [`authenticate`]. `standing` is what this node tells the leader
/// of itself; a `never_lead` node refuses leadership transfers to it.
pub fn peer_router(
    raft: Arc<Raft>,
    incarnations: Arc<Incarnations>,
    api: Router,
    tls: bool,
    standing: Standing,
) -> Router {
    let gate = PeerGate {
        raft: raft.clone(),
        incarnations,
        tls,
        logged: Arc::default(),
    };
    raft_routes(raft, standing)
        .nest("/forward", api)
        .layer(axum::middleware::from_fn_with_state(gate, authenticate))
}

/// Refuses an RPC whose vote names another node than the one that sent it:
/// a member may speak only for itself.
fn speaks_for_itself(from: PeerId, vote: &VoteOf<TypeConfig>) -> Result<(), ApiError> {
    let claimed = *vote.leader_id().node_id();
    if claimed == from.0 {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "node {} sent an RPC in the name of node {claimed}",
            from.0
        )))
    }
}

/// The largest snapshot a node accepts from a peer: 1 GiB (about ten
/// million leases in [`crate::snapshot_codec`]'s encoding).
pub const MAX_SNAPSHOT_BYTES: usize = 1 << 30;

/// The snapshot RPC's body: `u32` (little-endian) length of a JSON
/// `[vote, meta]`, that JSON, then the snapshot data as it is — no JSON
/// array of numbers around a blob that may be hundreds of megabytes.
fn snapshot_frame(
    vote: &VoteOf<TypeConfig>,
    meta: &openraft::alias::SnapshotMetaOf<TypeConfig>,
    data: &[u8],
) -> Result<Vec<u8>, std::io::Error> {
    let header = serde_json::to_vec(&(vote, meta))?;
    let len = u32::try_from(header.len()).map_err(std::io::Error::other)?;
    let mut frame = Vec::with_capacity(4 + header.len() + data.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&header);
    frame.extend_from_slice(data);
    Ok(frame)
}

/// A snapshot RPC's parts: the sender's vote, the snapshot's meta, its data.
type SnapshotParts = (
    VoteOf<TypeConfig>,
    openraft::alias::SnapshotMetaOf<TypeConfig>,
    Vec<u8>,
);

/// Splits a [`snapshot_frame`] into vote, meta and data.
fn parse_snapshot_frame(mut frame: Vec<u8>) -> Result<SnapshotParts, String> {
    let len = frame
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
        .ok_or("snapshot frame: truncated")? as usize;
    let header = frame
        .get(4..4 + len)
        .ok_or("snapshot frame: truncated header")?;
    let (vote, meta) =
        serde_json::from_slice(header).map_err(|e| format!("snapshot frame: {e}"))?;
    let data = frame.split_off(4 + len);
    Ok((vote, meta, data))
}

/// The routes peers call:
/// `/raft/{append,vote,pre-vote,snapshot,transfer-leader,standing}`.
fn raft_routes(raft: Arc<Raft>, standing: Standing) -> Router {
    let transfer = if standing.never_lead {
        post(refuse_transfer)
    } else {
        post(transfer_leader)
    };
    Router::new()
        .route("/raft/append", post(append))
        .route("/raft/vote", post(vote))
        .route("/raft/pre-vote", post(pre_vote))
        .route(
            "/raft/snapshot",
            post(snapshot).layer(axum::extract::DefaultBodyLimit::max(MAX_SNAPSHOT_BYTES)),
        )
        .route("/raft/transfer-leader", transfer)
        .route(
            "/raft/standing",
            post(move || async move { Json(standing) }),
        )
        .with_state(raft)
}

type RpcResult<T> = Result<Json<Result<T, RaftError<TypeConfig>>>, ApiError>;

async fn append(
    State(raft): State<Arc<Raft>>,
    Extension(from): Extension<PeerId>,
    Json(request): Json<AppendEntriesRequest<TypeConfig>>,
) -> RpcResult<AppendEntriesResponse<TypeConfig>> {
    speaks_for_itself(from, &request.vote)?;
    Ok(Json(raft.append_entries(request).await))
}

async fn vote(
    State(raft): State<Arc<Raft>>,
    Extension(from): Extension<PeerId>,
    Json(request): Json<VoteRequest<TypeConfig>>,
) -> RpcResult<VoteResponse<TypeConfig>> {
    speaks_for_itself(from, &request.vote)?;
    Ok(Json(raft.vote(request).await))
}

async fn pre_vote(
    State(raft): State<Arc<Raft>>,
    Extension(from): Extension<PeerId>,
    Json(request): Json<VoteRequest<TypeConfig>>,
) -> RpcResult<VoteResponse<TypeConfig>> {
    speaks_for_itself(from, &request.vote)?;
    Ok(Json(raft.pre_vote(request).await))
}

async fn snapshot(
    State(raft): State<Arc<Raft>>,
    Extension(from): Extension<PeerId>,
    frame: axum::body::Bytes,
) -> RpcResult<SnapshotResponse<TypeConfig>> {
    let (vote, meta, data) = parse_snapshot_frame(frame.to_vec()).map_err(ApiError::BadRequest)?;
    speaks_for_itself(from, &vote)?;
    let snapshot = Snapshot {
        meta,
        snapshot: Cursor::new(data),
    };
    Ok(Json(
        raft.install_full_snapshot(vote, snapshot)
            .await
            .map_err(RaftError::Fatal),
    ))
}

/// A `--never-lead` node does not take leadership, even when handed it.
async fn refuse_transfer() -> ApiError {
    ApiError::Forbidden("this node never leads (--never-lead)".into())
}

async fn transfer_leader(
    State(raft): State<Arc<Raft>>,
    Extension(from): Extension<PeerId>,
    Json(request): Json<TransferLeaderRequest<TypeConfig>>,
) -> RpcResult<TransferLeaderResponse<TypeConfig>> {
    speaks_for_itself(from, request.from_leader())?;
    Ok(Json(
        raft.handle_transfer_leader(request)
            .await
            .map_err(RaftError::Fatal),
    ))
}
