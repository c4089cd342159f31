//! The filesystem core: POSIX semantics over the document model, written once
//! above the [`MetaStore`] and [`DataStore`] traits. Every operation returns
//! `FsResult`; the FUSE adapter (`crate::fuse`) only translates.
//!
//! [`Fs`] is a few named parts, each a file that owns its state, built
//! bottom-up (each part holds the parts below it that it uses):
//! - [`ids`] the id allocator; [`pending`] what waits in memory for the
//!   store (directory times, stale entries, atimes) and the unflushed
//!   [`journal`];
//! - [`docs`] inodes and entries as types, the optimistic read-modify-write;
//! - [`tree`] directories' places and paths, the namespace locks, a
//!   directory's times and link count;
//! - [`files`] open files (states, handles, the size/time overlay) and an
//!   inode's life past its last name ([`refs`]: kernel references, orphans);
//! - [`moves`] a rename's plan and its idempotent steps; [`intent`] the plan
//!   as a document, rolled forward when its mount died;
//! - [`writeback`] the batches that write what waits; [`dir_handles`] open
//!   directories; [`plocks`] advisory locks across mounts.
//!
//! The calls are `ops/`, one file per family, each an `impl Fs` block that
//! uses the parts by name (no op file calls another; no part calls an op).
//!
//! Concurrency: namespace changes take the tree's locks; attribute updates
//! are optimistic, which is also what keeps several mounts of one
//! Elasticsearch index safe.

mod dir_handles;
mod docs;
mod files;
mod ids;
pub mod intent;
pub(crate) mod journal;
mod moves;
mod ops;
mod pending;
pub mod plocks;
mod refs;
mod tree;
mod usage;
mod writeback;

pub use dir_handles::{DirEnt, DirItem};

use crate::data::DataStore;
use crate::error::{FsError, FsResult};
use crate::hook::{ContentHook, HookSlot};
use crate::locks::LockManager;
use crate::model::{Inode, Kind, Link, NAME_MAX, ROOT_INO, encode_bytes, inode_id, now_ns};
use crate::store::cache::CachedStore;
use crate::store::{Caller, Capabilities, Idx, MetaStore, StoreError};
use dir_handles::DirHandles;
use docs::{Docs, to_doc};
use files::OpenFiles;
use ids::Ids;
use intent::Intents;
use journal::Journal;
use moves::Moves;
use pending::Pending;
use plocks::Plocks;
use serde_json::json;
use std::sync::Arc;
use tree::Tree;
use usage::InodeCount;
use writeback::WriteBack;

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
    /// The open file it came through (ftruncate(2), open(2) with
    /// O_TRUNC): a truncate of it may wait for that file's close.
    pub handle: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
