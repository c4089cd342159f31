//! The metadata-store boundary: a small trait shaped like Elasticsearch's own
//! document primitives, so the filesystem, the lock protocol and the rename
//! algorithm are written once above it and run unchanged on every backend.
//!
//! Semantics every backend must honour (they are Elasticsearch's):
//! - `get`/`mget` are realtime: they see every acknowledged write at once.
//! - `search`/`count` may lag writes until `refresh` (near-real-time); the
//!   embedded store is realtime and its `refresh` is a no-op.
//! - every write returns a [`Version`] (`_seq_no` + `_primary_term`); a write
//!   or delete carrying `if_version` fails with [`StoreError::Conflict`] when
//!   the document changed since.
//! - `create` fails with `Conflict` when the id exists ("put if absent").
//! - `bulk` never fails as a whole for item errors: each item has its own result.
//! - ids are UTF-8 strings of at most [`MAX_ID_BYTES`] bytes.

pub mod cache;
pub mod delegated;
pub mod embedded;
pub mod es;
#[cfg(test)]
pub(crate) mod gated;
pub(crate) mod listing;
pub(crate) mod schema;

use serde_json::Value;
use std::sync::Arc;

pub use schema::Idx;

/// Elasticsearch refuses `_id`s longer than this.
pub const MAX_ID_BYTES: usize = 512;

/// What [`MetaStore::rebase_paths`] moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rebased {
    pub count: u64,
    /// The moved documents' ids, when the store has them at hand (a
    /// delegated mount's overlay): a cache above drops just those instead
    /// of looking through every document it holds. `None`: any document
    /// below the old path may have moved.
    pub ids: Option<Vec<String>>,
}

/// Optimistic-concurrency token of a document (`_seq_no`, `_primary_term`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    pub seq_no: u64,
    pub primary_term: u64,
}

/// A stored document.
#[derive(Clone, Debug, PartialEq)]
pub struct Doc {
    pub id: String,
    pub version: Version,
    pub source: Arc<Value>,
}

