//! The directory tree: where each directory stands (its parent and name,
//! cached; every document's path is composed from them), the locks a
//! namespace change takes (this mount's threads first, then the tree locks
//! every mount of the store shares), and what a name made or removed does
//! to its directory (times, link count).

use super::docs::{Docs, Fate, to_doc};
use super::pending::Pending;
use crate::error::{FsError, FsResult};
use crate::hook::HookSlot;
use crate::locks::manager::ancestors;
use crate::locks::{LockError, LockManager, NamespaceLocks, NsGuard, TreeGuard};
use crate::model::{Inode, Kind, ROOT_INO, inode_id, join_path, now_ns};
use crate::store::{BulkItemResult, BulkOp, Idx, MetaStore, Query, StoreResult, Version};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;

pub(super) struct Tree {
    store: Arc<dyn MetaStore>,
    docs: Arc<Docs>,
    /// A directory's times wait here under lazy close.
    pending: Arc<Pending>,
    /// Told of namespace activity (the indexer keeps out of its way).
    hook: Arc<HookSlot>,
    /// This mount's threads: shared tree, exclusive directories.
    locks: Arc<NamespaceLocks>,
    /// Store-level locks, shared with every other mount of the store.
    lm: Arc<LockManager>,
    /// Whether tree locks are lock documents in the store (see
    /// [`Tree::locks_stored`]).
    stored: bool,
    /// Directory inode -> (parent inode, encoded name): paths are composed
    /// from this. Only a rename of that directory changes its row.
    dirs: Arc<RwLock<HashMap<u64, (u64, String)>>>,
}

/// Store-level tree locks held for one namespace change; released (longest
/// path first) when dropped.
pub(super) struct TreeLock<'a> {
    lm: &'a LockManager,
    guard: Option<TreeGuard>,
}

impl TreeLock<'_> {
    /// Release the locks in one request after `first` (see
    /// `LockManager::release_with`: only `locks` items are ordered before
    /// the releases); returns `first`'s results.
    pub(super) fn release_with(mut self, first: Vec<BulkOp>) -> StoreResult<Vec<BulkItemResult>> {
        let g = self.guard.take().unwrap_or_default();
        self.lm.release_with(g, first)
    }
}

impl Drop for TreeLock<'_> {
    fn drop(&mut self) {
        if let Some(g) = self.guard.take() {
            self.lm.release(g);
        }
    }
}

impl Tree {
    /// `stored`: tree locks are lock documents in the store (not where
    /// this mount is the store's only writer, or benchmarks turned them off).
    pub(super) fn new(
        store: Arc<dyn MetaStore>,
        docs: Arc<Docs>,
        pending: Arc<Pending>,
        hook: Arc<HookSlot>,
        lm: Arc<LockManager>,
        stored: bool,
    ) -> Tree {
        Tree {
            store,
            docs,
            pending,
            hook,
            locks: Arc::default(),
            lm,
            stored,
            dirs: Arc::default(),
        }
    }

