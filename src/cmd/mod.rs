//! The `esfs` commands. Each parses its own arguments (clap), opens what it
//! needs through [`crate::open`], and returns an exit status;
//! [`CmdError`] is the one place the library's typed errors become the
//! one-line message a command prints.

pub(crate) mod args;
pub mod fsck;
pub mod locks;
pub mod mount;
pub mod search;

use crate::daemon::UmountError;
use crate::error::FsError;
use crate::fs::{Fs, FsConfig};
use crate::open::{OpenError, Stores, open_stores};
use crate::store::StoreError;
use crate::store::cache::CachedStore;
use args::StoreArgs;
use std::sync::Arc;

/// A command's failure, printed as `esfs: MESSAGE`.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Umount(#[from] UmountError),
    #[error(transparent)]
    Search(#[from] crate::search::SearchError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("corrupt document: {0}")]
    Json(#[from] serde_json::Error),
    /// A usage error or a failure the command words itself.
    #[error("{0}")]
    Msg(String),
}

impl From<String> for CmdError {
    fn from(m: String) -> Self {
        CmdError::Msg(m)
    }
}

impl From<&str> for CmdError {
    fn from(m: &str) -> Self {
        CmdError::Msg(m.to_string())
    }
}

/// An Fs for a maintenance command: no formatting or recovery on open.
/// Without `contents` the data directory is not opened (nor checked).
fn open_fs(store: &StoreArgs, contents: bool) -> Result<(Fs, Stores), CmdError> {
    let (backend, data, _) = store.resolve()?;
    let data = data.filter(|_| contents);
    let blocks = store.block_config()?;
    let stores = open_stores(&backend, data.as_deref(), blocks.as_ref(), false, None)?;
    let fs = Fs::new(
        Arc::new(CachedStore::off(stores.meta.clone())),
        stores.data.clone(),
        FsConfig {
            label: "esfs maintenance".into(),
            maintenance: true,
            ..Default::default()
        },
    )?;
    Ok((fs, stores))
}
