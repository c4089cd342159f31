//! A write-through document cache in front of a [`MetaStore`]. Gets of
//! inode and entry documents, the hot path of every FUSE call (getattr,
//! lookup, and the reads inside each namespace change), become a hash
//! lookup instead of a store read; absent documents are cached too, so
//! creating a new name does not look for it twice. Two modes:
//!
//! - **Sole** (the embedded store, which its lock file keeps to one mount):
//!   every write goes through this wrapper, so a cached document stays true
//!   until this process changes it. Writes are serialized (the backend
//!   serializes them anyway) and update the cache from their results before
//!   the next write starts, so the cache's order of updates is the store's.
//!   A read that misses fills the cache only if no write ran while it read
//!   (an epoch counter).
//! - **Shared** (Elasticsearch, which other mounts write too): a cached
//!   document is trusted for `ttl` (the mount's attribute TTL) after it was
//!   read or written, then read again: another mount's change is seen
//!   within that bound. Writes run concurrently. Each cached document keeps
//!   its `_seq_no`/`_primary_term`, and of two answers for one document the
//!   higher version wins, so concurrent writes and fills settle on the
//!   newest. A fill is dropped if a write of a document in the same stripe
//!   finished while it read (an epoch per stripe: an absent answer has no
//!   version to compare). Conditional writes made from a cached version
//!   that another mount overtook fail with a conflict, which evicts the
//!   document: the caller's retry reads the store. Reads a conditional
//!   write will not check go around the cache (`get_fresh`).
//!
//! In both modes it keeps the listings of directories it created or read
//! whole ([`super::listing`]), updated from the same writes; shared, a
//! listing is trusted for `ttl` as a document is.
//!
//! In both modes anything uncertain (an error) evicts the id. Searches are
//! not cached. The cache is bounded by an approximate byte weight;
//! documents bigger than `MAX_DOC_BYTES` (indexed file text) are never kept.

use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use quick_cache::Weighter;
use quick_cache::sync::Cache;
use serde_json::Value;

pub use super::listing::{Child, Gather};
use super::listing::{Listings, listed_fields, split_id};
use super::{
    Bucket, BulkItemResult, BulkOp, Caller, Doc, GroupRequest, Hit, Idx, MetaStore, Query, Rebased,
    SearchRequest, Sort, StoreError, StoreResult, Version,
};

/// Bulks of at most this many ops leave their documents cached (the
/// write-back of closed files' sizes and times writes 256 at a time: they
/// are the files being listed and stat'ed next).
const KEEP_BULK: usize = 1024;

/// Documents whose approximate size exceeds this are not cached.
const MAX_DOC_BYTES: u64 = 64 << 10;

/// Fill epochs of the shared mode, one per stripe of document ids.
const STRIPES: usize = 256;

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

/// A cached answer for one id.
#[derive(Clone)]
struct Slot {
    /// `None`: the document is absent.
    doc: Option<Doc>,
    /// The version of the answer (a delete has one too); `None` for an
    /// absent document read, which is older than any write's answer.
    version: Option<Version>,
    /// When the store gave this answer.
    at: Instant,
    /// The source leaves out the `Text` fields (a `get_brief`): it serves
    /// brief reads only, never one whose source may be written back.
    brief: bool,
    /// The source's [`approx_size`], weighed once: the cache weighs a slot
    /// on insert and again on removal, and walking a document each time
    /// was a fifth of a delegated 300-file directory rename's CPU (the
    /// moved ids dropped here).
    size: u64,
}

#[derive(Clone)]
struct DocWeight;

impl Weighter<Key, Slot> for DocWeight {
    fn weight(&self, key: &Key, val: &Slot) -> u64 {
        96 + key.1.len() as u64 + val.size
    }
}

