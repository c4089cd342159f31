//! The filesystem core: POSIX semantics over the document model, written once
//! above the [`MetaStore`] and [`DataStore`] traits. Every operation returns
//! `FsResult`; the FUSE adapter (`crate::fuse`) only translates.
//!
//! Concurrency: namespace changes take [`NamespaceLocks`]; attribute updates
//! are optimistic (read, change, write-if-version, retry on conflict), which
//! is also what keeps several mounts of one Elasticsearch index safe.
//!
//! Layout: this file holds [`Fs`], its configuration and the helpers every
//! call shares (documents, paths, tree locks); `ops/` the calls, one file
//! per family; [`intent`] the rename plan and its idempotent steps;
//! [`recovery`] the janitor's roll-forward and fsck's repairs; `writeback`
//! lazy close and directory times; [`journal`] the unflushed-files journal.

pub mod intent;
pub mod journal;
mod ops;
pub mod recovery;
mod writeback;

pub use ops::create::NewNode;
pub use ops::plock;
pub use ops::readdir::{DirEnt, DirItem};
pub use ops::rename::{RENAME_EXCHANGE, RENAME_NOREPLACE};

use crate::data::DataStore;
use crate::error::{FsError, FsResult};
use crate::locks::{LockError, LockManager, NamespaceLocks, TreeGuard, manager::ancestors};
use crate::model::*;
use crate::store::{BulkOp, Capabilities, Idx, MetaStore, StoreError, Version};
use parking_lot::{Mutex, RwLock};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// The caller of an operation.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Ctx {
    pub const ROOT: Ctx = Ctx {
        uid: 0,
        gid: 0,
        pid: 0,
    };
}

#[derive(Clone, Debug, Default)]
pub struct FsConfig {
    /// Owner of the root directory when the store is first formatted.
    pub root_uid: u32,
    pub root_gid: u32,
    /// What this mount is, for `esfs locks` (e.g. the mountpoint).
    pub label: String,
    /// Opened by a maintenance command (fsck): never format, reclaim or
    /// recover on open; the command decides what to change.
    pub maintenance: bool,
    /// Benchmarks only (`ESFS_BENCH_NO_TREE_LOCKS=1`): skip store-level
    /// tree locks to measure what they cost. Unsafe with several mounts.
    pub no_tree_locks: bool,
    /// The unflushed-files journal (single-writer mounts with a write-through
    /// data store): close sends nothing and sizes/times are written back
    /// in batches (see [`journal`]). None: every close persists.
    pub journal: Option<std::path::PathBuf>,
}

/// Changes requested by setattr; `None` leaves the attribute alone.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSpec>,
    pub mtime: Option<TimeSpec>,
    pub ctime: Option<i64>,
}

#[derive(Clone, Copy, Debug)]
pub enum TimeSpec {
    Now,
    At(i64),
}

/// What a read-modify-write of an inode does with its document.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Fate {
    Keep,
    Delete,
}

#[derive(Clone, Copy, Debug)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
}

pub const BLOCK_SIZE: u64 = 4096;
/// Optimistic updates retry this often before reporting EAGAIN.
const MAX_RETRIES: usize = 200;
/// Ids are reserved from the store in batches (one store write per batch).
const ID_BATCH: u64 = 1024;
const FORMAT_VERSION: u64 = 1;

