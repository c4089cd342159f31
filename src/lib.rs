//! esfs: a FUSE filesystem whose metadata lives in search-engine documents.
//!
//! Layers, top to bottom (dependencies point down only):
//! - [`cmd`]: the commands (mount, umount, fsck, locks, search);
//! - `open`: the one place a filesystem's stores are opened;
//! - `fuse`: fuser callbacks -> [`fs::Fs`] calls (no logic);
//! - [`fs`]: POSIX semantics over the document model (ops, rename intents);
//! - `search`: the content indexer (a `hook::ContentHook`) and grep's index;
//! - [`locks`]: namespace locking;
//! - [`model`]: what inodes and names look like as documents;
//! - [`store`]: the engine trait, its capabilities and its backends;
//! - [`data`]: file contents keyed by a stable id;
//! - `error`: the one mapping from failures to errnos; `causes`: a failure
//!   and its causes on one line;
//! - `daemon`, `private`: process and file-permission plumbing.
//!
//! Public are the modules the binary (`cmd`) and the integration tests
//! (the stores, the filesystem, its model and locks) use; `pub` items
//! elsewhere are reachable from those, or `pub(crate)`.
#![warn(unreachable_pub)]
// No function over 120 lines (clippy.toml) outside the integration tests.
#![warn(clippy::too_many_lines)]

pub mod cmd;
pub mod data;
pub mod fs;
pub mod locks;
pub mod model;
pub mod store;

mod causes;
mod daemon;
mod error;
mod fsck;
mod fuse;
mod hook;
mod open;
mod private;
mod search;