/// Heap bytes of a JSON value, roughly (cheap: no serialization).
pub(crate) fn approx_size(v: &Value) -> u64 {
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

/// Frees `garbage` off the calling thread when there is much of it: the
/// cached copies a directory rename drops (a tree of JSON values per moved
/// document) took a quarter of a 300-file rename's time on the syscall
/// path. One thread for the process, started on first use; if it cannot
/// be, the caller frees.
fn drop_later<T: Send + 'static>(garbage: Vec<T>) {
    type Garbage = Box<dyn Send>;
    static RECLAIM: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Garbage>>> =
        std::sync::OnceLock::new();
    if garbage.len() < 64 {
        return;
    }
    let reclaim = RECLAIM.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Garbage>();
        std::thread::Builder::new()
            .name("esfs-reclaim".into())
            .spawn(move || {
                // A batch thread: woken by a send, a thread of the normal
                // policy preempted the sender on its core (this machine has
                // two) for the whole free, up to 1.5 ms of a 300-file
                // rename. `SCHED_BATCH` is never favoured on wakeup yet keeps
                // its fair share (`SCHED_IDLE` could starve under load while
                // garbage piles up). Best effort: the normal policy is
                // correct too.
                let batch = libc::sched_param { sched_priority: 0 };
                // SAFETY: sets this thread's policy; `batch` outlives the call.
                unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &batch) };
                rx.into_iter().for_each(drop)
            })
            .ok()
            .map(|_| tx)
    });
    if let Some(tx) = reclaim {
        // A failed send hands the garbage back, dropped here.
        let _ = tx.send(Box::new(garbage));
    }
}

/// Whether version `a` is newer than `b` (an absent read is the oldest).
fn newer(a: Option<Version>, b: Option<Version>) -> bool {
    let key = |v: Option<Version>| v.map(|v| (v.primary_term, v.seq_no));
    key(a) > key(b)
}

enum Mode {
    /// This process is the store's only writer.
    Sole {
        /// Serializes writes with their cache updates.
        write: Mutex<()>,
        /// Odd while a write is in progress; bumped twice per write.
        epoch: AtomicU64,
    },
    /// Other mounts write too: documents are trusted for `ttl`.
    Shared {
        ttl: Duration,
        /// Per stripe of ids, bumped (under its lock) whenever a write's
        /// answer for an id of the stripe is applied.
        stripes: Box<[Mutex<u64>]>,
        hasher: std::collections::hash_map::RandomState,
    },
    /// No caching: every call goes to the store (a maintenance command,
    /// which must see the store as it is).
    Off,
}

/// A handle on one mount's cache over a store handle: every handle of the
/// cache ([`CachedStore::as_caller`]) shares the documents and listings
/// ([`Held`]) and names its requests, and reads, as its caller does.
pub struct CachedStore {
    inner: Arc<dyn MetaStore>,
    held: Arc<Held>,
    /// Reads skip the cache ([`Caller::reads_fresh`]); writes still keep it true.
    fresh: bool,
}

/// What the handles of one cache share.
pub struct Held {
    docs: Cache<Key, Slot, DocWeight>,
    mode: Mode,
    listings: Mutex<Listings>,
}

impl std::ops::Deref for CachedStore {
    type Target = Held;
    fn deref(&self) -> &Held {
        &self.held
    }
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
    /// Refused (a missing document, an invalid request): nothing was
    /// written.
    Refused,
    /// Refused for a version conflict: nothing was written.
    Conflict,
    /// Unknown (any other error).
    Failed,
}

impl Wrote<'_> {
    fn failed(e: &StoreError) -> Self {
        match e {
            StoreError::Conflict(_) => Wrote::Conflict,
            StoreError::NotFound(_) | StoreError::Invalid(_) => Wrote::Refused,
            _ => Wrote::Failed,
        }
    }
}

/// What a write's answer means for one cached id.
enum Answer {
    /// The document is now this (`None`: deleted), at this version.
    Is(Option<Doc>, Version),
    /// Unknown: forget the id.
    Evict,
}

/// The indices whose documents are cached.
fn cacheable(idx: Idx) -> bool {
    matches!(idx, Idx::Inodes | Idx::Entries)
}

impl CachedStore {
    /// The sole writer's cache. `bytes`: the document cache's approximate
    /// memory bound; `listing_bytes`: the directory listings'.
    pub fn new(inner: Arc<dyn MetaStore>, bytes: u64, listing_bytes: usize) -> CachedStore {
        CachedStore {
            inner,
            held: Arc::new(Held {
                docs: Cache::with_weighter((bytes / 1024) as usize, bytes, DocWeight),
                mode: Mode::Sole {
                    write: Mutex::new(()),
                    epoch: AtomicU64::new(0),
                },
                listings: Mutex::new(Listings::new(listing_bytes, None)),
            }),
            fresh: false,
        }
    }