pub enum TimeSpec {
    Now,
    At(i64),
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
const FORMAT_VERSION: u64 = 1;
/// How long a closed file's size and times may wait in memory (lazy close).
const STATE_WRITE_BACK: std::time::Duration = std::time::Duration::from_secs(1);

/// What kind of node to make, with its kind-specific payload.
pub enum NewNode<'a> {
    File,
    Dir,
    Symlink(&'a [u8]),
    Special(Kind, u32),
}

/// renameat2(2)'s flags that esfs supports.
pub const RENAME_NOREPLACE: u32 = libc::RENAME_NOREPLACE;
pub const RENAME_EXCHANGE: u32 = libc::RENAME_EXCHANGE;

pub struct Fs {
    /// The store behind this mount's document cache (every write goes
    /// through it, so what it holds stays true).
    store: Arc<CachedStore>,
    /// What the store offers (read once): where it is this mount's alone,
    /// stale orphans are reclaimed at start, dead owners' locks broken at
    /// once, and the kernel may keep its caches.
    caps: Capabilities,
    data: Arc<dyn DataStore>,
    /// Store-level locks, shared with every other mount of the store.
    lm: Arc<LockManager>,
    /// Content indexing for `esfs search` (set by the mount).
    hook: Arc<HookSlot>,
    ids: Arc<Ids>,
    pending: Arc<Pending>,
    docs: Arc<Docs>,
    tree: Arc<Tree>,
    files: Arc<OpenFiles>,
    moves: Arc<Moves>,
    intents: Intents,
    write_back: WriteBack,
    dir_handles: Arc<DirHandles>,
    plocks: Arc<Plocks>,
    /// The inode count statfs reports.
    inode_count: Arc<InodeCount>,
    /// The mount's own filesystem, not another caller's handle on it
    /// ([`Fs::as_caller`]): its drop ends the lock session.
    root: bool,
}

impl Fs {
    /// A filesystem over `store` (see `crate::open::cache_for_mount`; a
    /// maintenance command's is [`CachedStore::off`]).
    pub fn new(store: Arc<CachedStore>, data: Arc<dyn DataStore>, cfg: FsConfig) -> FsResult<Fs> {
        let lm = LockManager::new(store.clone(), &session_id(), &cfg.label)?;
        lm.spawn_heartbeat();
        let caps = store.capabilities();
        // A mount holding the whole tree's delegation gives it back first:
        // then what it acknowledged is in the cluster, and it no longer
        // writes from memory (see `store::delegated`).
        if !caps.single_writer {
            crate::locks::delegation::recall_others(&*store, &lm)?;
        }
        let hook = Arc::new(HookSlot::default());
        let ids = Arc::new(Ids::new(store.clone()));
        let pending = Arc::new(Pending::default());
        let docs = Arc::new(Docs::new(store.clone(), data.clone(), pending.clone()));
        // Store-level tree locks: not where this mount is the store's only
        // writer (see `Tree::lock_with`).
        let stored_locks = !(cfg.no_tree_locks || caps.single_writer);
        let tree = Arc::new(Tree::new(
            store.clone(),
            docs.clone(),
            pending.clone(),
            hook.clone(),
            lm.clone(),
            stored_locks,
        ));
        let files = Arc::new(OpenFiles::new(
            store.clone(),
            docs.clone(),
            data.clone(),
            pending.clone(),
            tree.clone(),
            hook.clone(),
        ));
        let moves = Arc::new(Moves::new(
            store.clone(),
            docs.clone(),
            tree.clone(),
            files.clone(),
            ids.clone(),
        ));
        let fs = Fs {
            intents: Intents::new(
                store.clone(),
                docs.clone(),
                tree.clone(),
                moves.clone(),
                ids.clone(),
                lm.clone(),
            ),
            write_back: WriteBack::new(
                store.clone(),
                docs.clone(),
                files.clone(),
                pending.clone(),
                data.clone(),
            ),
            dir_handles: Arc::default(),
            plocks: Arc::new(Plocks::new(store.clone(), lm.clone())),
            inode_count: Arc::new(InodeCount::new(caps.single_writer)),
            root: true,
            store,
            caps,
            data,
            lm,
            hook,
            ids,
            pending,
            docs,
            tree,
            files,
            moves,
        };
        if cfg.maintenance {
            if fs.store.get(Idx::Meta, "fs")?.is_none() {
                return Err(FsError::Io(format!(
                    "no esfs filesystem at {}",
                    fs.store.describe()
                )));
            }
            return Ok(fs);
        }
        format_if_new(&*fs.store, &cfg)?;
        if fs.caps.single_writer {
            fs.lm.become_sole_owner()?;
            fs.files.reclaim_orphans()?;
            if let Some(path) = &cfg.journal {
                let (j, left) = Journal::open(path)
                    .map_err(|e| FsError::Io(format!("journal {}: {e}", path.display())))?;
                fs.write_back.replay(&fs, &left)?;
                j.settle(|_| true)?;
                fs.pending.start_journal(j);
            }
        }
        fs.intents.recover()?;
        Ok(fs)
    }

    /// This filesystem as `caller` sees it: the same state (open files,
    /// what waits, the tree's places and locks, the lock session), every
    /// part reaching the store through `caller`'s handles, so its requests
    /// go out under its name and it reads as it reads (the janitor reads
    /// past the cache, see [`Caller`]). The background loops run on one.
    fn as_caller(&self, caller: Caller) -> Fs {
        self.over(
            self.store.for_caller(caller),
            self.lm.for_caller(caller),
            false,
        )
    }

