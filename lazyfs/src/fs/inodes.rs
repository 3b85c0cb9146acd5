//! The state behind the filesystem's one lock, and its inode table: which
//! backing path each inode the kernel knows names, how many lookups and
//! open handles hold it, its open backing file and its unsynced data
//! ([`Pending`]). An inode is forgotten once nothing reaches it, unless it
//! still has a name and unsynced data (a later lookup must see that data).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo};

use crate::pending::Pending;

/// One inode the kernel knows, or one with unsynced data.
#[derive(Debug)]
pub(super) struct Node {
    /// Its path under the backing root; `None` once unlinked (or replaced
    /// by a rename).
    pub(super) path: Option<PathBuf>,
    pub(super) kind: FileType,
    /// Lookups the kernel holds (entries replied, less forgets).
    pub(super) lookups: u64,
    /// Open file handles.
    pub(super) open: u64,
    /// The backing file, open while the inode is used.
    pub(super) disk: Option<File>,
    /// Unsynced changes.
    pub(super) pending: Option<Pending>,
}

/// One open directory: its entries, read at opendir.
#[derive(Debug)]
pub(super) struct DirHandle {
    pub(super) entries: Vec<(u64, FileType, std::ffi::OsString)>,
}

/// Counters, for the control socket's `stats`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Write requests.
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// fsync and fdatasync requests.
    pub fsyncs: u64,
    /// Of those, the ones that had something to persist.
    pub fsyncs_with_data: u64,
    /// Cuts so far.
    pub cuts: u64,
    /// Files whose pending changes cuts discarded.
    pub lost_files: u64,
    /// Dirty bytes cuts discarded.
    pub lost_bytes: u64,
}

/// The whole state, behind one lock: requests and cuts never interleave.
#[derive(Debug)]
pub struct State {
    pub(super) root: PathBuf,
    pub(super) nodes: HashMap<u64, Node>,
    pub(super) by_path: HashMap<PathBuf, u64>,
    pub(super) next_ino: u64,
    /// Open files: handle → inode (and whether it was opened O_APPEND).
    pub(super) files: HashMap<u64, (u64, bool)>,
    pub(super) dirs: HashMap<u64, DirHandle>,
    pub(super) next_fh: u64,
    pub(super) stats: Stats,
}

/// Locks the state; a panic elsewhere does not stop the filesystem.
pub fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The errno of `err` (EIO if it has none).
pub(super) fn errno(err: &io::Error) -> Errno {
    Errno::from_i32(err.raw_os_error().unwrap_or(libc::EIO))
}

/// The FUSE file type of `meta` (a regular file if FUSE has no name for it).
pub(super) fn kind_of(meta: &std::fs::Metadata) -> FileType {
    FileType::from_std(meta.file_type()).unwrap_or(FileType::RegularFile)
}

/// A timestamp from `stat`'s seconds and nanoseconds (the epoch if negative).
fn time(secs: i64, nsecs: i64) -> SystemTime {
    let nanos = u32::try_from(nsecs).unwrap_or(0);
    match u64::try_from(secs) {
        Ok(secs) => UNIX_EPOCH + Duration::new(secs, nanos),
        Err(_) => UNIX_EPOCH,
    }
}

impl State {
    /// The state of a fresh mount of `root`: only the root inode known.
    pub(super) fn new(root: &Path) -> Self {
        let root_node = Node {
            path: Some(PathBuf::new()),
            kind: FileType::Directory,
            lookups: 1,
            open: 0,
            disk: None,
            pending: None,
        };
        Self {
            root: root.to_owned(),
            nodes: HashMap::from([(INodeNo::ROOT.0, root_node)]),
            by_path: HashMap::from([(PathBuf::new(), INodeNo::ROOT.0)]),
            next_ino: INodeNo::ROOT.0 + 1,
            files: HashMap::new(),
            dirs: HashMap::new(),
            next_fh: 1,
            stats: Stats::default(),
        }
    }