    /// This tree through another caller's handles (the same locks and places).
    pub(super) fn over(
        &self,
        store: Arc<dyn MetaStore>,
        docs: Arc<Docs>,
        lm: Arc<LockManager>,
    ) -> Tree {
        Tree {
            store,
            docs,
            pending: self.pending.clone(),
            hook: self.hook.clone(),
            locks: self.locks.clone(),
            lm,
            stored: self.stored,
            dirs: self.dirs.clone(),
        }
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

    /// Directory `ino` now stands in `parent` as `name` (encoded).
    pub(super) fn placed(&self, ino: u64, parent: u64, name: &str) {
        self.dirs.write().insert(ino, (parent, name.to_string()));
    }

    /// Directory `ino` is gone.
    pub(super) fn forget(&self, ino: u64) {
        self.dirs.write().remove(&ino);
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
    pub(super) fn dir_path(&self, ino: u64) -> FsResult<String> {
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

    /// Whether directory `dir` is `ino` or one of its ancestors is.
    pub(super) fn is_ancestor(&self, ino: u64, dir: u64) -> FsResult<bool> {
        Ok(dir == ino || self.ancestors(dir)?.iter().any(|(a, _)| *a == ino))
    }

    // ---- locks ----

    /// This mount's lock for a change of entries in `dirs` (under the
    /// shared tree lock).
    pub(super) fn lock_dirs(&self, dirs: &[u64]) -> NsGuard<'_> {
        self.locks.dirs(dirs)
    }

    /// This mount's exclusive tree lock (a directory's move, a roll-forward).
    pub(super) fn lock_all(&self) -> NsGuard<'_> {
        self.locks.exclusive()
    }

    /// Take the tree locks a namespace change needs: shared on every
    /// ancestor of each directory in `dirs` (themselves included), exclusive
    /// on the full paths of `targets` (directory, encoded name). Returns the
    /// directories' paths, valid while the lock is held: when a lock was
    /// newly taken from the store, the cached paths are re-read first (a
    /// rename by another mount may have changed them before we locked).
    pub(super) fn lock(
        &self,
        dirs: &[u64],
        targets: &[(u64, &str)],
    ) -> FsResult<(TreeLock<'_>, Vec<String>)> {
        self.lock_with(dirs, targets, &[])
            .map(|(t, paths, _)| (t, paths))
    }

    /// Whether tree locks are lock documents in the store (so writes can
    /// ride in the request that takes them: see `lock_with`).
    pub(super) fn locks_stored(&self) -> bool {
        self.stored
    }

    /// [`Tree::lock`], with writes sent in the request that takes the
    /// exclusive locks (idempotent ones: see `LockManager::lock_tree_with`).
    /// The bool: they landed (never where tree locks are not stored).
    pub(super) fn lock_with(
        &self,
        dirs: &[u64],
        targets: &[(u64, &str)],
        with: &[BulkOp],
    ) -> FsResult<(TreeLock<'_>, Vec<String>, bool)> {
        // This mount the store's only writer (the embedded store: its lock
        // file keeps every other mount out), the in-process locks already
        // exclude everything the store-level tree locks would; taking them
        // there only costs lock-document writes per call.
        if !self.stored {
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

    // ---- a directory's times and links ----

    /// Whether directory `ino` has no entries.
    pub(super) fn is_empty(&self, ino: u64) -> FsResult<bool> {
        Ok(self
            .store
            .count(Idx::Entries, &Query::term("parent", ino))?
            == 0)
    }

    /// Directory link count from the truth: 2 + its subdirectories; its
    /// times to now.
    pub(super) fn recount(&self, ino: u64) -> FsResult<()> {
        let subdirs = self.store.count(
            Idx::Entries,
            &Query::and(vec![Query::term("parent", ino), Query::term("kind", "dir")]),
        )?;
        let now = now_ns();
        match self.docs.update(ino, |i| {
            i.nlink = 2 + subdirs as u32;
            i.mtime_ns = now;
            i.ctime_ns = now;
            Ok(())
        }) {
            Ok(_) | Err(FsError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Directory mtime/ctime to now and its link count changed by `nlink`.
    pub(super) fn touch(&self, ino: u64, nlink: i32) -> FsResult<()> {
        self.touch_seen(ino, nlink, None)
    }

    /// [`Tree::touch`] from a copy of the directory's inode the caller
    /// read under the call's locks (one read fewer on a shared store).
    pub(super) fn touch_seen(
        &self,
        ino: u64,
        nlink: i32,
        seen: Option<(Inode, Version)>,
    ) -> FsResult<()> {
        let now = now_ns();
        self.hook.activity();
        // Lazy close: only the times change, so they wait in memory for
        // the write-back like a closed file's size (a read-modify-write
        // of the directory was a sixth of an unlink or a rename).
        if nlink == 0 && self.pending.wait_dir_time(ino, now)? {
            return Ok(());
        }
        self.docs.change_seen(ino, seen, |i| {
            touch(i, nlink, now);
            Ok(Fate::Keep)
        })?;
        // The entry's copy of the directory's times only serves searches:
        // the write-back refreshes it, once a second at most instead of
        // once per name created in the directory (a write of its own per
        // call). A crash leaves it stale until the next change.
        self.pending.stale_dir(ino);
        Ok(())
    }

    /// [`Tree::touch_seen`]'s write as a bulk item, for the bulk of the
    /// change that moves the directory's times (a request fewer per call
    /// on Elasticsearch), conditional on the copy read (`seen`, else the
    /// cached one). None where the times wait in memory (lazy close) or
    /// the directory is gone. The caller passes the item's result to
    /// [`Tree::touched`].
    pub(super) fn touch_op(
        &self,
        ino: u64,
        nlink: i32,
        seen: Option<(Inode, Version)>,
    ) -> FsResult<Option<BulkOp>> {
        if self.pending.lazy() {
            return Ok(None);
        }
        let (mut i, ver) = match seen {
            Some(s) => s,
            None => match self.docs.inode(ino) {
                Ok(s) => s,
                Err(FsError::NotFound) => return Ok(None),
                Err(e) => return Err(e),
            },
        };
        touch(&mut i, nlink, now_ns());
        Ok(Some(BulkOp::Index {
            index: Idx::Inodes,
            id: inode_id(ino),
            source: to_doc(&i),
            if_version: Some(ver),
        }))
    }

    /// After a [`Tree::touch_op`] item: what follows its write if it
    /// `landed`, else the touch the re-reading way.
    pub(super) fn touched(&self, ino: u64, nlink: i32, landed: bool) -> FsResult<()> {
        match landed {
            true => {
                self.hook.activity();
                self.pending.stale_dir(ino);
                Ok(())
            }
            _ => self.touch(ino, nlink),
        }
    }
}

/// A directory's change: mtime and ctime `now`, link count moved by `nlink`.
fn touch(i: &mut Inode, nlink: i32, now: i64) {
    i.mtime_ns = now;
    i.ctime_ns = now;
    i.nlink = (i.nlink as i64 + nlink as i64).max(0) as u32;
}