    /// This filesystem through other store handles (`batched`: one batch's).
    fn over(&self, store: Arc<CachedStore>, lm: Arc<LockManager>, batched: bool) -> Fs {
        let meta: Arc<dyn MetaStore> = store.clone();
        let ids = Arc::new(self.ids.over(meta.clone()));
        let docs = Arc::new(if batched {
            self.docs.batched(store.clone())
        } else {
            Docs::new(store.clone(), self.data.clone(), self.pending.clone())
        });
        let tree = Arc::new(self.tree.over(meta.clone(), docs.clone(), lm.clone()));
        let files = Arc::new(self.files.over(meta.clone(), docs.clone(), tree.clone()));
        let moves = Arc::new(Moves::new(
            meta.clone(),
            docs.clone(),
            tree.clone(),
            files.clone(),
            ids.clone(),
        ));
        Fs {
            intents: Intents::new(
                meta.clone(),
                docs.clone(),
                tree.clone(),
                moves.clone(),
                ids.clone(),
                lm.clone(),
            ),
            write_back: self.write_back.over(meta, docs.clone(), files.clone()),
            dir_handles: self.dir_handles.clone(),
            plocks: self.plocks.clone(),
            inode_count: self.inode_count.clone(),
            root: false,
            store,
            caps: self.caps,
            data: self.data.clone(),
            lm,
            hook: self.hook.clone(),
            ids,
            pending: self.pending.clone(),
            docs,
            tree,
            files,
            moves,
        }
    }

    /// Run one filesystem call with its store writes in one batch (one
    /// commit on the embedded store), acknowledged before it returns: `f`
    /// runs on this filesystem through the batch's handles. Inside a batch
    /// (or on a store without batches) `f` runs on `self`.
    pub fn batch<T>(&self, f: impl FnOnce(&Fs) -> FsResult<T>) -> FsResult<T> {
        let Some(store) = self.store.batch() else {
            return f(self);
        };
        struct Open<'a>(&'a CachedStore, bool);
        impl Drop for Open<'_> {
            // A panic still ends the batch (and commits what it wrote).
            fn drop(&mut self) {
                if !self.1 {
                    let _ = self.0.end_batch();
                }
            }
        }
        let mut open = Open(&store, false);
        let call = self.over(store.clone(), self.lm.clone(), true);
        let r = f(&call);
        open.1 = true;
        store.end_batch()?;
        call.docs.batch_acknowledged();
        r
    }

    pub fn lock_manager(&self) -> &Arc<LockManager> {
        &self.lm
    }

    /// What the store offers (see [`Capabilities`]).
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    /// The store, through this mount's cache.
    pub fn store(&self) -> Arc<dyn MetaStore> {
        self.store.clone()
    }

    pub fn data(&self) -> &Arc<dyn DataStore> {
        &self.data
    }

    /// Index file contents for `esfs search` (see `crate::hook`).
    pub fn set_content_hook(&self, hook: Box<dyn ContentHook>) {
        self.hook.set(hook);
    }

    /// Whether close(2) may skip esfs (no FLUSH): written sizes and times
    /// are then written back in batches, and the journal covers a crash
    /// before that.
    pub fn lazy_close(&self) -> bool {
        self.pending.lazy()
    }

    /// The kernel took over files' sizes and times (writeback-cache mode).
    pub fn kernel_keeps_times(&self) {
        self.files.kernel_keeps_times();
        crate::model::use_kernel_clock();
    }

    /// Full path of a directory, as stored in documents.
    pub fn dir_path(&self, ino: u64) -> FsResult<String> {
        self.tree.dir_path(ino)
    }

    // ---- background work ----

    /// Background write-back: states (lazy close) every second, atimes
    /// when due.
    pub fn spawn_write_back(self: &Arc<Self>) {
        let fs = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("esfs-writeback".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(STATE_WRITE_BACK);
                    let Some(fs) = fs.upgrade() else { return };
                    let fs = fs.as_caller(Caller::WriteBack);
                    if !fs.write_back.pass(&fs) {
                        return;
                    }
                    fs.inode_count.recount_if_wanted(&*fs.store);
                }
            })
            .expect("spawn write-back");
    }

    /// Shared stores (Elasticsearch): a mount that died while other mounts
    /// kept running leaves intents and locks no restart may come back for.
    /// Every lease period, roll forward and release those whose owners'
    /// leases have run out.
    pub fn spawn_janitor(self: &Arc<Self>) {
        if self.caps.single_writer {
            return; // the only mount recovers at start
        }
        let fs = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("esfs-janitor".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(crate::locks::manager::LEASE);
                    let Some(fs) = fs.upgrade() else { return };
                    let fs = fs.as_caller(Caller::Janitor);
                    match fs.batch(|fs| fs.intents.reap_dead_mounts()) {
                        Ok((0, 0)) => {}
                        Ok((n, k)) => log::info!(
                            "dead mounts: rolled forward {n} change(s), removed {k} lock(s) and session(s)"
                        ),
                        Err(e) => log::warn!("recovering dead mounts' changes: {e}"),
                    }
                }
            })
            .expect("spawn janitor");
    }

    /// Clean unmount, once no request can come: stop the background
    /// writers, write back what waits in memory, end the lock session, and
    /// commit. The commit must be the last write: anything written after it
    /// (the session's deletion did) stays in the redo log, and the next
    /// mount replays it as if this one had crashed.
    pub fn shutdown(&self) -> FsResult<()> {
        // Waits for a pass of the write-back thread in progress.
        self.write_back.stop();
        if let Some(h) = self.hook.get() {
            h.stop();
        }
        self.write_back.write_back(self)?;
        self.write_back.write_back_atimes(self)?;
        self.lm.shutdown();
        self.store.sync()?;
        Ok(())
    }

    // ---- maintenance (esfs fsck) ----

    /// Roll forward the intents of dead mounts (all of them on an exclusive
    /// store, whose only other writer was this mount's previous life).
    pub fn recover_intents(&self) -> FsResult<usize> {
        self.intents.recover()
    }

    /// Recompute `path`/`dir` of every entry below directory `ino` from the
    /// parent chain; returns how many changed.
    pub fn fix_paths(&self, ino: u64) -> FsResult<u64> {
        self.moves.fix_paths(ino)
    }

    /// Set an inode's link count and back-links.
    pub fn set_links(&self, ino: u64, nlink: u32, links: Vec<Link>) -> FsResult<()> {
        self.docs.update(ino, |i| {
            i.nlink = nlink;
            if ino != ROOT_INO {
                i.links = links.clone();
            }
            Ok(())
        })?;
        Ok(())
    }

    /// A journaled file whose stored size or mtime lags its data (written
    /// just before a crash): the data's length and mtime.
    pub fn behind_data(&self, ino: u64) -> FsResult<Option<(u64, i64)>> {
        self.write_back.behind_data(ino)
    }

    /// Bring a file's stored size and mtime up to its data's.
    pub fn catch_up_with_data(&self, ino: u64, len: u64, mtime: i64) -> FsResult<()> {
        self.write_back.catch_up_with_data(self, ino, len, mtime)
    }
}

