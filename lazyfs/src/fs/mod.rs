//! The filesystem: a passthrough to a backing directory whose file data
//! stays in a page-cache model ([`Pending`]) until fsync.
//!
//! What is modelled: file *data* (write, truncate, O_TRUNC) is kept in
//! memory per inode and reaches the backing file only on fsync or
//! fdatasync of that file, or on [`State::sync_all`] (the control
//! socket's `sync`, and a clean unmount). `close` does not persist, as a
//! real page cache does not. A cut ([`State::cut`]) throws every pending
//! change away; a tearing cut first writes one file as if the power went
//! during its last write (what came before it whole, the write itself up
//! to a 512-byte sector boundary).
//!
//! What is not: metadata (create, mkdir, unlink, rmdir, rename, chmod,
//! chown, times) goes to the backing directory at once, so a cut never
//! loses a name, only data; a real filesystem could also lose an unsynced
//! create or rename. Hard links, symlinks, special files, xattrs,
//! fallocate and RENAME_EXCHANGE are refused; POSIX and flock locks are
//! left to the kernel (it handles them locally when the filesystem does
//! not ask for them).
//!
//! The kernel must not cache what a cut can change: files are opened with
//! FOPEN_DIRECT_IO (no page cache on the kernel's side) and every entry
//! and attribute is answered with a zero ttl.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::pending::{Pending, Torn};

/// Entries and attributes are never cached by the kernel.
const TTL: Duration = Duration::ZERO;

/// One inode the kernel knows, or one with unsynced data.
#[derive(Debug)]
struct Node {
    /// Its path under the backing root; `None` once unlinked (or replaced
    /// by a rename).
    path: Option<PathBuf>,
    kind: FileType,
    /// Lookups the kernel holds (entries replied, less forgets).
    lookups: u64,
    /// Open file handles.
    open: u64,
    /// The backing file, open while the inode is used.
    disk: Option<File>,
    /// Unsynced changes.
    pending: Option<Pending>,
}

