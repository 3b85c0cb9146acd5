//! palisade-lazyfs: a FUSE filesystem for power-loss tests, in the manner of
//! Jepsen's LazyFS. It mounts a backing directory and keeps every file's
//! unsynced data in memory (a page-cache model, [`pending`]), so that a
//! simulated power cut ([`control`]) loses exactly what a real one could:
//! whatever was written but not fsynced. What is and is not modelled is in
//! [`fs`].
//!
//! The binary (`palisade-lazyfs MOUNT BACKING`) serves one mount in the
//! foreground and its control socket; `palisade-lazyfs cut SOCKET` cuts
//! the power. A test kills the processes using the mount, cuts, and
//! starts them again on the same mount.

pub mod control;
pub mod fs;
pub mod pending;

pub use fs::{CutMode, CutReport, LazyFs, State, Stats};
pub use pending::{Pending, Torn, PAGE, SECTOR};