    /// The cache of a store other mounts write too: a document (and a
    /// listing) is trusted for `ttl` after the store answered for it.
    pub fn shared(
        inner: Arc<dyn MetaStore>,
        bytes: u64,
        listing_bytes: usize,
        ttl: Duration,
    ) -> CachedStore {
        CachedStore {
            inner,
            held: Arc::new(Held {
                docs: Cache::with_weighter((bytes / 1024) as usize, bytes, DocWeight),
                mode: Mode::Shared {
                    ttl,
                    stripes: (0..STRIPES).map(|_| Mutex::new(0)).collect(),
                    hasher: Default::default(),
                },
                listings: Mutex::new(Listings::new(listing_bytes, Some(ttl))),
            }),
            fresh: false,
        }
    }

    /// No cache: the store itself, behind the same type (a maintenance
    /// command's filesystem).
    pub fn off(inner: Arc<dyn MetaStore>) -> CachedStore {
        CachedStore {
            inner,
            held: Arc::new(Held {
                docs: Cache::with_weighter(1, 1, DocWeight),
                mode: Mode::Off,
                listings: Mutex::new(Listings::new(0, None)),
            }),
            fresh: false,
        }
    }

    /// The store behind the cache.
    pub fn inner(&self) -> &Arc<dyn MetaStore> {
        &self.inner
    }

    /// A handle on this cache whose writes are one batch (see
    /// [`MetaStore::begin_batch`]).
    pub fn batch(&self) -> Option<Arc<CachedStore>> {
        Some(Arc::new(CachedStore {
            inner: self.inner.begin_batch()?,
            held: self.held.clone(),
            fresh: self.fresh,
        }))
    }

    /// Another handle on this cache, for `caller`: its requests go out
    /// under that name and it reads as that caller reads.
    /// Forget every cached document and listing: what the store below
    /// answered may no longer hold (its delegation was given back, see
    /// [`super::delegated`]).
    pub fn clear(&self) {
        self.docs.clear();
        self.listings.lock().clear();
    }

    pub fn for_caller(&self, caller: Caller) -> Arc<CachedStore> {
        Arc::new(CachedStore {
            inner: super::for_caller(&self.inner, caller),
            held: self.held.clone(),
            fresh: caller.reads_fresh(),
        })
    }

    fn sole(&self) -> bool {
        matches!(self.mode, Mode::Sole { .. })
    }

    /// Whether documents of `idx` are cached here.
    fn cached(&self, idx: Idx) -> bool {
        !matches!(self.mode, Mode::Off) && cacheable(idx)
    }

    /// The shared mode's stripe of an id.
    fn stripe(&self, idx: Idx, id: &str) -> Option<&Mutex<u64>> {
        match &self.mode {
            Mode::Shared {
                stripes, hasher, ..
            } => {
                let mut h = hasher.build_hasher();
                KeyRef(idx, id).hash(&mut h);
                Some(&stripes[std::hash::Hasher::finish(&h) as usize % STRIPES])
            }
            Mode::Sole { .. } | Mode::Off => None,
        }
    }

