//! rename(2) and renameat2(2): the fast paths of a move and an exchange.
//!
//! A rename writes an intent first (see [`crate::fs::intent`]), then does
//! the change (the steps of [`crate::fs::moves`]), then deletes the intent:
//! a crash in between is rolled forward by whoever notices. The new entry
//! is written before the old one goes, so a crash leaves the file reachable.

use crate::error::{FsError, FsResult};
use crate::fs::docs::{Found, bulk_check};
use crate::fs::moves::{Intent, MoveIntent, Seen};
use crate::fs::tree::TreeLock;
use crate::fs::{Fs, RENAME_EXCHANGE, RENAME_NOREPLACE, encode_name};
use crate::model::{Entry, Inode, Kind, join_path};
use crate::store::{BulkOp, Idx, MetaStore, Version};

/// What a move read and decided before writing anything.
struct Prepared {
    /// The new name held an (empty) directory.
    replaced_dir: bool,
    /// The new parent (checked a directory) and the old one if another,
    /// with versions.
    parents: Vec<(Inode, Version)>,
    /// The moved inode, when its back-link goes in the entries' bulk.
    moved_inode: Option<(Inode, Version)>,
    intent: MoveIntent,
}

/// Two plans of one move, whatever the entries' attribute copies say.
fn same_plan(a: &MoveIntent, b: &MoveIntent) -> bool {
    let plan = |m: &MoveIntent| {
        (
            m.src_parent,
            m.src_name.clone(),
            m.old_path.clone(),
            m.replaced,
        )
    };
    let (x, y) = (&a.entry, &b.entry);
    plan(a) == plan(b)
        && (x.ino, x.kind, x.parent, &x.name, &x.path, &x.dir, x.cookie)
            == (y.ino, y.kind, y.parent, &y.name, &y.path, &y.dir, y.cookie)
}