impl Doc {
    /// Its source as a typed document, read in place (the source is shared
    /// with the caches that handed it out: no copy).
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        T::deserialize(&*self.source)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    /// 409 `version_conflict_engine_exception`: exists (create) or stale version.
    #[error("version conflict on {0}")]
    Conflict(String),
    /// 404: the document (for a conditional write/delete) does not exist.
    #[error("document not found: {0}")]
    NotFound(String),
    /// The request itself is wrong (bad id, unknown field, invalid document).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The backend cannot be reached or is overloaded after retries.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backend refuses this client for a cause the user must fix
    /// (credentials, privileges, TLS trust); the message names it.
    #[error("{0}")]
    Refused(String),
    /// Anything else the backend reports.
    #[error("store error: {0}")]
    Other(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// One item of a bulk request.
#[derive(Clone, Debug)]
pub enum BulkOp {
    /// Put-if-absent.
    Create {
        index: Idx,
        id: String,
        source: Value,
    },
    /// Create or overwrite; with `if_version`, only if the current version matches.
    Index {
        index: Idx,
        id: String,
        source: Value,
        if_version: Option<Version>,
    },
    /// Partial update (Elasticsearch's `update` with a `doc`): the top-level
    /// fields of `doc` replace the document's, the others stay (file text
    /// is neither read nor rewritten). `Err(NotFound)` when the document is
    /// absent; with `if_version`, `Conflict` when stale.
    Update {
        index: Idx,
        id: String,
        doc: Value,
        if_version: Option<Version>,
    },
    /// Delete; with `if_version`, only if the current version matches.
    Delete {
        index: Idx,
        id: String,
        if_version: Option<Version>,
    },
}

impl BulkOp {
    pub fn index(&self) -> Idx {
        match self {
            BulkOp::Create { index, .. }
            | BulkOp::Index { index, .. }
            | BulkOp::Update { index, .. }
            | BulkOp::Delete { index, .. } => *index,
        }
    }

    pub fn id(&self) -> &str {
        match self {
            BulkOp::Create { id, .. }
            | BulkOp::Index { id, .. }
            | BulkOp::Update { id, .. }
            | BulkOp::Delete { id, .. } => id,
        }
    }
}

/// Per-item result of a bulk request: the new version, or the item's error.
/// A delete of an absent document (without `if_version`) is `Err(NotFound)`.
pub type BulkItemResult = StoreResult<Version>;

/// The query subset esfs needs; each variant maps to one Elasticsearch query.
#[derive(Clone, Debug, PartialEq)]
pub enum Query {
    MatchAll,
    /// `term`: exact value of a keyword/numeric/bool field.
    Term {
        field: String,
        value: Value,
    },
    /// `terms`: any of the values.
    Terms {
        field: String,
        values: Vec<Value>,
    },
    /// `prefix` on a keyword field.
    Prefix {
        field: String,
        value: String,
    },
    /// `term` on `<field>.tree` (path_hierarchy): the path itself or anything
    /// below it (`/a/b` matches `/a/b` and `/a/b/c`, never `/a/bc`).
    Tree {
        field: String,
        path: String,
    },
    /// `range` on a numeric field; bounds are inclusive (`gte`/`lte`) or exclusive.
    Range {
        field: String,
        gte: Option<Value>,
        gt: Option<Value>,
        lte: Option<Value>,
        lt: Option<Value>,
    },
    /// `exists`.
    Exists {
        field: String,
    },
    /// Full-text substring on a `Text` field: the documents whose text
    /// contains every trigram (3-character window) of `text`, case-folded.
    /// Backends may match more than the substring itself (the trigrams in
    /// any order), never less. `text` must have at least 3 characters.
    Text {
        field: String,
        text: String,
    },
    /// `bool`: all of `must`, none of `must_not`, and (if non-empty) any of `should`.
    Bool {
        must: Vec<Query>,
        must_not: Vec<Query>,
        should: Vec<Query>,
    },
}

impl Query {
    pub fn term(field: &str, value: impl Into<Value>) -> Query {
        Query::Term {
            field: field.to_string(),
            value: value.into(),
        }
    }
    pub fn tree(field: &str, path: &str) -> Query {
        Query::Tree {
            field: field.to_string(),
            path: path.to_string(),
        }
    }
    pub fn and(must: Vec<Query>) -> Query {
        Query::Bool {
            must,
            must_not: vec![],
            should: vec![],
        }
    }

    /// The clauses a query is the conjunction of: itself when a term, the
    /// `must` clauses of a `bool` with no other kind; None otherwise.
    pub fn clauses(&self) -> Option<Vec<&Query>> {
        match self {
            Query::Term { .. } => Some(vec![self]),
            Query::Bool {
                must,
                must_not,
                should,
            } if must_not.is_empty() && should.is_empty() => Some(must.iter().collect()),
            _ => None,
        }
    }

    /// The `parent` every match of a conjunction of terms has (a directory
    /// listing's query), if it names one.
    pub fn parent_term(&self) -> Option<u64> {
        self.clauses()?.iter().find_map(|t| match t {
            Query::Term { field, value } if field == "parent" => value.as_u64(),
            _ => None,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Sort {
    pub field: String,
    pub descending: bool,
}

impl Sort {
    pub fn asc(field: &str) -> Sort {
        Sort {
            field: field.to_string(),
            descending: false,
        }
    }
}

/// A search: query, sort (must end in a unique field for stable paging),
/// `search_after` (the `sort` values of the last hit of the previous page).
#[derive(Clone, Debug)]
pub struct SearchRequest {
    pub index: Idx,
    pub query: Query,
    pub sort: Vec<Sort>,
    pub search_after: Option<Vec<Value>>,
    pub size: usize,
    /// Skip read-your-writes: the caller made the index current itself
    /// and pages past what it writes between pages (a subtree rename's
    /// path rewrite: its `search_after` cursor is beyond every document it
    /// rewrote). On Elasticsearch that is a refresh fewer per page.
    pub past_own_writes: bool,
}

/// Field collapsing (terms + top_hits, as in Elasticsearch: The Definitive
/// Guide, chapter "Handling Relationships", "Field Collapsing"): the documents matching
/// `query`, in one bucket per value of `field`, buckets ordered by their best
/// hit's score (then key), each with its `per_bucket` best hits (score, then
/// id). `score` adds relevance without filtering (a `should` clause); without
/// it every score is 0.
#[derive(Clone, Debug)]
pub struct GroupRequest {
    pub index: Idx,
    pub query: Query,
    pub score: Option<Query>,
    pub field: String,
    pub buckets: usize,
    pub per_bucket: usize,
}

#[derive(Clone, Debug)]
pub struct Bucket {
    pub key: Value,
    pub doc_count: u64,
    pub top_score: f64,
    /// Best hits, with their scores; sources are brief (no `Text` fields).
    pub hits: Vec<(Doc, f64)>,
}

#[derive(Clone, Debug)]
pub struct Hit {
    pub doc: Doc,
    /// The hit's sort values, to pass as the next page's `search_after`.
    pub sort: Vec<Value>,
}

/// Which part of esfs a thread's store requests serve. Elasticsearch hears
/// it as `X-Opaque-Id` (shown in its task list and slow logs, so an operator
/// can tell a mount's heartbeat from its users' work), and the request
/// tests count by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A filesystem call (FUSE threads; the default).
    Fs,
    /// Lazy close, directory times and atimes written back in the background.
    WriteBack,
    /// The content indexer.
    Indexer,
    /// The session lease's renewal.
    Heartbeat,
    /// Cached shared tree locks let go after their operations.
    LockRelease,
    /// The janitor reaping dead mounts.
    Janitor,
    /// A command (fsck, locks, search).
    Command,
}

impl Caller {
    pub const ALL: [Caller; 7] = [
        Caller::Fs,
        Caller::WriteBack,
        Caller::Indexer,
        Caller::Heartbeat,
        Caller::LockRelease,
        Caller::Janitor,
        Caller::Command,
    ];

    /// The `X-Opaque-Id` value.
    pub fn opaque_id(self) -> &'static str {
        match self {
            Caller::Fs => "esfs/fs",
            Caller::WriteBack => "esfs/writeback",
            Caller::Indexer => "esfs/indexer",
            Caller::Heartbeat => "esfs/heartbeat",
            Caller::LockRelease => "esfs/locks",
            Caller::Janitor => "esfs/janitor",
            Caller::Command => "esfs/command",
        }
    }

    /// The janitor looks for sessions and intents at least a lease old,
    /// which a near-real-time search sees without a refresh: its searches
    /// skip read-your-writes (otherwise the heartbeat's write to the same
    /// index makes every janitor pass cost a refresh too). So do searches
    /// [`SearchRequest::past_own_writes`], for any caller.
    pub fn reads_only_old_documents(self) -> bool {
        self == Caller::Janitor
    }

    /// The janitor rolls other mounts' half-done changes forward: what it
    /// reads decides multi-document repairs, so no cache answers it.
    pub fn reads_fresh(self) -> bool {
        self == Caller::Janitor
    }
}

/// What an engine offers beyond the required primitives. The filesystem,
/// the lock protocol and the rename read these, never a backend's name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// This process is the store's only writer (an embedded store claimed by
    /// its mount): what it read stays true until it changes it, so its
    /// caches need no revalidation, the kernel may cache for long, and every
    /// other lock owner is dead. Otherwise other mounts write too.
    pub single_writer: bool,
    /// [`MetaStore::bulk_atomic`] applies a bulk all or nothing.
    pub atomic_bulk: bool,
    /// [`MetaStore::rebase_paths`] rewrites a moved subtree's paths in the engine.
    pub rebase_paths: bool,
    /// [`MetaStore::begin_batch`]/[`MetaStore::end_batch`] group a call's
    /// writes into one commit.
    pub batches: bool,
    /// `search` sees every acknowledged write at once (no refresh needed).
    pub realtime_search: bool,
}

/// The metadata store: the primitives an engine implements. Synchronous on
/// purpose: FUSE handlers run on their own threads and block; a network
/// backend owns its own async runtime inside.
///
/// Three tiers: the required primitives (Elasticsearch's own: get, mget,
/// bulk, search, count, refresh, plus sync, describe and the
/// [`Capabilities`]); single-document writes and projections, provided in
/// terms of those and overridden where an engine has a cheaper path; and
/// the optional primitives a capability declares, whose defaults say "not
/// offered". What only a cache needs (fresh reads, hints, directory
/// listings) is not here: it is [`cache::CachedStore`]'s, a layer above.
pub trait MetaStore: Send + Sync {
    // ---- required primitives ----

    /// What this engine offers beyond the primitives.
    fn capabilities(&self) -> Capabilities;
    /// Realtime get by id.
    fn get(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>>;
    /// Realtime multi-get; results in the order of `ids`.
    fn mget(&self, index: Idx, ids: &[String]) -> StoreResult<Vec<Option<Doc>>>;
    /// Bulk: one result per op, in order. The call errs only when the whole
    /// request fails (transport); item errors are in the items.
    fn bulk(&self, ops: Vec<BulkOp>) -> StoreResult<Vec<BulkItemResult>>;
    /// One page of a sorted search.
    fn search(&self, req: &SearchRequest) -> StoreResult<Vec<Hit>>;
    /// Number of documents matching.
    fn count(&self, index: Idx, query: &Query) -> StoreResult<u64>;
    /// Make all acknowledged writes visible to search.
    fn refresh(&self, index: Idx) -> StoreResult<()>;
    /// Make this client's own acknowledged writes to `index` visible to
    /// every client's searches: a refresh only where some may not be yet.
    /// A mount does this before it gives up a shared tree lock, so whoever
    /// locks the directory next counts its names without a refresh (see
    /// `LockManager`). By default a refresh unless searches are realtime;
    /// a layer passes it down.
    fn publish(&self, index: Idx) -> StoreResult<()> {
        if self.capabilities().realtime_search {
            return Ok(());
        }
        self.refresh(index)
    }
    /// [`MetaStore::publish`], and for every reader at once, other processes
    /// included: what this store acknowledged in `index` is searchable when
    /// it returns (the content indexer's texts, before the entries that
    /// send readers to them). A layer passes it down; a mount holding the
    /// delegation sends what it holds first.
    fn expose(&self, index: Idx) -> StoreResult<()> {
        self.publish(index)
    }
    /// Make all acknowledged writes durable (fsync) where the backend buffers them.
    fn sync(&self) -> StoreResult<()>;
    /// A short human description ("sqlite:/path", "elasticsearch:http://...").
    fn describe(&self) -> String;

    // ---- provided: single-document writes (one-item bulks by default) ----

    /// Put if absent: `Conflict` when the id exists.
    fn create(&self, index: Idx, id: &str, source: &Value) -> StoreResult<Version> {
        one(self.bulk(vec![BulkOp::Create {
            index,
            id: id.into(),
            source: source.clone(),
        }])?)
    }
    /// Create or overwrite; with `if_version`, `Conflict` when stale (also when
    /// the document is gone: Elasticsearch answers 409 there too).
    fn put(
        &self,
        index: Idx,
        id: &str,
        source: &Value,
        if_version: Option<Version>,
    ) -> StoreResult<Version> {
        one(self.bulk(vec![BulkOp::Index {
            index,
            id: id.into(),
            source: source.clone(),
            if_version,
        }])?)
    }
    /// Delete; `Ok(false)` when absent (404). With `if_version`, `Conflict` when stale.
    fn delete(&self, index: Idx, id: &str, if_version: Option<Version>) -> StoreResult<bool> {
        let r = one(self.bulk(vec![BulkOp::Delete {
            index,
            id: id.into(),
            if_version,
        }])?);
        match r {
            Ok(_) => Ok(true),
            Err(StoreError::NotFound(_)) if if_version.is_none() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Realtime get of documents of several indices, results in order: one
    /// round trip where the engine can (Elasticsearch's `_mget` names an
    /// index per document), by default one `mget` per index. `brief`: the
    /// sources may leave out the `Text` fields (see `get_brief`).
    fn mget_docs(&self, keys: &[(Idx, String)], _brief: bool) -> StoreResult<Vec<Option<Doc>>> {
        let mut out: Vec<Option<Doc>> = vec![None; keys.len()];
        let mut indices: Vec<Idx> = Vec::new();
        for (idx, _) in keys {
            if !indices.contains(idx) {
                indices.push(*idx);
            }
        }
        for idx in indices {
            let at: Vec<usize> = (0..keys.len()).filter(|&i| keys[i].0 == idx).collect();
            let ids: Vec<String> = at.iter().map(|&i| keys[i].1.clone()).collect();
            for (i, d) in at.into_iter().zip(self.mget(idx, &ids)?) {
                out[i] = d;
            }
        }
        Ok(out)
    }
    // ---- provided: projections (whole documents by default) ----

    /// `get` whose source leaves out the `Text` fields (a file's contents):
    /// for readers that need only metadata. Never write such a source back.
    /// Whether a read of this document (`brief`: without its text fields)
    /// would be answered from this process's memory, without a request (a
    /// layer holding documents says so; callers skip reading it along with
    /// others).
    fn in_memory(&self, _index: Idx, _id: &str, _brief: bool) -> bool {
        false
    }

    fn get_brief(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
        self.get(index, id)
    }
    /// `search` whose sources leave out the `Text` fields (see `get_brief`).
    fn search_brief(&self, req: &SearchRequest) -> StoreResult<Vec<Hit>> {
        self.search(req)
    }
    /// `search` returning just the values of `fields` of each hit, in
    /// order, `null` where absent (Elasticsearch's `_source` includes): for
    /// listings that need a few fields of many documents.
    fn search_fields(&self, req: &SearchRequest, fields: &[&str]) -> StoreResult<Vec<Vec<Value>>> {
        Ok(field_values(self.search_brief(req)?, fields))
    }
    /// Visit every hit of a query, a page at a time, until `f` returns
    /// false. The sort must end with a unique field. Backends with
    /// snapshots (Elasticsearch's point in time) override this so a long
    /// iteration sees one consistent view.
    fn scan_pages(
        &self,
        index: Idx,
        query: &Query,
        sort: &[Sort],
        page: usize,
        f: &mut dyn FnMut(Vec<Hit>) -> StoreResult<bool>,
    ) -> StoreResult<()> {
        search_after_pages(self, index, query, sort, page, f)
    }
    /// Field collapsing: see [`GroupRequest`].
    fn group(&self, req: &GroupRequest) -> StoreResult<Vec<Bucket>> {
        let _ = req;
        Err(StoreError::Invalid(format!(
            "{} cannot group search results",
            self.describe()
        )))
    }

    // ---- optional primitives, each declared by a capability ----

    /// `atomic_bulk`: a bulk applied all or nothing (the embedded store:
    /// one transaction and one redo record, which no crash splits). One
    /// result per op: if any item failed, none was applied (the others say
    /// so as conflicts). `Ok(None)`: not offered; the caller does without.
    fn bulk_atomic(&self, _ops: Vec<BulkOp>) -> StoreResult<Option<Vec<BulkItemResult>>> {
        Ok(None)
    }
    /// `batches`: a handle on this store whose writes are one batch,
    /// grouped into as few commits as the backend can (a filesystem call
    /// runs on one). Reads through it see its writes, as always. A write
    /// through it is acknowledged (survives a crash of this process) only
    /// once `end_batch` on it returned `Ok`. `None` without the capability,
    /// and on a batch's handle: batches do not nest (a call's inner work
    /// joins its batch).
    fn begin_batch(&self) -> Option<Arc<dyn MetaStore>> {
        None
    }
    /// End this handle's batch: its writes are acknowledged. An error
    /// means some of them may be lost. `Ok` on any other handle.
    fn end_batch(&self) -> StoreResult<()> {
        Ok(())
    }
    /// The same store, its requests named for `caller` and read as it
    /// reads (see [`Caller`]); what the handles share (connections, caches,
    /// read-your-writes state) stays one. `None`: this engine does not tell
    /// callers apart, and this handle serves all (see [`for_caller`]).
    fn as_caller(&self, _caller: Caller) -> Option<Arc<dyn MetaStore>> {
        None
    }
    /// `rebase_paths`: a directory rename's path rewrite done inside the
    /// store (what Elasticsearch's `_update_by_query` with a script would
    /// do): every document strictly below `old` in the `path` tree gets the
    /// prefix `old` of its `path` and `dir` replaced by `new`, each with a
    /// new version, all or nothing. `Ok(None)`: not offered; the caller runs
    /// the scan and bulk update of Elasticsearch: The Definitive Guide, chapter
    /// "Handling Relationships" ("Renaming Files and Directories") instead. Returns the number of
    /// documents moved, and their ids when the store has them at hand.
    fn rebase_paths(&self, _index: Idx, _old: &str, _new: &str) -> StoreResult<Option<Rebased>> {
        Ok(None)
    }
}

/// `store`'s handle for `caller` (see [`MetaStore::as_caller`]).
pub fn for_caller(store: &Arc<dyn MetaStore>, caller: Caller) -> Arc<dyn MetaStore> {
    store.as_caller(caller).unwrap_or_else(|| store.clone())
}

/// The single result of a one-item bulk.
fn one(mut results: Vec<BulkItemResult>) -> StoreResult<Version> {
    match results.pop() {
        Some(r) if results.is_empty() => r,
        _ => Err(StoreError::Other(
            "a one-item bulk answered otherwise".into(),
        )),
    }
}

pub(crate) fn field_values(hits: Vec<Hit>, fields: &[&str]) -> Vec<Vec<Value>> {
    hits.into_iter()
        .map(|mut h| {
            fields
                .iter()
                .map(|f| {
                    Arc::make_mut(&mut h.doc.source)
                        .get_mut(*f)
                        .map(Value::take)
                        .unwrap_or_default()
                })
                .collect()
        })
        .collect()
}

/// Visit every hit of a query in pages of `page` (see [`MetaStore::scan_pages`]).
pub fn scan(
    store: &dyn MetaStore,
    index: Idx,
    query: Query,
    sort: Vec<Sort>,
    page: usize,
    mut f: impl FnMut(Vec<Hit>) -> StoreResult<bool>,
) -> StoreResult<()> {
    store.scan_pages(index, &query, &sort, page, &mut f)
}

/// Plain `search_after` paging, for backends whose search has no snapshots.
pub fn search_after_pages<S: MetaStore + ?Sized>(
    store: &S,
    index: Idx,
    query: &Query,
    sort: &[Sort],
    page: usize,
    f: &mut dyn FnMut(Vec<Hit>) -> StoreResult<bool>,
) -> StoreResult<()> {
    pages(store, index, query, sort, page, false, f)
}

/// `search_after` paging of brief sources (no file text): for a caller
/// that rewrites some fields with partial updates, so never needs the text.
/// No snapshot: the sort must be on a unique field the caller's changes
/// keep consistent (a subtree rename under its exclusive lock), which
/// made the index current before and pages past what it writes
/// ([`SearchRequest::past_own_writes`]).
pub fn scan_brief(
    store: &dyn MetaStore,
    index: Idx,
    query: Query,
    sort: Vec<Sort>,
    page: usize,
    mut f: impl FnMut(Vec<Hit>) -> StoreResult<bool>,
) -> StoreResult<()> {
    pages(store, index, &query, &sort, page, true, &mut f)
}

fn pages<S: MetaStore + ?Sized>(
    store: &S,
    index: Idx,
    query: &Query,
    sort: &[Sort],
    page: usize,
    brief: bool,
    f: &mut dyn FnMut(Vec<Hit>) -> StoreResult<bool>,
) -> StoreResult<()> {
    let mut after: Option<Vec<Value>> = None;
    loop {
        let req = SearchRequest {
            index,
            query: query.clone(),
            sort: sort.to_vec(),
            search_after: after.clone(),
            size: page,
            // Brief pages are scan_brief's, whose callers page past their own
            // writes (see there).
            past_own_writes: brief,
        };
        let hits = if brief {
            store.search_brief(&req)?
        } else {
            store.search(&req)?
        };
        let n = hits.len();
        if n == 0 {
            return Ok(());
        }
        let next = hits[n - 1].sort.clone();
        if !f(hits)? || n < page {
            return Ok(());
        }
        // A full page must move the cursor on, or the loop would never end.
        if next.is_empty() || after.as_ref() == Some(&next) {
            return Err(StoreError::Other(format!(
                "{}: search_after paging did not advance (sort values {next:?}): refusing to loop",
                store.describe()
            )));
        }
        after = Some(next);
    }
}

#[cfg(test)]
mod tests {
    use super::Caller;

    /// The Elasticsearch store keeps one client per caller, indexed by
    /// `caller as usize`: `ALL` must list them in that order.
    #[test]
    fn callers_are_listed_in_discriminant_order() {
        for (i, c) in Caller::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{c:?}");
        }
        let ids: std::collections::HashSet<_> = Caller::ALL.iter().map(|c| c.opaque_id()).collect();
        assert_eq!(ids.len(), Caller::ALL.len(), "opaque ids are distinct");
    }
}
