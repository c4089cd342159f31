//! The filesystem core: POSIX semantics over the document model, written once
//! above the [`MetaStore`] and [`DataStore`] traits. Every operation returns
//! `FsResult`; the FUSE adapter (`crate::fuse`) only translates.
//!
//! Concurrency: namespace changes take the [`tree`]'s locks; attribute updates
//! are optimistic (read, change, write-if-version, retry on conflict), which
//! is also what keeps several mounts of one Elasticsearch index safe.
//!
//! Layout: this file holds [`Fs`] and its configuration; [`ids`] the id
//! allocator; [`docs`] inodes and entries as types and their optimistic
//! read-modify-write; [`pending`] what waits in memory for the store
//! (directory times, stale entries, atimes) and the unflushed [`journal`];
//! [`tree`] directories' places and paths, the namespace locks, a
//! directory's times and link count; [`files`] open files and an inode's
//! life past its last name ([`refs`]); `ops/` the calls, one file per
//! family; [`intent`] the rename plan and its idempotent steps;
//! [`recovery`] the janitor's roll-forward and fsck's repairs; `writeback`
//! lazy close and its batches.

mod docs;
mod files;
mod ids;
pub mod intent;
pub mod journal;
mod ops;
mod pending;
pub mod recovery;
mod refs;
mod tree;
mod writeback;

pub use ops::plock;
pub use ops::readdir::{DirEnt, DirItem};
pub use ops::rename::{RENAME_EXCHANGE, RENAME_NOREPLACE};

use crate::data::DataStore;
use crate::error::{FsError, FsResult};
use crate::hook::{ContentHook, HookSlot};
use crate::locks::LockManager;
use crate::model::*;
use crate::store::{BulkOp, Capabilities, Idx, MetaStore, StoreError, Version};
use docs::{Docs, Found, MAX_RETRIES, bulk_check, to_doc};
use files::OpenFiles;
use ids::Ids;
use parking_lot::Mutex;
use pending::Pending;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use tree::{Tree, TreeLock};

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

/// What kind of node to make, with its kind-specific payload.
pub enum NewNode<'a> {
    File,
    Dir,
    Symlink(&'a [u8]),
    Special(Kind, u32),
}

pub struct Fs {
    store: Arc<dyn MetaStore>,
    /// What the store offers (read once): where it is this mount's alone,
    /// stale orphans are reclaimed at start, dead owners' locks broken at
    /// once, and the kernel may keep its caches.
    caps: Capabilities,
    data: Arc<dyn DataStore>,
    cfg: FsConfig,
    /// Store-level locks, shared with every other mount of the store.
    lm: Arc<LockManager>,
    /// Content indexing for `esfs search` (set by the mount).
    hook: Arc<HookSlot>,
    ids: Arc<Ids>,
    /// Directory times, stale entries and atimes waiting in memory, and
    /// the journal.
    pending: Arc<Pending>,
    /// Inodes and entries as types; the optimistic read-modify-write.
    docs: Arc<Docs>,
    /// Directories' places and paths, namespace locks, directory changes.
    tree: Arc<Tree>,
    /// Open files, the size/time overlay, kernel references and orphans.
    files: Arc<OpenFiles>,
    /// Inodes on which this mount holds advisory locks.
    plocked: Mutex<std::collections::HashSet<u64>>,
    dir_handles: Mutex<HashMap<u64, Arc<Mutex<ops::readdir::DirHandle>>>>,
    next_fh: AtomicU64,
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
        let caps = store.capabilities();
        let hook = Arc::new(HookSlot::default());
        let pending = Arc::new(Pending::default());
        let docs = Arc::new(Docs::new(store.clone(), data.clone(), pending.clone()));
        let ids = Arc::new(Ids::new(store.clone()));
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
        let fs = Fs {
            caps,
            store,
            data,
            cfg,
            lm,
            hook,
            ids,
            pending,
            docs,
            tree,
            files,
            plocked: Mutex::new(Default::default()),
            dir_handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
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
            fs.files.reclaim_orphans()?;
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
    pub fn set_content_hook(&self, hook: Box<dyn ContentHook>) {
        self.hook.set(hook);
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

    /// Full path of a directory, as stored in documents.
    pub fn dir_path(&self, ino: u64) -> FsResult<String> {
        self.tree.dir_path(ino)
    }

    /// The kernel took over files' sizes and times (writeback-cache mode).
    pub fn kernel_keeps_times(&self) {
        self.files.kernel_keeps_times();
        crate::model::use_kernel_clock();
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
