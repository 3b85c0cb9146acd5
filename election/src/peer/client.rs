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

use crate::group_id::GroupId;
use crate::raft::{NodeId, TypeConfig};

use super::beats::{Beat, BeatAnswer, Carry, Failed, BEATS_ROUTE, BEATS_WAIT_HEADER};
use super::dialer::{explain, PeerDialer};
use super::reachability;
use super::snapshot_frame::snapshot_frame;

impl RaftNetworkFactory<TypeConfig> for PeerDialer {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerClient {
            group: self.group,
            target,
            addr: node.addr.clone(),
            dialer: self.clone(),
        }
    }
}

/// Sends Raft RPCs to one peer.
#[derive(Debug)]
pub struct PeerClient {
    /// The group whose RPCs these are: names their routes.
    group: GroupId,
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

    /// One RPC: `body` fills the request; the answer is JSON. Whether the
    /// peer answered is noted in the dialer's `Reachability`, which logs
    /// the peer going down and coming back (a refusal in Raft terms, such as
    /// a higher vote, is an answer).
    async fn exchange<Resp>(
        &self,
        path: &str,
        body: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Resp: DeserializeOwned,
    {
        let result = self.exchange_once(path, body, timeout).await;
        self.noted(result)
    }

    /// `result` of an exchange with the peer, its outcome noted in the
    /// dialer's `Reachability`.
    fn noted<Resp>(
        &self,
        result: Result<Resp, RPCError<TypeConfig>>,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let seen = &self.dialer.reachability;
        match &result {
            Err(RPCError::Unreachable(err)) => {
                let said = seen.failed(self.target, true);
                reachability::log(said, self.target, &self.addr, err);
            }
            Err(RPCError::Network(err)) => {
                let said = seen.failed(self.target, false);
                reachability::log(said, self.target, &self.addr, err);
            }
            _ => reachability::log(seen.answered(self.target), self.target, &self.addr, &""),
        }
        result
    }

    async fn exchange_once<Resp>(
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
            &self.group.names().route(path),
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

/// How long an append that carries entries may take at least. openraft
/// gives every append the heartbeat interval (20 ms by default), which a
/// heartbeat fits; but a follower that fell behind is sent up to 300
/// entries at once, to decode, write and fsync, and a busy node can take
/// longer than that every time: each try timed out, the same batch was sent
/// again, and the follower never caught up (the fault suite's stalls, see
/// TESTING.md). A slow append holds up only that follower's replication
/// stream; heartbeats go on their own.
const ENTRIES_DEADLINE: Duration = Duration::from_secs(2);

/// The deadline of an append of `entries` entries, given openraft's `ttl`.
fn append_deadline(entries: usize, ttl: Duration) -> Duration {
    if entries == 0 {
        ttl
    } else {
        ttl.max(ENTRIES_DEADLINE)
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let heartbeat = rpc.entries.is_empty();
        if heartbeat && self.dialer.reachability.backing_off(self.target) {
            return Err(RPCError::Unreachable(Unreachable::from_string(format!(
                "node {} is down; backing off",
                self.target
            ))));
        }
        if let Some(beats) = self.dialer.beats.clone().filter(|_| heartbeat) {
            let peer = (self.target, self.addr.as_str());
            let ttl = option.hard_ttl();
            let answer = beats.beat(&self.dialer, peer, self.group, (rpc, ttl)).await;
            return self.noted(answer);
        }
        let deadline = append_deadline(rpc.entries.len(), option.hard_ttl());
        self.call("append", &rpc, deadline).await
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

impl Carry for PeerDialer {
    fn detached(&self) -> Self {
        let mut detached = self.clone();
        detached.beats = None;
        detached
    }

    /// One batch of heartbeats to `target`, over the connection kept for
    /// them ([`PeerDialer::beats_request`]).
    async fn carry(
        &self,
        target: NodeId,
        addr: &str,
        beats: &[Beat],
        wait: Duration,
    ) -> Result<Vec<BeatAnswer>, Failed> {
        self.metrics.heartbeats_carried.inc_by(beats.len() as u64);
        // The receiver answers what its groups answered within three
        // quarters of the wait, and says of the rest that they were late.
        let theirs = (wait * 3 / 4).as_millis().to_string();
        let response = self
            .beats_request(target, addr)
            .header(BEATS_WAIT_HEADER, theirs)
            .json(beats)
            .timeout(wait)
            .send()
            .await
            .map_err(|e| {
                let why = explain(&e);
                if e.is_connect() {
                    Failed::Unreachable(why)
                } else {
                    Failed::Network(why)
                }
            })?;
        if !response.status().is_success() {
            return Err(Failed::Network(format!(
                "node {target} answered {} to {BEATS_ROUTE}",
                response.status()
            )));
        }
        self.answer_is_trusted(target, &response)
            .map_err(Failed::Unreachable)?;
        let answers: Vec<BeatAnswer> = response
            .json()
            .await
            .map_err(|e| Failed::Network(explain(&e)))?;
        if answers.len() != beats.len() {
            return Err(Failed::Network(format!(
                "node {target} answered {} beats of {}",
                answers.len(),
                beats.len()
            )));
        }
        Ok(answers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_keep_openraft_deadline_and_entries_get_longer() {
        let ttl = Duration::from_millis(20);
        assert_eq!(append_deadline(0, ttl), ttl);
        assert_eq!(append_deadline(1, ttl), ENTRIES_DEADLINE);
        assert_eq!(append_deadline(300, ttl), ENTRIES_DEADLINE);
        let long = Duration::from_secs(5);
        assert_eq!(append_deadline(300, long), long);
    }
}
