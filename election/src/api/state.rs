//! [`ApiState`]: what every handler of the client API shares.

use std::sync::Arc;

use palisade_names::LeaseName;
use palisade_serve::admission::Admission;

use crate::config::ElectionConfig;
use crate::error::ApiError;
use crate::group::Group;
use crate::group_id::GroupId;

/// What every handler shares: one `Arc`, so the clone axum makes for every
/// handler and middleware of every request is one atomic increment (as a
/// struct of a dozen `Arc`s it was ~4% of a renewal's CPU in a profile).
#[derive(Debug, Clone)]
pub struct ApiState(Arc<ApiParts>);

impl ApiState {
    /// Shares `parts` with every handler.
    pub fn new(parts: ApiParts) -> Self {
        Self(Arc::new(parts))
    }
}

impl std::ops::Deref for ApiState {
    type Target = ApiParts;

    fn deref(&self) -> &ApiParts {
        &self.0
    }
}

/// The parts of [`ApiState`].
#[derive(Debug)]
pub struct ApiParts {
    /// The Raft groups this node runs, one per partition, in id order
    /// (group 0 first; never empty): reached through [`ApiState::group`].
    pub(crate) groups: Vec<Group>,
    /// This node's metrics (`/metrics`, the status page's samples); the
    /// group's apply counts into the same ones.
    pub metrics: Arc<crate::metrics::ElectionMetrics>,
    /// This node's settings.
    pub config: Arc<ElectionConfig>,
    /// The peer client: forwards calls to the leader, asks peers for
    /// their status figures and meets them; openraft's network factory
    /// too (`peer/client.rs`).
    pub dialer: crate::peer::dialer::PeerDialer,
    /// What the status page plots, and peers' status pages ask for
    /// (`series.rs`).
    pub series: Arc<crate::series::Series>,
    /// Peers' incarnations (membership changes forget removed nodes').
    pub incarnations: Arc<crate::peer::incarnation::Incarnations>,
    /// This node's settings and its peers' (`peer/settings.rs`): a peer
    /// that disagrees is refused, and the leader lease takes the shortest.
    pub settings: Arc<crate::peer::settings::PeerSettings>,
    /// Permits for blocking calls (waiting acquires, watches): the cap.
    pub waiters: Arc<tokio::sync::Semaphore>,
    /// Request seats per flow on the client API (`api/admit.rs`).
    pub admission: Admission,
    /// Seats per flow on the forwarding connection to the leader (its
    /// HTTP/2 streams), so no flow takes them all.
    pub forwarding: Admission,
}

impl ApiState {
    /// Blocking calls (waiting acquires, watches) waiting on this node now.
    pub(super) fn waiting(&self) -> u64 {
        (self.config.max_waiters - self.waiters.available_permits()) as u64
    }

    /// A permit to wait, or 429 when `max_waiters` calls already wait here.
    pub(super) fn waiter(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        self.waiters.clone().try_acquire_owned().map_err(|_| {
            ApiError::TooManyWaiters(format!(
                "{} calls already wait on this node; retry later",
                self.config.max_waiters
            ))
        })
    }

    /// The group `lease` belongs to, for ever ([`GroupId::of`]).
    pub(crate) fn group(&self, lease: &LeaseName) -> &Group {
        let id = GroupId::of(lease.as_str(), self.partitions());
        self.groups.get(id.0 as usize).unwrap_or(self.group_zero())
    }

    /// Group 0: the one whose membership and signing keys the node's own
    /// calls (cluster view, members, keys, the status page) read and change.
    pub(crate) fn group_zero(&self) -> &Group {
        &self.groups[0]
    }

    /// Group `id` (group 0 for an id beyond the count: callers check it
    /// first, `partitions.rs`).
    pub(crate) fn group_of(&self, id: GroupId) -> &Group {
        self.groups.get(id.0 as usize).unwrap_or(self.group_zero())
    }

    /// Every group of this node, in id order.
    pub(crate) fn groups(&self) -> &[Group] {
        &self.groups
    }

    /// How many partitions (groups) the cluster runs.
    pub(crate) fn partitions(&self) -> u32 {
        self.groups.len() as u32
    }
}
