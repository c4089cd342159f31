//! A write-through document cache in front of a [`MetaStore`], for a store
//! that this process alone writes (the embedded store: its lock file keeps
//! every other mount out). Gets of inode and entry documents, the hot path
//! of every FUSE call (getattr, lookup, and the reads inside each namespace
//! change), become a hash lookup instead of an SQLite read and JSON parse;
//! absent entries are cached too, so creating a new name does not look for
//! it twice.
//!
//! Coherence: every write goes through this wrapper. Writes are serialized
//! (the backend serializes them anyway) and update the cache from their
//! results before the next write starts, so the cache's order of updates is
//! the store's. A read that misses fills the cache only if no write ran
//! while it read (an epoch counter), so a fill can never put back a value a
//! concurrent write replaced. Anything uncertain (an error) evicts the id.
//! Searches are not cached. The cache is bounded by an approximate byte
//! weight; documents bigger than `MAX_DOC_BYTES` (indexed file text) are
//! never kept.
//!
//! It also keeps the listings of directories it has seen from creation
//! ([`super::listing`]), updated from the same write results.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use quick_cache::Weighter;
use quick_cache::sync::Cache;
use serde_json::Value;

use super::listing::{Child, Listings, listed_fields};
use super::{
    Bucket, BulkItemResult, BulkOp, Doc, GroupRequest, Hit, Idx, MetaStore, Query, SearchRequest,
    Sort, StoreError, StoreResult, Version,
};

/// Bulks of at most this many ops leave their documents cached (the
/// write-back of closed files' sizes and times writes 256 at a time: they
/// are the files being listed and stat'ed next).
const KEEP_BULK: usize = 1024;

/// Documents whose approximate size exceeds this are not cached.
const MAX_DOC_BYTES: u64 = 64 << 10;

type Key = (Idx, String);

/// A borrowed [`Key`], for lookups and removals without allocating. Hashes
/// exactly as the tuple does (field by field; `&str` hashes as `String`).
#[derive(Hash)]
struct KeyRef<'a>(Idx, &'a str);

impl quick_cache::Equivalent<Key> for KeyRef<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        self.0 == key.0 && self.1 == key.1
    }
}

#[derive(Clone)]
struct DocWeight;

impl Weighter<Key, Option<Doc>> for DocWeight {
    fn weight(&self, key: &Key, val: &Option<Doc>) -> u64 {
        64 + key.1.len() as u64 + val.as_ref().map_or(0, |d| approx_size(&d.source))
    }
}

/// Heap bytes of a JSON value, roughly (cheap: no serialization).
fn approx_size(v: &Value) -> u64 {
    match v {
        Value::String(s) => 24 + s.len() as u64,
        Value::Array(a) => 24 + a.iter().map(approx_size).sum::<u64>(),
        Value::Object(m) => {
            48 + m
                .iter()
                .map(|(k, v)| 32 + k.len() as u64 + approx_size(v))
                .sum::<u64>()
        }
        _ => 16,
    }
}

pub struct CachedStore {
    inner: Arc<dyn MetaStore>,
    docs: Cache<Key, Option<Doc>, DocWeight>,
    /// Serializes writes with their cache updates.
    write: Mutex<()>,
    /// Odd while a write is in progress; bumped twice per write.
    epoch: AtomicU64,
    listings: Mutex<Listings>,
}

/// A bulk item's cache work, planned before the ops are handed over.
struct Planned {
    idx: Idx,
    id: String,
    /// `None`: deleted; `Some(Null)`: evict; else the source to keep.
    keep: Option<Value>,
    listed: Listed,
}

/// [`Wrote`], owned, before the result is known.
enum Listed {
    Created(Value),
    Put(Value),
    Merged(Value),
    Deleted,
}