impl Fs {
    /// rename(2) and renameat2(2) with RENAME_NOREPLACE / RENAME_EXCHANGE.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags == RENAME_NOREPLACE | RENAME_EXCHANGE
        {
            return Err(FsError::Invalid); // RENAME_WHITEOUT and unknown flags
        }
        encode_name(name)?;
        let new_ename = encode_name(newname)?;
        let exchange = flags & RENAME_EXCHANGE != 0;
        loop {
            // Peek without locks to pick the lock scope, then re-read under it.
            let (peek, peek_dst) =
                self.docs
                    .two_entries((parent, name), (newparent, newname), false)?;
            let (peek, _) = peek.ok_or(FsError::NotFound)?;
            let moves_dir = |s: &Entry, d: &Option<(Entry, Version)>| {
                s.kind == Kind::Dir
                    || (exchange && d.as_ref().is_some_and(|(d, _)| d.kind == Kind::Dir))
            };
            let whole_tree = moves_dir(&peek, &peek_dst);
            // A directory's move rewrites its subtree's entries: the content
            // indexer holds off until it is done (see ContentHook::rewriting).
            let _rewriting = whole_tree.then(|| self.hook.rewriting());
            let _g = if whole_tree {
                self.tree.lock_all()
            } else {
                self.tree.lock_dirs(&[parent, newparent])
            };
            // A move is planned from the peek, and its intent goes in the
            // request that takes the tree locks: the names read under them
            // confirm the plan (or it is written again). A plan never
            // confirmed is checked against the names by any roll-forward
            // (`Intents::move_state`, which also refuses a directory's move
            // into itself), so a stale peek is never carried out. Not where
            // the peek already says the move is refused (a directory to
            // replace or to be replaced by a file, a directory over a file,
            // a name NOREPLACE keeps): a plan the names still match would be
            // carried out by a roll-forward if this mount died before
            // withdrawing it, and a roll-forward does not repeat those checks.
            let refused = peek_dst.as_ref().is_some_and(|(d, _)| {
                d.kind == Kind::Dir || peek.kind == Kind::Dir || flags & RENAME_NOREPLACE != 0
            });
            let early = match !exchange && !refused && self.tree.locks_stored() {
                true => {
                    let replaced = peek_dst.as_ref().map(|(d, _)| d.ino);
                    let plan = self.plan_move(
                        &peek,
                        (newparent, &new_ename),
                        replaced,
                        self.ids.alloc()?,
                    )?;
                    Some((self.intents.id()?, plan))
                }
                false => None,
            };
            let with: Vec<BulkOp> = early
                .iter()
                .map(|(id, plan)| self.intents.op(id, &Intent::Move(plan.clone())))
                .collect();
            // Across mounts: tree locking (Elasticsearch: The Definitive Guide,
            // chapter "Handling Relationships", "Tree Locking"), exclusive on both names.
            let locked = self.tree.lock_with(
                &[parent, newparent],
                &[(parent, &peek.name), (newparent, &new_ename)],
                &with,
            );
            let (t, _, landed) = match locked {
                Ok(l) => l,
                Err(e) => {
                    // An attempt may have written the intent: no change is.
                    if let Some((id, _)) = &early {
                        let _ = self.store.delete(Idx::Locks, id, None);
                    }
                    return Err(e);
                }
            };
            if !landed && let Some((id, _)) = &early {
                // Not written with the locks (refused): none left behind by
                // an earlier attempt either; the intent's own write follows.
                let _ = self.store.delete(Idx::Locks, id, None);
            }
            let early = early.filter(|_| landed);
            // Fresh: the intent is written (or confirmed) from these.
            let (src, dst) = match self
                .docs
                .two_entries((parent, name), (newparent, newname), true)
            {
                Ok(two) => two,
                Err(e) => {
                    self.abandon(early, t)?;
                    return Err(e);
                }
            };
            let Some(src) = src else {
                self.abandon(early, t)?;
                return Err(FsError::NotFound);
            };
            if moves_dir(&src.0, &dst) && !whole_tree {
                self.abandon(early, t)?;
                continue; // changed under us: retry with the tree lock
            }
            return if exchange {
                self.exchange(src, dst.ok_or(FsError::NotFound)?, t)
            } else {
                self.move_entry(src, (newparent, new_ename), dst, flags, t, early)
            };
        }
    }

    /// A rename that changes nothing after all: its early intent (if any)
    /// goes with its locks, in one request.
    fn abandon(&self, early: Option<(String, MoveIntent)>, t: TreeLock<'_>) -> FsResult<()> {
        match early {
            Some((id, _)) => self.intents.finish(&id, t),
            None => Ok(()),
        }
    }

    /// The plan of moving entry `src` to `to` (new parent, encoded name),
    /// replacing inode `replaced`; the new entry gets `cookie`.
    fn plan_move(
        &self,
        src: &Entry,
        (newparent, new_ename): (u64, &str),
        replaced: Option<u64>,
        cookie: u64,
    ) -> FsResult<MoveIntent> {
        let new_dir = self.tree.dir_path(newparent)?;
        Ok(MoveIntent {
            src_parent: src.parent,
            src_name: src.name.clone(),
            old_path: src.path.clone(),
            entry: Entry {
                parent: newparent,
                name: new_ename.to_string(),
                path: join_path(&new_dir, new_ename),
                dir: new_dir,
                cookie,
                ..src.clone()
            },
            replaced,
        })
    }

    /// A move of `src` to `to` (new parent, encoded name) under the
    /// rename's tree locks `t`, released when it is done.
    /// `early`: the intent written with the locks, from the peek.
    fn move_entry(
        &self,
        (src, sver): (Entry, Version),
        to: (u64, String),
        dst: Option<(Entry, Version)>,
        flags: u32,
        t: TreeLock<'_>,
        early: Option<(String, MoveIntent)>,
    ) -> FsResult<()> {
        let cookie = match &early {
            Some((_, plan)) => plan.entry.cookie,
            None => self.ids.alloc()?,
        };
        // Nothing is written until the checks pass: a refusal (or a move
        // that changes nothing) takes the early intent along with the locks.
        let prepared = match self.prepare_move(&src, (to.0, &to.1), &dst, flags, cookie) {
            Ok(Some(p)) => p,
            r => {
                self.abandon(early, t)?;
                return r.map(|_| ());
            }
        };
        let Prepared {
            replaced_dir,
            parents,
            moved_inode,
            intent,
        } = prepared;
        let src_is_dir = src.kind == Kind::Dir;
        let newparent = to.0;
        if let Some(seen) = &moved_inode
            && early.is_none()
            && !src_is_dir
            && dst.is_none()
            && self.moves.move_at_once(&intent, sver, seen)?
        {
            for p in parents {
                self.tree.touch_seen(p.0.ino, 0, Some(p))?;
            }
            return Ok(());
        }
        // Directory link counts: the moved directory's ".." leaves the old
        // parent; a replaced directory's ".." leaves the new parent.
        let dir_delta = |p: u64| -> i32 {
            let mut d = 0;
            if src_is_dir && p == src.parent {
                d -= 1;
            }
            if src_is_dir && p == newparent {
                d += 1;
            }
            if replaced_dir && p == newparent {
                d -= 1;
            }
            d
        };
        // The parents' touches go in the entries' bulk where they are plain
        // writes, conditional on the reads above (a crash before the intent
        // is gone: its roll-forward recounts them).
        let touches = parents
            .iter()
            .map(|p| {
                self.tree
                    .touch_op(p.0.ino, dir_delta(p.0.ino), Some(p.clone()))
            })
            .collect::<FsResult<Vec<Option<BulkOp>>>>();
        let touches = match touches {
            Ok(ops) => ops,
            Err(e) => {
                self.abandon(early, t)?;
                return Err(e);
            }
        };
        // The intent is in place before any change: if this mount dies from
        // here on, whoever notices rolls the rename forward from it.
        let iid = match early {
            Some((iid, plan)) if same_plan(&plan, &intent) => iid,
            Some((iid, plan)) => {
                // The peek was stale: the plan as the names now say.
                let op = self.intents.op(&iid, &Intent::Move(intent.clone()));
                if let Err(e) = self
                    .store
                    .bulk(vec![op])
                    .map_err(FsError::from)
                    .and_then(bulk_check)
                {
                    self.abandon(Some((iid, plan)), t)?;
                    return Err(e);
                }
                iid
            }
            None => self.intents.write(&Intent::Move(intent.clone()))?,
        };
        let seen = Seen {
            entries: (sver, dst.as_ref().map(|(_, v)| *v)),
            inodes: moved_inode.into_iter().collect(),
            also: touches.iter().flatten().cloned().collect(),
        };
        let mut touched = self.moves.apply_move(&intent, Some(&seen))?.into_iter();
        for (p, touch) in parents.into_iter().zip(touches) {
            let ino = p.0.ino;
            match touch {
                // Not landed: changed since read, or the bulk did not happen.
                Some(_) => self
                    .tree
                    .touched(ino, dir_delta(ino), touched.next() == Some(true))?,
                None => self.tree.touch_seen(ino, dir_delta(ino), Some(p))?,
            }
        }
        self.intents.finish(&iid, t)
    }

    /// A move's checks and reads, before anything is written: None when it
    /// changes nothing (two names of one file).
    fn prepare_move(
        &self,
        src: &Entry,
        (newparent, new_ename): (u64, &str),
        dst: &Found,
        flags: u32,
        cookie: u64,
    ) -> FsResult<Option<Prepared>> {
        let src_is_dir = src.kind == Kind::Dir;
        let mut replaced_dir = false;
        if let Some((d, _)) = dst {
            if d.ino == src.ino {
                return Ok(None); // two names of one file: POSIX says do nothing
            }
            if flags & RENAME_NOREPLACE != 0 {
                return Err(FsError::Exists);
            }
            match (src_is_dir, d.kind == Kind::Dir) {
                (true, false) => return Err(FsError::NotDir),
                (false, true) => return Err(FsError::IsDir),
                (true, true) => {
                    if !self.tree.is_empty(d.ino)? {
                        return Err(FsError::NotEmpty);
                    }
                    replaced_dir = true;
                }
                (false, false) => {}
            }
        }
        // The parents (the new one checked; both touched) and the moved
        // inode (its back-link goes in the entries' bulk), in one read. A
        // directory's only where its times are not waiting in memory (lazy
        // close: its own write takes them along).
        let mut ids = vec![newparent];
        if src.parent != newparent {
            ids.push(src.parent);
        }
        let link_in_bulk = !src_is_dir || !self.pending.lazy();
        if link_in_bulk {
            ids.push(src.ino);
        }
        let mut parents = self.docs.inodes(&ids)?;
        let moved_inode = link_in_bulk.then(|| parents.pop().expect("read"));
        if parents[0].0.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if src_is_dir && self.tree.is_ancestor(src.ino, newparent)? {
            return Err(FsError::Invalid);
        }
        let mut intent = self.plan_move(
            src,
            (newparent, new_ename),
            dst.as_ref().map(|(d, _)| d.ino),
            cookie,
        )?;
        // A directory's new entry carries its inode's times as read (its
        // old entry's copy lags after changes in it), so the write-back has
        // no copy left to refresh. A file's keeps its old entry's, which
        // its indexed text is checked against.
        if let (true, Some((inode, _))) = (src_is_dir, &moved_inode) {
            intent.entry.refresh_attrs(inode);
        }
        Ok(Some(Prepared {
            replaced_dir,
            parents,
            moved_inode,
            intent,
        }))
    }

    /// RENAME_EXCHANGE: the two names swap the inodes they point to.
    fn exchange(
        &self,
        (a, aver): (Entry, Version),
        (b, bver): (Entry, Version),
        t: TreeLock<'_>,
    ) -> FsResult<()> {
        if a.ino == b.ino {
            return Ok(());
        }
        if (a.kind == Kind::Dir && self.tree.is_ancestor(a.ino, b.parent)?)
            || (b.kind == Kind::Dir && self.tree.is_ancestor(b.ino, a.parent)?)
        {
            return Err(FsError::Invalid);
        }
        // The files' inodes, whose back-links go in the entries' bulk.
        let files: Vec<u64> = [&a, &b]
            .into_iter()
            .filter(|e| e.kind != Kind::Dir)
            .map(|e| e.ino)
            .collect();
        let inodes = if files.is_empty() {
            Vec::new()
        } else {
            self.docs.inodes(&files)?
        };
        let iid = self.intents.write(&Intent::Exchange {
            a: a.clone(),
            b: b.clone(),
        })?;
        let seen = Seen {
            entries: (aver, bver),
            inodes,
            also: Vec::new(),
        };
        if self.moves.apply_exchange(&a, &b, Some(&seen))? {
            // Directory link counts: a directory's ".." changes parents.
            if a.parent != b.parent && (a.kind == Kind::Dir) != (b.kind == Kind::Dir) {
                let d = if a.kind == Kind::Dir { 1 } else { -1 };
                self.tree.touch(a.parent, -d)?;
                self.tree.touch(b.parent, d)?;
            } else {
                self.tree.touch(a.parent, 0)?;
                if a.parent != b.parent {
                    self.tree.touch(b.parent, 0)?;
                }
            }
        }
        self.intents.finish(&iid, t)
    }
}
