//! [`Incarnations`]: telling a node that kept its data from one that lost it.
//!
//! Raft's safety rests on every voter remembering its vote and its log. A
//! node whose data dir was wiped and that comes back under the same id has
//! forgotten both: if it were counted, it could vote twice in a term or ack
//! entries it no longer has. So every data dir gets a random *incarnation*
//! the first time the node starts on it; every peer request and answer
//! carries the sender's incarnation; and each node remembers (on disk) the
//! incarnation it first saw for every member. A member that shows up with
//! another one lost its data: its requests are refused and its answers
//! (votes, acks) are discarded, until an operator removes it and adds it
//! back (`palisade cluster remove` / `add`), at which point the old
//! incarnation is forgotten and the new one is learned.

use std::collections::HashMap;
use std::sync::RwLock;

use crate::io_error::io_err;
use crate::raft::durable::Durable;
use crate::raft::NodeId;

/// The header carrying the sender's incarnation on peer requests and answers.
pub const INCARNATION_HEADER: &str = "x-palisade-incarnation";

const MINE: &str = "mine";

/// This node's incarnation and the ones it has seen for its peers.
#[derive(Debug)]
pub struct Incarnations {
    mine: String,
    known: RwLock<HashMap<NodeId, String>>,
    tree: sled::Tree,
    durable: Durable,
}

impl Incarnations {
    /// Loads (or, on a fresh data dir, creates) this node's incarnation and
    /// the peers' ones it remembers.
    ///
    /// # Errors
    /// sled's error.
    pub fn open(durable: &Durable) -> std::io::Result<Self> {
        let tree = durable.db().open_tree("incarnations").map_err(io_err)?;
        let mine = match tree.get(MINE).map_err(io_err)? {
            Some(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            None => {
                let fresh: [u8; 16] = rand::random();
                let mine: String = fresh.iter().map(|b| format!("{b:02x}")).collect();
                tree.insert(MINE, mine.as_bytes()).map_err(io_err)?;
                durable.flush_blocking()?;
                tracing::info!(incarnation = %mine, "a fresh data dir: new incarnation");
                mine
            }
        };
        let mut known = HashMap::new();
        for entry in tree.iter() {
            let (key, value) = entry.map_err(io_err)?;
            if let Some(id) = std::str::from_utf8(&key)
                .ok()
                .and_then(|k| k.strip_prefix("peer-"))
                .and_then(|id| id.parse::<NodeId>().ok())
            {
                known.insert(id, String::from_utf8_lossy(&value).into_owned());
            }
        }
        Ok(Self {
            mine,
            known: RwLock::new(known),
            tree,
            durable: durable.clone(),
        })
    }

    /// This node's incarnation.
    pub fn mine(&self) -> &str {
        &self.mine
    }

    /// Whether this node has seen member `id`'s incarnation.
    pub fn knows(&self, id: NodeId) -> bool {
        self.read().contains_key(&id)
    }

    /// Checks that member `id` is the incarnation first seen for it; the
    /// first time, remembers `seen` on disk, durably, before the peer counts:
    /// a node killed before that sync would forget it, and could take the
    /// peer's vote after it came back wiped (`tests/membership.rs` found
    /// this with sled's one-second flush). Once per peer per incarnation.
    ///
    /// # Errors
    /// A sentence when `id` came back with another incarnation, sent none,
    /// or could not be remembered.
    pub fn check(&self, id: NodeId, seen: Option<&str>) -> Result<(), String> {
        let Some(seen) = seen.filter(|s| !s.is_empty() && s.len() <= 64) else {
            return Err(format!("node {id} sent no incarnation"));
        };
        if let Some(known) = self.read().get(&id) {
            return if known == seen {
                Ok(())
            } else {
                Err(format!(
                    "node {id} came back without its data (incarnation {seen}, was {known}); \
                     remove it and add it back"
                ))
            };
        }
        // One writer at a time: the first to learn `id` persists it, and
        // only then does anyone see it as known.
        let mut known = palisade_plumbing::sync::write(&self.known);
        if let Some(first) = known.get(&id) {
            return if first == seen {
                Ok(())
            } else {
                Err(format!("node {id} changed incarnation"))
            };
        }
        let key = format!("peer-{id}");
        let persisted = self
            .tree
            .insert(key.as_bytes(), seen.as_bytes())
            .map_err(io_err)
            .and_then(|_| self.durable.flush_blocking());
        if let Err(err) = persisted {
            tracing::warn!(id, %err, "could not persist a peer's incarnation");
            return Err(format!("node {id}: cannot remember its incarnation: {err}"));
        }
        known.insert(id, seen.to_owned());
        tracing::info!(id, incarnation = %seen, "learned a peer's incarnation");
        Ok(())
    }

    /// Forgets the incarnations of nodes that are no longer members, so a
    /// node removed and added back is learned afresh.
    pub fn forget_all_but(&self, members: &[NodeId]) {
        let gone: Vec<NodeId> = self
            .read()
            .keys()
            .filter(|id| !members.contains(id))
            .copied()
            .collect();
        if gone.is_empty() {
            return;
        }
        let mut known = palisade_plumbing::sync::write(&self.known);
        for id in gone {
            known.remove(&id);
            let _ = self.tree.remove(format!("peer-{id}").as_bytes());
            tracing::info!(id, "forgot the incarnation of a removed node");
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<NodeId, String>> {
        palisade_plumbing::sync::read(&self.known)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_that_lost_its_data_is_refused_until_forgotten() {
        let dir = tempfile::tempdir().expect("dir");
        let db = Durable::open(dir.path()).expect("db");
        let incarnations = Incarnations::open(&db).expect("open");
        let mine = incarnations.mine().to_owned();
        incarnations.check(2, Some("aaaa")).expect("first sight");
        incarnations.check(2, Some("aaaa")).expect("same");
        assert!(incarnations.check(2, Some("bbbb")).is_err(), "wiped");
        assert!(incarnations.check(2, None).is_err());
        drop(incarnations);
        // Remembered across restarts, with our own incarnation.
        let again = Incarnations::open(&db).expect("reopen");
        assert_eq!(again.mine(), mine);
        assert!(again.check(2, Some("bbbb")).is_err());
        again.forget_all_but(&[1, 3]);
        again
            .check(2, Some("bbbb"))
            .expect("re-added: learned afresh");
    }
}
