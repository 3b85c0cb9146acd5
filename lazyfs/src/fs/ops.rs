//! What each file and directory request does to the state and the
//! backing directory: lookups, attributes, create and open (O_TRUNC is a
//! pending truncate), read and write through the pending data, release,
//! and the metadata operations, which reach the backing directory at once.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::time::SystemTime;

use fuser::{Errno, FileAttr, FileType, RenameFlags, TimeOrNow};

use super::inodes::{errno, kind_of, DirHandle, State};

impl State {
    pub(super) fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
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
    pub(super) fn setattr(
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

    pub(super) fn create(
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

    pub(super) fn open(&mut self, ino: u64, flags: i32) -> Result<u64, Errno> {
        self.open_disk(ino)?;
        if flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY {
            self.pending(ino)?.1.truncate(0);
        }
        self.new_file_handle(ino, flags & libc::O_APPEND != 0)
    }

    pub(super) fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
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

    pub(super) fn write(
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

    pub(super) fn release(&mut self, fh: u64) {
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

    pub(super) fn mkdir(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
    ) -> Result<FileAttr, Errno> {
        let rel = self.dir_path(parent)?.join(name);
        std::fs::DirBuilder::new()
            .mode(mode & 0o7777)
            .create(self.full(&rel))
            .map_err(|e| errno(&e))?;
        let ino = self.remember(rel, FileType::Directory);
        self.attr(ino)
    }

    pub(super) fn mknod(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
    ) -> Result<FileAttr, Errno> {
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

    pub(super) fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
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

    pub(super) fn rename(
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

    pub(super) fn opendir(&mut self, ino: u64) -> Result<u64, Errno> {
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