impl writeback::Batches for Fs {
    fn batch(&self, work: &mut dyn FnMut(&WriteBack) -> FsResult<()>) -> FsResult<()> {
        Fs::batch(self, |fs| work(&fs.write_back))
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        if self.root {
            self.lm.shutdown();
        }
    }
}

/// First mount of an empty store: root inode, id allocator, then the
/// superblock last, so an interrupted format is simply redone.
fn format_if_new(store: &dyn MetaStore, cfg: &FsConfig) -> FsResult<()> {
    if let Some(sb) = store.get(Idx::Meta, "fs")? {
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
        uid: cfg.root_uid,
        gid: cfg.root_gid,
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
        map: None,
    };
    for (idx, id, doc) in [
        (Idx::Inodes, inode_id(ROOT_INO), to_doc(&root)),
        (Idx::Meta, "ids".to_string(), json!({ "next": 16 })),
    ] {
        match store.create(idx, &id, &doc) {
            Ok(_) | Err(StoreError::Conflict(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let sb = json!({ "format": FORMAT_VERSION, "created_ns": now, "block_size": BLOCK_SIZE });
    match store.create(Idx::Meta, "fs", &sb) {
        Ok(_) | Err(StoreError::Conflict(_)) => Ok(()),
        Err(e) => Err(e.into()),
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

/// Whether the caller is in `gid`: its primary group or, read from
/// /proc/PID/status, a supplementary one.
fn in_group(ctx: Ctx, gid: u32) -> bool {
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

/// A name as stored in documents (checked against what Linux allows).
fn encode_name(name: &[u8]) -> FsResult<String> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(FsError::Invalid);
    }
    Ok(encode_bytes(name))
}
