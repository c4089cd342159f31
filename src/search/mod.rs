//! `esfs search`: grep through the index.
//!
//! - [`indexer`]: the mount side, putting file text into the `texts` index
//!   in the background and its state into the entries ([`SearchHook`] is
//!   the filesystem's `ContentHook`).
//! - [`run`]: one search, from its [`run::Options`] to its output and exit
//!   status; the command `crate::cmd::search` parses its arguments into them.
//! - [`operand`]: where each PATH is searched (a mount's store, a store
//!   named directly, or plain `grep -r`), and the output paths under it.
//! - [`pattern`]: which literals every match of a grep pattern contains.
//! - [`query`]: the store query for the candidate files.
//! - [`grep`]: the exact answer, from the real `grep` over the candidates.
//! - [`output`]: what is printed beyond grep's own output (JSON, groups, counts).
//!
//! How a search stays identical to `grep -r`: the index only *narrows*. The
//! candidates are every regular file under the PATHs whose indexed text
//! contains the pattern's required literals (case-folded trigrams, so a
//! superset: the inodes a query of `texts` finds, then their entries under
//! the PATHs), plus every file whose text is not indexed (binary, too large,
//! not indexed yet, or being written right now); the real `grep` binary,
//! with the user's flags, then reads exactly those files through the mount.

pub(crate) mod glob;
pub(crate) mod grep;
pub(crate) mod indexer;
pub(crate) mod operand;
pub(crate) mod output;
pub(crate) mod pattern;
pub(crate) mod query;
pub(crate) mod run;

use crate::hook::ContentHook;
use crate::open::OpenError;
use crate::store::{Idx, MetaStore, Query, SearchRequest, Sort, StoreError, StoreResult};
use indexer::Indexer;
use serde_json::{Value, json};
use std::sync::Arc;

/// The inodes whose text in `texts` matches `query`, in order (a text
/// search's first step; fsck's list of texts).
pub(crate) fn text_inos(store: &dyn MetaStore, query: &Query) -> StoreResult<Vec<u64>> {
    const PAGE: usize = 10_000;
    let mut out = Vec::new();
    let mut after: Option<Vec<Value>> = None;
    loop {
        let rows = store.search_fields(
            &SearchRequest {
                past_own_writes: false,
                index: Idx::Texts,
                query: query.clone(),
                sort: vec![Sort::asc("ino")],
                search_after: after.clone(),
                size: PAGE,
            },
            &["ino"],
        )?;
        let n = rows.len();
        out.extend(rows.iter().filter_map(|r| r.first()?.as_u64()));
        match out.last() {
            Some(&last) if n == PAGE => after = Some(vec![Value::from(last)]),
            _ => return Ok(out),
        }
    }
}

/// A search's failure (worded as `esfs search: MESSAGE`).
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("corrupt document: {0}")]
    Json(#[from] serde_json::Error),
    /// A failure the search words itself.
    #[error("{0}")]
    Msg(String),
}

impl From<String> for SearchError {
    fn from(m: String) -> Self {
        SearchError::Msg(m)
    }
}

impl From<&str> for SearchError {
    fn from(m: &str) -> Self {
        SearchError::Msg(m.to_string())
    }
}

/// What a mount's filesystem holds for search: its indexer and description.
pub(crate) struct SearchHook {
    pub indexer: Arc<Indexer>,
    /// The mount description (`crate::open::Backend::description`).
    pub info: Value,
}

impl ContentHook for SearchHook {
    fn changed(&self, ino: u64) {
        self.indexer.enqueue(ino);
    }

    fn activity(&self) {
        self.indexer.activity();
    }

    fn rewriting(&self, on: bool) {
        self.indexer.rewriting(on);
    }

    /// `{"mount": info, "pending": N, "open": [ino...]}`; `pending` counts
    /// files queued for indexing (their entries say "not indexed", so search
    /// scans them), `open` lists files with unpersisted writes (scanned too).
    /// No waiting: a backlog of thousands of files must not delay a search.
    fn describe(&self, open: Vec<u64>) -> Vec<u8> {
        let pending = self.indexer.queued();
        serde_json::to_vec(&json!({"mount": self.info, "pending": pending, "open": open}))
            .expect("json")
    }

    fn stop(&self) {
        self.indexer.stop();
    }
}

/// Maximum size of indexed text: `ESFS_INDEX_MAX_BYTES` (0 = index no text), else 1 MiB.
pub(crate) fn max_index_bytes() -> u64 {
    std::env::var("ESFS_INDEX_MAX_BYTES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(indexer::DEFAULT_MAX_BYTES)
}

/// Start content indexing for a mount's filesystem; `info` is the mount's
/// description, which `esfs search` reads back to open the same store.
pub(crate) fn attach(fs: &crate::fs::Fs, info: Value) {
    let indexer = Indexer::start(fs.store(), fs.data().clone(), max_index_bytes());
    fs.set_content_hook(Box::new(SearchHook {
        indexer: Arc::new(indexer),
        info,
    }));
}