pub struct Fs {
    store: Arc<dyn MetaStore>,
    /// What the store offers (read once): where it is this mount's alone,
    /// stale orphans are reclaimed at start, dead owners' locks broken at
    /// once, and the kernel may keep its caches.
    caps: Capabilities,
    data: Arc<dyn DataStore>,
    cfg: FsConfig,
    locks: NamespaceLocks,
    /// Store-level locks, shared with every other mount of the store.
    lm: Arc<LockManager>,
    ids: Mutex<(u64, u64)>,
    /// Directory inode -> (parent inode, encoded name): paths are composed
    /// from this. Only a rename of that directory changes its row.
    dirs: RwLock<HashMap<u64, (u64, String)>>,
    open: Mutex<HashMap<u64, ops::io::OpenState>>,
    /// Inodes whose last name is being removed and whose document goes with
    /// it (shared stores): an open(2) of one answers ESTALE. Locked inside
    /// `open`.
    dying: Mutex<HashSet<u64>>,
    /// Inodes this mount deleted lately (bounded, oldest forgotten first):
    /// an open(2) that read the inode before the deletion and registers
    /// after it must not serve the deleted contents (zeros) either.
    gone: Mutex<(std::collections::VecDeque<u64>, HashSet<u64>)>,
    /// Inodes this mount may have kept at zero links (orphans: unlinked
    /// while open or referenced): only these are read again when the last
    /// handle or kernel reference goes, to delete them. Every other inode
    /// a mount lets go of is left alone without a read (on a shared store
    /// another mount's orphans are that mount's to delete).
    orphans: Mutex<HashSet<u64>>,
    /// Per stripe of inode numbers (`ino % SETTLE_STRIPES`), bumped under
    /// the `open` lock whenever a state's size and times went to the store
    /// and left the overlay (a persist, setattr, drop): an inode read
    /// before is older than what the kernel was told, so it is read again
    /// (see [`Fs::overlay`]).
    settled: [AtomicU64; ops::io::SETTLE_STRIPES],
    /// The kernel keeps files' sizes and times (its writeback-cache mode):
    /// writes leave mtime/ctime to the SETATTR it sends at close.
    kernel_times: std::sync::atomic::AtomicBool,
    /// atime updates from reads not yet in the store (see `write_back_atimes`).
    atimes: Mutex<HashMap<u64, i64>>,
    /// Inodes on which this mount holds advisory locks.
    plocked: Mutex<std::collections::HashSet<u64>>,
    /// Kernel lookup counts: an inode whose last name is gone stays until
    /// the kernel forgets it (a process may still open it by a cached name).
    lookups: Mutex<HashMap<u64, u64>>,
    handles: Mutex<HashMap<u64, ops::io::Handle>>,
    dir_handles: Mutex<HashMap<u64, Arc<Mutex<ops::readdir::DirHandle>>>>,
    next_fh: AtomicU64,
    /// Content indexing for `esfs search` (set by the mount).
    search: std::sync::OnceLock<Box<dyn crate::hook::ContentHook>>,
    /// Files written but not yet persisted (lazy close; see [`journal`]).
    journal: Option<journal::Journal>,
    /// Inodes the kernel forgot, for the write-back to finish (lazy close).
    forgotten: Mutex<Vec<u64>>,
    /// Directories whose entry documents' copies of their attributes (for
    /// searches) the write-back is to refresh (lazy close).
    stale_dirs: Mutex<std::collections::HashSet<u64>>,
    /// Directory mtime/ctime moved by a name made or removed in it and not
    /// yet in the store (lazy close): written back with the file sizes,
    /// overlaid by `getattr`, absorbed by any write of the directory, and
    /// covered by the journal (see `touch_dir`).
    dir_times: Mutex<HashMap<u64, i64>>,
    /// Set by `shutdown`: the background write-back stops.
    closing: std::sync::atomic::AtomicBool,
    /// Held by a background write-back pass (`shutdown` waits for it).
    write_back_pass: Mutex<()>,
}

thread_local! {
    /// `Fs::batch`es open on this thread.
    static BATCH_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Directory inodes written in this thread's open batch, with the
    /// deferred time each write took along (see `Fs::dirs_written`).
    static WRITTEN_DIRS: std::cell::RefCell<Vec<(u64, Option<i64>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn encode_name(name: &[u8]) -> FsResult<String> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(FsError::Invalid);
    }
    Ok(encode_bytes(name))
}

fn to_doc<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("documents serialize")
}

/// A stored document as its type, with its version.
fn typed<T: serde::de::DeserializeOwned>(
    doc: Option<crate::store::Doc>,
) -> FsResult<Option<(T, Version)>> {
    doc.map(|d| Ok((serde_json::from_value(d.source)?, d.version)))
        .transpose()
}

