//! esfs: a FUSE filesystem whose metadata lives in search-engine documents.
//!
//! Layers, top to bottom:
//! - [`fuse`]: fuser callbacks -> [`fs::Fs`] calls (no logic);
//! - [`fs`]: POSIX semantics over the document model (namespace, files, dirs);
//! - [`locks`]: namespace locking;
//! - [`model`]: what inodes and names look like as documents;
//! - [`store`]: the metadata-store trait and its backends;
//! - [`data`]: file contents keyed by a stable id;
//! - [`error`]: the one mapping from failures to errnos.

pub mod cmd;
pub mod daemon;
pub mod data;
pub mod error;
pub mod fs;
pub mod fsck;
pub mod fuse;
pub mod hook;
pub mod locks;
pub mod model;
pub mod private;
pub mod search;
pub mod store;