    /// Applies one write's outcome to the listings (sole mode: called
    /// while writing, so in the store's order; shared: between
    /// [`Listings::sending`] and [`Listings::sent`], which catch writes
    /// under one directory overtaking each other).
    fn list(&self, idx: Idx, id: &str, wrote: Wrote<'_>) {
        if matches!(self.mode, Mode::Off) {
            return;
        }
        let dir = || id.parse::<u64>().ok();
        match (idx, wrote) {
            (Idx::Entries, Wrote::Created(src) | Wrote::Put(src)) => {
                self.listings.lock().put(id, src)
            }
            (Idx::Entries, Wrote::Merged(doc)) => self.listings.lock().update(id, doc),
            (Idx::Entries, Wrote::Deleted) => self.listings.lock().delete(id),
            (Idx::Entries, Wrote::Failed) => self.listings.lock().invalidate(id),
            // Shared: the name is not what this process thought (another
            // mount changed it), nor maybe its neighbours. Sole: a refusal.
            (Idx::Entries, Wrote::Conflict) if !self.sole() => self.listings.lock().invalidate(id),
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

    /// The cached answer for an id, if it is still to be trusted (and
    /// whole, unless `brief` will do).
    fn lookup(&self, idx: Idx, id: &str, brief: bool) -> Option<Option<Doc>> {
        if !self.cached(idx) {
            return None;
        }
        let slot = self
            .docs
            .get(&KeyRef(idx, id))
            .filter(|s| brief || !s.brief)?;
        match &self.mode {
            Mode::Sole { .. } | Mode::Off => Some(slot.doc),
            Mode::Shared { .. } if self.fresh => None,
            Mode::Shared { ttl, .. } => (slot.at.elapsed() < *ttl).then_some(slot.doc),
        }
    }

    /// Cache an answer (unless too big to keep).
    fn put_slot(
        &self,
        idx: Idx,
        id: &str,
        doc: Option<Doc>,
        version: Option<Version>,
        brief: bool,
    ) {
        let size = doc.as_ref().map_or(0, |d| approx_size(&d.source));
        if size > MAX_DOC_BYTES {
            self.docs.remove(&KeyRef(idx, id));
        } else {
            let at = Instant::now();
            // An absent document is absent, whoever asked.
            let brief = brief && doc.is_some();
            let slot = Slot {
                doc,
                version,
                at,
                brief,
                size,
            };
            self.docs.insert((idx, id.to_string()), slot);
        }
    }

    /// A write's answer for one id. Sole mode: called under the write
    /// lock, so in the store's order. Shared mode: under the id's stripe
    /// lock, keeping the newer of this and what is cached, and bumping the
    /// stripe so that a fill which read before this cannot land after it.
    fn answer(&self, idx: Idx, id: &str, a: Answer) {
        if !self.cached(idx) {
            return;
        }
        let _stripe = self.stripe(idx, id).map(|s| {
            let mut g = s.lock();
            *g += 1;
            g
        });
        match a {
            Answer::Is(doc, v) => {
                // Sole: the write lock orders answers; no need to compare
                // (a lookup clones the cached document).
                if self.sole()
                    || self
                        .docs
                        .get(&KeyRef(idx, id))
                        .is_none_or(|c| !newer(c.version, Some(v)))
                {
                    self.put_slot(idx, id, doc, Some(v), false);
                }
            }
            Answer::Evict => {
                self.docs.remove(&KeyRef(idx, id));
            }
        }
    }

    /// Run a write whose entry ops are under directories `dirs`: in the
    /// sole mode with the epoch odd, serialized with other writes; shared
    /// writes run concurrently.
    fn writing<T>(&self, dirs: Vec<u64>, f: impl FnOnce() -> T) -> T {
        if !dirs.is_empty() {
            self.listings.lock().sending(&dirs);
        }
        let r = self.writing_serial(f);
        if !dirs.is_empty() {
            self.listings.lock().sent(&dirs);
        }
        r
    }

    fn writing_serial<T>(&self, f: impl FnOnce() -> T) -> T {
        match &self.mode {
            Mode::Sole { write, epoch } => {
                let _w = write.lock();
                epoch.fetch_add(1, Ordering::AcqRel);
                let r = f();
                epoch.fetch_add(1, Ordering::AcqRel);
                r
            }
            Mode::Shared { .. } | Mode::Off => f(),
        }
    }

    /// Taken before a read that may fill the cache for `id`.
    fn fill_token(&self, idx: Idx, id: &str) -> u64 {
        match &self.mode {
            Mode::Sole { epoch, .. } => epoch.load(Ordering::Acquire),
            Mode::Shared { .. } => *self.stripe(idx, id).expect("shared").lock(),
            Mode::Off => 0,
        }
    }

    /// Cache what a read answered, unless a write's answer for the same
    /// id (sole: any write) may have landed since `token` was taken.
    fn fill(&self, idx: Idx, id: &str, token: u64, doc: &Option<Doc>, brief: bool) {
        if !self.cached(idx) {
            return;
        }
        let version = doc.as_ref().map(|d| d.version);
        match &self.mode {
            Mode::Sole { write, epoch } => {
                let Some(_w) = write.try_lock() else { return };
                if epoch.load(Ordering::Acquire) == token {
                    self.put_slot(idx, id, doc.clone(), version, brief);
                }
            }
            Mode::Shared { ttl, .. } => {
                let g = self.stripe(idx, id).expect("shared").lock();
                if *g != token {
                    return;
                }
                // Over a copy still trusted, only a newer answer (or a
                // whole one of the same version over a brief one): of two
                // racing fills the newer stays.
                let keep = |c: &Slot| {
                    c.at.elapsed() < *ttl
                        && (newer(c.version, version)
                            || (c.version == version && (brief || !c.brief)))
                };
                if !self.docs.get(&KeyRef(idx, id)).is_some_and(|c| keep(&c)) {
                    self.put_slot(idx, id, doc.clone(), version, brief);
                }
            }
            Mode::Off => {}
        }
    }

    /// Read through to the store, filling the cache.
    fn read(&self, idx: Idx, id: &str) -> StoreResult<Option<Doc>> {
        let token = self.fill_token(idx, id);
        let doc = self.inner.get(idx, id)?;
        self.fill(idx, id, token, &doc, false);
        Ok(doc)
    }

    /// [`CachedStore::read`] of a brief source.
    fn read_brief(&self, idx: Idx, id: &str) -> StoreResult<Option<Doc>> {
        let token = self.fill_token(idx, id);
        let doc = self.inner.get_brief(idx, id)?;
        self.fill(idx, id, token, &doc, true);
        Ok(doc)
    }

    /// Read `ids` through to the store, filling the cache.
    fn read_many(&self, idx: Idx, ids: &[String]) -> StoreResult<Vec<Option<Doc>>> {
        let tokens: Vec<u64> = ids.iter().map(|id| self.fill_token(idx, id)).collect();
        let docs = self.inner.mget(idx, ids)?;
        for ((id, t), d) in ids.iter().zip(tokens).zip(&docs) {
            self.fill(idx, id, t, d, false);
        }
        Ok(docs)
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
                if !self.cached(idx) {
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
        let dirs = plan
            .iter()
            .flatten()
            .flat_map(|p| entry_dir(p.idx, &p.id))
            .collect();
        self.writing(dirs, || {
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
                let a = match (item, keep) {
                    (Some(Ok(v)), None) => Answer::Is(None, *v),
                    (Some(Ok(v)), Some(src)) if !src.is_null() => {
                        Answer::Is(Some(doc(&id, *v, src)), *v)
                    }
                    _ => Answer::Evict,
                };
                self.answer(idx, &id, a);
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

/// What only a cache offers, beside the store's primitives.
impl CachedStore {
    /// `get` that the cache may not answer: the document as the store
    /// has it now. For reads a conditional write will not check (a
    /// directory's parent chain under a newly taken tree lock, the names
    /// a rename reads under its locks).
    pub fn get_fresh(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
        match self.mode {
            // Nothing else writes: the cache is the store.
            Mode::Sole { .. } | Mode::Off => self.get(index, id),
            Mode::Shared { .. } => self.read(index, id),
        }
    }

    /// `mget` that the cache may answer however old its copies: for a hint
    /// a fresh read verifies (the lock scope a rename peeks for).
    pub fn mget_hint(&self, index: Idx, ids: &[String]) -> StoreResult<Vec<Option<Doc>>> {
        if !self.cached(index) {
            return self.inner.mget(index, ids);
        }
        let held: Vec<Option<Option<Doc>>> = ids
            .iter()
            .map(|id| self.docs.get(&KeyRef(index, id)).map(|s| s.doc))
            .collect();
        if held.iter().all(|d| d.is_some()) {
            return Ok(held.into_iter().flatten().collect());
        }
        self.mget(index, ids)
    }

    /// Whether a `get` (`get_brief` if `brief`) of this document would be
    /// answered without a round trip (the cache holds a copy it trusts, or
    /// the store below holds it in memory: the delegation's overlay).
    pub fn holds(&self, index: Idx, id: &str, brief: bool) -> bool {
        self.lookup(index, id, brief).is_some() || self.inner.in_memory(index, id, brief)
    }

    /// Any copy the cache holds of this document, however old (None: none;
    /// Some(None): it was absent): a hint of what to read along with it
    /// when it is read again.
    pub fn hint(&self, index: Idx, id: &str) -> Option<Option<Doc>> {
        self.cached(index)
            .then(|| self.docs.get(&KeyRef(index, id)).map(|s| s.doc))
            .flatten()
    }

    /// `mget` that the cache may not answer (see `get_fresh`).
    pub fn mget_fresh(&self, index: Idx, ids: &[String]) -> StoreResult<Vec<Option<Doc>>> {
        match self.mode {
            Mode::Sole { .. } | Mode::Off => self.mget(index, ids),
            Mode::Shared { .. } => self.read_many(index, ids),
        }
    }

    /// The children of directory `parent` with a cookie above `after`, in
    /// cookie order, from a listing kept in memory (see [`super::listing`]),
    /// passed to `f` until it returns true. `None`: no such listing here;
    /// the caller searches (`parent` term, sorted by `cookie`).
    pub fn cached_children(
        &self,
        parent: u64,
        after: u64,
        f: &mut dyn FnMut(Child<'_>) -> bool,
    ) -> Option<()> {
        self.listings.lock().visit(parent, after, f)
    }

    /// To begin before the searches that may read directory `parent`
    /// whole, from offset 0: what they return is gathered for
    /// [`CachedStore::offer_children`]. `None`: no listing would be kept.
    pub fn gather(&self, parent: u64) -> Option<Gather> {
        if matches!(self.mode, Mode::Off) {
            return None;
        }
        self.listings.lock().token(parent).map(Gather::start)
    }

    /// Every child of `parent`, gathered from searches begun after
    /// [`CachedStore::gather`]; kept as its listing unless a write under
    /// `parent` was applied since.
    pub fn offer_children(&self, parent: u64, gathered: Gather) {
        let (token, children) = gathered.into_listing();
        self.listings.lock().fill(parent, token, children)
    }
}

/// The directory of an entry id, for [`CachedStore::writing`].
fn entry_dir(index: Idx, id: &str) -> Option<u64> {
    (index == Idx::Entries)
        .then(|| split_id(id).map(|(d, _)| d))
        .flatten()
}

fn doc(id: &str, version: Version, source: Value) -> Doc {
    Doc {
        id: id.to_string(),
        version,
        source: source.into(),
    }
}

impl MetaStore for CachedStore {
    fn capabilities(&self) -> crate::store::Capabilities {
        self.inner.capabilities()
    }

    fn as_caller(&self, caller: Caller) -> Option<Arc<dyn MetaStore>> {
        Some(self.for_caller(caller))
    }

    fn get(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
        match self.lookup(index, id, false) {
            Some(d) => Ok(d),
            None if self.cached(index) => self.read(index, id),
            None => self.inner.get(index, id),
        }
    }

    fn mget(&self, index: Idx, ids: &[String]) -> StoreResult<Vec<Option<Doc>>> {
        if !self.cached(index) {
            return self.inner.mget(index, ids);
        }
        let mut out: Vec<Option<Option<Doc>>> =
            ids.iter().map(|id| self.lookup(index, id, false)).collect();
        let missing: Vec<String> = ids
            .iter()
            .zip(&out)
            .filter(|(_, d)| d.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        if !missing.is_empty() {
            let mut got = self.read_many(index, &missing)?.into_iter();
            for slot in out.iter_mut().filter(|d| d.is_none()) {
                *slot = Some(got.next().expect("one result per id"));
            }
        }
        Ok(out.into_iter().map(|d| d.expect("filled")).collect())
    }

    /// Cached documents from the cache, the rest in one read through
    /// (filling the cache as `mget` does).
    fn mget_docs(&self, keys: &[(Idx, String)], brief: bool) -> StoreResult<Vec<Option<Doc>>> {
        let mut out: Vec<Option<Option<Doc>>> = keys
            .iter()
            .map(|(idx, id)| self.lookup(*idx, id, brief))
            .collect();
        let missing: Vec<(Idx, String)> = keys
            .iter()
            .zip(&out)
            .filter(|(_, d)| d.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        if !missing.is_empty() {
            let tokens: Vec<Option<u64>> = missing
                .iter()
                .map(|(idx, id)| self.cached(*idx).then(|| self.fill_token(*idx, id)))
                .collect();
            let docs = self.inner.mget_docs(&missing, brief)?;
            for (((idx, id), t), d) in missing.iter().zip(tokens).zip(&docs) {
                if let Some(t) = t {
                    // Brief only where it left something out.
                    self.fill(*idx, id, t, d, brief && idx.has_text());
                }
            }
            let mut got = docs.into_iter();
            for slot in out.iter_mut().filter(|d| d.is_none()) {
                *slot = Some(got.next().expect("one result per key"));
            }
        }
        Ok(out.into_iter().map(|d| d.expect("filled")).collect())
    }

    fn create(&self, index: Idx, id: &str, source: &Value) -> StoreResult<Version> {
        self.writing(entry_dir(index, id).into_iter().collect(), || {
            let r = self.inner.create(index, id, source);
            match &r {
                Ok(v) => {
                    self.answer(index, id, Answer::Is(Some(doc(id, *v, source.clone())), *v));
                    self.list(index, id, Wrote::Created(source));
                }
                Err(e) => {
                    self.answer(index, id, Answer::Evict);
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
        self.writing(entry_dir(index, id).into_iter().collect(), || {
            let r = self.inner.put(index, id, source, if_version);
            match &r {
                Ok(v) => {
                    self.answer(index, id, Answer::Is(Some(doc(id, *v, source.clone())), *v));
                    self.list(index, id, Wrote::Put(source));
                }
                Err(e) => {
                    self.answer(index, id, Answer::Evict);
                    self.list(index, id, Wrote::failed(e));
                }
            }
            r
        })
    }

    fn delete(&self, index: Idx, id: &str, if_version: Option<Version>) -> StoreResult<bool> {
        // Through the bulk path: its answer carries the delete's version,
        // which orders it against concurrent fills and writes.
        let r = self
            .bulk(vec![BulkOp::Delete {
                index,
                id: id.into(),
                if_version,
            }])?
            .pop()
            .expect("one result");
        match r {
            Ok(_) => Ok(true),
            Err(StoreError::NotFound(_)) if if_version.is_none() => Ok(false),
            Err(e) => Err(e),
        }
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

    /// A cached full document serves too (more than asked, never less);
    /// a miss fills a brief copy, which serves only brief reads.
    fn get_brief(&self, index: Idx, id: &str) -> StoreResult<Option<Doc>> {
        match self.lookup(index, id, true) {
            Some(d) => Ok(d),
            None if self.cached(index) => self.read_brief(index, id),
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

    fn publish(&self, index: Idx) -> StoreResult<()> {
        self.inner.publish(index)
    }

    fn expose(&self, index: Idx) -> StoreResult<()> {
        self.inner.expose(index)
    }

    fn sync(&self) -> StoreResult<()> {
        self.inner.sync()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn rebase_paths(&self, index: Idx, old: &str, new: &str) -> StoreResult<Option<Rebased>> {
        self.writing(Vec::new(), || {
            let r = self.inner.rebase_paths(index, old, new);
            if !self.cached(index) {
                return r;
            }
            // The moved documents keep their ids: drop the cached ones
            // below `old` (after an error, every document of the index),
            // by id when the store named them.
            match &r {
                Ok(None) => {}
                Ok(Some(Rebased { count: 0, .. })) => {}
                Ok(Some(Rebased { ids: Some(ids), .. })) => {
                    let dropped: Vec<(Key, Slot)> = ids
                        .iter()
                        .filter_map(|id| self.docs.remove(&KeyRef(index, id)))
                        .collect();
                    drop_later(dropped);
                }
                Ok(Some(Rebased { ids: None, .. })) | Err(_) => {
                    let below = format!("{old}/");
                    let failed = r.is_err();
                    self.docs.retain(|k, v| {
                        k.0 != index
                            || !(failed
                                || v.doc.as_ref().is_some_and(|d| {
                                    d.source["path"]
                                        .as_str()
                                        .is_none_or(|p| p.starts_with(&below))
                                }))
                    });
                }
            }
            r
        })
    }

    fn begin_batch(&self) -> Option<Arc<dyn MetaStore>> {
        self.batch().map(|b| b as Arc<dyn MetaStore>)
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

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
