//! esfs: a FUSE filesystem whose metadata lives in search-engine documents.
//!
//! Layers, top to bottom (dependencies point down only):
//! - [`cmd`]: the commands (mount, umount, fsck, locks, search);
//! - [`open`]: the one place a filesystem's stores are opened;
//! - [`fuse`]: fuser callbacks -> [`fs::Fs`] calls (no logic);
//! - [`fs`]: POSIX semantics over the document model (ops, rename intents);
//! - [`search`]: the content indexer (a [`hook::ContentHook`]) and grep's index;
//! - [`locks`]: namespace locking;
//! - [`model`]: what inodes and names look like as documents;
//! - [`store`]: the engine trait, its capabilities and its backends;
//! - [`data`]: file contents keyed by a stable id;
//! - [`error`]: the one mapping from failures to errnos;
//! - [`daemon`], [`private`]: process and file-permission plumbing.

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
pub mod open;
pub mod private;
pub mod search;
pub mod store;
