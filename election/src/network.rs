//! Raft RPC over HTTP: the client openraft calls ([`HttpNetwork`]) and the
//! server routes that answer it ([`raft_routes`]).
//!
//! Every RPC carries openraft's deadline as the request timeout, so a hung
//! peer costs one timeout and never stalls the Raft core (openraft #1810).
//! Connections are pooled per peer by one shared HTTP client. Bodies are JSON.

use std::future::Future;
use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use openraft::alias::{SnapshotOf, VoteOf};
use openraft::error::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, OptionalSend, Snapshot};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{NodeId, Raft, TypeConfig};

/// Creates one [`PeerClient`] per peer; they share a connection pool.
#[derive(Debug, Clone)]
pub struct HttpNetwork {
    client: reqwest::Client,
}

impl HttpNetwork {
    /// A network whose connections time out after `connect_timeout` and
    /// leave from `source_ip` (kernel's choice when `None`).
    pub fn new(connect_timeout: Duration, source_ip: Option<std::net::IpAddr>) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .local_address(source_ip)
            .pool_idle_timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .build()
            .unwrap_or_default();
        Self { client }
    }
}

impl RaftNetworkFactory<TypeConfig> for HttpNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerClient {
            target,
            base: format!("http://{}/raft", node.addr),
            client: self.client.clone(),
        }
    }
}

/// Sends Raft RPCs to one peer.
#[derive(Debug)]
pub struct PeerClient {
    target: NodeId,
    base: String,
    client: reqwest::Client,
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
        let url = format!("{}/{path}", self.base);
        let response = self
            .client
            .post(&url)
            .json(request)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| {
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
        let request = (vote, snapshot.meta, snapshot.snapshot.into_inner());
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            result = self.call("snapshot", &request, option.hard_ttl()) => Ok(result?),
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

/// The routes peers call: `/raft/{append,vote,pre-vote,snapshot,transfer-leader}`.
pub fn raft_routes(raft: Arc<Raft>) -> Router {
    Router::new()
        .route("/raft/append", post(append))
        .route("/raft/vote", post(vote))
        .route("/raft/pre-vote", post(pre_vote))
        .route("/raft/snapshot", post(snapshot))
        .route("/raft/transfer-leader", post(transfer_leader))
        .with_state(raft)
}

type RpcResult<T> = Json<Result<T, RaftError<TypeConfig>>>;

async fn append(
    State(raft): State<Arc<Raft>>,
    Json(request): Json<AppendEntriesRequest<TypeConfig>>,
) -> RpcResult<AppendEntriesResponse<TypeConfig>> {
    Json(raft.append_entries(request).await)
}

async fn vote(
    State(raft): State<Arc<Raft>>,
    Json(request): Json<VoteRequest<TypeConfig>>,
) -> RpcResult<VoteResponse<TypeConfig>> {
    Json(raft.vote(request).await)
}

async fn pre_vote(
    State(raft): State<Arc<Raft>>,
    Json(request): Json<VoteRequest<TypeConfig>>,
) -> RpcResult<VoteResponse<TypeConfig>> {
    Json(raft.pre_vote(request).await)
}

async fn snapshot(
    State(raft): State<Arc<Raft>>,
    Json((vote, meta, data)): Json<(
        VoteOf<TypeConfig>,
        openraft::alias::SnapshotMetaOf<TypeConfig>,
        Vec<u8>,
    )>,
) -> RpcResult<SnapshotResponse<TypeConfig>> {
    let snapshot = Snapshot {
        meta,
        snapshot: Cursor::new(data),
    };
    Json(
        raft.install_full_snapshot(vote, snapshot)
            .await
            .map_err(RaftError::Fatal),
    )
}

async fn transfer_leader(
    State(raft): State<Arc<Raft>>,
    Json(request): Json<TransferLeaderRequest<TypeConfig>>,
) -> RpcResult<TransferLeaderResponse<TypeConfig>> {
    Json(
        raft.handle_transfer_leader(request)
            .await
            .map_err(RaftError::Fatal),
    )
}
