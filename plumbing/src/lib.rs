//! Palisade's shared plumbing, which is not vocabulary (that is
//! `palisade-names`): [`sync`], locks that survive a panicked holder, and
//! [`sled_files`], the fsyncs after sled's flush (new blobs, then the data
//! file) without which a power cut loses what sled called stable. Every
//! crate that locks or keeps a sled database uses these.

pub mod sled_files;
pub mod sync;