impl Fs {
    pub fn new(store: Arc<dyn MetaStore>, data: Arc<dyn DataStore>, cfg: FsConfig) -> FsResult<Fs> {
        let owner = session_id();
        let lm = LockManager::new(store.clone(), &owner, &cfg.label)?;
        lm.spawn_heartbeat();
        let mut fs = Fs {
            caps: store.capabilities(),
            store,
            data,
            cfg,
            locks: NamespaceLocks::default(),
            lm,
            ids: Mutex::new((0, 0)),
            dirs: RwLock::new(HashMap::new()),
            open: Mutex::new(HashMap::new()),
            dying: Mutex::new(HashSet::new()),
            gone: Mutex::new(Default::default()),
            orphans: Mutex::new(HashSet::new()),
            settled: Default::default(),
            kernel_times: Default::default(),
            atimes: Mutex::new(HashMap::new()),
            plocked: Mutex::new(Default::default()),
            lookups: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            dir_handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            search: std::sync::OnceLock::new(),
            journal: None,
            forgotten: Mutex::new(Vec::new()),
            stale_dirs: Mutex::new(Default::default()),
            dir_times: Mutex::new(HashMap::new()),
            closing: Default::default(),
            write_back_pass: Mutex::new(()),
        };
        if fs.cfg.maintenance {
            if fs.store.get(Idx::Meta, "fs")?.is_none() {
                return Err(FsError::Io(format!(
                    "no esfs filesystem at {}",
                    fs.store.describe()
                )));
            }
            return Ok(fs);
        }
        fs.format_if_new()?;
        if fs.caps.single_writer {
            fs.lm.become_sole_owner()?;
            fs.reclaim_orphans()?;
            if let Some(path) = fs.cfg.journal.clone() {
                let (j, left) = journal::Journal::open(&path)
                    .map_err(|e| FsError::Io(format!("journal {}: {e}", path.display())))?;
                fs.replay_journal(&left)?;
                j.settle(|_| true)?;
                fs.journal = Some(j);
            }
        }
        fs.recover_intents()?;
        Ok(fs)
    }

