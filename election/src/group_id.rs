//! [`GroupId`]: which Raft group, and [`GroupNames`]: the names of its
//! sled trees, snapshot file and peer routes, made in one place. Below
//! `raft/` and `peer/` (it depends on nothing), so storage and the network
//! name a group without reaching [`crate::group`].

use std::path::{Path, PathBuf};

/// The most partitions (Raft groups) a cluster may run: bounds the
/// per-partition metric labels and each node's idle cost.
pub const MAX_PARTITIONS: u32 = 64;

/// A Raft group's number (a partition's): 0..partitions. Group 0 also
/// holds the cluster's signing keys and is the one whose membership the
/// node reads first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GroupId(pub u32);

impl GroupId {
    /// The partition `lease` belongs to among `partitions`, for ever: the
    /// 64-bit FNV-1a hash of the name's bytes, modulo `partitions`
    /// (README, "Partitions": clients compute the same to find a lease's
    /// leader). With one partition, always group 0.
    pub fn of(lease: &str, partitions: u32) -> GroupId {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let hash = lease
            .bytes()
            .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
        let partitions = u64::from(partitions.max(1));
        GroupId(u32::try_from(hash % partitions).unwrap_or(0))
    }

    /// The groups of a cluster of `partitions`, in order.
    pub fn all(partitions: u32) -> impl Iterator<Item = GroupId> {
        (0..partitions.max(1)).map(GroupId)
    }

    /// The group every node has always run; its [`GroupNames`] are the
    /// names that came before groups, so an existing data dir opens
    /// unchanged.
    pub const ZERO: GroupId = GroupId(0);

    /// Where this group lives on disk and on the wire (see [`GroupNames`]).
    pub fn names(self) -> GroupNames {
        GroupNames(self)
    }
}

impl std::fmt::Display for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The one place a group's names are made: sled trees, the snapshot file
/// and the peer routes of its Raft RPCs. Group 0's are today's names
/// exactly (tested): the stored format and the wire format do not change;
/// another group's carry its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupNames(GroupId);

impl GroupNames {
    /// What group `n > 0` adds to a name; nothing for group 0.
    fn suffix(self) -> String {
        match self.0 {
            GroupId::ZERO => String::new(),
            GroupId(n) => format!("-g{n}"),
        }
    }

    /// A sled tree of this group, from its group-0 name (`raft_log`,
    /// `raft_meta`, `raft_sm`, `raft_snapshot`, ...).
    pub fn tree(self, base: &str) -> String {
        format!("{base}{}", self.suffix())
    }

    /// The snapshot file of this group in `data_dir`.
    pub fn snapshot_path(self, data_dir: &Path) -> PathBuf {
        data_dir.join(format!("raft-snapshot{}", self.suffix()))
    }

    /// The peer route of a Raft RPC of this group, from its name
    /// (`append`, `vote`, `snapshot`, ...): `/raft/append` for group 0.
    pub fn route(self, rpc: &str) -> String {
        match self.0 {
            GroupId::ZERO => format!("/raft/{rpc}"),
            GroupId(n) => format!("/raft/group/{n}/{rpc}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The placement hash is fixed (clients in other languages compute
    /// it): FNV-1a's published test vectors, and where some names go.
    #[test]
    fn a_lease_goes_to_the_partition_its_name_hashes_to() {
        // FNV-1a 64 of "" is the offset basis, of "a" 0xaf63dc4c8601ec8c.
        assert_eq!(
            GroupId::of("", u32::MAX).0,
            (0xcbf2_9ce4_8422_2325u64 % u64::from(u32::MAX)) as u32
        );
        assert_eq!(
            GroupId::of("a", 1000).0,
            (0xaf63_dc4c_8601_ec8cu64 % 1000) as u32
        );
        assert_eq!(GroupId::of("orders", 1), GroupId::ZERO);
        let spread: std::collections::BTreeSet<u32> = (0..60)
            .map(|i| GroupId::of(&format!("lease-{i}"), 6).0)
            .collect();
        assert_eq!(spread.len(), 6, "60 names reach every one of 6 partitions");
        assert_eq!(
            GroupId::all(3).collect::<Vec<_>>(),
            [GroupId(0), GroupId(1), GroupId(2)]
        );
    }

    /// Group 0's names are exactly the names before groups: a data dir
    /// written by an earlier version opens unchanged, and peers of an
    /// earlier version understand its routes.
    #[test]
    fn group_zero_keeps_todays_names() {
        let names = GroupId::ZERO.names();
        for tree in ["raft_log", "raft_meta", "raft_sm", "raft_snapshot"] {
            assert_eq!(names.tree(tree), tree);
        }
        assert_eq!(
            names.snapshot_path(Path::new("/data")),
            Path::new("/data/raft-snapshot")
        );
        for rpc in ["append", "vote", "snapshot", "transfer", "figures"] {
            assert_eq!(names.route(rpc), format!("/raft/{rpc}"));
        }
    }

    /// Another group's names carry its id, and differ from group 0's.
    #[test]
    fn other_groups_names_carry_their_id() {
        let names = GroupId(3).names();
        assert_eq!(names.tree("raft_log"), "raft_log-g3");
        assert_eq!(
            names.snapshot_path(Path::new("/data")),
            Path::new("/data/raft-snapshot-g3")
        );
        assert_eq!(names.route("append"), "/raft/group/3/append");
    }
}