/// What a write did to one document, for the listings.
enum Wrote<'a> {
    /// Created (put-if-absent) with this source.
    Created(&'a Value),
    /// Created or overwritten with this source.
    Put(&'a Value),
    /// Partially updated with this doc.
    Merged(&'a Value),
    Deleted,
    /// Refused (a conflict, a missing document, an invalid request):
    /// nothing was written.
    Refused,
    /// Unknown (any other error).
    Failed,
}

impl Wrote<'_> {
    fn failed(e: &StoreError) -> Self {
        match e {
            StoreError::Conflict(_) | StoreError::NotFound(_) | StoreError::Invalid(_) => {
                Wrote::Refused
            }
            _ => Wrote::Failed,
        }
    }
}

fn cached(idx: Idx) -> bool {
    matches!(idx, Idx::Inodes | Idx::Entries)
}

impl CachedStore {
    /// `bytes`: the document cache's approximate memory bound;
    /// `listing_bytes`: the directory listings'.
    pub fn new(inner: Arc<dyn MetaStore>, bytes: u64, listing_bytes: usize) -> CachedStore {
        CachedStore {
            inner,
            docs: Cache::with_weighter((bytes / 1024) as usize, bytes, DocWeight),
            write: Mutex::new(()),
            epoch: AtomicU64::new(0),
            listings: Mutex::new(Listings::new(listing_bytes)),
        }
    }

    /// Applies one write's outcome to the listings (called while writing,
    /// so in the store's order).
    fn list(&self, idx: Idx, id: &str, wrote: Wrote<'_>) {
        let dir = || id.parse::<u64>().ok();
        match (idx, wrote) {
            (Idx::Entries, Wrote::Created(src) | Wrote::Put(src)) => {
                self.listings.lock().put(id, src)
            }
            (Idx::Entries, Wrote::Merged(doc)) => self.listings.lock().update(id, doc),
            (Idx::Entries, Wrote::Deleted) => self.listings.lock().delete(id),
            (Idx::Entries, Wrote::Failed) => self.listings.lock().invalidate(id),
            // Inode numbers are never reused: a directory inode being
            // created has no children yet.
            (Idx::Inodes, Wrote::Created(src)) if src["kind"] == "dir" => {
                if let Some(d) = dir() {
                    self.listings.lock().adopt_empty(d)
                }
            }
            (Idx::Inodes, Wrote::Deleted) => {
                if let Some(d) = dir() {
                    self.listings.lock().drop_dir(d)
                }
            }
            _ => {}
        }
    }

    fn lookup(&self, idx: Idx, id: &str) -> Option<Option<Doc>> {
        if !cached(idx) {
            return None;
        }
        self.docs.get(&KeyRef(idx, id))
    }

    fn keep(&self, idx: Idx, id: &str, doc: Option<Doc>) {
        if !cached(idx) {
            return;
        }
        if doc
            .as_ref()
            .is_some_and(|d| approx_size(&d.source) > MAX_DOC_BYTES)
        {
            self.docs.remove(&KeyRef(idx, id));
        } else {
            self.docs.insert((idx, id.to_string()), doc);
        }
    }

    fn evict(&self, idx: Idx, id: &str) {
        if cached(idx) {
            self.docs.remove(&KeyRef(idx, id));
        }
    }

    /// Run a write with the epoch odd, serialized with other writes.
    fn writing<T>(&self, f: impl FnOnce() -> T) -> T {
        let _w = self.write.lock();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let r = f();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        r
    }

    /// Held while filling: no write ran since `before` and none can start.
    fn quiet_since(&self, before: u64) -> Option<parking_lot::MutexGuard<'_, ()>> {
        let w = self.write.try_lock()?;
        (self.epoch.load(Ordering::Acquire) == before).then_some(w)
    }

    /// Read through to the store; fill the cache if no write overlapped.
    fn fill(&self, idx: Idx, id: &str) -> StoreResult<Option<Doc>> {
        let before = self.epoch.load(Ordering::Acquire);
        let doc = self.inner.get(idx, id)?;
        if let Some(_w) = self.quiet_since(before) {
            self.keep(idx, id, doc.clone());
        }
        Ok(doc)
    }

    /// A bulk through `send`, the cache and listings updated from its
    /// results (`None`: the backend did nothing).
    fn bulk_via(
        &self,
        ops: Vec<BulkOp>,
        send: impl FnOnce(Vec<BulkOp>) -> StoreResult<Option<Vec<BulkItemResult>>>,
    ) -> StoreResult<Option<Vec<BulkItemResult>>> {
        // Per op, what to do with its cached id afterwards: keep the written
        // source (bulks up to a write-back batch of hot inodes) or evict
        // (larger ones, such as a subtree rename, would only flush the hot set).
        let small = ops.len() <= KEEP_BULK;
        let plan: Vec<Option<Planned>> = ops
            .iter()
            .map(|op| {
                let (idx, id, src, delete) = match op {
                    BulkOp::Create { index, id, source }
                    | BulkOp::Index {
                        index, id, source, ..
                    } => (*index, id, Some(source), false),
                    // The merged document is the store's to make: evict.
                    BulkOp::Update { index, id, .. } => (*index, id, None, false),
                    BulkOp::Delete { index, id, .. } => (*index, id, None, true),
                };
                if !cached(idx) {
                    return None;
                }
                // For the listings, only the fields they read.
                let listed = match op {
                    BulkOp::Create { source, .. } => Listed::Created(listed_fields(source)),
                    BulkOp::Index { source, .. } => Listed::Put(listed_fields(source)),
                    BulkOp::Update { doc, .. } => Listed::Merged(listed_fields(doc)),
                    BulkOp::Delete { .. } => Listed::Deleted,
                };
                Some(Planned {
                    idx,
                    id: id.clone(),
                    // A delete keeps "absent"; an evicted write keeps nothing.
                    keep: if delete {
                        None
                    } else {
                        src.filter(|_| small).cloned().or(Some(Value::Null))
                    },
                    listed,
                })
            })
            .collect();
        self.writing(|| {
            let r = send(ops);
            if let Ok(None) = r {
                return r;
            }
            for (i, p) in plan.into_iter().enumerate() {
                let Some(Planned {
                    idx,
                    id,
                    keep,
                    listed,
                }) = p
                else {
                    continue;
                };
                let item = r.as_ref().ok().and_then(|rs| rs.as_ref()?.get(i));
                match (item, keep) {
                    (Some(Ok(_)), None) => self.keep(idx, &id, None),
                    (Some(Ok(v)), Some(src)) if !src.is_null() => {
                        self.keep(idx, &id, Some(doc(&id, *v, src)))
                    }
                    _ => self.evict(idx, &id),
                }
                let wrote = match (item, &listed) {
                    (Some(Ok(_)), Listed::Created(v)) => Wrote::Created(v),
                    (Some(Ok(_)), Listed::Put(v)) => Wrote::Put(v),
                    (Some(Ok(_)), Listed::Merged(v)) => Wrote::Merged(v),
                    (Some(Ok(_)), Listed::Deleted) => Wrote::Deleted,
                    (Some(Err(e)), _) => Wrote::failed(e),
                    _ => Wrote::Failed,
                };
                self.list(idx, &id, wrote);
            }
            r
        })
    }
}

