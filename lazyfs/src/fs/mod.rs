//! The filesystem: a passthrough to a backing directory whose file data
//! stays in a page-cache model ([`Pending`](crate::pending::Pending)) until fsync.
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
//!
//! - `inodes.rs`: the state behind the one lock and its inode table (which
//!   inode names which backing path, who holds it, when it is forgotten);
//! - `ops.rs`: what each file and directory request does;
//! - `durability.rs`: fsync, [`State::sync_all`] and power cuts;
//! - `fuse.rs`: [`LazyFs`], the requests' entry points.

mod durability;
mod fuse;
mod inodes;
mod ops;

pub use durability::{CutMode, CutReport};
pub use fuse::LazyFs;
pub use inodes::{lock, State, Stats};