    /// Run one filesystem call with its store writes in one batch (one
    /// commit on the embedded store), acknowledged before it returns.
    pub fn batch<T>(&self, f: impl FnOnce() -> FsResult<T>) -> FsResult<T> {
        struct Guard<'a>(&'a dyn MetaStore, bool);
        impl Drop for Guard<'_> {
            // A panic still ends the batch (and commits what it wrote).
            fn drop(&mut self) {
                BATCH_DEPTH.with(|d| d.set(d.get() - 1));
                if !self.1 {
                    let _ = self.0.end_batch();
                }
            }
        }
        self.store.begin_batch();
        BATCH_DEPTH.with(|d| d.set(d.get() + 1));
        let mut g = Guard(&*self.store, false);
        let r = f();
        g.1 = true;
        let end = self.store.end_batch();
        drop(g);
        let outermost = BATCH_DEPTH.with(|d| d.get()) == 0;
        match end {
            Ok(()) => {
                if outermost {
                    self.dirs_written(None);
                }
                r
            }
            Err(e) => {
                if outermost {
                    // Not acknowledged: their times stay pending.
                    WRITTEN_DIRS.with(|w| w.borrow_mut().clear());
                }
                Err(e.into())
            }
        }
    }

    pub fn lock_manager(&self) -> &Arc<LockManager> {
        &self.lm
    }

    /// What the store offers (see [`Capabilities`]).
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    pub fn store(&self) -> &Arc<dyn MetaStore> {
        &self.store
    }

    pub fn data(&self) -> &Arc<dyn DataStore> {
        &self.data
    }

    /// Index file contents for `esfs search` (see `crate::hook`).
    pub fn set_content_hook(&self, hook: Box<dyn crate::hook::ContentHook>) {
        let _ = self.search.set(hook);
    }

    /// The contents of `ino` may have changed (after a close that wrote,
    /// an fsync, a truncate): queue it for indexing.
    fn content_changed(&self, ino: u64) {
        if let Some(h) = self.search.get() {
            h.changed(ino);
        }
    }

    /// First mount of an empty store: root inode, id allocator, then the
    /// superblock last, so an interrupted format is simply redone.
    fn format_if_new(&self) -> FsResult<()> {
        if let Some(sb) = self.store.get(Idx::Meta, "fs")? {
            let v = sb.source["format"].as_u64().unwrap_or(0);
            if v != FORMAT_VERSION {
                return Err(FsError::Io(format!(
                    "store has format {v}, this esfs reads format {FORMAT_VERSION}"
                )));
            }
            return Ok(());
        }
        let now = now_ns();
        let root = Inode {
            ino: ROOT_INO,
            kind: Kind::Dir,
            mode: 0o755,
            uid: self.cfg.root_uid,
            gid: self.cfg.root_gid,
            size: 0,
            nlink: 2,
            rdev: 0,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            btime_ns: now,
            target: None,
            xattrs: Default::default(),
            content: None,
            links: vec![],
            orphan: false,
            stored: None,
        };
        for (idx, id, doc) in [
            (Idx::Inodes, inode_id(ROOT_INO), to_doc(&root)),
            (Idx::Meta, "ids".to_string(), json!({ "next": 16 })),
        ] {
            match self.store.create(idx, &id, &doc) {
                Ok(_) | Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let sb = json!({ "format": FORMAT_VERSION, "created_ns": now, "block_size": BLOCK_SIZE });
        match self.store.create(Idx::Meta, "fs", &sb) {
            Ok(_) | Err(StoreError::Conflict(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// A fresh id (inode numbers and readdir cookies share the sequence).
    fn alloc(&self) -> FsResult<u64> {
        let mut ids = self.ids.lock();
        if ids.0 >= ids.1 {
            for _ in 0..MAX_RETRIES {
                let doc = self
                    .store
                    .get(Idx::Meta, "ids")?
                    .ok_or_else(|| FsError::Io("id allocator missing".into()))?;
                let next = doc.source["next"].as_u64().unwrap_or(16);
                let end = next + ID_BATCH;
                match self
                    .store
                    .put(Idx::Meta, "ids", &json!({ "next": end }), Some(doc.version))
                {
                    Ok(_) => {
                        *ids = (next, end);
                        break;
                    }
                    Err(StoreError::Conflict(_)) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            if ids.0 >= ids.1 {
                return Err(FsError::Again);
            }
        }
        ids.0 += 1;
        Ok(ids.0 - 1)
    }

    // ---- documents ----

    fn get_inode(&self, ino: u64) -> FsResult<(Inode, Version)> {
        typed(self.store.get(Idx::Inodes, &inode_id(ino))?)?.ok_or(FsError::NotFound)
    }

    /// [`Fs::get_inode`] from the store itself, not a cache in front of a
    /// shared one (see `MetaStore::get_fresh`).
    fn get_inode_fresh(&self, ino: u64) -> FsResult<(Inode, Version)> {
        typed(self.store.get_fresh(Idx::Inodes, &inode_id(ino))?)?.ok_or(FsError::NotFound)
    }

    /// Read-modify-write of an inode with optimistic concurrency.
    fn update_inode(
        &self,
        ino: u64,
        mut f: impl FnMut(&mut Inode) -> FsResult<()>,
    ) -> FsResult<Inode> {
        let (inode, _) = self.change_inode(ino, |i| f(i).map(|()| Fate::Keep))?;
        Ok(inode)
    }

    /// Read-modify-write of an inode document under its version, retried
    /// when another call changed it in between: `f` changes the inode and
    /// says whether the document is written back or deleted.
    pub(super) fn change_inode(
        &self,
        ino: u64,
        f: impl FnMut(&mut Inode) -> FsResult<Fate>,
    ) -> FsResult<(Inode, Fate)> {
        self.change_inode_seen(ino, None, f)
    }

    /// [`Fs::change_inode`] starting from a copy the caller read (and its
    /// version), saving a read: a conflict re-reads as usual.
    pub(super) fn change_inode_seen(
        &self,
        ino: u64,
        mut seen: Option<(Inode, Version)>,
        mut f: impl FnMut(&mut Inode) -> FsResult<Fate>,
    ) -> FsResult<(Inode, Fate)> {
        let id = inode_id(ino);
        for _ in 0..MAX_RETRIES {
            let (mut inode, ver) = match seen.take() {
                Some(s) => s,
                None => self.get_inode(ino)?,
            };
            // A directory's times waiting in memory go in with this write
            // (before `f`, which may set them explicitly).
            let pending = self.pending_dir_time(&inode);
            if let Some(t) = pending {
                inode.mtime_ns = inode.mtime_ns.max(t);
                inode.ctime_ns = inode.ctime_ns.max(t);
            }
            let fate = f(&mut inode)?;
            let r = match fate {
                Fate::Keep => self
                    .store
                    .put(Idx::Inodes, &id, &to_doc(&inode), Some(ver))
                    .map(|_| ()),
                Fate::Delete => self.delete_inode_doc(&inode, Some(ver)),
            };
            match r {
                Ok(()) => {
                    if inode.kind == Kind::Dir && self.journal.is_some() {
                        self.dirs_written(Some((ino, pending)));
                    }
                    return Ok((inode, fate));
                }
                Err(StoreError::Conflict(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(FsError::Again)
    }

    fn get_entry(&self, parent: u64, name: &[u8]) -> FsResult<Option<(Entry, Version)>> {
        typed(self.store.get(Idx::Entries, &entry_id(parent, name))?)
    }

    /// [`Fs::get_entry`] from the store itself: for a name read under an
    /// exclusive tree lock to decide a change of several documents.
    fn get_entry_fresh(&self, parent: u64, name: &[u8]) -> FsResult<Option<(Entry, Version)>> {
        typed(
            self.store
                .get_fresh(Idx::Entries, &entry_id(parent, name))?,
        )
    }

    /// [`Fs::update_inode`] then [`Fs::sync_entries`], in one bulk where
    /// they were two writes or more: the inode conditional on the version
    /// read, each entry's attribute copy on its own. The inode's conflict
    /// retries (an entry written ahead of it is written again); an entry's
    /// (a rename or text refresh meanwhile) is synced the re-reading way.
    fn update_inode_synced(
        &self,
        ino: u64,
        mut f: impl FnMut(&mut Inode) -> FsResult<()>,
    ) -> FsResult<Inode> {
        for _ in 0..MAX_RETRIES {
            let (mut inode, ver) = self.get_inode(ino)?;
            f(&mut inode)?;
            let mut ops = vec![BulkOp::Index {
                index: Idx::Inodes,
                id: inode_id(ino),
                source: to_doc(&inode),
                if_version: Some(ver),
            }];
            for link in &inode.links {
                let id = entry_id(link.p, &decode_bytes(&link.n));
                let Some(doc) = self.store.get(Idx::Entries, &id)? else {
                    continue;
                };
                let mut entry: Entry = serde_json::from_value(doc.source)?;
                if entry.ino == ino && entry.refresh_attrs(&inode) {
                    ops.push(BulkOp::Index {
                        index: Idx::Entries,
                        id,
                        source: to_doc(&entry),
                        if_version: Some(doc.version),
                    });
                }
            }
            let mut results = self.store.bulk(ops)?.into_iter();
            match results.next().expect("one result per op") {
                Ok(_) => {}
                Err(StoreError::Conflict(_)) => continue,
                Err(e) => return Err(e.into()),
            }
            if results.any(|r| r.is_err()) {
                self.sync_entries(&inode)?;
            }
            return Ok(inode);
        }
        Err(FsError::Again)
    }

    /// Copy the inode's searchable attributes into each of its entry documents.
    fn sync_entries(&self, inode: &Inode) -> FsResult<()> {
        for link in &inode.links {
            let id = entry_id(link.p, &decode_bytes(&link.n));
            for _ in 0..MAX_RETRIES {
                let Some(doc) = self.store.get(Idx::Entries, &id)? else {
                    break;
                };
                let mut entry: Entry = serde_json::from_value(doc.source)?;
                if entry.ino != inode.ino || !entry.refresh_attrs(inode) {
                    break;
                }
                match self
                    .store
                    .put(Idx::Entries, &id, &to_doc(&entry), Some(doc.version))
                {
                    Ok(_) => break,
                    Err(StoreError::Conflict(_)) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Delete an inode's document and contents (its last name is gone and
    /// nothing has it open).
    fn destroy_inode(&self, inode: &Inode) -> FsResult<()> {
        self.delete_inode_doc(inode, None)?;
        self.orphans.lock().remove(&inode.ino);
        self.forget_inode_state(inode.ino);
        Ok(())
    }

    /// An inode's document deleted (conditional on `ver`) with its
    /// contents: in one bulk where they are documents of the store (the
    /// chunks by id, then the inode), else the contents first. Either way
    /// a crash never leaves contents without an inode that owns them.
    fn delete_inode_doc(
        &self,
        inode: &Inode,
        ver: Option<Version>,
    ) -> crate::store::StoreResult<()> {
        let mut ops = Vec::new();
        if let Some(key) = &inode.content {
            // What this mount knows of its size: the stored figure, or an
            // open state's if it grew since.
            let size = self.open_size(inode.ino).unwrap_or(0).max(inode.size);
            match self.data.removal_ops(key, size) {
                Some(chunks) => ops = chunks,
                None => self
                    .data
                    .remove_sized(key, size)
                    .map_err(|e| StoreError::Other(e.to_string()))?,
            }
        }
        ops.push(BulkOp::Delete {
            index: Idx::Inodes,
            id: inode_id(inode.ino),
            if_version: ver,
        });
        let mut results = self.store.bulk(ops)?;
        let own = results.pop().expect("one result per op");
        for r in results {
            match r {
                Ok(_) | Err(StoreError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        match own {
            Ok(_) => Ok(()),
            Err(StoreError::NotFound(_)) if ver.is_none() => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn forget_inode_state(&self, ino: u64) {
        self.dirs.write().remove(&ino);
        self.dir_times.lock().remove(&ino);
        self.atimes.lock().remove(&ino);
    }

    /// Searches are near-real-time on Elasticsearch: under an exclusive
    /// lock, make the changes other mounts finished before it visible.
    /// (A mount's own writes are always visible to its searches.)
    fn see_other_mounts(&self) -> FsResult<()> {
        if !self.caps.realtime_search {
            self.store.refresh(Idx::Entries)?;
        }
        Ok(())
    }

    // ---- paths ----

    /// (parent, encoded name) of a directory.
    fn dir_link(&self, ino: u64) -> FsResult<(u64, String)> {
        if let Some(l) = self.dirs.read().get(&ino) {
            return Ok(l.clone());
        }
        let (inode, _) = self.get_inode(ino)?;
        if inode.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let link = inode
            .links
            .first()
            .ok_or_else(|| FsError::Io(format!("directory {ino} has no parent link")))?;
        let l = (link.p, link.n.clone());
        self.dirs.write().insert(ino, l.clone());
        Ok(l)
    }

    /// The directory's ancestors, itself first, the root last.
    fn ancestors(&self, ino: u64) -> FsResult<Vec<(u64, String)>> {
        let mut chain = Vec::new();
        let mut cur = ino;
        while cur != ROOT_INO {
            let (parent, name) = self.dir_link(cur)?;
            chain.push((cur, name));
            if chain.len() > 8192 {
                return Err(FsError::Io(format!("directory loop above inode {ino}")));
            }
            cur = parent;
        }
        Ok(chain)
    }

    /// Full path of a directory, as stored in documents.
    pub fn dir_path(&self, ino: u64) -> FsResult<String> {
        let chain = self.ancestors(ino)?;
        if chain.is_empty() {
            return Ok("/".to_string());
        }
        let mut p = String::new();
        for (_, name) in chain.iter().rev() {
            p.push('/');
            p.push_str(name);
        }
        Ok(p)
    }
}

/// Store-level tree locks held for one namespace change; released (longest
/// path first) when dropped.
pub struct TreeLock<'a> {
    lm: &'a LockManager,
    guard: Option<TreeGuard>,
}

impl Drop for TreeLock<'_> {
    fn drop(&mut self) {
        if let Some(g) = self.guard.take() {
            self.lm.release(g);
        }
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        self.lm.shutdown();
    }
}

/// A mount's unique lock-owner id: host, pid and random bits.
fn session_id() -> String {
    let mut r = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut r);
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let rand: String = r.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{rand}", host.trim(), std::process::id())
}

impl Fs {
    /// Take the tree locks a namespace change needs: shared on every
    /// ancestor of each directory in `dirs` (themselves included), exclusive
    /// on the full paths of `targets` (directory, encoded name). Returns the
    /// directories' paths, valid while the lock is held: when a lock was
    /// newly taken from the store, the cached paths are re-read first (a
    /// rename by another mount may have changed them before we locked).
    pub(crate) fn tree_lock(
        &self,
        dirs: &[u64],
        targets: &[(u64, &str)],
    ) -> FsResult<(TreeLock<'_>, Vec<String>)> {
        self.tree_lock_with(dirs, targets, &[])
            .map(|(t, paths, _)| (t, paths))
    }

    /// Whether tree locks are lock documents in the store (so writes can
    /// ride in the request that takes them: see `tree_lock_with`).
    pub(crate) fn tree_locks_stored(&self) -> bool {
        !(self.cfg.no_tree_locks || self.caps.single_writer)
    }

    /// [`Fs::tree_lock`], with writes sent in the request that takes the
    /// exclusive locks (idempotent ones: see `LockManager::lock_tree_with`).
    /// The bool: they landed (never where tree locks are not stored).
    pub(crate) fn tree_lock_with(
        &self,
        dirs: &[u64],
        targets: &[(u64, &str)],
        with: &[BulkOp],
    ) -> FsResult<(TreeLock<'_>, Vec<String>, bool)> {
        // This mount the store's only writer (the embedded store: its lock
        // file keeps every other mount out), the in-process locks already
        // exclude everything the store-level tree locks would; taking them
        // there only costs lock-document writes per call.
        if !self.tree_locks_stored() {
            let paths = dirs
                .iter()
                .map(|d| self.dir_path(*d))
                .collect::<FsResult<_>>()?;
            return Ok((
                TreeLock {
                    lm: &self.lm,
                    guard: None,
                },
                paths,
                false,
            ));
        }
        for _ in 0..20 {
            let paths: Vec<String> = dirs
                .iter()
                .map(|d| self.dir_path(*d))
                .collect::<FsResult<_>>()?;
            let mut shared: Vec<String> = paths.iter().flat_map(|p| ancestors(p)).collect();
            shared.sort_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)));
            shared.dedup();
            let excl: Vec<String> = targets
                .iter()
                .map(|(d, n)| {
                    Ok(join_path(
                        &paths[dirs.iter().position(|x| x == d).expect("target dir listed")],
                        n,
                    ))
                })
                .collect::<FsResult<_>>()?;
            let guard = match self.lm.lock_tree_with(&shared, &excl, with) {
                Ok(g) => g,
                Err(LockError::Store(e)) => return Err(e.into()),
                Err(e) => {
                    log::warn!("{e}");
                    return Err(FsError::Busy);
                }
            };
            let (fresh, landed) = (guard.fresh, guard.with_landed);
            let lock = TreeLock {
                lm: &self.lm,
                guard: Some(guard),
            };
            if !fresh || self.chains_valid(dirs)? {
                return Ok((lock, paths, landed));
            }
            // Stale cache: it was refreshed; lock again with the new paths.
        }
        Err(FsError::Busy)
    }

    /// Re-read the parent chain of each directory from the store; false (and
    /// the cache corrected) if any cached link was stale.
    fn chains_valid(&self, dirs: &[u64]) -> FsResult<bool> {
        let mut valid = true;
        for d in dirs {
            for (ino, _) in self.ancestors(*d)? {
                let cached = self.dirs.read().get(&ino).cloned();
                let (inode, _) = self.get_inode_fresh(ino)?;
                let now = inode.links.first().map(|l| (l.p, l.n.clone()));
                if now != cached {
                    valid = false;
                    match now {
                        Some(l) => self.dirs.write().insert(ino, l),
                        None => self.dirs.write().remove(&ino),
                    };
                }
            }
        }
        Ok(valid)
    }
}

/// Whether the caller is in `gid`: its primary group or, read from
/// /proc/PID/status, a supplementary one.
pub fn in_group(ctx: Ctx, gid: u32) -> bool {
    if ctx.gid == gid {
        return true;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", ctx.pid)) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(gid)))
}

/// Every item of a bulk must have succeeded. A version conflict there means
/// another writer changed the same document meanwhile: EAGAIN, not EIO.
pub(crate) fn bulk_check(results: Vec<crate::store::BulkItemResult>) -> FsResult<()> {
    for r in results {
        match r {
            Ok(_) => {}
            Err(StoreError::Conflict(_)) => return Err(FsError::Again),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// For calls on an inode number the kernel holds: its document being gone
/// means the kernel's name for it is stale, not that the path is missing
/// (see [`FsError::Stale`]). On shared stores an unlinked file only the
/// kernel remembers is deleted at once, so a rename over a file can race
/// an open(2) of its old inode.
pub(crate) fn stale(e: FsError) -> FsError {
    match e {
        FsError::NotFound => FsError::Stale,
        e => e,
    }
}
