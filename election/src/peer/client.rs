//! [`PeerClient`]: openraft's network client to one peer (`RaftNetworkV2`),
//! made by [`PeerDialer`]'s `RaftNetworkFactory`. Bodies are JSON, but for a
//! snapshot's data (see `snapshot_frame.rs`).

use std::future::Future;
use std::io::Cursor;
use std::time::Duration;

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
use openraft::{BasicNode, OptionalSend};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::raft::{NodeId, TypeConfig};

use super::dialer::PeerDialer;
use super::snapshot_frame::snapshot_frame;

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
