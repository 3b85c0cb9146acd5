//! [`GroupId`]: which Raft group, and [`GroupNames`]: the names of its
//! sled trees, snapshot file and peer routes, made in one place. Below
//! `raft/` and `peer/` (it depends on nothing), so storage and the network
//! name a group without reaching [`crate::group`].

use std::path::{Path, PathBuf};

/// A Raft group's number: 0 for the one group a node runs today.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GroupId(pub u32);

impl GroupId {
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