    pub(super) fn full(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    pub(super) fn node(&self, ino: u64) -> Result<&Node, Errno> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    pub(super) fn node_mut(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    /// The path of a directory inode, for an operation in it.
    pub(super) fn dir_path(&self, ino: u64) -> Result<PathBuf, Errno> {
        self.node(ino)?.path.clone().ok_or(Errno::ENOENT)
    }

    pub(super) fn metadata(&self, ino: u64) -> Result<std::fs::Metadata, Errno> {
        let node = self.node(ino)?;
        let result = match (&node.disk, &node.path) {
            (Some(file), _) => file.metadata(),
            (None, Some(path)) => std::fs::symlink_metadata(self.full(path)),
            (None, None) => return Err(Errno::ENOENT),
        };
        result.map_err(|e| errno(&e))
    }

    pub(super) fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let meta = self.metadata(ino)?;
        let node = self.node(ino)?;
        let size = node.pending.as_ref().map_or(meta.len(), Pending::size);
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind: kind_of(&meta),
            perm: (meta.mode() & 0o7777) as u16,
            nlink: u32::try_from(meta.nlink()).unwrap_or(u32::MAX),
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: u32::try_from(meta.rdev()).unwrap_or(0),
            blksize: 4096,
            flags: 0,
        })
    }

    /// The inode for `rel` (which exists on the backing side), made known
    /// to the kernel once more.
    pub(super) fn remember(&mut self, rel: PathBuf, kind: FileType) -> u64 {
        let ino = match self.by_path.get(&rel) {
            Some(&ino) => ino,
            None => {
                let ino = self.next_ino;
                self.next_ino += 1;
                self.nodes.insert(
                    ino,
                    Node {
                        path: Some(rel.clone()),
                        kind,
                        lookups: 0,
                        open: 0,
                        disk: None,
                        pending: None,
                    },
                );
                self.by_path.insert(rel, ino);
                ino
            }
        };
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups += 1;
        }
        ino
    }

    /// Forgets an inode nobody can reach any more. One with unsynced data
    /// and a name stays: a later lookup must see that data.
    pub(super) fn maybe_drop(&mut self, ino: u64) {
        let Some(node) = self.nodes.get(&ino) else {
            return;
        };
        if ino == INodeNo::ROOT.0 || node.lookups > 0 || node.open > 0 {
            return;
        }
        if node.path.is_some() && node.pending.is_some() {
            return;
        }
        if let Some(node) = self.nodes.remove(&ino) {
            if let Some(path) = node.path {
                if self.by_path.get(&path) == Some(&ino) {
                    self.by_path.remove(&path);
                }
            }
        }
    }

    /// The name at `rel` is gone (unlink, rmdir, replaced by a rename).
    pub(super) fn unlinked(&mut self, rel: &Path) {
        if let Some(ino) = self.by_path.remove(rel) {
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.path = None;
            }
            self.maybe_drop(ino);
        }
    }

    /// Opens the backing file of a regular-file inode if it is not open.
    pub(super) fn open_disk(&mut self, ino: u64) -> Result<(), Errno> {
        let full = {
            let node = self.node(ino)?;
            if node.disk.is_some() {
                return Ok(());
            }
            if node.kind != FileType::RegularFile {
                return Err(Errno::EISDIR);
            }
            self.full(node.path.as_ref().ok_or(Errno::ENOENT)?)
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&full)
            .or_else(|_| File::open(&full))
            .map_err(|e| errno(&e))?;
        self.node_mut(ino)?.disk = Some(file);
        Ok(())
    }

    /// The inode's pending state, made if it has none.
    pub(super) fn pending(&mut self, ino: u64) -> Result<(&File, &mut Pending), Errno> {
        self.open_disk(ino)?;
        let node = self.node_mut(ino)?;
        let disk = node.disk.as_ref().ok_or(Errno::EBADF)?;
        if node.pending.is_none() {
            let len = disk.metadata().map_err(|e| errno(&e))?.len();
            node.pending = Some(Pending::new(len));
        }
        match (&node.disk, &mut node.pending) {
            (Some(disk), Some(pending)) => Ok((disk, pending)),
            _ => Err(Errno::EIO),
        }
    }

    pub(super) fn new_file_handle(&mut self, ino: u64, append: bool) -> Result<u64, Errno> {
        self.node_mut(ino)?.open += 1;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.files.insert(fh, (ino, append));
        Ok(fh)
    }
}