fn doc(id: &str, version: Version, source: Value) -> Doc {
    Doc {
        id: id.to_string(),
        version,
        source,
    }
}

impl MetaStore for CachedStore {
    fn capabilities(&self) -> crate::store::Capabilities {
        crate::store::Capabilities {
            listings: true,
            ..self.inner.capabilities()
        }
    }

    fn get(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
        match self.lookup(index, id) {
            Some(d) => Ok(d),
            None if cached(index) => self.fill(index, id),
            None => self.inner.get(index, id),
        }
    }

    fn mget(&self, index: Idx, ids: &[String]) -> StoreResult<Vec<Option<Doc>>> {
        if !cached(index) {
            return self.inner.mget(index, ids);
        }
        let mut out: Vec<Option<Option<Doc>>> =
            ids.iter().map(|id| self.lookup(index, id)).collect();
        let missing: Vec<String> = ids
            .iter()
            .zip(&out)
            .filter(|(_, d)| d.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        if !missing.is_empty() {
            let before = self.epoch.load(Ordering::Acquire);
            let got = self.inner.mget(index, &missing)?;
            let fill = self.quiet_since(before);
            let mut got = got.into_iter();
            for (id, slot) in ids.iter().zip(out.iter_mut()) {
                if slot.is_none() {
                    let d = got.next().expect("one result per id");
                    if fill.is_some() {
                        self.keep(index, id, d.clone());
                    }
                    *slot = Some(d);
                }
            }
        }
        Ok(out.into_iter().map(|d| d.expect("filled")).collect())
    }

    fn create(&self, index: Idx, id: &str, source: &Value) -> StoreResult<Version> {
        self.writing(|| {
            let r = self.inner.create(index, id, source);
            match &r {
                Ok(v) => {
                    self.keep(index, id, Some(doc(id, *v, source.clone())));
                    self.list(index, id, Wrote::Created(source));
                }
                Err(e) => {
                    self.evict(index, id);
                    self.list(index, id, Wrote::failed(e));
                }
            }
            r
        })
    }

    fn put(
        &self,
        index: Idx,
        id: &str,
        source: &Value,
        if_version: Option<Version>,
    ) -> StoreResult<Version> {
        self.writing(|| {
            let r = self.inner.put(index, id, source, if_version);
            match &r {
                Ok(v) => {
                    self.keep(index, id, Some(doc(id, *v, source.clone())));
                    self.list(index, id, Wrote::Put(source));
                }
                Err(e) => {
                    self.evict(index, id);
                    self.list(index, id, Wrote::failed(e));
                }
            }
            r
        })
    }

    fn delete(&self, index: Idx, id: &str, if_version: Option<Version>) -> StoreResult<bool> {
        self.writing(|| {
            let r = self.inner.delete(index, id, if_version);
            match &r {
                Ok(_) => {
                    self.keep(index, id, None);
                    self.list(index, id, Wrote::Deleted);
                }
                Err(e) => {
                    self.evict(index, id);
                    self.list(index, id, Wrote::failed(e));
                }
            }
            r
        })
    }

    fn bulk(&self, ops: Vec<BulkOp>) -> StoreResult<Vec<BulkItemResult>> {
        self.bulk_via(ops, |ops| self.inner.bulk(ops).map(Some))
            .map(|r| r.expect("a plain bulk always answers"))
    }

    fn bulk_atomic(&self, ops: Vec<BulkOp>) -> StoreResult<Option<Vec<BulkItemResult>>> {
        self.bulk_via(ops, |ops| self.inner.bulk_atomic(ops))
    }

    fn search(&self, req: &SearchRequest) -> StoreResult<Vec<Hit>> {
        self.inner.search(req)
    }

    /// A cached full document serves too (more than asked, never less); a
    /// miss is not filled, since a brief source must not be written back.
    fn get_brief(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
        match self.lookup(index, id) {
            Some(d) => Ok(d),
            None => self.inner.get_brief(index, id),
        }
    }

    fn search_brief(&self, req: &SearchRequest) -> StoreResult<Vec<Hit>> {
        self.inner.search_brief(req)
    }

    fn search_fields(&self, req: &SearchRequest, fields: &[&str]) -> StoreResult<Vec<Vec<Value>>> {
        self.inner.search_fields(req, fields)
    }

    fn group(&self, req: &GroupRequest) -> StoreResult<Vec<Bucket>> {
        self.inner.group(req)
    }

    fn count(&self, index: Idx, query: &Query) -> StoreResult<u64> {
        self.inner.count(index, query)
    }

    fn refresh(&self, index: Idx) -> StoreResult<()> {
        self.inner.refresh(index)
    }

    fn sync(&self) -> StoreResult<()> {
        self.inner.sync()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn rebase_paths(&self, index: Idx, old: &str, new: &str) -> StoreResult<Option<u64>> {
        self.writing(|| {
            let r = self.inner.rebase_paths(index, old, new);
            if cached(index) && !matches!(r, Ok(None) | Ok(Some(0))) {
                // The moved documents keep their ids: drop the cached ones
                // below `old` (after an error, every document of the index).
                let below = format!("{old}/");
                let failed = r.is_err();
                self.docs.retain(|k, v| {
                    k.0 != index
                        || !(failed
                            || v.as_ref().is_some_and(|d| {
                                d.source["path"]
                                    .as_str()
                                    .is_none_or(|p| p.starts_with(&below))
                            }))
                });
            }
            r
        })
    }

    fn cached_children(
        &self,
        parent: u64,
        after: u64,
        f: &mut dyn FnMut(Child<'_>) -> bool,
    ) -> Option<()> {
        self.listings.lock().visit(parent, after, f)
    }

    fn begin_batch(&self) {
        self.inner.begin_batch()
    }

    fn end_batch(&self) -> StoreResult<()> {
        let r = self.inner.end_batch();
        if r.is_err() {
            // Writes the cache already shows may have been rolled back.
            self.docs.clear();
            self.listings.lock().clear();
        }
        r
    }

    fn scan_pages(
        &self,
        index: Idx,
        query: &Query,
        sort: &[Sort],
        page: usize,
        f: &mut dyn FnMut(Vec<Hit>) -> StoreResult<bool>,
    ) -> StoreResult<()> {
        self.inner.scan_pages(index, query, sort, page, f)
    }
}
