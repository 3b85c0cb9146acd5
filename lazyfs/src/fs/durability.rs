//! What reaches the backing files, and when: an fsync persists one
//! inode's pending changes, [`State::sync_all`] every inode's, and a power
//! cut ([`State::cut`]) throws them all away, after tearing one file's last
//! write with [`CutMode::Tear`].

use std::io;
use std::path::PathBuf;

use fuser::Errno;

use super::inodes::{errno, State, Stats};
use crate::pending::{Pending, Torn};

/// What a cut did.
#[derive(Debug, Clone)]
pub struct CutReport {
    /// Files whose pending changes were discarded.
    pub files: u64,
    /// Dirty bytes discarded (whole pages).
    pub bytes: u64,
    /// The torn write, if the cut tore one: the file and what was kept.
    pub torn: Option<(PathBuf, Torn)>,
}

/// How a cut treats the pending writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutMode {
    /// Every pending change is lost.
    Lose,
    /// The power goes during one file's last write (file and cut point
    /// chosen by the seed; see [`Pending::tear`]); everything else is
    /// lost.
    Tear {
        /// Picks the file and the length of the prefix.
        seed: u64,
    },
}

/// A small deterministic generator (splitmix64) for cuts.
fn splitmix(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl State {
    /// Persists one inode's pending changes (fsync).
    pub(super) fn sync(&mut self, ino: u64) -> Result<bool, Errno> {
        let node = self.node_mut(ino)?;
        let Some(pending) = node.pending.take() else {
            return Ok(false);
        };
        let Some(disk) = &node.disk else {
            return Err(Errno::EIO);
        };
        if let Err(err) = pending.persist(disk) {
            node.pending = Some(pending);
            return Err(errno(&err));
        }
        self.maybe_drop(ino);
        Ok(true)
    }

    /// Persists every pending change (sync(2), a clean unmount).
    ///
    /// # Errors
    /// Writing a backing file failed (the others are still written).
    pub fn sync_all(&mut self) -> io::Result<u64> {
        let inos: Vec<u64> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.pending.is_some())
            .map(|(&ino, _)| ino)
            .collect();
        let mut synced = 0;
        let mut failure = None;
        for ino in inos {
            match self.sync(ino) {
                Ok(true) => synced += 1,
                Ok(false) => {}
                Err(err) => failure = Some(io::Error::from_raw_os_error(i32::from(err))),
            }
        }
        failure.map_or(Ok(synced), Err)
    }

    /// A power cut: every pending change is lost; with [`CutMode::Tear`],
    /// one file's last pending write first reaches the disk in part.
    ///
    /// # Errors
    /// Writing the torn prefix failed (everything is discarded anyway).
    pub fn cut(&mut self, mode: CutMode) -> io::Result<CutReport> {
        let mut torn = None;
        let mut result = Ok(());
        if let CutMode::Tear { seed } = mode {
            let mut rng = seed;
            let mut candidates: Vec<u64> = self
                .nodes
                .iter()
                .filter(|(_, n)| n.pending.as_ref().is_some_and(Pending::has_write))
                .map(|(&ino, _)| ino)
                .collect();
            candidates.sort_unstable();
            if !candidates.is_empty() {
                let pick = candidates[(splitmix(&mut rng) % candidates.len() as u64) as usize];
                let cut_at = splitmix(&mut rng);
                if let Some(node) = self.nodes.get(&pick) {
                    if let (Some(pending), Some(disk)) = (&node.pending, &node.disk) {
                        match pending.tear(disk, cut_at) {
                            Ok(t) => {
                                let path = node.path.clone().unwrap_or_else(|| "(unlinked)".into());
                                torn = t.map(|t| (path, t));
                            }
                            Err(err) => result = Err(err),
                        }
                    }
                }
            }
        }
        let mut files = 0;
        let mut bytes = 0;
        let inos: Vec<u64> = self.nodes.keys().copied().collect();
        for ino in inos {
            if let Some(node) = self.nodes.get_mut(&ino) {
                if let Some(pending) = node.pending.take() {
                    files += 1;
                    bytes += pending.dirty_bytes();
                }
            }
            self.maybe_drop(ino);
        }
        self.stats.cuts += 1;
        self.stats.lost_files += files;
        self.stats.lost_bytes += bytes;
        result.map(|()| CutReport { files, bytes, torn })
    }

    /// The counters, and what is pending now: (stats, files, dirty bytes).
    pub fn stats(&self) -> (Stats, u64, u64) {
        let pending = self.nodes.values().filter_map(|n| n.pending.as_ref());
        let (files, bytes) = pending.fold((0, 0), |(f, b), p| (f + 1, b + p.dirty_bytes()));
        (self.stats, files, bytes)
    }
}