/// One open directory: its entries, read at opendir.
#[derive(Debug)]
struct DirHandle {
    entries: Vec<(u64, FileType, std::ffi::OsString)>,
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

/// The whole state, behind one lock: requests and cuts never interleave.
#[derive(Debug)]
pub struct State {
    root: PathBuf,
    nodes: HashMap<u64, Node>,
    by_path: HashMap<PathBuf, u64>,
    next_ino: u64,
    /// Open files: handle → inode (and whether it was opened O_APPEND).
    files: HashMap<u64, (u64, bool)>,
    dirs: HashMap<u64, DirHandle>,
    next_fh: u64,
    stats: Stats,
}

/// The filesystem handed to fuser; clones of [`LazyFs::state`] drive cuts.
#[derive(Debug, Clone)]
pub struct LazyFs {
    state: Arc<Mutex<State>>,
}

impl LazyFs {
    /// A filesystem over the backing directory `root`.
    pub fn new(root: &Path) -> Self {
        let root_node = Node {
            path: Some(PathBuf::new()),
            kind: FileType::Directory,
            lookups: 1,
            open: 0,
            disk: None,
            pending: None,
        };
        let state = State {
            root: root.to_owned(),
            nodes: HashMap::from([(INodeNo::ROOT.0, root_node)]),
            by_path: HashMap::from([(PathBuf::new(), INodeNo::ROOT.0)]),
            next_ino: INodeNo::ROOT.0 + 1,
            files: HashMap::new(),
            dirs: HashMap::new(),
            next_fh: 1,
            stats: Stats::default(),
        };
        Self {
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// The shared state (for the control socket).
    pub fn state(&self) -> Arc<Mutex<State>> {
        self.state.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

/// Locks the state; a panic elsewhere does not stop the filesystem.
pub fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A small deterministic generator (splitmix64) for cuts.
fn splitmix(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn errno(err: &io::Error) -> Errno {
    Errno::from_i32(err.raw_os_error().unwrap_or(libc::EIO))
}

fn kind_of(meta: &std::fs::Metadata) -> FileType {
    FileType::from_std(meta.file_type()).unwrap_or(FileType::RegularFile)
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let nanos = u32::try_from(nsecs).unwrap_or(0);
    match u64::try_from(secs) {
        Ok(secs) => UNIX_EPOCH + Duration::new(secs, nanos),
        Err(_) => UNIX_EPOCH,
    }
}

impl State {
    fn full(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    fn node(&self, ino: u64) -> Result<&Node, Errno> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    /// The path of a directory inode, for an operation in it.
    fn dir_path(&self, ino: u64) -> Result<PathBuf, Errno> {
        self.node(ino)?.path.clone().ok_or(Errno::ENOENT)
    }

    fn metadata(&self, ino: u64) -> Result<std::fs::Metadata, Errno> {
        let node = self.node(ino)?;
        let result = match (&node.disk, &node.path) {
            (Some(file), _) => file.metadata(),
            (None, Some(path)) => std::fs::symlink_metadata(self.full(path)),
            (None, None) => return Err(Errno::ENOENT),
        };
        result.map_err(|e| errno(&e))
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
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
    fn remember(&mut self, rel: PathBuf, kind: FileType) -> u64 {
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
    fn maybe_drop(&mut self, ino: u64) {
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
    fn unlinked(&mut self, rel: &Path) {
        if let Some(ino) = self.by_path.remove(rel) {
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.path = None;
            }
            self.maybe_drop(ino);
        }
    }

    /// Opens the backing file of a regular-file inode if it is not open.
    fn open_disk(&mut self, ino: u64) -> Result<(), Errno> {
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
    fn pending(&mut self, ino: u64) -> Result<(&File, &mut Pending), Errno> {
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

    fn new_file_handle(&mut self, ino: u64, append: bool) -> Result<u64, Errno> {
        self.node_mut(ino)?.open += 1;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.files.insert(fh, (ino, append));
        Ok(fh)
    }

    /// Persists one inode's pending changes (fsync).
    fn sync(&mut self, ino: u64) -> Result<bool, Errno> {
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

    fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        let rel = self.dir_path(parent)?.join(name);
        let meta = std::fs::symlink_metadata(self.full(&rel)).map_err(|e| errno(&e))?;
        let ino = self.remember(rel, kind_of(&meta));
        self.attr(ino)
    }

    fn set_times(
        &mut self,
        ino: u64,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
    ) -> io::Result<()> {
        let resolve = |t: TimeOrNow| match t {
            TimeOrNow::SpecificTime(t) => t,
            TimeOrNow::Now => SystemTime::now(),
        };
        let mut times = std::fs::FileTimes::new();
        if let Some(t) = atime {
            times = times.set_accessed(resolve(t));
        }
        if let Some(t) = mtime {
            times = times.set_modified(resolve(t));
        }
        let node = self.nodes.get(&ino).ok_or(io::ErrorKind::NotFound)?;
        match (&node.disk, &node.path) {
            (Some(file), _) => file.set_times(times),
            (None, Some(path)) => File::open(self.full(path))?.set_times(times),
            (None, None) => Err(io::ErrorKind::NotFound.into()),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &mut self,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
    ) -> Result<FileAttr, Errno> {
        let full = self.node(ino)?.path.as_ref().map(|p| self.full(p));
        let disk = self.node(ino)?.disk.as_ref();
        if let Some(mode) = mode {
            let perms = std::fs::Permissions::from_mode(mode & 0o7777);
            let result = match (disk, &full) {
                (Some(file), _) => file.set_permissions(perms),
                (None, Some(path)) => std::fs::set_permissions(path, perms),
                (None, None) => Err(io::ErrorKind::NotFound.into()),
            };
            result.map_err(|e| errno(&e))?;
        }
        if uid.is_some() || gid.is_some() {
            let result = match (disk, &full) {
                (Some(file), _) => std::os::unix::fs::fchown(file, uid, gid),
                (None, Some(path)) => std::os::unix::fs::lchown(path, uid, gid),
                (None, None) => Err(io::ErrorKind::NotFound.into()),
            };
            result.map_err(|e| errno(&e))?;
        }
        if let Some(size) = size {
            let (_, pending) = self.pending(ino)?;
            pending.truncate(size);
        }
        if atime.is_some() || mtime.is_some() {
            self.set_times(ino, atime, mtime).map_err(|e| errno(&e))?;
        }
        self.attr(ino)
    }

    fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(FileAttr, u64), Errno> {
        let rel = self.dir_path(parent)?.join(name);
        let mut options = OpenOptions::new();
        options.read(true).write(true).mode(mode & 0o7777);
        if flags & libc::O_EXCL != 0 {
            options.create_new(true);
        } else {
            options.create(true);
        }
        let file = options.open(self.full(&rel)).map_err(|e| errno(&e))?;
        let ino = self.remember(rel, FileType::RegularFile);
        let node = self.node_mut(ino)?;
        if node.disk.is_none() {
            node.disk = Some(file);
        }
        if flags & libc::O_TRUNC != 0 {
            self.pending(ino)?.1.truncate(0);
        }
        let fh = self.new_file_handle(ino, flags & libc::O_APPEND != 0)?;
        Ok((self.attr(ino)?, fh))
    }

    fn open(&mut self, ino: u64, flags: i32) -> Result<u64, Errno> {
        self.open_disk(ino)?;
        if flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY {
            self.pending(ino)?.1.truncate(0);
        }
        self.new_file_handle(ino, flags & libc::O_APPEND != 0)
    }

    fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let node = self.node(ino)?;
        let disk = node.disk.as_ref().ok_or(Errno::EBADF)?;
        let result = match &node.pending {
            Some(pending) => pending.read(disk, offset, u64::from(size)),
            None => {
                let mut buf = vec![0; size as usize];
                let mut done = 0;
                loop {
                    match disk.read_at(&mut buf[done..], offset + done as u64) {
                        Ok(0) => break,
                        Ok(n) => {
                            done += n;
                            if done == buf.len() {
                                break;
                            }
                        }
                        Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                        Err(err) => return Err(errno(&err)),
                    }
                }
                buf.truncate(done);
                Ok(buf)
            }
        };
        result.map_err(|e| errno(&e))
    }

    fn write(
        &mut self,
        fh: u64,
        ino: u64,
        offset: u64,
        data: &[u8],
        flags: i32,
    ) -> Result<u32, Errno> {
        let append = self.files.get(&fh).is_some_and(|&(_, a)| a) || flags & libc::O_APPEND != 0;
        let (disk, pending) = self.pending(ino)?;
        let offset = if append { pending.size() } else { offset };
        pending.write(disk, offset, data).map_err(|e| errno(&e))?;
        self.stats.writes += 1;
        self.stats.write_bytes += data.len() as u64;
        u32::try_from(data.len()).map_err(|_| Errno::EINVAL)
    }

    fn release(&mut self, fh: u64) {
        if let Some((ino, _)) = self.files.remove(&fh) {
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.open = node.open.saturating_sub(1);
                if node.open == 0 && node.pending.is_none() {
                    node.disk = None;
                }
            }
            self.maybe_drop(ino);
        }
    }

    fn mkdir(&mut self, parent: u64, name: &OsStr, mode: u32) -> Result<FileAttr, Errno> {
        let rel = self.dir_path(parent)?.join(name);
        std::fs::DirBuilder::new()
            .mode(mode & 0o7777)
            .create(self.full(&rel))
            .map_err(|e| errno(&e))?;
        let ino = self.remember(rel, FileType::Directory);
        self.attr(ino)
    }

    fn mknod(&mut self, parent: u64, name: &OsStr, mode: u32) -> Result<FileAttr, Errno> {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Errno::EPERM);
        }
        let rel = self.dir_path(parent)?.join(name);
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode & 0o7777)
            .open(self.full(&rel))
            .map_err(|e| errno(&e))?;
        let ino = self.remember(rel, FileType::RegularFile);
        self.attr(ino)
    }

    fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let rel = self.dir_path(parent)?.join(name);
        let full = self.full(&rel);
        let result = if dir {
            std::fs::remove_dir(full)
        } else {
            std::fs::remove_file(full)
        };
        result.map_err(|e| errno(&e))?;
        self.unlinked(&rel);
        Ok(())
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return Err(Errno::EINVAL);
        }
        let from = self.dir_path(parent)?.join(name);
        let to = self.dir_path(new_parent)?.join(new_name);
        let (from_full, to_full) = (self.full(&from), self.full(&to));
        if flags.contains(RenameFlags::RENAME_NOREPLACE)
            && std::fs::symlink_metadata(&to_full).is_ok()
        {
            return Err(Errno::EEXIST);
        }
        std::fs::rename(&from_full, &to_full).map_err(|e| errno(&e))?;
        if from == to {
            return Ok(());
        }
        self.unlinked(&to);
        let moved: Vec<(PathBuf, u64)> = self
            .by_path
            .iter()
            .filter(|(path, _)| path.starts_with(&from))
            .map(|(path, &ino)| (path.clone(), ino))
            .collect();
        for (old, ino) in moved {
            let Ok(rest) = old.strip_prefix(&from) else {
                continue;
            };
            let new = if rest.as_os_str().is_empty() {
                to.clone()
            } else {
                to.join(rest)
            };
            self.by_path.remove(&old);
            self.by_path.insert(new.clone(), ino);
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.path = Some(new);
            }
        }
        Ok(())
    }

    fn opendir(&mut self, ino: u64) -> Result<u64, Errno> {
        let rel = self.dir_path(ino)?;
        let mut entries = vec![
            (ino, FileType::Directory, ".".into()),
            (ino, FileType::Directory, "..".into()),
        ];
        for entry in std::fs::read_dir(self.full(&rel)).map_err(|e| errno(&e))? {
            let entry = entry.map_err(|e| errno(&e))?;
            let kind = entry
                .file_type()
                .ok()
                .and_then(FileType::from_std)
                .unwrap_or(FileType::RegularFile);
            let child = self
                .by_path
                .get(&rel.join(entry.file_name()))
                .copied()
                .unwrap_or_else(|| std::os::unix::fs::DirEntryExt::ino(&entry).max(1));
            entries.push((child, kind, entry.file_name()));
        }
        let fh = self.next_fh;
        self.next_fh += 1;
        self.dirs.insert(fh, DirHandle { entries });
        Ok(fh)
    }
}

impl Filesystem for LazyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lock().lookup(parent.0, name) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut state = self.lock();
        if let Some(node) = state.nodes.get_mut(&ino.0) {
            node.lookups = node.lookups.saturating_sub(nlookup);
        }
        state.maybe_drop(ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.lock().attr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self
            .lock()
            .setattr(ino.0, mode, uid, gid, size, atime, mtime)
        {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        match self.lock().mknod(parent.0, name, mode & !umask) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        match self.lock().mkdir(parent.0, name, mode & !umask) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.lock().remove(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.lock().remove(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match self
            .lock()
            .rename(parent.0, name, newparent.0, newname, flags)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.lock().open(ino.0, flags.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.lock().read(ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.lock().write(fh.0, ino.0, offset, data, flags.0) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    /// close(2): nothing reaches the disk (a page cache keeps it).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.lock().release(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut state = self.lock();
        state.stats.fsyncs += 1;
        match state.sync(ino.0) {
            Ok(had_data) => {
                if had_data {
                    state.stats.fsyncs_with_data += 1;
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.lock().opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let state = self.lock();
        let Some(dir) = state.dirs.get(&fh.0) else {
            reply.error(Errno::EBADF);
            return;
        };
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (ino, kind, name)) in dir.entries.iter().enumerate().skip(skip) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.lock().dirs.remove(&fh.0);
        reply.ok();
    }

    /// Names are applied to the backing directory at once: nothing to do.
    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let root = self.lock().root.clone();
        match nix::sys::statvfs::statvfs(&root) {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                u32::try_from(s.block_size()).unwrap_or(4096),
                u32::try_from(s.name_max()).unwrap_or(255),
                u32::try_from(s.fragment_size()).unwrap_or(4096),
            ),
            Err(e) => reply.error(Errno::from_i32(e as i32)),
        }
    }

    /// The mount uses `default_permissions`: the kernel checks access.
    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.lock().create(parent.0, name, mode & !umask, flags) {
            Ok((attr, fh)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(e),
        }
    }
}
