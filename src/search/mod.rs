//! `esfs search`: grep through the index.
//!
//! - [`indexer`]: the mount side, putting file text into entry documents in
//!   the background, and the flush/discovery protocol ([`SearchHook`]).
//! - [`pattern`]: which literals every match of a grep pattern contains.
//! - [`query`]: the store query for the candidate files.
//! - [`grep`]: the exact answer, from the real `grep` over the candidates.
//! - [`cli`]: the command.
//!
//! How a search stays identical to `grep -r`: the index only *narrows*. The
//! candidates are every regular file under the PATHs whose indexed text
//! contains the pattern's required literals (case-folded trigrams, so a
//! superset), plus every file whose text is not indexed (binary, too large,
//! not indexed yet, or being written right now); the real `grep` binary,
//! with the user's flags, then reads exactly those files through the mount.

pub mod cli;
pub mod glob;
pub mod grep;
pub mod indexer;
pub mod pattern;
pub mod query;

use indexer::Indexer;
use serde_json::{Value, json};
use std::sync::Arc;

/// The reserved xattr of a mount's root: reading it writes back pending
/// sizes and times and returns the mount's description (JSON, see
/// [`SearchHook::flush`]); it never waits for the indexer. `user.` because the kernel passes only known
/// namespaces to FUSE; setting it is EPERM, and it is never listed.
pub const FLUSH_XATTR: &str = "user.esfs.flush";

/// What a mount's filesystem holds for search: its indexer and description.
pub struct SearchHook {
    pub indexer: Arc<Indexer>,
    /// `{"backend": "embedded", "store": DIR, "data": DIR}` or
    /// `{"backend": "elasticsearch", "url": URL (no credentials), "index":
    /// NAME, "data": DIR|null, "ca": FILE|null}`.
    pub info: Value,
}

impl SearchHook {
    /// The answer to a read of [`FLUSH_XATTR`]:
    /// `{"mount": info, "pending": N, "open": [ino...]}`; `pending` counts
    /// files queued for indexing (their entries say "not indexed", so search
    /// scans them), `open` lists files with unpersisted writes (scanned too).
    /// No waiting: a backlog of thousands of files must not delay a search.
    pub fn flush(&self, open: Vec<u64>) -> Vec<u8> {
        let pending = self.indexer.queued();
        serde_json::to_vec(&json!({"mount": self.info, "pending": pending, "open": open}))
            .expect("json")
    }
}

/// Maximum size of indexed text: `ESFS_INDEX_MAX_BYTES` (0 = index no text), else 1 MiB.
pub fn max_index_bytes() -> u64 {
    std::env::var("ESFS_INDEX_MAX_BYTES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(indexer::DEFAULT_MAX_BYTES)
}

/// Start content indexing for a mount's filesystem.
pub fn attach(fs: &crate::fs::Fs, backend: &crate::mount::Backend, data: Option<&std::path::Path>) {
    use crate::mount::Backend;
    let info = match backend {
        Backend::Embedded(dir) => json!({"backend": "embedded", "store": dir, "data": data}),
        Backend::Elasticsearch(es) => json!({
            "backend": "elasticsearch",
            "url": crate::store::es::redact(&es.url),
            "index": es.index,
            "data": data,
            "ca": es.ca,
        }),
    };
    let indexer = Indexer::start(fs.store().clone(), fs.data().clone(), max_index_bytes());
    fs.set_search(SearchHook {
        indexer: Arc::new(indexer),
        info,
    });
}
