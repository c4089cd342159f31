//! The filesystem core: POSIX semantics over the document model, written once
//! above the [`MetaStore`] and [`DataStore`] traits. Every operation returns
//! `FsResult`; the FUSE adapter (`crate::fuse`) only translates.
//!
//! Concurrency: namespace changes take [`NamespaceLocks`]; attribute updates
//! are optimistic (read, change, write-if-version, retry on conflict), which
//! is also what keeps several mounts of one Elasticsearch index safe.
//!
//! Layout: this file holds [`Fs`], its configuration and the helpers every
//! call shares (paths, tree locks); [`ids`] the id allocator; [`docs`]
//! inodes and entries as types and their optimistic read-modify-write;
//! [`pending`] what waits in memory for the store (directory times, stale
//! entries, atimes) and the unflushed [`journal`]; `ops/` the calls, one
//! file per family; [`intent`] the rename plan and its idempotent steps;
//! [`recovery`] the janitor's roll-forward and fsck's repairs; `writeback`
//! lazy close and its batches.

mod docs;
mod ids;
pub mod intent;
pub mod journal;
mod ops;
mod pending;
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
use docs::{Docs, Fate, Found, MAX_RETRIES, bulk_check, stale, to_doc};
use ids::Ids;
use parking_lot::{Mutex, RwLock};
use pending::Pending;
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
    ids: Arc<Ids>,
    /// Directory times, stale entries and atimes waiting in memory, and
    /// the journal.
    pending: Arc<Pending>,
    /// Inodes and entries as types; the optimistic read-modify-write.
    docs: Arc<Docs>,
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
    /// Inodes the kernel forgot, for the write-back to finish (lazy close).
    forgotten: Mutex<Vec<u64>>,
    /// Set by `shutdown`: the background write-back stops.
    closing: std::sync::atomic::AtomicBool,
    /// Held by a background write-back pass (`shutdown` waits for it).
    write_back_pass: Mutex<()>,
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

impl Fs {
    pub fn new(store: Arc<dyn MetaStore>, data: Arc<dyn DataStore>, cfg: FsConfig) -> FsResult<Fs> {
        let owner = session_id();
        let lm = LockManager::new(store.clone(), &owner, &cfg.label)?;
        lm.spawn_heartbeat();
        let pending = Arc::new(Pending::default());
        let docs = Arc::new(Docs::new(store.clone(), data.clone(), pending.clone()));
        let ids = Arc::new(Ids::new(store.clone()));
        let fs = Fs {
            caps: store.capabilities(),
            store,
            data,
            cfg,
            locks: NamespaceLocks::default(),
            lm,
            ids,
            pending,
            docs,
            dirs: RwLock::new(HashMap::new()),
            open: Mutex::new(HashMap::new()),
            dying: Mutex::new(HashSet::new()),
            gone: Mutex::new(Default::default()),
            orphans: Mutex::new(HashSet::new()),
            settled: Default::default(),
            kernel_times: Default::default(),
            plocked: Mutex::new(Default::default()),
            lookups: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            dir_handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            search: std::sync::OnceLock::new(),
            forgotten: Mutex::new(Vec::new()),
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
                fs.pending.start_journal(j);
            }
        }
        fs.recover_intents()?;
        Ok(fs)
    }

    /// Run one filesystem call with its store writes in one batch (one
    /// commit on the embedded store), acknowledged before it returns.
    pub fn batch<T>(&self, f: impl FnOnce() -> FsResult<T>) -> FsResult<T> {
        self.docs.batch(f)
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

    /// Delete an inode's document and contents (its last name is gone and
    /// nothing has it open).
    fn destroy_inode(&self, inode: &Inode) -> FsResult<()> {
        self.docs
            .delete_inode(inode, None, self.open_size(inode.ino))?;
        self.orphans.lock().remove(&inode.ino);
        self.forget_inode_state(inode.ino);
        Ok(())
    }

    fn forget_inode_state(&self, ino: u64) {
        self.dirs.write().remove(&ino);
        self.pending.forget(ino);
    }

    // ---- paths ----

    /// (parent, encoded name) of a directory.
    fn dir_link(&self, ino: u64) -> FsResult<(u64, String)> {
        if let Some(l) = self.dirs.read().get(&ino) {
            return Ok(l.clone());
        }
        let (inode, _) = self.docs.inode(ino)?;
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
                let (inode, _) = self.docs.inode_fresh(ino)?;
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
